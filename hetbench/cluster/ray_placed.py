"""The cluster seam on Ray: one actor per worker, pinned to the node advertising its label; within a
run, a process an earlier row started there (ray_hosts.py)."""

from __future__ import annotations

import ray

from hetbench.cluster.placed import Placed
from hetbench.cluster.ray_connection import connect, on_driver_node, placement
from hetbench.config import ClusterConfig, WorkerConfig
from hetbench.errors import RunFailed, UserError, WorkersLost


def _node(_actor) -> dict:
    return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address()}


CAUSES_WAIT_S = 10.0  # how long the other calls of a failed batch may take to say their own reasons
DRIVER_NODE = "the driver's node"  # where a coordinator's host runs, as the pool files it


class RayPlaced(Placed):
    def __init__(
        self, cluster: ClusterConfig, workers: tuple[WorkerConfig, ...], owner: str, ranks: list[int] | None = None
    ) -> None:
        super().__init__(cluster, workers, owner, ranks)
        self.timeout_s = cluster.step_timeout_s
        self.joined = bool(cluster.ray_address)
        self.connection = None  # Ray, joined or started (ray_connection.connect), once started
        self.driver_node: str | None = None  # the Ray node this process runs on, once started
        self.actors: list = []  # the workers' host actors, in rank order
        self.coordinator = None  # the parameter server's host actor, on the driver's node
        self.failed = False  # a call failed the row: its processes' state is unknown, none is kept

    def start(self, role: type, coordinator: type | None) -> None:
        self.connection = connect(self.cluster, self.workers)
        self.driver_node = ray.get_runtime_context().get_node_id()
        pool = self.connection.hosts
        self.coordinator = pool.take(DRIVER_NODE, on_driver_node()) if coordinator else None
        self.actors = [pool.take(spec.node, placement(spec)) for spec in self.specs]
        # a fresh role object in each: nothing of an earlier row's is left in it
        roles = [(a, role) for a in self.actors] + ([(self.coordinator, coordinator)] if coordinator else [])
        self.results([host.become.remote(r) for host, r in roles], "starting")

    def setup(self, job) -> list[dict]:
        info = super().setup(job)
        nodes = self.results([a.__ray_call__.remote(_node) for a in self.actors], "setting up")
        for i, node in zip(info, nodes):
            i.update(node)
        return info

    def call(self, rank: int, method: str, *args, returns: int = 1, **kwargs):
        return self.actors[rank].invoke.options(num_returns=returns).remote(method, *args, **kwargs)

    def coordinator_call(self, method: str, *args, returns: int = 1, **kwargs):
        return self.coordinator.invoke.options(num_returns=returns).remote(method, *args, **kwargs)

    def results(self, handles: list, doing: str, survivable: bool = False) -> list:
        try:
            return self._results(handles, doing, survivable)
        except WorkersLost:  # the row goes on without them: the others are sound
            raise
        except BaseException:
            self.failed = True
            raise

    def _results(self, handles: list, doing: str, survivable: bool) -> list:
        try:
            return ray.get(handles, timeout=self.timeout_s)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, UserError):
                raise UserError(str(e.cause)) from None
            raise RunFailed(f"{self.owner} failed while {doing}: {'; '.join(self._causes(handles, e))}") from None
        except ray.exceptions.RayActorError:
            if self.on_death:
                self.on_death()
            dead = self._dead_ranks()
            if dead and survivable:
                raise WorkersLost(dead) from None
            who = f"worker '{self.specs[dead[0]].name}'" if dead else self.coordinator_name
            raise RunFailed(f"{self.owner}: {who} died while {doing}") from None
        except ray.exceptions.GetTimeoutError:
            raise RunFailed(
                f"{self.owner}: no answer from the workers within {self.timeout_s:g} s while {doing}"
            ) from None

    def _causes(self, handles: list, first: ray.exceptions.RayTaskError) -> list[str]:
        """Each failed call's reason, the first raised first: where ranks fail together (a group
        that never forms) the one that broke it is often not the first to say so. The others are
        given CAUSES_WAIT_S to settle."""
        causes = [str(first.cause).splitlines()[0]]
        if len(handles) < 2:
            return causes
        ready, _ = ray.wait(handles, num_returns=len(handles), timeout=CAUSES_WAIT_S)
        for handle in ready:
            try:
                ray.get(handle, timeout=0)
            except ray.exceptions.RayTaskError as e:
                cause = str(e.cause).splitlines()[0]
                if cause not in causes:
                    causes.append(cause)
            except Exception:  # lost or still running: the first reason stands
                pass
        return causes

    def succeeded(self, handle) -> bool:
        try:
            ray.get(handle, timeout=self.timeout_s)
            return True
        except Exception:  # its failure is the question asked
            return False

    def _dead_ranks(self) -> list[int]:
        """The ranks of the actors that no longer answer (one busy past any step is not known dead)."""
        dead = []
        for rank, actor in enumerate(self.actors):
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=self.timeout_s)
            except ray.exceptions.RayActorError:
                dead.append(rank)
            except ray.exceptions.GetTimeoutError:
                pass
        return dead

    def on_driver_host(self, rank: int) -> bool:
        return self.info[rank]["node_id"] == self.driver_node

    def kill(self, rank: int) -> None:
        ray.kill(self.actors[rank], no_restart=True)

    def drop(self, rank: int) -> None:
        super().drop(rank)
        del self.actors[rank]

    def close(self) -> None:
        if self.connection:
            if self.connection.kept:  # the run's Ray stays up: its hosts serve the next row
                hosts = [(spec.node, a) for spec, a in zip(self.specs, self.actors)]
                if self.coordinator:
                    hosts.append((DRIVER_NODE, self.coordinator))
                if self.failed:  # e.g. a gloo group half formed: the next row starts afresh
                    self.connection.hosts.discard(hosts)
                else:
                    self.connection.hosts.give_back(hosts)
            self.connection.release()
            self.connection = None
