"""Each worker measured alone, in the same run: the speeds `balance: auto` splits by, and the
reference of scaling efficiency (measured throughput / the sum of the workers' standalone ones).

Every worker trains alone, one after the other, on the whole global batch, on its own node and
device (placed as every strategy's workers are: cluster/placed.py), with the threads it gets in the
run (on one box the emulated machines share the cores). `hetbench run` times them at its start
(auto's split: A B .. B A), then just before and just after every row they judge (Brackets): a
machine's speed drifts over a run (a shared box, a warm laptop), and each row's reference should be
the speed its workers had while it ran, not an hour before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hetbench.clock import median
from hetbench.cluster.place import place
from hetbench.config import Job
from hetbench.strategies.replica import Replica

WARMUP_STEPS = 3


def measure_standalone(job: Job, order: list[int] | None = None) -> dict[str, list[float]]:
    """Worker name -> its samples/s training alone, one figure per timing: by default two each, in
    the order A B .. B A, so drift on a shared machine hits every worker alike; else in `order`."""
    workers = place(job.cluster, job.workers, Replica, "standalone", job)
    try:
        return _alone(workers, job, order)
    finally:
        workers.close()


@dataclass(frozen=True)
class Together:
    """Each worker's samples/s alone at two global batches, then at the smaller with every worker
    training at once, each alone on its own copy: worker name -> its figures (empty: not timed)."""

    large: dict[str, list[float]]  # alone at the job's global batch, two timings (A B .. B A)
    small: dict[str, list[float]]  # alone at the smaller, two timings
    free: dict[str, list[float]]  # all at once, each at its own pace, one figure (an asynchronous row's)
    lockstep: dict[str, list[float]]  # all at once, every step started together, one figure a step (a
    # synchronous row's after each sync: an emulated machine's real compute lands on the others' every step)


def measure_alone_and_together(job: Job, small: int, room_s: float | None = None) -> Together:
    """Each worker alone at the job's global batch and at `small`, in the order L_A L_B S_A S_B S_B
    S_A L_B L_A (L the global batch, S the small; A, B .. the workers): mirrored, so drift over the
    timing hits both batches alike, where timed one batch after the other it reads as a step's fixed
    cost. Then every worker at once at `small`: a row's workers compute at once, and on one box they
    share its cores, which timing each alone misses (on separate machines the two agree). At their
    own pace the faster take more steps, by their speeds alone, so that all train about as long as
    the slowest; in lockstep each step waits for the slowest's. Where the small batch and the timings
    together would pass `room_s` seconds (judged by the first L_A L_B), the global batch alone."""
    workers = place(job.cluster, job.workers, Replica, "standalone", job)
    ranks = list(range(len(job.workers)))
    try:
        started = time.perf_counter()
        large = _alone(workers, job, ranks)
        half = time.perf_counter() - started  # a step costs about its share; each timing together
        # (one step each at once) about half the two alone timings at the small batch
        if room_s is not None and half * (2 + 4 * small / job.run.batch_size) > room_s:
            return Together(merged(large, _alone(workers, job, ranks[::-1])), {}, {}, {})
        small_alone = _alone(workers, job, ranks + ranks[::-1], small)
        large = merged(large, _alone(workers, job, ranks[::-1]))
        pace = speeds(small_alone)
        slowest = min(pace.values())
        calls = [
            workers.call(rank, "alone", round(job.run.standalone_steps * pace[w.name] / slowest), WARMUP_STEPS, small)
            for rank, w in enumerate(job.workers)
        ]
        free = workers.results(calls, "timing the workers together")
        workers.results([workers.call(r, "begin_alone", WARMUP_STEPS, small) for r in ranks], "warming up together")
        steps = [
            workers.results([workers.call(rank, "alone_step") for rank in ranks], "timing the workers in lockstep")
            for _ in range(job.run.standalone_steps)
        ]
        return Together(
            large,
            small_alone,
            {w.name: [rate] for w, rate in zip(job.workers, free)},
            {w.name: [small / step[rank] for step in steps] for rank, w in enumerate(job.workers)},
        )
    finally:
        workers.close()


def _alone(workers, job: Job, order: list[int] | None = None, batch: int | None = None) -> dict[str, list[float]]:
    """Each worker in `order` (by default A B .. B A) timed alone at `batch` (the job's global batch)."""
    ranks = list(range(len(job.workers)))
    timed: dict[str, list[float]] = {w.name: [] for w in job.workers}
    for rank in order or ranks + ranks[::-1]:
        name = job.workers[rank].name
        timed[name] += workers.results(
            [workers.call(rank, "alone", job.run.standalone_steps, WARMUP_STEPS, batch)], f"timing {name} alone"
        )
    return timed


def merged(*timings: dict[str, list[float]]) -> dict[str, list[float]]:
    """Worker name -> every figure of each of `timings`, in their order."""
    return {name: [rate for timed in timings for rate in timed[name]] for name in timings[0]}


class Brackets:
    """Each worker timed alone just before and just after every row it judges (one timing each way:
    A B, then B A, so the two around a row mirror each other). Rows run back to back share the
    timing between them; after any other row (the baseline, a failed one) the next is timed anew."""

    def __init__(self, job: Job, enabled: bool) -> None:
        self.job, self.enabled = job, enabled
        self.latest: dict[str, list[float]] | None = None  # the last timings, if nothing ran since
        self.before_row: dict[str, list[float]] | None = None  # those just before the running row
        self.timings = 0

    def before(self, judges: bool) -> bool:
        """A row starts: where they judge it, its workers timed alone first (unless that was just
        done); whether they do."""
        if judges and self.enabled and self.latest is None:
            self.latest = self._measure()
        self.before_row, self.latest = (self.latest if judges and self.enabled else None), None
        return self.before_row is not None

    def after(self) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        """After a row they judge: the timings just before it, and anew just after (the next row's before)."""
        self.latest = self._measure()
        return self.before_row, self.latest

    def _measure(self) -> dict[str, list[float]]:
        ranks = list(range(len(self.job.workers)))
        self.timings += 1
        return measure_standalone(self.job, ranks if self.timings % 2 else ranks[::-1])


def speeds(*timings: dict[str, list[float]]) -> dict[str, float]:
    """Worker name -> samples/s alone: the median of all its timings."""
    return {name: median(rates) for name, rates in merged(*timings).items()}
