"""pytest-benchmark suite: strategy x scenario on a local-multinode cluster, one worker 3x slower.

Scenarios: equal vs auto-balanced batches; loopback vs an emulated 100 Mbit/s link (root);
2 and 4 workers. One benchmark round is one global training step, after warm-up steps, with
startup outside the timing. `extra_info` carries samples/s and the step breakdown, so the JSON
alone answers "which strategy pays here". The `gloo-floor` benchmark is the reference of each link.
"""

from __future__ import annotations

import itertools
import os

import pytest

from hetbench.clock import median
from hetbench.config import load_config
from hetbench.floor import FLOOR_NAME, measure_floor
from hetbench.scenarios import balanced
from hetbench.step_timing import StepTiming
from hetbench.strategies.registry import BASELINE, STRATEGIES, declared, load
from hetbench.workload import load_workload

MODES = {  # what each --bench-mode covers; the full set is the matrix
    "short": {
        "strategies": ["single", "ray-ps", "dask-sync"],
        "balance": ["equal", "auto"],
        "links": [None],
        "workers": [2],
        "batch_size": 64,
        "rounds": 4,
        "warmup": 1,
        "standalone_steps": 2,
    },
    "full": {
        "strategies": list(STRATEGIES),  # every registered one
        "balance": ["equal", "auto"],
        "links": [None, "100mbit"],
        "workers": [2, 4],
        "batch_size": 256,
        "rounds": 20,
        "warmup": 3,
        "standalone_steps": 10,
    },
}


def scenarios(mode: str) -> list:
    """(link, workers, strategy, balance) per benchmark, grouped by the cluster they need."""
    m, out = MODES[mode], []
    root = pytest.mark.skipif(os.geteuid() != 0, reason="link emulation needs root (network namespaces, tc)")
    for link, n in itertools.product(m["links"], m["workers"]):
        where = f"{link or 'loopback'}-{n}w"
        rows = [(FLOOR_NAME, None)] + [
            (name, balance) for name in m["strategies"] for balance in ([None] if name == BASELINE else m["balance"])
        ]
        out += [
            pytest.param(
                link,
                n,
                name,
                balance,
                marks=[root] if link else [],
                id=f"{where}-{name}" + (f"-{balance}" if balance else ""),
            )
            for name, balance in rows
        ]
    return out


def pytest_generate_tests(metafunc):
    if "strategy_name" in metafunc.fixturenames:
        metafunc.parametrize(
            "link,n_workers,strategy_name,balance", scenarios(metafunc.config.getoption("--bench-mode"))
        )


def scenario_config(m: dict, link: str | None, n: int) -> dict:
    """n workers on two labelled nodes (desktop first), the last one emulated 3x slower."""
    workers = ", ".join(
        f"{{name: w{i}, node: {'desktop' if i < (n + 1) // 2 else 'mac'}" + (", slowdown: 3.0}" if i == n - 1 else "}")
        for i in range(n)
    )
    return load_config(
        None,
        [
            f"workers=[{workers}]",
            "cluster.mode=local-multinode",
            f"link.rate={link or 'null'}",
            f"batch_size={m['batch_size']}",
            f"standalone_steps={m['standalone_steps']}",
            "download=false",
        ],
        declared(),
    )


@pytest.fixture(scope="session")
def standalone():
    """Each worker's samples/s alone, measured once per cluster (auto's speeds)."""
    from hetbench.standalone import measure_standalone, speeds

    cache: dict = {}

    def get(cfg, key: tuple) -> dict:
        if key not in cache:
            cache[key] = speeds(measure_standalone(cfg.job()))
        return cache[key]

    return get


def test_step(benchmark, request, clusters, standalone, link, n_workers, strategy_name, balance):
    m = MODES[request.config.getoption("--bench-mode")]
    key = (link, n_workers)
    cluster_cfg, _, _ = clusters(scenario_config(m, link, n_workers), key)
    benchmark.extra_info.update(strategy=strategy_name, balance=balance, link=link or "loopback", workers=n_workers)
    if strategy_name == FLOOR_NAME:
        floors, c = [], cluster_cfg
        parameters = load_workload(c.run).parameters
        benchmark.pedantic(
            lambda: floors.extend(measure_floor(c.floor, c.cluster, c.workers, c.link, parameters)),
            rounds=1,
            iterations=1,
        )
        gloo, ps = floors
        benchmark.extra_info.update(allreduce_ms=gloo["allreduce_s"] * 1000, allreduce_cv=gloo["allreduce_cv"])
        benchmark.extra_info.update(ps_roundtrip_ms=ps["roundtrip_s"] * 1000, ps_roundtrip_cv=ps["roundtrip_cv"])
        return
    cfg = (
        cluster_cfg
        if balance is None
        else balanced(cluster_cfg, balance, standalone(cluster_cfg, key) if balance == "auto" else None)
    )
    cls = load(strategy_name)
    strategy = cls(cfg.job(strategy_name))
    timings: list[StepTiming] = []
    try:
        strategy.start()  # startup stays outside the timed rounds
        strategy.reset(cfg.run.seed)
        last = m["warmup"] + m["rounds"] - 1
        for step in range(m["warmup"]):
            strategy.step(step, step + 1)  # steps follow each other at once, as in `hetbench run`
        steps = itertools.count(m["warmup"])

        def one_step():
            step = next(steps)
            timings.append(strategy.step(step, step + 1 if step < last else None))

        benchmark.pedantic(one_step, rounds=m["rounds"], iterations=1)
        workers = strategy.worker_info()
    finally:
        strategy.close()
    benchmark.extra_info.update(
        samples_per_s=cfg.run.batch_size / median([t.total_s for t in timings]),
        step_ms={
            part: 1000
            * median([getattr(t, part) if part != "compute_s" else max(t.compute_s.values()) for t in timings])
            for part in ("compute_s", "comm_s", "wait_s", "sync_overhead_s")
        },
        split=[w["batch"] for w in workers],
        emulated={w["name"]: f"slowed {w['slowdown']:g}x" for w in workers if w.get("slowdown", 1.0) > 1.0},
    )
