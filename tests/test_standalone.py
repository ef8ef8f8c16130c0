"""The workers timed alone around each row they judge: when, in which order, and what the row keeps."""

from dataclasses import replace

import pytest

from helpers import small_config
from hetbench import standalone
from hetbench.results.record import from_json
from hetbench.results.report import alone
from hetbench.results.rows import bracketed
from hetbench.strategies.replica import Replica


@pytest.fixture
def timed(monkeypatch):
    """measure_standalone's orders, in call order; each timing returns the call's number as both speeds."""
    orders: list[list[int]] = []

    def measure(job, order=None):
        orders.append(order)
        return {"a": [100.0 * len(orders)], "b": [10.0 * len(orders)]}

    monkeypatch.setattr(standalone, "measure_standalone", measure)
    return orders


def test_rows_run_back_to_back_share_the_timing_between_them_and_others_are_timed_anew(tmp_path, timed):
    brackets = standalone.Brackets(small_config(tmp_path, "workers=[{name: a}, {name: b}]").job(), enabled=True)
    assert brackets.before(judges=False) is False and timed == []  # the baseline: nobody timed
    assert brackets.before(judges=True) and len(timed) == 1  # the first judged row: timed before it
    assert brackets.after() == ({"a": [100.0], "b": [10.0]}, {"a": [200.0], "b": [20.0]})
    assert brackets.before(judges=True) and len(timed) == 2  # the next row: that timing serves as its before
    assert brackets.after()[0] == {"a": [200.0], "b": [20.0]}
    brackets.before(judges=True)  # a row that failed: no after, so the next is timed anew
    assert brackets.before(judges=True) and len(timed) == 4
    # each timing runs the other way round from the one before: the two around a row mirror each other
    assert timed == [[0, 1], [1, 0], [0, 1], [1, 0]]


def test_no_timings_where_the_run_wants_none(tmp_path, timed):
    brackets = standalone.Brackets(small_config(tmp_path).job(), enabled=False)
    assert brackets.before(judges=True) is False and timed == []


def test_a_row_is_judged_by_its_own_bracket_and_the_table_shows_each_timing_once():
    workers = [{"name": "a", "batch": 48}, {"name": "b", "batch": 16}]
    first = {"strategy": "ray-ps", "samples_per_s": 110.0, "workers": [dict(w) for w in workers]}
    second = {"strategy": "dask-sync", "samples_per_s": 99.0, "workers": [dict(w) for w in workers]}
    row = from_json(first)
    first = bracketed(row, {"a": [100.0], "b": [10.0]}, {"a": [120.0], "b": [20.0]})
    second = bracketed(from_json(second), {"a": [120.0], "b": [20.0]}, {"a": [80.0], "b": [10.0]})
    assert row == from_json({"strategy": "ray-ps", "samples_per_s": 110.0, "workers": workers})  # unchanged
    assert [w.standalone_samples_per_s for w in first.workers] == [110.0, 15.0]
    assert first.scaling_efficiency == pytest.approx(110.0 / 125.0)
    assert second.scaling_efficiency == pytest.approx(99.0 / 115.0)
    assert cells(alone([first, second])) == [
        ["timed", "a", "b"],
        ["before ray-ps", "100", "10"],
        ["after ray-ps", "120", "20"],
        ["after dask-sync", "80", "10"],
    ]


def test_records_from_before_the_brackets_show_the_runs_start_and_end():
    kept = {"strategy": "ray-ps", "standalone_timings": {"a": {"start": [100.0, 102.0], "end": [90.0, 91.0]}}}
    assert cells(alone([from_json(kept)]))[1:] == [["the run's start", "100/102"], ["the run's end", "90/91"]]


def cells(table: str) -> list[list[str]]:
    """A Markdown table's cells, line by line, its rule left out."""
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


