"""Ray parameter server: single.py's loop with steps (1)-(3) spread over Ray actors.

Each worker actor computes on its own batch and device; a server actor holds the master
weights and optimizer. Every message is one flat float32 buffer: a worker on the server's node
exchanges it through shared memory both map (host_memory.py); one on another node through
Ray's object store, put once by the process that made it and read zero-copy by the others.
When steps follow each other at once, the next step's calls wait on the workers before the
new weights exist (4). In shared memory the workers and the server hand each other the turn
through counters in the same file (host_memory.py), not through Ray's dependencies.
"""
from __future__ import annotations

import ray
import torch

from hetbench.strategies.base import StepTiming, Strategy, workers_per_host
from hetbench.clock import now
from hetbench.errors import RunFailed, UserError, WorkersLost
from hetbench.gradients import batch_shares
from hetbench.transport.host_memory import HandsOff, HostBuffers
from hetbench.cluster.ray_connection import RayConnection, on_driver_node, placement
from hetbench.strategies.roles import ParameterServer, Replica

# Across nodes both flat buffers travel as [ObjectRef], put by the process that made them: returned by value,
# each hop also waited for the driver (a return's owner) to learn the object was stored. Measured
# here: worker -> server 4.2 -> 1.8 ms, server -> workers 6.3 -> 2.5 ms (plus the server's put).
# Ray's compiled graphs move them faster, but their idle actors spin a core each: measured and
# not kept (README, "Where a ray-ps step's time goes").


class RayWorker(Replica):
    def setup(self, cfg: dict, rank: int, threads_share: int) -> dict:
        return {**super().setup(cfg, rank, threads_share), "node_id": ray.get_runtime_context().get_node_id(),
                "node_ip": ray.util.get_node_ip_address()}

    def compute(self, weights: list | None, step: int, ticket: int | None = None, after: int | None = None):
        grad, compute_s = super().compute(None if self.shared else ray.get(weights[0]), step, ticket, after)
        return [grad if self.shared else ray.put(grad)], compute_s


class RayServer(ParameterServer):
    object_store = True  # whether any worker reads the weights from the object store

    def shared_by_all(self, object_store: bool) -> None:
        super().shared_by_all()
        self.object_store = object_store

    def reset(self, cfg: dict, seed: int) -> list:
        return self._put(super().reset(cfg, seed))

    def load_state(self, state: dict) -> list:
        return self._put(super().load_state(state))

    def apply(self, shares: list[float], *grads: list, ticket: int | None = None):
        refs = [g[0] for g in grads if isinstance(g[0], ray.ObjectRef)]  # the others are slots of shared memory
        fetched = dict(zip(refs, ray.get(refs)))
        weights, update_s = super().apply(shares, *[fetched.get(g[0], g[0]) for g in grads], ticket=ticket)
        return self._put(weights), update_s

    def _put(self, weights) -> list:
        return [ray.put(weights) if self.object_store else None]


STEP_TIMEOUT_S = 600  # no single step on any device takes this long: past it, something hangs
RemoteWorker = ray.remote(RayWorker)
RemoteServer = ray.remote(RayServer)


