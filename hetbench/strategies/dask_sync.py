"""Dask synchronous data parallelism: single.py's loop with (1) on Dask workers, (2)(3) on the client.

Each configured worker maps to one Dask worker, which holds a model replica and its data
between steps as a Dask actor (Replica, as in ray-ps). Actor calls go straight from the client
to the worker (direct_to_workers: relayed by the scheduler, the overhead per step was ~40% more
here): a step sends each worker the new flat weights, gets its flat gradient back, and the
client applies the shared sample-weighted rule and the optimizer (ParameterServer, in-process).
Workers on this host (not behind an emulated link) exchange both buffers through shared memory
instead (host_memory.py), and hand the turn to and from the client through its counters: the next
step's calls are queued before the update (4), so no Dask message lies between two steps.
Measured here, the task path (scatter with broadcast=True, submit, gather) cost about 3x the
actors' overhead per step.
"""
from __future__ import annotations

import ipaddress
import logging
import socket

import torch

from hetbench.cluster.addresses import check_reachable
from hetbench.strategies.base import StepTiming, Strategy, quiet_loggers, workers_per_host
from hetbench.clock import now
from hetbench.errors import RunFailed, UserError, WorkersLost
from hetbench.gradients import batch_shares
from hetbench.transport.host_memory import HandsOff, HostBuffers
from hetbench.cluster.multinode import placement_labels
from hetbench.cluster.nodes import dask_workers
from hetbench.strategies.roles import ParameterServer, Replica

LOSS_POLL_S = 0.5  # while a call is unanswered, how often the scheduler is asked whether its worker is gone


class DaskReplica(Replica):
    def compute(self, weights, step: int, ticket: int | None = None, after: int | None = None):
        answer = super().compute(weights, step, ticket, after)
        if ticket is not None:
            # answer once the update is done: an answer reaching the client while it updates takes the
            # GIL from the update (the client's event loop thread reads it)
            self.shared.wait_weights(ticket)
        return answer


