"""ray-ps with bounded staleness: ray_ps.py's parameter server without the barrier.

Differs from ray-ps in (2)/(3): a finished worker's gradient is applied at once, scaled by its
batch share, and the worker restarts from the newest weights, unless it is more than
`max_staleness` versions ahead of the slowest worker still computing: then it waits. A runner
"step" is one global batch's worth of samples applied, from whichever workers delivered them.
The weights go down a worker's direct channel only when it starts from them (ray-ps pushes every
version to every worker, which here would send each worker versions it never uses). When every
worker has such a channel the server serves them itself (async_serving.py) and the driver only
opens each step; otherwise the driver hands each worker its next batch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import ray

from hetbench.clock import now
from hetbench.config import Job, setting
from hetbench.errors import RunFailed, WorkersLost
from hetbench.step_timing import StepTiming
from hetbench.strategies.async_serving import ServingReplica, ServingServer, too_far_ahead
from hetbench.strategies.ray_ps import RayParameterServer, RayPsOptions


@dataclass(frozen=True)
class AsyncOptions(RayPsOptions):
    max_staleness: int = setting(2, "a worker this many weights versions ahead of the slowest waits")
    update_first: bool = setting(
        True, "a worker's next weights include its own gradient; false: they leave before it is applied (one staler)"
    )


class RayParameterServerAsync(RayParameterServer):
    name = "ray-ps-async"
    options = AsyncOptions
    replica, server = ServingReplica, ServingServer
    table_note = (
        "ray-ps-async: no barrier, so its sync overhead is a worker's own wait for fresh weights after each "
        "batch (its gradient up, the update, the weights down), wait ms the time max_staleness held it "
        "back, and no link prediction applies."
    )
    synchronous = False
    uses_host_memory = False  # the server writes while other workers read: each needs its own copy
    floor_transfers = None  # no barrier: transfers overlap other workers' compute
    resumable = False  # gradients in flight at a checkpoint would be lost: not built yet
    overlap = ""  # no barrier: a step has no backward for its transfers to hide behind, only others' work

    def __init__(self, job: Job) -> None:
        super().__init__(job)
        self.in_flight: dict = {}  # gradient handle -> (rank, version it started from, compute handle, parked s)
        self.staleness: list[int] = []  # versions behind, per applied gradient, over every repeat
        self.serving = False  # the server and the workers' loops are running (async_serving.py)
        self.at_step = 0  # the last step served: where a loss the server saw after it is filed
        self.version = 0  # updates applied this repeat (the driver's path)
        self.next_batch: list[int] = []  # per live worker: the next of its own stream of slices
        self.parked: list[int] = []  # ranks max_staleness holds back (the driver's path)
        self.parked_at: dict[int, float] = {}  # rank -> when its batch was applied, until it is given its next
        # the server serves the workers itself (every worker has a channel of its own): fixed at
        # start, as a loss later must not switch a repeat from one path to the other
        self.served = False
        self.went_on = False  # the last served step left the server applying, into the next step

    @property
    def max_staleness(self) -> int:
        return self.settings.max_staleness

    def start(self) -> None:
        super().start()
        self.served = all(self.direct)

    def reset(self, seed: int) -> None:
        self._stop()
        super().reset(seed)
        self.version = 0
        self.next_batch = [0] * len(self.info)  # each worker reads its own stream of slices
        self.in_flight, self.parked, self.parked_at = {}, [], {}
        self.went_on = False
        if self.served:  # (2a) each worker's first weights down its channel; from then on it loops
            options = (self.settings.max_staleness, self.settings.update_first)
            first = self._server("start_serving", self.job.run.batch_size, *options)
            self.placed.results(self._each("start_loop", first), "starting the workers' loops")
            self.serving = True
            return
        for rank in range(len(self.info)):
            self._submit(rank)

    def _submit(self, rank: int, parked_s: float = 0.0) -> None:
        """Worker `rank`'s next batch, from the newest weights; `parked_s`: how long max_staleness held it."""
        weights, ticket = self.newest, None
        if self.direct[rank]:  # (2a) down its channel, tagged with their version; its gradient comes back up it
            weights, ticket = self.placed.coordinator_call("send_to", self.info[rank]["name"]), self._next_ticket()
        call = self.placed.call(rank, "compute_after_idle", weights, self.next_batch[rank], ticket, returns=2)
        self.next_batch[rank] += 1
        self.in_flight[call[0]] = (rank, self.version, call[1], parked_s)

    def step(self, step: int, then: int | None = None) -> StepTiming:
        if self.served:
            return self._served_step(step, then)
        start, applied = now(), 0
        computes: dict[str, list[float]] = {w["name"]: [] for w in self.info}
        idles, parks = [], []  # per batch applied: its worker's wait for fresh weights before it, held back
        while applied < self.job.run.batch_size:
            # (1) whichever worker finishes first ...
            ready, _ = ray.wait(list(self.in_flight), num_returns=1, timeout=self.job.cluster.step_timeout_s)
            if not ready:
                raise RunFailed(f"{self.name}: no worker finished a batch at step {step}")
            rank, started_at, timing, parked_s = self.in_flight.pop(ready[0])
            try:
                compute_s, idle_s, batch = self.placed.results([timing], f"step {step}", True)[0]
            except WorkersLost as e:  # its gradient never came: go on with the others
                self.placed.succeeded(ready[0])
                self._lose(e.ranks, step)
                continue
            computes[self.info[rank]["name"]].append(compute_s)
            if idle_s is not None:  # its overhead: the wait beyond what max_staleness held it back
                idles.append(max(0.0, idle_s - parked_s))
                parks.append(parked_s)
            # (2) (3) ... has its gradient applied at once, scaled by its share of the global batch
            share = batch / self.job.run.batch_size  # the samples it computed on, even if re-split since
            self.newest, _ = self.placed.coordinator_call("apply", [share], ready[0], returns=2)
            self.staleness.append(self.version - started_at)
            self.version += 1
            applied += batch
            # bounded staleness: run ahead of the slowest worker by at most max_staleness versions
            self.parked_at.setdefault(rank, now())
            for r in [rank, *self.parked]:
                self.parked = [p for p in self.parked if p != r]
                if self._too_far_ahead():
                    self.parked.append(r)
                else:
                    self._submit(r, now() - self.parked_at.pop(r))
        return self._timing(now() - start, computes, idles, parks)

    def _served_step(self, step: int, then: int | None) -> StepTiming:
        """(1)-(3) on the workers and the server alone; here one global batch's worth is let through.
        (4) When the runner goes straight on, the server goes on applying while the driver is away:
        the next step began where this one ends, and is timed from there."""
        start = self.ended if self.went_on else now()
        timeout_s = 0.8 * self.job.cluster.step_timeout_s
        served = self._server("run_step", self.job.run.batch_size, timeout_s, then is None)
        self.ended, self.went_on = now(), then is not None
        total = self.ended - start
        if served["failure"]:
            raise RunFailed(f"{self.name}: {served['failure']}")
        self.at_step = step
        self._lose_named(served["lost"], step)
        if not served["done"]:
            raise RunFailed(f"{self.name}: no worker finished a batch at step {step}")
        self.staleness += served["staleness"]
        computes = {name: c for name, c in served["computes"].items() if name in {i["name"] for i in self.info}}
        return self._timing(total, computes, served["idles"], served["parks"])

    @staticmethod
    def _timing(total: float, computes: dict[str, list[float]], idles: list[float], parks: list[float]) -> StepTiming:
        # a worker that finished no batch during this step reports no compute for it
        compute_s = {name: (sum(c) / len(c) if c else 0.0) for name, c in computes.items()}
        overhead = statistics.fmean(idles) if idles else 0.0
        waited = statistics.fmean(parks) if parks else 0.0
        comm_s = max(0.0, total - max(compute_s.values()))
        return StepTiming(compute_s, comm_s=comm_s, wait_s=waited, total_s=total, overhead_s=overhead)

    def _lose(self, ranks: list[int], step: int) -> None:
        """As ray-ps, and the lost workers' batches in flight are dropped; the others' ranks move down."""
        for lost in sorted(ranks, reverse=True):
            del self.next_batch[lost]
            self.parked = [r - (r > lost) for r in self.parked if r != lost]
            self.parked_at = {r - (r > lost): t for r, t in self.parked_at.items() if r != lost}
            self.in_flight = {ref: (r - (r > lost), *rest) for ref, (r, *rest) in self.in_flight.items() if r != lost}
        super()._lose(ranks, step)
        if not self.in_flight:  # the lost worker was the one the parked ones waited for
            for rank in self.parked:
                self._submit(rank, now() - self.parked_at.pop(rank))
            self.parked = []

    def _lose_named(self, names: list[str], step: int) -> None:
        if names:
            ranks = [rank for rank, info in enumerate(self.info) if info["name"] in names]
            self._lose(ranks, step)

    def _too_far_ahead(self) -> bool:
        started_from = (v for _, v, *_ in self.in_flight.values())
        return too_far_ahead(self.version, started_from, self.settings.max_staleness)

    def record_extras(self, earlier: dict) -> dict:
        counts: dict[int, int] = {}
        for versions, n in earlier.get("staleness", {}).get("histogram", {}).items():  # JSON's keys are text
            counts[int(versions)] = n
        for s in self.staleness:
            counts[s] = counts.get(s, 0) + 1
        ordered = sorted(s for s, n in counts.items() for _ in range(n))
        return {
            "staleness": {
                "histogram": dict(sorted(counts.items())),
                "max": max(ordered, default=0),
                "median": ordered[len(ordered) // 2] if ordered else 0,
                "max_allowed": self.settings.max_staleness,
            },
        }

    def _stop(self) -> None:
        """Let a previous repeat's batches finish, or stop the loops, before the models are replaced."""
        if self.serving:
            self._lose_named(self._server("stop_serving"), self.at_step)
            self.placed.results(self._each("stop_loop"), "stopping the workers' loops")
            self.serving = False
        pending = list(self.in_flight)
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=self.job.cluster.step_timeout_s)
