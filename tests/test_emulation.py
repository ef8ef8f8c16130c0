"""An emulated slower device (`slowdown`): slowed for its own work, not for the box's crowding."""

import os
import re
import subprocess
import sys
import time

import pytest
import torch

from hetbench import clock
from hetbench.clock import Stopwatch, cpu_wait
from hetbench.config import WorkerConfig
from hetbench.strategies import replica


def replica_slowed(factor: float) -> replica.Replica:
    worker = replica.Replica()
    worker.spec, worker.device = WorkerConfig(slowdown=factor), torch.device("cpu")
    worker.watch = Stopwatch(worker.device, factor)
    return worker


def worked(factor: float, device_work) -> float:
    """`device_work`'s seconds on a worker slowed `factor` times, as its stopwatch reads them."""
    return worked_and_waited(factor, device_work)[0]


def worked_and_waited(factor: float, device_work) -> tuple[float, float]:
    """(seconds as the stopwatch reads them, seconds the work call took): the host's clock around the
    call alone, so that building the worker on a loaded box (CI's ran it 0.36 s late) is in neither."""
    worker = replica_slowed(factor)
    started = time.perf_counter()
    worker.work(device_work)
    waited = time.perf_counter() - started
    return worker.watch.read().work_s, waited


def test_an_emulated_worker_waits_slowdown_minus_one_times_its_work(monkeypatch):
    monkeypatch.setattr(clock, "cpu_wait", lambda: 0.0)  # a late wake-up on a loaded box is no CPU wait here
    seconds, waited = worked_and_waited(3.0, lambda: time.sleep(0.1))
    assert seconds == pytest.approx(0.3, abs=0.05)
    # it really waited: not less than it reports (a loaded box may add its own delay, never remove one)
    assert seconds - 0.01 <= waited <= seconds + 0.15


def test_time_spent_waiting_for_a_cpu_comes_out_of_the_emulated_wait(monkeypatch):
    waits = iter([0.0, 0.04])  # the thread waited 40 ms of the work's 100 for a CPU held elsewhere
    monkeypatch.setattr(clock, "cpu_wait", lambda: next(waits))
    seconds = worked(3.0, lambda: time.sleep(0.1))
    assert seconds == pytest.approx(3 * 0.06, abs=0.03)  # 3x its own 60 ms: a machine of its own waits for no CPU


def test_crowding_longer_than_the_emulated_wait_still_shows(monkeypatch):
    waits = iter([0.0, 0.09])  # 90 ms of the 100 waiting for a CPU: 3x its own 10 ms is past already
    monkeypatch.setattr(clock, "cpu_wait", lambda: next(waits))
    seconds, waited = worked_and_waited(3.0, lambda: time.sleep(0.1))
    assert seconds == pytest.approx(0.1, abs=0.03)
    assert waited < 0.15  # no wait added


def test_an_emulated_wait_counts_as_long_as_it_took(monkeypatch):
    # no CPU wait: on a loaded box (CI's) the spin's real one came out of the wait and read 0.31
    monkeypatch.setattr(clock, "cpu_wait", lambda: 0.0)
    sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: sleep(s + 0.05))  # a busy box wakes the worker late
    seconds, waited = worked_and_waited(3.0, lambda: spin(0.1))
    assert seconds == pytest.approx(0.35, abs=0.03)  # its work, the 0.2 s asked for and the 0.05 overrun
    assert seconds - 0.01 <= waited <= seconds + 0.15  # as test_an_emulated_worker_waits...: never shorter


def test_a_worker_not_slowed_takes_its_own_time():
    assert worked(1.0, lambda: time.sleep(0.05)) == pytest.approx(0.05, abs=0.02)


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="schedstat is Linux's")
def test_cpu_wait_counts_time_runnable_behind_other_processes():
    original = os.sched_getaffinity(0)
    cpu = min(original)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        os.sched_setaffinity(0, {cpu})  # this thread and both hogs on one CPU: one of us always waits
        for hog in hogs:
            os.sched_setaffinity(hog.pid, {cpu})
        before = cpu_wait()
        spin(0.5)
        assert cpu_wait() - before > 0.1
    finally:
        os.sched_setaffinity(0, original)
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)


