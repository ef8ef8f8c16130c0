"""The cluster seam: one process per configured worker, each on the node its placement label names.

A strategy that computes on remote workers asks `place(cluster, workers, role, owner, job)` for
them and then talks to them only through `Placed`: call a method of the role in one worker's
process, wait for results (errors in one sentence), kill one, drop a lost one, close. The role is a
plain class (strategies/replica.py): its `setup(job, rank, threads)` runs first, in the worker's own
process, on its own node, so the device is resolved where the math runs. The seam reads the
cluster's section and the workers, nothing else: the job is the role's (a row's config, the floor's
workers), carried through unread. A parameter server's coordinator can come along: it runs on the
driver's node (a Ray actor there, or this very process under Dask).

Launchers: Ray actors (ray_placed.py) and Dask actors (dask_placed.py). A strategy outside both
(plain torch.distributed, say) takes Ray's: its processes are placed like any worker's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from hetbench.config import ClusterConfig, WorkerConfig
from hetbench.workload import check_same_workload


class Placed(ABC):
    """The live workers' processes in rank order; rank r runs configured worker `specs[r]`."""

    joined: bool = False  # the workers share a cluster someone else started (their cores too)
    coordinator_name = "the parameter server"

    def __init__(
        self, cluster: ClusterConfig, workers: tuple[WorkerConfig, ...], owner: str, ranks: list[int] | None = None
    ) -> None:
        self.cluster, self.workers, self.owner = cluster, workers, owner
        # which configured workers get a process (all by default; a reference row takes one or two)
        self.ranks = list(range(len(workers))) if ranks is None else list(ranks)
        self.specs = [workers[r] for r in self.ranks]
        self.info: list[dict] = []
        self.on_death = None  # called first when a process died: whatever waits on it must stop

    def setup(self, job) -> list[dict]:
        """Every worker's role set up in its process with `job` (whatever that role's setup takes):
        name, device as resolved there, node, batch, ...

        Each gets the threads its worker has in the whole run, placed alone or not: a reference
        row measures a machine on the budget it brings to the distributed rows."""
        threads = [workers_per_host(self.cluster, self.workers, spec, self.joined) for spec in self.specs]
        self.info = self.results(
            [self.call(i, "setup", job, rank, threads[i]) for i, rank in enumerate(self.ranks)], "setting up"
        )
        check_same_workload(self.info)
        return self.info

    def each(self, method: str, args: list[tuple], doing: str) -> list:
        """`method` called in every worker's process with its own args; their results in rank order."""
        return self.results([self.call(rank, method, *a) for rank, a in enumerate(args)], doing)

    @abstractmethod
    def call(self, rank: int, method: str, *args, returns: int = 1, **kwargs):
        """Start `method` in worker `rank`'s process; a handle for its result (a tuple of `returns` handles)."""

    @abstractmethod
    def coordinator_call(self, method: str, *args, returns: int = 1, **kwargs):
        """As `call`, on the coordinator (on the driver's node)."""

    @abstractmethod
    def results(self, handles: list, doing: str, survivable: bool = False) -> list:
        """The handles' values. Bad input stays UserError; a lost worker is RunFailed naming it or,
        where `survivable`, WorkersLost with the lost ranks."""

    @abstractmethod
    def succeeded(self, handle) -> bool:
        """Whether a call returned rather than failed, waiting for it to settle (bounded)."""

    @abstractmethod
    def on_driver_host(self, rank: int) -> bool:
        """Whether worker `rank` runs on the driver's own machine (it can map the driver's shared memory)."""

    @abstractmethod
    def kill(self, rank: int) -> None:
        """Fault injection: end worker `rank`'s process for real, as a lost machine would."""

    def drop(self, rank: int) -> None:
        """Forget lost worker `rank`; the ranks above move down one."""
        del self.ranks[rank], self.specs[rank], self.info[rank]

    @abstractmethod
    def close(self) -> None:
        """Stop what this started; idempotent, on every exit path."""


def workers_per_host(
    cluster: ClusterConfig, workers: tuple[WorkerConfig, ...], worker: WorkerConfig, joined_cluster: bool
) -> int:
    """How many training processes share this worker's host (they split its cores).

    Locally all of them (local-multinode's nodes share one box too, unless each is pinned to cores
    of its own); in a joined cluster those placed on the same labelled node.
    """
    if not joined_cluster or (cluster.mode == "local-multinode" and not cluster.pin_nodes):
        return len(workers)
    return sum(1 for w in workers if w.node == worker.node)
