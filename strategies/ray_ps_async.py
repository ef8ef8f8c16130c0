"""ray-ps with bounded staleness: ray_ps.py's parameter server without the barrier.

Differs from ray-ps in (2)/(3): a finished worker's gradient is applied at once, scaled by its
batch share, and the worker restarts from the newest weights, unless it is more than
`max_staleness` versions ahead of the slowest worker still computing: then it waits. A runner
"step" is one global batch's worth of samples applied, from whichever workers delivered them.
"""

from __future__ import annotations

from dataclasses import dataclass

import ray

from hetbench.clock import now
from hetbench.config import Config, setting
from hetbench.errors import RunFailed, WorkersLost
from hetbench.step_timing import StepTiming
from hetbench.strategies.ray_ps import RayParameterServer


@dataclass(frozen=True)
class AsyncOptions:
    max_staleness: int = setting(2, "a worker this many weights versions ahead of the slowest waits")


class RayParameterServerAsync(RayParameterServer):
    name = "ray-ps-async"
    options = AsyncOptions
    table_note = (
        "ray-ps-async: no barrier, so wait ms is the time a worker was held back by max_staleness "
        "and no link prediction applies."
    )
    synchronous = False
    uses_host_memory = False  # the server writes while other workers read: each needs its own copy
    floor_transfers = None  # no barrier: transfers overlap other workers' compute
    resumable = False  # gradients in flight at a checkpoint would be lost: not built yet
    # the object store only: a worker pulls just the version it starts from (channels push every version)
    direct_channels = False

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.in_flight: dict = {}  # gradient handle -> (rank, version it started from, compute handle, batch)
        self.staleness: list[int] = []  # versions behind, per applied gradient, over every repeat

    def reset(self, seed: int) -> None:
        self._drain()
        super().reset(seed)
        self.version = 0
        self.next_batch = [0] * len(self.info)  # each worker reads its own stream of slices
        self.in_flight = {}
        self.parked: list[int] = []
        for rank in range(len(self.info)):
            self._submit(rank)

    def _submit(self, rank: int) -> None:
        grad, compute = self.placed.call(rank, "compute", self.newest, self.next_batch[rank], returns=2)
        self.next_batch[rank] += 1
        self.in_flight[grad] = (rank, self.version, compute, self.batches[rank])

    def step(self, step: int, then: int | None = None) -> StepTiming:
        start, applied, waited = now(), 0, 0.0
        computes: dict[str, list[float]] = {w["name"]: [] for w in self.info}
        while applied < self.cfg.run.batch_size:
            # (1) whichever worker finishes first ...
            ready, _ = ray.wait(list(self.in_flight), num_returns=1, timeout=self.cfg.cluster.step_timeout_s)
            if not ready:
                raise RunFailed(f"{self.name}: no worker finished a batch at step {step}")
            rank, started_at, compute, batch = self.in_flight.pop(ready[0])
            try:
                computes[self.info[rank]["name"]].append(self.placed.results([compute], f"step {step}", True)[0])
            except WorkersLost as e:  # its gradient never came: go on with the others
                self.placed.succeeded(ready[0])
                self._lose(e.ranks, step)
                continue
            # (2) (3) ... has its gradient applied at once, scaled by its share of the global batch
            share = batch / self.cfg.run.batch_size  # the batch it computed on, even if re-split since
            self.newest, _ = self.placed.coordinator_call("apply", [share], ready[0], returns=2)
            self.staleness.append(self.version - started_at)
            self.version += 1
            applied += batch
            # bounded staleness: run ahead of the slowest worker by at most max_staleness versions
            parked_at = now()
            for r in [rank, *self.parked]:
                self.parked = [p for p in self.parked if p != r]
                if self._too_far_ahead():
                    self.parked.append(r)
                else:
                    self._submit(r)
            waited += now() - parked_at
        total = now() - start
        # a worker that finished no batch during this step reports no compute for it
        compute_s = {name: (sum(c) / len(c) if c else 0.0) for name, c in computes.items()}
        return StepTiming(compute_s, comm_s=max(0.0, total - max(compute_s.values())), wait_s=waited, total_s=total)

    def _lose(self, ranks: list[int], step: int) -> None:
        """As ray-ps, and the lost workers' batches in flight are dropped; the others' ranks move down."""
        for lost in sorted(ranks, reverse=True):
            del self.next_batch[lost]
            self.parked = [r - (r > lost) for r in self.parked if r != lost]
            self.in_flight = {ref: (r - (r > lost), *rest) for ref, (r, *rest) in self.in_flight.items() if r != lost}
        super()._lose(ranks, step)
        if not self.in_flight:  # the lost worker was the one the parked ones waited for
            for rank in self.parked:
                self._submit(rank)
            self.parked = []

    def _too_far_ahead(self) -> bool:
        oldest = min((v for _, v, *_ in self.in_flight.values()), default=self.version)
        return self.version - oldest > self.settings.max_staleness

    def record_extras(self) -> dict:
        counts: dict[int, int] = {}
        for s in self.staleness:
            counts[s] = counts.get(s, 0) + 1
        ordered = sorted(self.staleness)
        return {
            **super().record_extras(),
            "staleness": {
                "histogram": dict(sorted(counts.items())),
                "max": max(ordered, default=0),
                "median": ordered[len(ordered) // 2] if ordered else 0,
                "max_allowed": self.settings.max_staleness,
            },
        }

    def _drain(self) -> None:
        """Let a previous repeat's in-flight batches finish before the models are replaced."""
        pending = list(self.in_flight)
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=self.cfg.cluster.step_timeout_s)
