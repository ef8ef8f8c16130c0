"""What the tests share: small configs, fake MNIST files, the CLI as a user runs it, and the checks
every registered strategy must pass (tests iterate over the registry, so a new strategy is covered
by adding it there)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from hetbench.config import Config, load_config
from hetbench.strategies import registry

REPO = Path(__file__).resolve().parents[1]
# The real MNIST test set: where HETBENCH_DATA_DIR points, else beside the checkout (CI's layout).
REFERENCE = REPO / "results" / "reference"  # the shipped results; a run writes to results/ beside it


def committed(folder: Path, pattern: str) -> list[Path]:
    """The files git tracks in `folder` that match `pattern`: what was shipped, not what a run left."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", str(folder.relative_to(REPO))], cwd=REPO, capture_output=True, timeout=60
    )
    assert listed.returncode == 0, f"tests read the shipped results through git: {listed.stderr.decode()}"
    paths = [REPO / p for p in listed.stdout.decode().split("\0") if p]
    return sorted(p for p in paths if p.parent == folder and p.match(pattern))


SHARED_MNIST = Path(os.environ.get("HETBENCH_DATA_DIR") or REPO.parent / "shared" / "data" / "mnist")
# A process can be held to some of this machine's cores: CPU affinity, taskset, and more than one core.
CAN_PIN = bool(shutil.which("taskset") and hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1)


def made(strategy_cls, cfg: Config):
    """The strategy as the runner makes it for a row of `cfg`: given its Job."""
    return strategy_cls(cfg.job(strategy_cls.name))


def placed_workers(strategy_cls, cfg: Config, where: str) -> dict:
    """Worker name -> `where` (node_id, dask_worker) as the strategy placed it; the strategy is closed."""
    strategy = made(strategy_cls, cfg)
    try:
        strategy.start()
        return {w["name"]: w[where] for w in strategy.worker_info()}
    finally:
        strategy.close()


def sets(*settings: str) -> list[str]:
    """Command-line arguments that set each `key=value`: --set key=value ..."""
    return [arg for setting in settings for arg in ("--set", setting)]


# A few steps, one repeat, no standalone timings, no download, no floor (the last, so TINY[:-2] keeps
# it): a run's settings for tests of anything but its figures.
TINY = sets("steps=2", "warmup_steps=0", "repeats=1", "standalone_steps=0", "download=false", "floor.enabled=false")

LABELLED = "workers=[{name: d, node: desktop, batch: 16}, {name: m, node: mac, batch: 8}]"


def small_config(tmp_path: Path, *overrides: str) -> Config:
    """A resolved config that downloads nothing and writes under tmp_path. Accuracy on 500 real test
    images (one image is 0.002): evaluation is most of a short run's time (~0.5 s per 1,000 images here).
    No standalone timings (~18 s a run: each worker alone, at the start and the end) unless a test
    sets standalone_steps: balance auto, scaling efficiency and the reference worker need them."""
    base = ["download=false", "test_samples=500", "eval_samples=500", "standalone_steps=0"]
    return load_config(None, [*base, f"results_dir={tmp_path / 'results'}", *overrides], registry.declared())


def cnn(dropout: float = 0.25):
    """The built-in mnist-cnn workload at `dropout`, as every strategy loads it."""
    from hetbench.config import RunConfig
    from hetbench.workload import load_workload

    return load_workload(RunConfig(dropout=dropout))


def build_model(dropout: float, seed: int) -> torch.nn.Module:
    return cnn(dropout).build_model(seed)


def forward_backward(model, inputs, labels, keys=None) -> torch.Tensor:
    return cnn().forward_backward(model, inputs, labels, keys)