class InProcess:
    """A placement whose workers are Replicas in this process: each call runs as it is started, and
    every call and every read of results is logged in order."""

    def __init__(self, cluster, workers, role, name, job) -> None:
        self.replicas = [Replica() for _ in workers]
        for rank, worker in enumerate(self.replicas):
            worker.setup(job, rank, len(workers))
        self.log: list[tuple] = []
        self.stepped: list[tuple[int, float]] = []  # (rank, seconds) of each alone_step
        self.closed = False

    def call(self, rank: int, method: str, *args):
        self.log.append((method, rank, *args))
        value = getattr(self.replicas[rank], method)(*args)
        if method == "alone_step":
            self.stepped.append((rank, value))
        return value

    def results(self, handles: list, doing: str, survivable: bool = False) -> list:
        self.log.append(("read", len(handles)))
        return handles

    def close(self) -> None:
        self.closed = True


def test_workers_timed_at_two_batches_mirrored_then_together_in_lockstep(tmp_path, monkeypatch):
    placed: list[InProcess] = []
    monkeypatch.setattr(standalone, "place", lambda *a: placed.append(InProcess(*a)) or placed[-1])
    job = small_config(tmp_path, "workers=[{name: desk}, {name: mac, slowdown: 2.0}]", "batch_size=16").job()
    job = replace(job, run=replace(job.run, standalone_steps=3))
    together = standalone.measure_alone_and_together(job, 8)
    (workers,) = placed
    assert workers.closed
    alone = [(rank, args[-1]) for method, rank, *args in workers.log if method == "alone"]
    # L_A L_B S_A S_B S_B S_A L_B L_A (None: the job's batch of 16), then both at their own pace
    assert alone == [(0, None), (1, None), (0, 8), (1, 8), (1, 8), (0, 8), (1, None), (0, None), (0, 8), (1, 8)]
    lockstep = workers.log[workers.log.index(("begin_alone", 0, standalone.WARMUP_STEPS, 8)) :]
    # every worker warmed up, then each step: one call a worker, read together before the next starts
    each_step = [("alone_step", 0), ("alone_step", 1), ("read", 2)]
    assert lockstep == [("begin_alone", 0, 3, 8), ("begin_alone", 1, 3, 8), ("read", 2), *each_step * 3]
    assert [w.steps_alone for w in workers.replicas] == [standalone.WARMUP_STEPS + 3] * 2
    assert [w.samples for w in workers.replicas] == [8, 8]  # the small batch, whole on each
    figures = {name: len(rates) for name, rates in together.lockstep.items()}
    assert figures == {"desk": 3, "mac": 3}  # a figure a step
    for timed in (together.large, together.small):
        assert {name: len(rates) for name, rates in timed.items()} == {"desk": 2, "mac": 2}
    # each step's figure is the small batch over that worker's seconds (the warmup's: not a call's)
    for rank, name in enumerate(("desk", "mac")):
        seconds = [s for r, s in workers.stepped if r == rank]
        assert together.lockstep[name] == [8 / s for s in seconds] and min(seconds) > 0


def test_with_no_room_left_the_workers_are_timed_at_the_global_batch_alone(tmp_path, monkeypatch):
    placed: list[InProcess] = []
    monkeypatch.setattr(standalone, "place", lambda *a: placed.append(InProcess(*a)) or placed[-1])
    job = small_config(tmp_path, "workers=[{name: desk}, {name: mac}]", "batch_size=16", "standalone_steps=1").job()
    together = standalone.measure_alone_and_together(job, 8, room_s=0.0)
    alone = [(rank, args[-1]) for method, rank, *args in placed[0].log if method == "alone"]
    assert alone == [(0, None), (1, None), (1, None), (0, None)]  # A B B A, at the job's batch
    assert len(together.large["mac"]) == 2 and together.small == together.free == together.lockstep == {}


def test_a_worker_timed_alone_keeps_its_share_of_a_row_s_batch(tmp_path):
    job = small_config(tmp_path, "workers=[{name: desk}, {name: mac}]", "batch_size=16").job()
    worker = Replica()
    worker.setup(job, 1, 2)
    assert worker.alone(2, 1) > 0 and worker.steps_alone == 3 and worker.samples == 16
    assert worker.alone(1, 0, 32) > 0 and worker.samples == 32  # a batch larger than the job's, whole
    assert (worker.batches, worker.rank) == ([8, 8], 1)  # its slice of a row: as before the timing