class DaskSync(Strategy, HandsOff):
    name = "dask-sync"
    floor_transfers = 2.0
    survives_worker_loss = True
    resumable = True
    rebalances = True

    def start(self) -> None:
        from distributed import Client, LocalCluster

        quiet_loggers("distributed")
        workers, cluster = self.cfg["workers"], self.cfg["cluster"]
        self.batches = [w["batch"] for w in workers]
        self.shares = batch_shares(self.batches)
        self.local = None
        if cluster["dask_scheduler"]:
            check_reachable(cluster["dask_scheduler"], cluster["connect_timeout_s"])
            self.client = Client(cluster["dask_scheduler"], timeout=cluster["connect_timeout_s"], direct_to_workers=True)
        else:
            # One single-threaded worker process per configured worker, on loopback, no dashboard.
            self.local = LocalCluster(n_workers=len(workers), threads_per_worker=1, processes=True,
                                      host="127.0.0.1", dashboard_address=None, silence_logs=logging.CRITICAL)
            self.client = Client(self.local, direct_to_workers=True)
        self.addresses = self._place(workers)
        joined = bool(cluster["dask_scheduler"])
        self.replicas = self._results([self.client.submit(DaskReplica, actor=True, workers=[a], pure=False)
                                       for a in self.addresses], "placing replicas")
        self.info = self._results([r.setup(self.cfg, rank, workers_per_host(self.cfg, w, joined))
                                   for rank, (r, w) in enumerate(zip(self.replicas, workers))], "setting up")
        self.server = ParameterServer()
        self._share_host_memory()

    def _share_host_memory(self) -> None:
        """Workers on this host exchange weights and gradients through memory this process and they
        map, not through their sockets. In a one-box multi-node cluster only the head node's workers
        count as this host: the other nodes stand for other machines (as they do for ray-ps)."""
        head = placement_labels(self.cfg)[0] if self.cfg["cluster"]["mode"] == "local-multinode" else None
        local = [rank for rank, (address, worker) in enumerate(zip(self.addresses, self.cfg["workers"]))
                 if _on_this_host(address) and head in (None, worker["node"])]
        shared = self.server.share_with(self.cfg, len(local)) if local else None
        attached = self._results([self.replicas[r].attach(*shared, len(local), slot) for slot, r in enumerate(local)],
                                 "sharing memory") if shared else []
        self.server.shared_by_all()
        in_shared_memory = {rank for rank, ok in zip(local, attached) if ok}
        self.slots = [local.index(rank) if rank in in_shared_memory else None for rank in range(len(self.replicas))]
        for rank, info in enumerate(self.info):
            info["transport"] = "shared memory" if rank in in_shared_memory else "tcp"
        # the server is this process: it and the workers hand each other the turn through the file's counters
        self.host = self.server.shared if in_shared_memory and HostBuffers.can_hand_off() else None

    def _place(self, workers: list[dict]) -> list[str]:
        """A Dask worker address per configured worker, each its own: the first free one carrying the
        worker's label (joined clusters), else the first free one. Two replicas on one single-threaded
        Dask worker would take turns, and waiting in shared memory, wait on each other for good."""
        available = dask_workers(self.client)
        joined = bool(self.cfg["cluster"]["dask_scheduler"])
        carrying = {label: [a for a in sorted(available) if label in available[a].get("resources", {})]
                    for label in {w["node"] for w in workers if w["node"] and joined}}
        free, addresses = sorted(available), [None] * len(workers)
        # labelled workers first, so an unlabelled one never takes the Dask worker a label needs
        for rank in sorted(range(len(workers)), key=lambda r: not (workers[r]["node"] and joined)):
            label = workers[rank]["node"] if joined else None
            candidates = [a for a in free if a in carrying[label]] if label else free
            if not candidates:
                raise UserError(_too_few_dask_workers(label, carrying, workers, available))
            addresses[rank] = candidates[0]
            free.remove(candidates[0])
        return addresses

    def reset(self, seed: int) -> None:
        self.ahead = None  # (step, its ticket, {rank: compute call}) submitted before the step was called
        self.weights_now = self.server.reset(self.cfg, seed)
        self._results([r.reset(seed) for r in self.replicas], "resetting")

    def step(self, step: int, then: int | None = None) -> StepTiming:
        # a step submitted ahead began on the workers when the previous one ended, so it is timed from there
        start = self.ended if self.ahead and self.ahead[0] == step else now()
        while True:
            self.applied = None
            try:
                return self._step(step, start, then)
            except WorkersLost as e:
                self._give_up_hand_offs()
                self.ahead = None
                if self.applied is not None:  # (hand-off) every gradient was in and the update ran before the loss showed
                    self.ended = now()
                    timing = StepTiming.synchronous(self._survivors_computes(), self.ended - start, self.applied)
                    self._lose(e.ranks, step)
                    return timing
                self._lose(e.ranks, step)  # nothing was applied yet: redo the step with the survivors

    def _step(self, step: int, start: float, then: int | None) -> StepTiming:
        # (2a) (1) every worker gets the new weights as one flat buffer (or reads them in shared
        # memory) and computes on its own batch with its resident replica
        ticket, calls = self.ahead[1:] if self.ahead and self.ahead[0] == step else (self._next_ticket(), {})
        self.calls = [calls[rank] if rank in calls else self._call(rank, "compute", *self._compute_args(rank, step, ticket))
                      for rank in range(len(self.replicas))]
        # (2b) its flat gradient comes straight back, or is left in its slot of shared memory: then
        # the server waits on the slot's counter instead of on Dask (handed_off)
        handed_off = [self.host is not None and slot is not None for slot in self.slots]
        by_value = [rank for rank, h in enumerate(handed_off) if not h]
        returned = dict(zip(by_value, self._results([self.calls[r] for r in by_value], f"step {step}", True, by_value)))
        grads = [self.slots[rank] if h else returned[rank][0] for rank, h in enumerate(handed_off)]
        # (4) when the runner goes straight on, the next step's calls are queued now: a worker in
        # shared memory starts as soon as the new weights are there, with no round trip through here
        self.ahead = None
        if then is not None and self.host is not None:
            next_ticket = self._next_ticket()
            self.ahead = (then, next_ticket, {rank: self._call(rank, "compute", None, then, next_ticket, ticket)
                                              for rank, h in enumerate(handed_off) if h})
        # (3) the sample-weighted rule and the optimizer step, here on the client
        deadline = now() + self.cfg["cluster"]["step_timeout_s"]
        self.weights_now, self.applied = self.server.apply(
            self.shares, *grads, ticket=ticket if self.host else None, check=lambda: self._check_calls(ticket, deadline))
        compute = [c for _, c in self._results(self.calls, f"step {step}", survivable=True)]
        self.ended = now()
        return StepTiming.synchronous({w["name"]: c for w, c in zip(self.info, compute)}, self.ended - start,
                                      self.applied)

    def _compute_args(self, rank: int, step: int, ticket: int) -> tuple:
        """The weights by value, or none (they are in shared memory), and a ticket where handed off."""
        if self.slots[rank] is None:
            return (self.weights_now, step)
        return (None, step, ticket) if self.host else (None, step)

    def _check_calls(self, ticket: int, deadline: float) -> None:
        """While the server waits in shared memory: a call that failed, or whose worker the scheduler
        dropped or whose gradient is not in past the step timeout, ends the wait (as WorkersLost)."""
        workers = dask_workers(self.client)
        settled = [rank for rank, call in enumerate(self.calls)
                   if isinstance(call, Exception) or call.done() or self.addresses[rank] not in workers]
        self._results([self.calls[r] for r in settled], "waiting for a gradient", True, settled)  # raises if one failed
        if now() > deadline:
            raise WorkersLost([rank for rank, slot in enumerate(self.slots)
                               if slot is not None and not self.host.gradient_in(slot, ticket)])

    def _survivors_computes(self) -> dict[str, float]:
        computes = {}
        for rank, (info, call) in enumerate(zip(self.info, self.calls)):
            try:
                computes[info["name"]] = self._results([call], "", True, [rank])[0][1]
            except WorkersLost:  # its worker is the one lost
                pass
        return computes

    def state(self) -> dict:
        return self.server.state()

    def load_state(self, state: dict) -> None:
        self.weights_now = self.server.load_state(state)

    def kill_worker(self, name: str) -> None:
        rank = next(rank for rank, info in enumerate(self.info) if info["name"] == name)
        try:  # its process ends before it can answer
            self.replicas[rank].die().result(timeout=30)
        except Exception:  # OSError from the closed connection, or the timeout
            pass

    def _lose(self, ranks: list[int], step: int) -> None:
        """Forget the lost workers (highest rank first, so the others keep their places), re-split."""
        for rank in sorted(ranks, reverse=True):
            del self.replicas[rank], self.addresses[rank], self.slots[rank]
            self.lose_worker(rank, step)
        self.push_split()

    def push_split(self) -> None:
        self._results(self._calls("resplit", [(self.batches, rank) for rank in range(len(self.replicas))]), "re-splitting")

    def weights(self) -> torch.Tensor:
        return torch.from_numpy(self.weights_now.copy())

    def worker_info(self) -> list[dict]:
        peaks = self._results(self._calls("peak_rss_mb", [()] * len(self.replicas)), "reading memory")
        return ([dict(i, dask_worker=a, peak_rss_mb=p) for i, a, p in zip(self.info, self.addresses, peaks)]
                + [dict(i) for i in self.lost])

    def close(self) -> None:
        self._give_up_hand_offs()  # a call queued ahead must not keep its worker from closing
        self.replicas = []
        client = getattr(self, "client", None)
        if client is not None:
            client.close(timeout=10)
        if self.local is not None:
            self.local.close(timeout=10)

    def _calls(self, method: str, args: list[tuple]) -> list:
        return [self._call(rank, method, *a) for rank, a in enumerate(args)]

    def _call(self, rank: int, method: str, *args):
        """A replica's `method` called with `args`; where Dask already knows its worker lost, that error instead."""
        try:
            return getattr(self.replicas[rank], method)(*args)
        except RuntimeError as e:  # 'Worker holding Actor was lost'
            return e

    def _results(self, futures: list, doing: str, survivable: bool = False, ranks: list[int] | None = None) -> list:
        """Results, or one sentence: bad input stays bad input, a lost worker is named (or, where
        the caller can go on without it, WorkersLost with the lost workers' ranks). `ranks`: whose
        calls `futures` are, where not every worker's in rank order."""
        values, lost, failure = [], [], None
        deadline = now() + self.cfg["cluster"]["step_timeout_s"]  # silent past it: cut off, asleep, gone
        for rank, future in zip(ranks or range(len(futures)), futures):
            try:
                if isinstance(future, Exception):
                    raise future
                values.append(self._result(future, rank, deadline))
            except UserError:
                raise
            except Exception as e:  # a lost worker, or a task's own exception
                if _worker_gone(e):
                    lost.append(rank)
                else:
                    failure = failure or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if failure:
            raise RunFailed(f"{self.name} failed while {doing}: {failure}")
        if lost and survivable:
            raise WorkersLost(lost)
        if lost:
            raise RunFailed(f"{self.name} failed while {doing}: worker '{getattr(self, 'info', self.cfg['workers'])[lost[0]]['name']}' was lost")
        return values

    def _result(self, future, rank: int, deadline: float):
        """One call's result; TimeoutError at the deadline, or as soon as the scheduler has dropped
        the call's worker (a dead worker's port refuses new connections, which Dask retries for 30 s)."""
        while True:
            try:
                return future.result(timeout=max(0.1, min(LOSS_POLL_S, deadline - now())))
            except TimeoutError:
                if now() >= deadline or self.addresses[rank] not in dask_workers(self.client):
                    raise


