"""The cluster seam on Dask: one Dask actor per worker, each on its own single-threaded Dask worker
carrying the worker's label; the coordinator is this process.

Actor calls go straight from the client to the worker (direct_to_workers): relayed by the
scheduler, each step pays more overhead (docs/design.md).
"""

from __future__ import annotations

import ipaddress
import logging
import socket

from hetbench.clock import now
from hetbench.cluster.addresses import check_reachable
from hetbench.cluster.multinode import placement_labels
from hetbench.cluster.nodes import dask_workers
from hetbench.cluster.placed import Placed
from hetbench.config import ClusterConfig, WorkerConfig
from hetbench.errors import RunFailed, UserError, WorkersLost, quiet_loggers

LOSS_POLL_S = 0.5  # while a call is unanswered, how often the scheduler is asked whether its worker is gone


class Unanswered(Exception):
    """A call whose worker the scheduler still has did not answer by the deadline: busy or stuck, not lost.
    (Not TimeoutError: that is an OSError, which is how a lost worker's connection fails.)"""


class Done:
    """A value the coordinator (this process) already has, as a handle like the others."""

    def __init__(self, value) -> None:
        self.value = value


class Part:
    """Item `index` of what a Dask actor call on the worker at `address` returns (its future, or the
    error that stopped the call)."""

    def __init__(self, future, address: str, index: int | None = None) -> None:
        self.future, self.address, self.index = future, address, index