class RayParameterServer(Strategy, HandsOff):
    name = "ray-ps"
    uses_host_memory = True  # workers on the server's node exchange through shared memory
    floor_transfers = 2.0
    survives_worker_loss = True
    resumable = True
    rebalances = True

    def start(self) -> None:
        workers = self.cfg["workers"]
        self.batches = [w["batch"] for w in workers]
        self.shares = batch_shares(self.batches)  # the sample-weighted rule, as weights
        self.specs = list(workers)                 # the live workers' configs, in rank order
        self.cluster = RayConnection(self.cfg, {w["node"] for w in workers if w["node"]})
        self.server = RemoteServer.options(**on_driver_node()).remote()
        self.workers = [RemoteWorker.options(**placement(w)).remote() for w in workers]
        joined = bool(self.cfg["cluster"]["ray_address"])
        self.info = self._get([w.setup.remote(self.cfg, rank, workers_per_host(self.cfg, spec, joined))
                               for rank, (w, spec) in enumerate(zip(self.workers, workers))], "setting up")
        self._share_host_memory()

    def _share_host_memory(self) -> None:
        """The workers on the server's node map one shared file with it; the others use the object store."""
        here = ray.get_runtime_context().get_node_id()
        local = [r for r, i in enumerate(self.info) if i["node_id"] == here and self.uses_host_memory]
        shared = self._get([self.server.share_with.remote(self.cfg, len(local))], "sharing memory")[0] if local else None
        attached = self._get([self.workers[r].attach.remote(*shared, len(local), slot)
                              for slot, r in enumerate(local)], "sharing memory") if shared else []
        in_shared_memory = {r for r, ok in zip(local, attached) if ok}
        for rank, info in enumerate(self.info):
            info["transport"] = "shared memory" if rank in in_shared_memory else "object store"
        # Where this process maps the file too (it can give up a step for them), the workers and the
        # server hand each other the turn through its counters, not through Ray's calls.
        self.host = HostBuffers.attach(*shared, len(local)) if in_shared_memory and HostBuffers.can_hand_off() else None
        self.slots = [local.index(r) if r in in_shared_memory and self.host else None for r in range(len(self.workers))]
        self._get([self.server.shared_by_all.remote(len(in_shared_memory) < len(self.workers))], "sharing memory")

    def reset(self, seed: int) -> None:
        self.ahead = None  # (step, its ticket, its compute calls) submitted before the step was called
        self.weights_ref = self.server.reset.remote(self.cfg, seed)
        self._get([w.reset.remote(seed) for w in self.workers] + [self.weights_ref], "resetting")

    def step(self, step: int, then: int | None = None) -> StepTiming:
        # a step submitted ahead began on the workers when the previous one ended, so it is timed from there
        start = self.ended if self.ahead and self.ahead[0] == step else now()
        weights_before = self.weights_ref
        while True:
            try:
                return self._step(step, start, then)
            except WorkersLost as e:
                _discard(self.step_refs)
                self.ahead = None
                if _succeeded(self.update_ref):  # (hand-off) every gradient was in before the loss showed: done
                    self.ended = now()
                    timing = StepTiming.synchronous(self._survivors_computes(), self.ended - start,
                                                    ray.get(self.update_ref))
                    self._lose(e.ranks, step)
                    return timing
                # the server never ran this step's update: redo it with the survivors
                self.weights_ref = weights_before
                self._lose(e.ranks, step)

    def _step(self, step: int, start: float, then: int | None) -> StepTiming:
        # (1) every worker computes on its own batch, from the weights stored once for all of them
        if self.ahead and self.ahead[0] == step:
            _, ticket, outputs = self.ahead
        else:
            ticket = self._next_ticket()
            outputs = self._compute(step, ticket)
        grads, compute_refs = zip(*outputs)
        # (2) (3) the server combines by the sample-weighted rule and steps; Ray passes it the
        # gradients straight from the workers' object-store entries (in shared memory: their slots,
        # each waited for on its counter)
        grads = [g if slot is None else [slot] for g, slot in zip(grads, self.slots)]
        self.weights_ref, update_ref = self.server.apply.options(num_returns=2).remote(
            self.shares, *grads, ticket=ticket if self.host else None)
        # (4) when the runner goes straight on, the next step's calls are queued now: each worker
        # starts as soon as the new weights exist, without waiting for a round trip through here
        self.ahead = None
        if then is not None:
            next_ticket = self._next_ticket()
            self.ahead = (then, next_ticket, self._compute(then, next_ticket, after=ticket))
        ahead_refs = [ref for call in self.ahead[2] for ref in call] if self.ahead else []
        self.compute_refs, self.update_ref = compute_refs, update_ref
        self.step_refs = [*grads, *compute_refs, self.weights_ref, update_ref, *ahead_refs]
        compute = self._get(list(compute_refs), f"step {step}", survivable=True)
        # the update's timing is the server's other return: once it is here, so are the new weights
        (update_s,) = self._get([update_ref], f"step {step}", survivable=True)
        self.ended = now()
        return StepTiming.synchronous({w["name"]: c for w, c in zip(self.info, compute)}, self.ended - start, update_s)

    def _compute(self, step: int, ticket: int, after: int | None = None) -> list:
        """Every worker's call for `step`; one `after` a weights version waits for it in shared memory,
        with no Ray dependency on the server's call (the others wait for the weights' ref)."""
        return [w.compute.options(num_returns=2).remote(self.weights_ref, step) if slot is None else
                w.compute.options(num_returns=2).remote(None if after is not None else self.weights_ref, step, ticket, after)
                for w, slot in zip(self.workers, self.slots)]

    def _survivors_computes(self) -> dict[str, float]:
        return {info["name"]: ray.get(ref) for info, ref in zip(self.info, self.compute_refs) if _succeeded(ref)}

    def state(self) -> dict:
        return self._get([self.server.state.remote()], "checkpointing")[0]

    def load_state(self, state: dict) -> None:
        self.weights_ref = self.server.load_state.remote(state)
        self._get([self.weights_ref], "resuming")

    def kill_worker(self, name: str) -> None:
        ray.kill(self.workers[self._rank(name)], no_restart=True)

    def _rank(self, name: str) -> int:
        return next(rank for rank, info in enumerate(self.info) if info["name"] == name)

    def _lose(self, ranks: list[int], step: int) -> None:
        """Forget the lost workers (highest rank first, so the others keep their places), re-split."""
        for rank in sorted(ranks, reverse=True):
            del self.workers[rank], self.specs[rank], self.slots[rank]
            self.lose_worker(rank, step)
        self.push_split()

    def push_split(self) -> None:
        self._get([w.resplit.remote(self.batches, rank) for rank, w in enumerate(self.workers)], "re-splitting")

    def weights(self) -> torch.Tensor:
        return torch.from_numpy(self._get([self.server.params.remote()], "reading the weights")[0].copy())

    def worker_info(self) -> list[dict]:
        peaks = self._get([w.peak_rss_mb.remote() for w in self.workers], "reading memory")
        return [dict(i, peak_rss_mb=p) for i, p in zip(self.info, peaks)] + [dict(i) for i in self.lost]

    def close(self) -> None:
        if getattr(self, "cluster", None):
            self.cluster.close()

    def _get(self, refs: list, doing: str, survivable: bool = False) -> list:
        return results(refs, doing, self.name, self.workers, self.specs, survivable, self._give_up_hand_offs)