def _on_this_host(address: str) -> bool:
    """Whether a worker's address belongs to this machine's own network (a worker behind an
    emulated link, inside its own namespace, does not): this process can bind to it."""
    from distributed.comm import get_address_host

    try:
        ip = ipaddress.ip_address(get_address_host(address))
        with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET) as probe:
            probe.bind((str(ip), 0))
        return True
    except (ValueError, OSError):  # a name (not resolved: that could wait on DNS), or not an address here
        return False


def _worker_gone(e: Exception) -> bool:
    """An actor call failed because its worker is gone or silent past the step timeout (measured:
    OSError while the connection breaks, then RuntimeError 'Worker holding Actor was lost';
    TimeoutError, an OSError too), not because of the task."""
    return isinstance(e, OSError) or "Worker holding Actor was lost" in str(e)


def _too_few_dask_workers(label: str | None, carrying: dict[str, list[str]], workers: list[dict],
                          available: dict[str, dict]) -> str:
    if label and not carrying[label]:
        advertised = {r for w in available.values() for r in w.get("resources", {})}
        return (f"no Dask worker advertises placement label '{label}' "
                f"(labels here: {', '.join(sorted(advertised)) or 'none'})")
    if label:
        wanted = sum(w["node"] == label for w in workers)
        return (f"{len(carrying[label])} Dask worker(s) advertise placement label '{label}' for {wanted} configured "
                f"workers: start one single-threaded Dask worker per configured worker")
    return (f"{len(available)} Dask worker(s) for {len(workers)} configured workers: start one single-threaded Dask "
            f"worker per configured worker")