class DaskPlaced(Placed):
    def __init__(
        self, cluster: ClusterConfig, workers: tuple[WorkerConfig, ...], owner: str, ranks: list[int] | None = None
    ) -> None:
        super().__init__(cluster, workers, owner, ranks)
        self.joined = bool(cluster.dask_scheduler)
        self.client = None  # Dask's client, once started
        self.local = None  # the LocalCluster this started, where none was joined
        self.addresses: list[str] = []  # the Dask worker each rank's actor lives on, in rank order
        self.actors: list = []
        self.coordinator = None  # the coordinator's role, in this process, once started

    def start(self, role: type, coordinator: type | None) -> None:
        from distributed import Client, LocalCluster

        # tornado.application: Dask's sync wrapper, interrupted (Ctrl-C, SIGTERM) before its future
        # exists, logs its cancel callback's NameError as "Exception in callback" with a traceback
        quiet_loggers("distributed", "tornado.application")
        cluster = self.cluster
        if self.joined:
            check_reachable(cluster.dask_scheduler, cluster.connect_timeout_s)
            self.client = Client(cluster.dask_scheduler, timeout=cluster.connect_timeout_s, direct_to_workers=True)
        else:  # one single-threaded worker process per configured worker, on loopback, no dashboard
            self.local = LocalCluster(
                n_workers=len(self.specs),
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
                silence_logs=logging.CRITICAL,
            )
            self.client = Client(self.local, direct_to_workers=True)
        self.addresses = self._addresses()
        self.actors = self.results(
            [Part(self.client.submit(role, actor=True, workers=[a], pure=False), a) for a in self.addresses],
            "placing the workers",
        )
        self.coordinator = coordinator() if coordinator else None

    def setup(self, job) -> list[dict]:
        for i, address in zip(super().setup(job), self.addresses):
            i["dask_worker"] = address
        return self.info

    def _addresses(self) -> list[str]:
        """A Dask worker per configured worker, each its own: the first free one carrying the worker's
        label (joined clusters), else the first free one. Two replicas on one single-threaded Dask
        worker would take turns, and waiting in shared memory, wait on each other for good."""
        available = dask_workers(self.client)
        labels = [w.node if self.joined else None for w in self.specs]
        carrying = {
            label: [a for a in sorted(available) if label in available[a].get("resources", {})]
            for label in set(labels)
            if label
        }
        free, addresses = sorted(available), [None] * len(self.specs)
        for rank in sorted(range(len(labels)), key=lambda r: not labels[r]):  # labelled first
            candidates = [a for a in free if a in carrying[labels[rank]]] if labels[rank] else free
            if not candidates:
                raise UserError(_too_few_dask_workers(labels[rank], carrying, labels, available))
            addresses[rank] = candidates[0]
            free.remove(candidates[0])
        return addresses

    def call(self, rank: int, method: str, *args, returns: int = 1, **kwargs):
        args = [a.value if isinstance(a, Done) else a for a in args]
        try:
            future = getattr(self.actors[rank], method)(*args, **kwargs)
        except RuntimeError as e:  # 'Worker holding Actor was lost': Dask knows already
            future = e
        address = self.addresses[rank]
        return tuple(Part(future, address, i) for i in range(returns)) if returns > 1 else Part(future, address)

    def coordinator_call(self, method: str, *args, returns: int = 1, **kwargs):
        value = getattr(self.coordinator, method)(*args, **kwargs)
        return tuple(Done(v) for v in value) if returns > 1 else Done(value)

    def results(self, handles: list, doing: str, survivable: bool = False) -> list:
        values, lost, failure = [], [], None
        timeout_s = self.cluster.step_timeout_s
        deadline = now() + timeout_s  # silent past it: cut off, asleep, gone
        for handle in handles:
            try:
                values.append(self._value(handle, deadline))
            except UserError:
                raise
            except Unanswered:
                name = self.specs[self.addresses.index(handle.address)].name
                failure = failure or (
                    f"worker '{name}' did not answer within {timeout_s:g} s, though it is still connected "
                    "(busy or stuck, not lost: a slower machine may need a larger cluster.step_timeout_s)"
                )
            except Exception as e:  # a lost worker, or a call's own exception
                if isinstance(e, OSError) or "Worker holding Actor was lost" in str(e):
                    lost.append(self.addresses.index(handle.address))  # measured: OSError, then RuntimeError
                else:
                    failure = failure or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if failure:
            raise RunFailed(f"{self.owner} failed while {doing}: {failure}")
        lost = sorted(set(lost))  # a call's two parts name its worker twice
        if lost and survivable:
            raise WorkersLost(lost)
        if lost:
            raise RunFailed(f"{self.owner} failed while {doing}: worker '{self.specs[lost[0]].name}' was lost")
        return values

    def _value(self, handle, deadline: float):
        """One call's value; TimeoutError at the deadline, or as soon as the scheduler has dropped the
        call's worker (a dead worker's port refuses new connections, which Dask retries for 30 s)."""
        if isinstance(handle, Done):
            return handle.value
        if isinstance(handle.future, Exception):
            raise handle.future
        while True:
            try:
                value = handle.future.result(timeout=max(0.1, min(LOSS_POLL_S, deadline - now())))
                return value if handle.index is None else value[handle.index]
            except TimeoutError:
                if not self.alive(handle.address):
                    raise  # lost
                if now() >= deadline:
                    raise Unanswered() from None

    def alive(self, address: str) -> bool:
        """Whether the scheduler still has this Dask worker."""
        return address in dask_workers(self.client)

    def settled(self, handle) -> bool:
        """Whether waiting for the handle ends now: it is done, failed, or its worker is gone."""
        return (
            isinstance(handle, Done)
            or isinstance(handle.future, Exception)
            or handle.future.done()
            or not self.alive(handle.address)
        )

    def succeeded(self, handle) -> bool:
        try:
            self.results([handle], "")
            return True
        except Exception:  # its failure is the question asked
            return False

    def on_driver_host(self, rank: int) -> bool:
        """The worker's address is this machine's (a worker behind an emulated link, in its own namespace,
        is not). In a one-box multi-node cluster only the head node's workers count as this host: the
        other nodes stand for other machines (as they do for Ray)."""
        head = placement_labels(self.workers)[0] if self.cluster.mode == "local-multinode" else None
        return _bindable(self.addresses[rank]) and head in (None, self.specs[rank].node)

    def kill(self, rank: int) -> None:
        try:  # its process ends before it can answer
            self.actors[rank].die().result(timeout=30)
        except Exception:  # OSError from the closed connection, or the timeout
            pass

    def drop(self, rank: int) -> None:
        super().drop(rank)
        del self.actors[rank], self.addresses[rank]

    def close(self) -> None:
        self.actors = []
        if self.client is not None:
            self.client.close(timeout=10)
            self.client = None
        if self.local is not None:
            self.local.close(timeout=10)
            self.local = None


def _bindable(address: str) -> bool:
    """Whether this process can bind to the address's host: it belongs to this machine's own network."""
    from distributed.comm import get_address_host

    try:
        ip = ipaddress.ip_address(get_address_host(address))
        with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET) as probe:
            probe.bind((str(ip), 0))
        return True
    except (ValueError, OSError):  # a name (not resolved: that could wait on DNS), or not an address here
        return False


def _too_few_dask_workers(
    label: str | None, carrying: dict[str, list[str]], labels: list, available: dict[str, dict]
) -> str:
    if label and not carrying[label]:
        advertised = {r for w in available.values() for r in w.get("resources", {})}
        return (
            f"no Dask worker advertises placement label '{label}' "
            f"(labels here: {', '.join(sorted(advertised)) or 'none'})"
        )
    if label:
        return (
            f"{len(carrying[label])} Dask worker(s) advertise placement label '{label}' for {labels.count(label)} "
            "configured workers: start one single-threaded Dask worker per configured worker"
        )
    return (
        f"{len(available)} Dask worker(s) for {len(labels)} configured workers: start one single-threaded Dask "
        "worker per configured worker"
    )