def results(refs: list, doing: str, owner: str, actors: list, specs: list[dict], survivable: bool = False,
            on_death=None) -> list:
    """ray.get with errors in one sentence: bad input stays bad input, a dead worker is named
    (or, where the caller can go on without it, WorkersLost with the dead workers' ranks).
    `on_death` runs first when an actor died: what waits for it must stop waiting before the
    others are asked whether they are alive."""
    try:
        return ray.get(refs, timeout=STEP_TIMEOUT_S)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, UserError):
            raise UserError(str(e.cause)) from None
        raise RunFailed(f"{owner} failed while {doing}: {str(e.cause).splitlines()[0]}") from None
    except ray.exceptions.RayActorError:
        if on_death:
            on_death()
        dead = dead_ranks(actors)
        if dead and survivable:
            raise WorkersLost(dead) from None
        who = f"worker '{specs[dead[0]]['name']}'" if dead else "the parameter server"
        raise RunFailed(f"{owner}: {who} died while {doing}") from None
    except ray.exceptions.GetTimeoutError:
        raise RunFailed(f"{owner}: no answer from the workers while {doing}") from None


def _discard(refs: list) -> None:
    """Read a failed step's results once, so Ray does not report their errors as unhandled."""
    for ref in refs:
        _succeeded(ref)


