"""The parameter-server driver that ray-ps, ray-ps-async and dask-sync share: single.py's loop with
(1) on the placed workers and (2)(3) on a coordinator that holds the master weights and optimizer.

Every message is one flat float32 buffer. Workers on the server's machine exchange both buffers
through shared memory they all map (transport/host_memory.py) and hand each other the turn
through its counters (a ticket per step attempt); the others by value, through the launcher's own
transport. A lost worker: the step is redone with the survivors, or kept where the update already
ran, and the survivors take its samples. A strategy module supplies the launcher, the two roles
and, where its server is not remote, how the update is applied.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from hetbench.clock import now
from hetbench.cluster.place import place
from hetbench.config import Job
from hetbench.errors import WorkersLost
from hetbench.floor import PS_FLOOR_NAME
from hetbench.gradients import batch_shares
from hetbench.step_timing import StepTiming
from hetbench.strategies.base import Strategy
from hetbench.strategies.roles import ParameterServer, Replica
from hetbench.transport.host_memory import HandsOff, HostBuffers


class ParameterServerDriver(Strategy, HandsOff):
    replica: ClassVar[type] = Replica  # the workers' role
    server: ClassVar[type] = ParameterServer  # the coordinator's role
    by_value: ClassVar[str] = "object store"  # how buffers reach workers off the server's machine
    uses_host_memory: ClassVar[bool] = True  # workers on the server's machine map its buffers
    calls_wait_for_weights: ClassVar[bool] = True  # a call given the weights' handle starts once they exist
    floor_transfers = 2.0  # the gradient up, then the weights down
    floor_name = PS_FLOOR_NAME
    survives_worker_loss = resumable = rebalances = True

    def __init__(self, job: Job) -> None:
        super().__init__(job)
        self.slots: list[int | None] = []  # per live worker: its slot in the shared memory, or None
        self.direct: list[bool] = []  # per live worker: whether it has a channel of its own to the server
        self.newest = None  # a handle of the newest weights, as the workers are given them
        self.ahead: tuple | None = None  # (step, its ticket, {rank: call}) queued before the runner asked for it
        self.calls: list[tuple] = []  # the step's calls, per worker: handles of (gradient, compute seconds)
        self.update = None  # the step's update, once called: the handle of its CentralUpdate timing
        self.pending: list = []  # every handle of the step's attempt, settled if a worker is lost
        self.ended = 0.0  # when the last step ended: a step queued ahead is timed from there

    def start(self) -> None:
        self.batches = [w.batch for w in self.job.workers]
        self.shares = batch_shares(self.batches)  # the sample-weighted rule, as weights
        self.placed = place(
            self.job.cluster, self.job.workers, self.replica, self.name, self.job, self.via, coordinator=self.server
        )
        self.placed.on_death = self._give_up_hand_offs  # what waits in shared memory must stop first
        self.info = list(self.placed.info)
        self._share_host_memory()

    def _share_host_memory(self) -> None:
        ranks = range(len(self.info))
        local = [r for r in ranks if self.uses_host_memory and self.placed.on_driver_host(r)]
        shared = self._server("share_with", self.job, len(local)) if local else None
        attached = (
            self.placed.results(
                [self.placed.call(r, "attach", *shared, len(local), slot) for slot, r in enumerate(local)],
                "sharing memory",
            )
            if shared
            else []
        )
        mapped = {r for r, ok in zip(local, attached) if ok}
        # this process maps the file too, to give up a step's waits when a worker is lost
        self.host = (
            HostBuffers.attach(*shared, len(local), self.job.cluster.step_timeout_s)
            if mapped and HostBuffers.can_hand_off()
            else None
        )
        self.slots = [local.index(r) if r in mapped else None for r in ranks]
        direct = self._connect_direct([r for r in ranks if r not in mapped])
        self.direct = [r in direct for r in ranks]
        # the name goes (nothing can be left); the server learns whether any weights go by value
        self._server("shared_by_all", len(mapped) + len(direct) < len(self.info))
        for rank, info in enumerate(self.info):
            info["transport"] = "shared memory" if rank in mapped else "direct tcp" if rank in direct else self.by_value

    def _connect_direct(self, ranks: list[int]) -> set[int]:
        """The ranks (of `ranks`, the workers not in shared memory) given a channel of their own to
        the server; a strategy with one sets it up here. The others go through `by_value`."""
        return set()

    def reset(self, seed: int) -> None:
        self.ahead = None
        self.newest = self.placed.coordinator_call("reset", self.job, seed)
        self.placed.results([self.newest, *self._each("reset", seed)], "resetting")

    def step(self, step: int, then: int | None = None) -> StepTiming:
        # a step queued ahead began on the workers when the previous one ended: it is timed from there
        start = self.ended if self.ahead and self.ahead[0] == step else now()
        weights_before = self.newest
        while True:
            self.update, self.pending = None, []
            try:
                return self._step(step, start, then)
            except WorkersLost as e:
                self._give_up_hand_offs()
                for handle in self.pending:  # settle every call of the attempt (Ray reports unread failures)
                    self.placed.succeeded(handle)
                self.ahead = None
                if self.update is not None and self.placed.succeeded(self.update):
                    # (hand-off) every gradient was in and the update ran before the loss showed: done
                    self.ended = now()
                    timing = StepTiming.synchronous(
                        self._survivors_computes([call[1] for call in self.calls]),
                        self.ended - start,
                        self.placed.results([self.update], "reading the update")[0],
                    )
                    self._lose(e.ranks, step)
                    return timing
                self.newest = weights_before  # the update never ran: redo the step with the survivors
                self._lose(e.ranks, step)

    def _step(self, step: int, start: float, then: int | None) -> StepTiming:
        ranks = range(len(self.info))
        # (1) every worker computes on its own slice, from the weights stored once for all of them
        ticket, queued = self.ahead[1:] if self.ahead and self.ahead[0] == step else (self._next_ticket(), {})
        self.calls = [queued.get(r) or self._compute(r, step, ticket) for r in ranks]
        # (2) (3) the server combines the gradients by the sample-weighted rule and steps: one in
        # shared memory is waited for on its slot's counter, the others come by value
        grads = [self.slots[r] if self._handed_off(r) else self._gradient_handle(r, ticket) for r in ranks]
        self.pending = [h for call in self.calls for h in call]
        self.newest, self.update = self._apply(grads, ticket if self.host else None)
        # (4) when the runner goes straight on, the next step's calls are queued now: each worker
        # starts as soon as the new weights exist, with no round trip through here (a call sent the
        # weights themselves, as dask-sync's are, goes with them: its update ran in `_apply`)
        self.ahead = None
        if then is not None:
            next_ticket = self._next_ticket()
            self.ahead = (then, next_ticket, {r: self._compute(r, then, next_ticket, after=ticket) for r in ranks})
            self.pending += [h for call in self.ahead[2].values() for h in call]
        compute = self.placed.results([call[1] for call in self.calls], f"step {step}", survivable=True)
        (update,) = self.placed.results([self.update], f"step {step}", survivable=True)
        self.ended = now()
        return StepTiming.synchronous({i["name"]: c for i, c in zip(self.info, compute)}, self.ended - start, update)

    def _handed_off(self, rank: int) -> bool:
        return self.slots[rank] is not None and self.host is not None

    def _gradient_handle(self, rank: int, ticket: int):
        """What the server is given for worker `rank`'s gradient of this attempt (not in shared memory)."""
        return self.calls[rank][0]

    def _compute(self, rank: int, step: int, ticket: int, after: int | None = None) -> tuple:
        """Worker `rank`'s call for `step`: handles of (its gradient, its compute seconds). A call queued
        `after` the update of that ticket waits for its weights where they arrive (shared memory, its
        own channel); the others are given the weights' handle."""
        handed_off = self._handed_off(rank)
        waits_itself = handed_off or self.direct[rank]
        needs_weights = not (waits_itself and after is not None) and (
            self.slots[rank] is None or self.calls_wait_for_weights
        )
        return self.placed.call(
            rank,
            "compute",
            self.newest if needs_weights else None,
            step,
            ticket if waits_itself else None,
            after if waits_itself else None,
            returns=2,
        )

    def _apply(self, grads: list, ticket: int | None) -> tuple:
        """(2) (3) on the coordinator: handles of (the new weights, the update's CentralUpdate timing)."""
        return self.placed.coordinator_call("apply", self.shares, *grads, ticket=ticket, returns=2)

    def _survivors_computes(self, computes: list) -> dict[str, float]:
        """Worker name -> compute seconds, from the handles (in rank order) of the calls that returned."""
        return {
            info["name"]: self.placed.results([compute], "reading a compute")[0]
            for info, compute in zip(self.info, computes)
            if self.placed.succeeded(compute)
        }

    def _lose(self, ranks: list[int], step: int) -> None:
        """Forget the lost workers (highest rank first, so the others keep their places), re-split."""
        for rank in sorted(ranks, reverse=True):
            self.placed.drop(rank)
            del self.slots[rank], self.direct[rank]
            self.lose_worker(rank, step)
        self.push_split()

    def push_split(self) -> None:
        self.placed.each("resplit", [(self.batches, rank) for rank in range(len(self.info))], "re-splitting")

    def kill_worker(self, name: str) -> None:
        self.placed.kill(next(rank for rank, info in enumerate(self.info) if info["name"] == name))

    def state(self) -> dict:
        return self._server("state")

    def load_state(self, state: dict) -> None:
        self.newest = self.placed.coordinator_call("load_state", state)
        self.placed.results([self.newest], "resuming")

    def weights(self) -> torch.Tensor:
        return torch.from_numpy(self._server("params").copy())

    def worker_info(self) -> list[dict]:
        peaks = self.placed.results(self._each("peak_rss_mb"), "reading memory")
        return [dict(i, peak_rss_mb=p) for i, p in zip(self.info, peaks)] + [dict(i) for i in self.lost]

    def close(self) -> None:
        self._give_up_hand_offs()  # a call queued ahead must not keep its worker from closing
        if self.placed:
            self.placed.close()

    def _each(self, method: str, *args) -> list:
        return [self.placed.call(rank, method, *args) for rank in range(len(self.info))]

    def _server(self, method: str, *args):
        return self.placed.results([self.placed.coordinator_call(method, *args)], f"calling the server's {method}")[0]
