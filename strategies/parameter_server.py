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

import time
from typing import ClassVar

import torch

from hetbench.clock import now
from hetbench.cluster.place import place
from hetbench.config import Job
from hetbench.devices import configure_threads, keep_freed_memory
from hetbench.errors import WorkersLost
from hetbench.floor import PS_FLOOR_NAME
from hetbench.gradients import FlatModel, batch_shares, from_wire, to_wire, weighted_sum
from hetbench.optimizer import ScheduledOptimizer
from hetbench.partial_step import Undo, step_only
from hetbench.step_timing import CentralUpdate, StepTiming
from hetbench.strategies.base import Strategy
from hetbench.strategies.replica import Replica
from hetbench.train_state import load_train_state, train_state
from hetbench.transport.host_memory import HandsOff, HostBuffers
from hetbench.workload import load_workload


class ParameterServer:
    """Master weights and the optimizer, on CPU (a Ray actor in ray-ps, the client in dask-sync).
    `reset` makes them for each repeat."""

    shared: HostBuffers | None = None  # from share_with, where workers share my host
    wire: str  # what the weights travel in
    flat: FlatModel
    optimizer: ScheduledOptimizer
    by_offset: dict[int, torch.Tensor]  # each parameter's offset in the buffers -> the parameter, to step it alone

    def share_with(self, job: Job, slots: int) -> tuple[str, int] | None:
        """Shared memory for `slots` workers on this host: the file's path and the weights' size, or None."""
        self.shared = HostBuffers.create(
            load_workload(job.run, announce=False).parameters, slots, job.cluster.step_timeout_s
        )
        return (self.shared.path, self.shared.numel) if self.shared else None

    def shared_by_all(self, by_value: bool = True) -> None:
        """Every worker that could has mapped the shared memory: its name goes (nothing to leave behind).
        `by_value`: whether some worker is not among them (and is sent the weights by value)."""
        if self.shared:
            self.shared.unlink()

    def reset(self, job: Job, seed: int):
        # The update runs while every worker waits for it: give it all of this host's cores.
        configure_threads(0)
        keep_freed_memory()  # the optimizer's 4.7 MB temporaries otherwise page-fault afresh every step
        self.wire = job.run.wire_dtype
        # the master weights live where the workers on this host read them: publishing them is free
        workload = load_workload(job.run, announce=False)
        self.flat = FlatModel(workload.build_model(seed), self.shared and self.shared.weights)
        self.optimizer = workload.build_optimizer(self.flat.optimizer_params(), job.run)
        self.by_offset = {offset: p for p, offset, _ in self.flat.spans}
        return to_wire(self.flat.params, self.wire)

    def state(self) -> dict:
        return train_state(self.flat, self.optimizer)

    def load_state(self, state: dict):
        load_train_state(self.flat, self.optimizer, state)
        return to_wire(self.flat.params, self.wire)

    def apply(self, shares: list[float], *grads, ticket: int | None = None, check=None):
        """(2c) the gradients (arrays, or slots of shared memory) weighted by their batch shares,
        (3) one optimizer step; new weights out. With a `ticket`, each slot's gradient is waited
        for on its counter (`check` may end that wait) and the new weights are announced on the
        version counter."""
        self._wait_for_slots(grads, ticket, check)
        start = time.perf_counter()
        grads = [self.shared.gradient(g) if isinstance(g, int) else from_wire(g) for g in grads]
        weighted_sum(grads, shares, out=self.flat.grads)
        stepping = time.perf_counter()
        self.optimizer.step()
        optimizer_s = time.perf_counter() - stepping
        return self._published(ticket), CentralUpdate(time.perf_counter() - start, optimizer_s)

    def apply_by_parameter(self, shares: list[float], grads: list, arrived, publish, ticket: int | None = None):
        """As `apply`, a parameter at a time, as DDP reduces a bucket: `arrived` yields (each parameter's
        offset, when the last of it came in) once every worker's gradient of it is in `grads` (buffers
        that fill as its parts come), and that parameter is combined, stepped and handed to
        `publish(offset, size)` while the others still come. The update is timed from when the last
        gradient came in; its optimizer seconds are those after it. Should `arrived` fail part-way,
        the weights and the optimizer's state are put back as they were (the step is redone without it)."""
        self._wait_for_slots(grads, ticket)
        last_in, stepped = time.perf_counter(), []  # (when, seconds) of each parameter's optimizer step
        grads = [self.shared.gradient(g) if isinstance(g, int) else g for g in grads]
        sizes = {offset: size for _, offset, size in self.flat.spans}
        undo = Undo(self.optimizer.optimizer)
        try:
            for offset, came_in in arrived:
                last_in, end = max(last_in, came_in), offset + sizes[offset]
                parts = [g[offset:end] if isinstance(g, torch.Tensor) else from_wire(g[offset:end]) for g in grads]
                weighted_sum(parts, shares, out=self.flat.grads[offset:end])
                undo.keep([self.by_offset[offset]])
                stepping = time.perf_counter()
                step_only(self.optimizer.optimizer, [self.by_offset[offset]])
                stepped.append((stepping, time.perf_counter() - stepping))
                publish(offset, end - offset)
        except BaseException:
            undo.restore()
            raise
        self.optimizer.advance()  # the schedule: once for the whole update
        weights = self._published(ticket)
        optimizer_s = sum(max(0.0, min(seconds, at + seconds - last_in)) for at, seconds in stepped)
        return weights, CentralUpdate(time.perf_counter() - last_in, optimizer_s)

    def _wait_for_slots(self, grads: list, ticket: int | None, check=None) -> None:
        for g in grads:
            if ticket is not None and isinstance(g, int):
                self.shared.wait_gradient(g, ticket, check)

    def _published(self, ticket: int | None):
        """The new weights announced to the workers in shared memory, and as they leave by value."""
        if ticket is not None:
            self.shared.publish_weights(ticket)
        return to_wire(self.flat.params, self.wire)

    def params(self):
        return self.flat.params.numpy()

    def learning_rate(self) -> float:
        return self.optimizer.lr


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

    def learning_rate(self) -> float:
        return self._server("learning_rate")

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