def _succeeded(ref) -> bool:
    """Whether a call returned (rather than failed), waiting for it to settle."""
    try:
        ray.get(ref, timeout=STEP_TIMEOUT_S)
        return True
    except Exception:  # its failure is the question asked
        return False


def dead_ranks(actors: list) -> list[int]:
    """The ranks of the actors that no longer answer."""
    dead = []
    for rank, actor in enumerate(actors):
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=STEP_TIMEOUT_S)
        except ray.exceptions.RayActorError:
            dead.append(rank)
        except ray.exceptions.GetTimeoutError:  # alive but busy past any step: not known to be dead
            pass
    return dead


class RayParameterServerAsync(RayParameterServer):
    """ray-ps with bounded staleness: the server applies each gradient as it arrives.

    Differs from ray-ps in (2)/(3): no barrier. A finished worker's gradient is applied at once,
    scaled by its batch share, and the worker restarts from the newest weights, unless it is more
    than `max_staleness` versions ahead of the slowest worker still computing: then it waits.
    """

    name = "ray-ps-async"
    uses_host_memory = False  # the server writes while other workers read: each needs its own copy
    floor_transfers = None  # no barrier: transfers overlap other workers' compute
    resumable = False       # gradients in flight at a checkpoint would be lost: not built yet

    def reset(self, seed: int) -> None:
        self._drain()
        super().reset(seed)
        self.version = 0
        self.next_batch = [0] * len(self.workers)   # each worker reads its own stream of slices
        self.in_flight: dict = {}                   # gradient ref -> (rank, version it started from, compute ref)
        self.parked: list[int] = []
        self.staleness = getattr(self, "staleness", [])
        for rank in range(len(self.workers)):
            self._submit(rank)

    def _submit(self, rank: int) -> None:
        grad, compute = self.workers[rank].compute.options(num_returns=2).remote(self.weights_ref,
                                                                                 self.next_batch[rank])
        self.next_batch[rank] += 1
        self.in_flight[grad] = (rank, self.version, compute, self.batches[rank])

    def step(self, step: int, then: int | None = None) -> StepTiming:
        start, applied = now(), 0
        computes: dict[str, list[float]] = {w["name"]: [] for w in self.info}
        waited = 0.0
        while applied < self.cfg["batch_size"]:
            # (1) whichever worker finishes first ...
            ready, _ = ray.wait(list(self.in_flight), num_returns=1, timeout=STEP_TIMEOUT_S)
            if not ready:
                raise RunFailed(f"{self.name}: no worker finished a batch at step {step}")
            rank, started_at, compute_ref, batch = self.in_flight.pop(ready[0])
            try:
                computes[self.info[rank]["name"]].append(self._get([compute_ref], f"step {step}", survivable=True)[0])
            except WorkersLost as e:  # its gradient never came: go on with the others
                _discard([ready[0]])
                self._lose(e.ranks, step)
                continue
            # (2) (3) ... has its gradient applied at once, scaled by its share of the global batch
            share = batch / self.cfg["batch_size"]  # the batch it computed on, even if re-split since
            self.weights_ref, _ = self.server.apply.options(num_returns=2).remote([share], ready[0])
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
        return StepTiming(compute_s, comm_s=max(0.0, total - max(compute_s.values())), wait_s=waited,
                          total_s=total)

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
        return self.version - oldest > self.cfg["max_staleness"]

    def record_extras(self) -> dict:
        counts: dict[int, int] = {}
        for s in self.staleness:
            counts[s] = counts.get(s, 0) + 1
        ordered = sorted(self.staleness)
        return {**super().record_extras(), "staleness": {"histogram": dict(sorted(counts.items())), "max": max(ordered, default=0),
                              "median": ordered[len(ordered) // 2] if ordered else 0,
                              "max_allowed": self.cfg["max_staleness"]}}

    def _drain(self) -> None:
        """Let a previous repeat's in-flight batches finish before the models are replaced."""
        pending = list(getattr(self, "in_flight", {}))
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=60)