def test_a_streamed_step_hands_off_each_gradient_as_backward_has_it_after_its_share_of_the_delay():
    from hetbench.gradients import FlatModel

    replica = replica_slowed(3.0)
    replica.flat = FlatModel(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)))
    started, sent = time.perf_counter(), []

    def compute_gradient(step):
        time.sleep(0.1)  # the forward pass's work: its delay comes before the first hand-off
        replica.flat.zero_grad()
        replica.flat.model(torch.ones(5, 3)).sum().backward()

    def send(offset, gradient):
        sent.append((offset, gradient.clone(), time.perf_counter() - started))
        time.sleep(0.05)  # sending is not the device's work: neither counted nor slowed

    replica.compute_gradient = compute_gradient
    replica.streamed_step(0, send)
    seconds = replica.watch.read().work_s
    offsets = [offset for _, offset, _ in replica.flat.spans]
    assert [offset for offset, _, _ in sent] == offsets[::-1]  # the last layer's gradients first
    # 0.1 s of work slowed 3x, the first hand-off after the forward pass's share of the delay; above it,
    # what a busy host adds: a thread woken from each hand-off's sleep may wait ~20 ms for its CPU, and
    # that is measured (and slowed) as work too
    assert 0.28 <= sent[0][2] < 0.6
    assert 0.28 <= seconds < 0.75
    for offset, gradient, _ in sent:  # each as backward left it in the flat buffer
        assert torch.equal(gradient, replica.flat.grads[offset : offset + gradient.numel()])


def test_a_ramping_slowdown_grows_from_its_start_to_its_end_over_its_seconds(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(clock.time, "time", lambda: now[0])
    watch = Stopwatch(torch.device("cpu"), 1.0, ramp=(3.0, 10.0, 1000.0))
    assert watch.slowed and watch.slowdown == 1.0  # a factor that will grow: timed as an emulation from the start
    now[0] = 1005.0
    assert watch.slowdown == 2.0
    watch.start()
    time.sleep(0.05)
    watch.stop()
    assert watch.read().work_s == pytest.approx(0.1, abs=0.03)  # twice its own time, halfway up the ramp
    now[0] = 1100.0
    assert watch.slowdown == 3.0  # and stays at its end


@pytest.mark.slow
def test_a_worker_that_slows_as_it_heats_is_followed_by_the_split_and_its_row_flagged(tmp_path, shared_cluster):
    import json

    from helpers import small_config
    from hetbench.runner import run

    cfg = small_config(
        tmp_path,
        *shared_cluster.overrides,
        "name=heating",
        # the baseline last, and a steep ramp that a long row spans much of: the mac's slowdown is
        # (1 + k(b + d)) / (1 + kb) across a row of d seconds that starts b seconds into the ramp, so
        # a slow start (b: 18 s here, longer on a loaded box) is outweighed by a long row; CI saw an
        # 80-step row (d ~ 15 s) time the mac only 15% slower while its box sped up 22%
        "strategies=[ray-ps, single]",
        "balance=[auto]",
        "batch_size=64",
        "workers=[{name: desk}, {name: mac, slowdown_to: 30.0, ramp_s: 150}]",  # as fast as desk at first
        "rebalance_every=4",
        "steps=240",
        "warmup_steps=2",
        "standalone_steps=6",
        "repeats=1",
        "eval_every=120",
        "floor.enabled=false",
    )
    row, single = json.loads(run(cfg).path.read_text())
    assert row["status"] == "ok" and row["config"]["workers"][1]["ramp_start"] > 0  # the run's start, recorded
    splits = [e["rebalanced"]["mac"] for e in row["events"] if "rebalanced" in e]
    assert len(splits) >= 2 and splits[-1] < splits[0]  # the split follows the mac down as it slows
    drift = row["standalone_timings"]["mac"]
    assert max(drift["after"]) < min(drift["before"]), (drift, splits)  # timed alone after the row: slower
    table = (tmp_path / "results" / "heating.md").read_text()
    # the mac flagged, whatever this box's own drift did to the desk meanwhile ("desk slowed 15% and ...")
    flagged = re.search(r"\(flagged: ([^)]*) during this row\)", table)
    assert flagged and "mac slowed" in flagged[1], (drift, splits, table)
    assert re.search(r"\| ok \((desk [+-]\d+%, )?mac -\d+%\)", table), table
