"""Whole runs: records, tables, plots and the verdict land; repeats, reuse of processes, interrupts."""

import json
import logging
import statistics

import numpy as np
import pytest
import torch

from helpers import UNEQUAL, sets, small_config
from hetbench import race, row_run
from hetbench.cluster.ray_connection import RayConnection
from hetbench.errors import RunFailed
from hetbench.results.rows import step_summary
from hetbench.runner import run
from hetbench.step_timing import CentralUpdate, StepTiming
from hetbench.strategies import registry
from hetbench.strategies.parameter_server import ParameterServer
from hetbench.training import Schedule, train_repeat


def test_a_tiny_run_writes_records_tables_plots_and_a_verdict(cli, tmp_path, shared_cluster):
    # ray-ps-async here: the one registered strategy without a barrier, so no equivalence test covers it
    settings = ["strategies=[single, ray-ps-async]", "steps=6", "warmup_steps=1", "repeats=2", "eval_every=3"]
    settings += ["standalone_steps=2", "floor.iterations=3", "ray-ps-async.max_staleness=1", "download=false"]
    settings += ["test_samples=300", "eval_samples=300", "fine_eval_every=0", *shared_cluster.overrides]
    result = cli("run", "-c", "benchmarks/configs/quick.yaml", *sets(*settings), "--results-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    (raw,) = (tmp_path / "raw").glob("*-quick-*.json")
    # the floors first: measured at the start, where the plan's measurement is made
    floor, ps_floor, single, ps_async = json.loads(raw.read_text())
    assert [r["status"] for r in (single, ps_async, floor, ps_floor)] == ["ok"] * 4
    assert (single["strategy"], ps_async["strategy"], floor["strategy"]) == ("single", "ray-ps-async", "gloo-floor")
    assert len(ps_async["repeat_samples_per_s"]) == 2 and ps_async["samples_per_s"] > 0
    # in passes, the second in reverse order: neither row always last (on a machine that heats, the hottest)
    assert (single["run_order"], ps_async["run_order"]) == ([1, 2], [2, 1])
    startups = ps_async["repeat_startup_s"]  # the row's strategy starts for each pass
    assert len(startups) == 2 and ps_async["startup_s"] == statistics.median(startups)
    # every worker's gradients were applied, none staler than the bound (a worker's own update in between)
    staleness = ps_async["staleness"]
    assert sum(staleness["histogram"].values()) >= 2 * 6 and staleness["max"] <= 2
    # checked every eval_every steps (fine checks near the target off: a lucky repeat would add some)
    assert [p["step"] for p in ps_async["accuracy_curve"]][:2] == [3, 6]
    # its overhead: the workers' own wait for fresh weights after each batch, never the step's leftover
    assert 0 < ps_async["step"]["sync_overhead_s"] < ps_async["step"]["total_s"]
    assert [w["transport"] for w in ps_async["workers"]] == ["direct tcp"] * 2  # each worker's own channel
    assert floor["allreduce_s"] > 0 and floor["bytes"] == 1_199_882 * 4
    assert floor["path"]["interfaces"] == [shared_cluster.interface] * 2  # each end's gloo, toward the other
    # the parameter server's floor: the same buffer up and back down between the same two processes
    assert ps_floor["strategy"] == "ps-floor" and ps_floor["roundtrip_s"] > 0 and ps_floor["path"] == floor["path"]
    assert ps_async["floor"] == "ps-floor" and "| ps-floor" in result.stdout
    assert result.stdout.startswith("Verdict: ") and "| ray-ps-async" in result.stdout
    md = (tmp_path / "quick.md").read_text()
    assert md.count("Verdict: ") == 1 and "| single" in md and "| gloo-floor" in md
    assert (tmp_path / "quick.csv").read_text().startswith("strategy,")
    for plot in ("throughput", "step", "accuracy"):
        assert (tmp_path / f"quick-{plot}.png").read_bytes()[:4] == b"\x89PNG"
    assert f"records: {raw}" in result.stderr


def test_repeats_give_median_and_spread(tmp_path, shared_cluster):
    cfg = small_config(
        tmp_path,
        *shared_cluster.overrides,
        "strategies=[single]",
        "steps=3",
        "warmup_steps=1",
        "repeats=3",
        "floor.enabled=false",
        "eval_every=100",
    )
    (record,) = json.loads(run(cfg).path.read_text())
    rates = record["repeat_samples_per_s"]
    assert len(rates) == 3 and record["samples_per_s"] == statistics.median(rates)
    assert record["samples_per_s_cv"] == pytest.approx(statistics.stdev(rates) / statistics.mean(rates))


@pytest.mark.slow
def test_one_ray_and_its_worker_processes_serve_the_whole_run(tmp_path, monkeypatch):
    import ray

    opened, alive_at_row_start = [], []
    open_ray = RayConnection.__init__
    monkeypatch.setattr(RayConnection, "__init__", lambda self, *a: opened.append(a) or open_ray(self, *a))
    run_pass = row_run.run_repeat

    def counting_actors(*args, **kwargs):
        alive = ray._private.state.actors(actor_state_name="ALIVE")
        # not Ray's own named singletons (Ray Train's AutoscalingCoordinator, one for the cluster)
        alive_at_row_start.append({actor for actor, info in alive.items() if not info["Name"]})
        return run_pass(*args, **kwargs)

    monkeypatch.setattr(row_run, "run_repeat", counting_actors)
    cfg = small_config(
        tmp_path,
        "strategies=[single, ray-ps, ray-train]",
        "workers=[{name: a}, {name: b}]",
        "steps=2",
        "warmup_steps=1",
        "repeats=2",
        "standalone_steps=2",
        "floor.iterations=3",
    )
    records = json.loads(run(cfg).path.read_text())
    assert [r["status"] for r in records] == ["ok"] * 5  # 3 rows and the 2 floors
    assert len(opened) == 1  # not one per row (3, and the floors) or repeat, nor for the standalone timings
    # every row's every pass starts with the run's processes alone: a worker each and a coordinator,
    # none left by the last row
    assert len(alive_at_row_start[0]) == 3 and alive_at_row_start == [alive_at_row_start[0]] * 6
    # single's worker runs in one of ray-ps's processes, a fresh role in it (the two workers share
    # a node here, so which of the node's processes serves which worker is the pool's choice)
    single, ray_ps = (next(r for r in records if r["strategy"] == name) for name in ("single", "ray-ps"))
    assert single["workers"][0]["pid"] in {w["pid"] for w in ray_ps["workers"]}
    assert single["ray_startup_s"] > 0 and not ray.is_initialized()


@pytest.mark.slow
def test_speed_steps_time_the_repeats_after_the_evaluated_ones_and_checks_go_fine_near_the_target(
    tmp_path, shared_cluster
):
    # ray-train's ranks run the Schedule themselves: they must check the same steps as the runner
    # (the driver refuses a check without fresh weights), fine ones included
    cfg = small_config(
        tmp_path,
        *shared_cluster.overrides,
        "name=speed",
        "strategies=[single, ray-train]",
        "workers=[{name: a}, {name: b}]",
        "steps=4",
        "speed_steps=2",
        "evaluated_repeats=2",
        "warmup_steps=1",
        "repeats=3",
        "eval_every=3",
        "fine_eval_every=2",
        "target_accuracy=1.0",  # never reached,
        "fine_eval_within=1.0",  # and near it from the first check on
        "floor.enabled=false",
    )
    records = json.loads(run(cfg).path.read_text())
    for record in records:
        assert record["status"] == "ok" and record["repeat_timed_steps"] == [4, 4, 2]
        assert record["evaluated_repeats"] == 2 and record["final_accuracy"] is not None
        # every 3 steps, then every 2 from the first check, and at the end
        assert [p["step"] for p in record["accuracy_curve"]] == [3, 4, 5]
    assert "speed_steps timed the others only" in (tmp_path / "results" / "speed.md").read_text()


def test_unavailable_strategy_is_skipped_not_crashed(tmp_path, monkeypatch, caplog, shared_cluster):
    caplog.set_level(logging.INFO, logger="hetbench")
    monkeypatch.setitem(registry.STRATEGIES, "ray-ps", "hetbench.strategies.not_written_yet:Nothing")
    cfg = small_config(
        tmp_path,
        "strategies=[ray-ps, single]",
        "steps=2",
        "repeats=1",
        "floor.enabled=false",
        *shared_cluster.overrides,
    )
    records = json.loads(run(cfg).path.read_text())
    assert [r["status"] for r in records] == ["skipped", "ok"]
    assert "not implemented yet" in records[0]["reason"]
    assert "skipped ray-ps" in caplog.text


def test_a_row_that_raises_anything_is_one_failed_row_and_the_rows_after_it_run(tmp_path, monkeypatch, shared_cluster):
    import sys

    from hetbench.errors import RunFailed

    # Ray Train not importable (as where ray[train] is not installed): ray-train's start() raises ImportError
    monkeypatch.setitem(sys.modules, "ray.train", None)
    strategies = "strategies=[single, ray-train, ray-ps]"
    cfg = small_config(tmp_path, strategies, "steps=2", "repeats=1", "floor.enabled=false", *shared_cluster.overrides)
    with pytest.raises(RunFailed, match=r"^ray-train raised ModuleNotFoundError: import of ray.train halted"):
        run(cfg)  # the tables printed, then the exit status says a row failed
    records = json.loads(next((tmp_path / "results" / "raw").glob("*.json")).read_text())
    statuses = [(r["strategy"], r["status"]) for r in records]
    assert statuses == [("single", "ok"), ("ray-train", "failed"), ("ray-ps", "ok")]
    assert records[1]["reason"].startswith("ray-train raised ModuleNotFoundError: ")
    assert "\n" not in records[1]["reason"]  # one line in the table


def test_a_sigterm_python_swallowed_still_stops_the_run_at_the_next_step(tmp_path, monkeypatch, capsys, shared_cluster):
    import gc
    import signal
    import sys

    from hetbench.cli import _unraisable
    from hetbench.errors import INTERRUPTED, interrupt

    class Finalized:  # a signal landing in a finalizer: Python prints "Exception ignored" and goes on
        def __del__(self):
            interrupt(signal.SIGTERM, None)

    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", swallowed.append)
    Finalized()
    gc.collect()
    assert swallowed[0].exc_type is KeyboardInterrupt
    _unraisable(swallowed[0])  # hetbench's hook: the swallowed interrupt prints no traceback
    assert capsys.readouterr().err == ""
    try:
        with pytest.raises(KeyboardInterrupt):
            joins = shared_cluster.overrides
            run(small_config(tmp_path, "strategies=[single]", "floor.enabled=false", *joins))
    finally:
        INTERRUPTED.clear()
    _unraisable(swallowed[0])  # with no interrupt pending, an unraisable error is still shown
    assert "KeyboardInterrupt" in capsys.readouterr().err


def test_a_strategy_exchanging_every_few_steps_is_summed_up_by_a_rounds_mean_step():
    quiet, exchange = StepTiming({"w": 0.1}, 0.0, 0.0, 0.1), StepTiming({"w": 0.1}, 0.3, 0.0, 0.4)
    round_of_four = [quiet, quiet, quiet, exchange]
    assert step_summary(round_of_four).sync_overhead_s == 0  # the median step exchanges nothing
    summary = step_summary(round_of_four, exchange_every=4)
    assert summary.sync_overhead_s == pytest.approx(0.075) and summary.total_s == pytest.approx(0.175)


def test_without_a_barrier_the_overhead_is_the_workers_own_wait_for_fresh_weights():
    # the slow worker finished no batch this step: step time minus the slowest compute would read 0
    step = StepTiming({"fast": 0.006, "slow": 0.0}, comm_s=0.0, wait_s=0.001, total_s=0.006, overhead_s=0.004)
    assert step.sync_overhead_s == 0.004 and step_summary([step] * 3).sync_overhead_s == pytest.approx(0.004)
    barrier = StepTiming({"fast": 0.006, "slow": 0.009}, comm_s=0.002, wait_s=0.003, total_s=0.011)
    assert barrier.sync_overhead_s == pytest.approx(0.002)


def test_a_servers_optimizer_step_is_work_single_does_too_not_overhead(tmp_path):
    server, threads = ParameterServer(), torch.get_num_threads()
    try:
        weights = server.reset(small_config(tmp_path), seed=0)
        _, update = server.apply([1.0], np.full_like(weights, 0.01))
    finally:
        torch.set_num_threads(threads)  # (the server takes every core, as in its own process)
    assert 0 < update.optimizer_s < update.seconds  # timed within the update, beside the combining
    step = StepTiming.synchronous({"fast": 0.006, "slow": 0.009}, 0.020, CentralUpdate(0.004, 0.003))
    assert step.comm_s == pytest.approx(0.011)  # the update is still part of the step's comm
    assert step.sync_overhead_s == pytest.approx(0.008)  # less the optimizer step single's step takes too
    assert step_summary([step] * 3).optimizer_s == pytest.approx(0.003)


def test_the_last_step_of_an_unevaluated_repeat_starts_nothing_ahead(tmp_path):
    # a step started past the end waited for weights that never came and held the next repeat's reset
    from hetbench.progress import Progress
    from hetbench.strategies.base import Strategy

    class Recorder(Strategy):
        name = "recorder"

        def start(self) -> None: ...
        def reset(self, seed: int) -> None: ...
        def weights(self): ...
        def worker_info(self) -> list[dict]:
            return []

        def step(self, step: int, then: int | None = None) -> StepTiming:
            self.thens.append(then)
            return StepTiming({"w": 0.01}, comm_s=0.0, wait_s=0.0, total_s=0.01)

    cfg = small_config(tmp_path, "steps=3", "warmup_steps=1")
    strategy = Recorder(cfg.job())
    strategy.thens = []
    with Progress("recorder", 4, 1) as bar:
        schedule, batch = Schedule.of(cfg.run), cfg.run.batch_size
        train_repeat(strategy, schedule, repeat=0, evaluate=None, bar=bar, seed=0, samples_per_step=batch)
    assert strategy.thens == [1, 2, 3, None]


def test_a_ps_floor_that_cannot_connect_fails_alone_and_the_gloo_floor_stands(tmp_path, shared_cluster, monkeypatch):
    from hetbench import floor

    reason = "gloo-floor failed while measuring the ps-floor: cannot reach 192.0.2.1:6386 (docs/deployment.md: Ports)"

    def unreachable(*_):
        raise RunFailed(reason)

    monkeypatch.setattr(floor, "measure_roundtrips", unreachable)
    cfg = small_config(tmp_path, UNEQUAL, "floor.iterations=3", *shared_cluster.overrides)
    gloo, ps = race.run_floors(cfg, env={}, parameters=1_199_882)
    assert (gloo.strategy, gloo.status) == ("gloo-floor", "ok") and gloo.seconds > 0
    assert (ps.strategy, ps.status, ps.reason) == ("ps-floor", "failed", reason)
    assert ps.seconds is None and ps.path == gloo.path