def write_idx(path: Path, array: np.ndarray, magic: int | None = None, gz: bool = False) -> Path:
    """An IDX file as published: big-endian magic, dimensions, then unsigned bytes."""
    magic = magic if magic is not None else (2051 if array.ndim == 3 else 2049)
    raw = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def fake_split(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def run_killing_a_worker(tmp_path: Path, monkeypatch, capsys, strategy_cls, kill, name: str, then: str):
    """Run `single`, `name`, whose step 3 starts by `kill(strategy)`, and `then`; returns the failure
    the run ended with, its records and what it printed."""
    from hetbench.errors import RunFailed
    from hetbench.runner import run

    step = strategy_cls.step

    def step_then_kill(self, n, then=None):
        if n == 3:
            kill(self)
        return step(self, n, then)

    monkeypatch.setattr(strategy_cls, "step", step_then_kill)
    cfg = small_config(
        tmp_path,
        "name=killed",
        f"strategies=[single, {name}, {then}]",
        "workers=[{name: big, batch: 40}, {name: small, batch: 24}]",
        "steps=6",
        "repeats=1",
        "floor.enabled=false",
    )
    with pytest.raises(RunFailed) as failure:
        run(cfg)
    records = json.loads(next((tmp_path / "results" / "raw").glob("*-killed-*.json")).read_text())
    return str(failure.value), records, capsys.readouterr().out


UNEQUAL = "workers=[{name: big, batch: 40}, {name: small, batch: 24}]"


def weights_after(name: str, cfg, steps: int):
    """Strategy `name`'s weights after `steps` steps from the seed, and its workers' info."""
    strategy = made(registry.load(name), cfg)
    try:
        strategy.start()
        strategy.reset(cfg.run.seed)
        for step in range(steps):
            strategy.step(step)
        return strategy.weights(), strategy.worker_info()
    finally:
        strategy.close()


def first_update(strategy_cls, cfg) -> torch.Tensor:
    strategy = made(strategy_cls, cfg)
    try:
        strategy.start()
        strategy.reset(cfg.run.seed)
        strategy.step(0)
        return strategy.weights()
    finally:
        strategy.close()


@dataclass
class CliResult:
    """What a `hetbench` command left: as subprocess.run's result, in the tests' in-process calls too."""

    returncode: int
    stdout: str
    stderr: str


def hetbench(*args, env=None, timeout=120, cwd=REPO):
    """The console script a user types, in its own process (the `cli` fixture runs it in this one)."""
    return run_child([str(Path(sys.executable).with_name("hetbench")), *args], env, timeout, cwd)


def run_child(
    argv: list[str], env: dict | None = None, timeout: float = 120, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """subprocess.run's capture, but a child cut short (its timeout, or this session ending: conftest
    makes SIGTERM unwind as Ctrl-C) is stopped by `stop_child`, so it can stop what it started."""
    env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_child(proc)
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def live_processes():
    """(PID, argv, /proc directory) of each live process; one that ends while it is read is skipped."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        yield int(cmdline.parent.name), argv, cmdline.parent


def processes_mentioning(*needles: str) -> dict[int, str]:
    """Live processes whose command lines name any of `needles` (cluster addresses, temp dirs): PID ->
    its state, parent and command line, so a failing check shows what was left and who holds it."""
    found = {}
    for pid, argv, proc in live_processes():
        text = b" ".join(argv).decode(errors="replace")
        if pid == os.getpid() or not any(n in text for n in needles):
            continue
        try:
            status = dict(line.split(":\t", 1) for line in (proc / "status").read_text().splitlines())
        except (OSError, ValueError):
            continue
        found[pid] = f"{status['State']}, parent {status['PPid']}: {text[:300]}"
    return found


def stop_child(proc: subprocess.Popen, grace_s: float = 60) -> None:
    """A child cut short: SIGTERM first, so a `hetbench run` stops the cluster it started (SIGKILL
    alone, as subprocess.run sends, leaves its nodes running), then killed if still there."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def assert_one_line_error(result, pattern):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("notice:")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hetbench: error: ") and "Traceback" not in result.stderr
    assert pattern in lines[0], lines[0]


def registered(wanted) -> list[str]:
    """The registered strategies whose class `wanted(cls)` accepts: tests iterate over these."""
    from hetbench.strategies import registry

    return [name for name in registry.STRATEGIES if wanted(registry.load(name))]


def check_first_update_is_the_union_batch_step(tmp_path: Path, name: str, shared=None, *settings: str) -> None:
    """With dropout on (its masks keyed by sample) and unequal batches (40 + 24), the first
    synchronous update equals one single-device step on the union batch; close() leaves no Ray
    running or, on the session's `shared` cluster, nothing but the kept worker processes.
    `settings`: more config settings (another workload, say)."""
    import ray

    from hetbench.strategies import registry

    joins = shared.overrides if shared else []
    cfg = small_config(tmp_path, UNEQUAL, "eval_every=1", "steps=1", "warmup_steps=0", "repeats=1", *joins, *settings)
    expected = first_update(registry.load(registry.BASELINE), cfg)
    got = first_update(registry.load(name), cfg)
    if shared:
        left = leftover_actors(shared.keeper)
        assert left == [], left
    else:
        assert not ray.is_initialized()
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()


def leftover_actors(keeper, settle_s: float = 10.0) -> list[str]:
    """Live Ray actors beyond the idle worker processes `keeper`'s connection holds (class names),
    after up to `settle_s` for those whose owner ended (Ray Train's) to go. Detached actors are
    Ray's own singletons (Ray Data's AutoscalingCoordinator): hetbench starts none. None where
    the kept Ray was shut down: a driver's actors end with it."""
    import ray

    if not ray.is_initialized():
        return []
    idle = {host._actor_id.hex() for hosts in keeper.connection.hosts.idle.values() for host in hosts}
    deadline = time.monotonic() + settle_s
    while True:
        alive = ray._private.state.actors(actor_state_name="ALIVE").items()
        left = sorted(a["ActorClassName"] for i, a in alive if i not in idle and not a["IsDetached"])
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def check_a_killed_worker_is_survived(tmp_path: Path, name: str) -> dict:
    """`single`, then `name` losing worker 'small' for real at step 4 (dropout 0): the run goes on, the
    loss is recorded, and every step before and after it is one step on the same union batch, so
    the run follows the single-device trajectory. Returns the strategy's record."""
    from hetbench.runner import run

    cfg = small_config(
        tmp_path,
        f"strategies=[single, {name}]",
        UNEQUAL,
        "dropout=0",
        "steps=12",
        "faults=[{at_step: 4, kill: worker, target: small}]",
        "warmup_steps=1",
        "eval_every=3",
        "fine_eval_every=0",  # checked at the same steps as single's, whatever the accuracy
        "floor.enabled=false",
        "repeats=1",
        "checkpoint_every=3",
        "cluster.step_timeout_s=120",  # a stuck step or restart fails the row with its reason, inside pytest's bound
    )
    single, faulted = json.loads(run(cfg).path.read_text())
    assert faulted["status"] == "ok", faulted.get("reason")
    injected, went_on = faulted["events"][:2]
    # each event with the repeat it happened in: the first, where faults are injected
    assert injected == {"step": 4, "injected": "kill worker small", "repeat": 0} and went_on["step_s"] > 0
    if "lost" in went_on:  # the survivor went on at once, with the lost worker's samples
        lost = {"step": 4, "lost": "small", "node": None, "split": {"big": 64}, "repeat": 0}
        assert went_on == {**lost, "step_s": went_on["step_s"]}
        workers = {w["name"]: w for w in faulted["workers"]}
        assert workers["small"]["lost_at_step"] == 4 and workers["big"]["batch"] == 64
    else:  # the group restarted from the last state it kept (every checkpoint_every steps; its ranks
        # may have run ahead of the driver up to the next evaluation when the worker died)
        assert went_on["restarts"] == 1 and went_on["restarted_from_step"] in (3, 6, 9)
    # accuracy on 500 images: one image is 0.002
    for a, b in zip(single["accuracy_curve"], faulted["accuracy_curve"], strict=True):
        assert a["step"] == b["step"] and a["accuracy"] == pytest.approx(b["accuracy"], abs=0.0021)
    assert faulted["final_accuracy"] == pytest.approx(single["final_accuracy"], abs=0.001)
    return faulted


def stop_a_run(
    results: Path, args: list[str], ready, within_s: float = 240, signum: int = signal.SIGTERM
) -> tuple[int, str]:
    """`hetbench run ARGS` in its own session, sent `signum` once `ready()` holds (bounded by
    `within_s`): SIGINT to its whole process group, as a terminal's Ctrl-C reaches every process the
    run started; SIGTERM to the run alone. Its exit code and stderr. Killed, not left, on every path."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetbench", "run", *args, "--results-dir", str(results)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline and not ready():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.2)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        stop_child(proc)
    return proc.returncode, err


def typed(records: list[dict]) -> list:
    """Hand-built records, JSON objects as a record file holds them, as the results read them."""
    from hetbench.results.record import from_json

    return [from_json(r) for r in records]
