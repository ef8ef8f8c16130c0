"""The cluster seam on Ray: one actor per worker, pinned to the node advertising its label."""

from __future__ import annotations

import ray

from hetbench.cluster.placed import Placed
from hetbench.cluster.ray_connection import connect, on_driver_node, placement
from hetbench.errors import RunFailed, UserError, WorkersLost


def _node(_actor) -> dict:
    return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address()}


class RayPlaced(Placed):
    def start(self, role: type, coordinator: type | None) -> None:
        self.timeout_s = self.cfg["cluster"]["step_timeout_s"]
        self.joined = bool(self.cfg["cluster"]["ray_address"])
        self.connection = connect(self.cfg)
        self.driver_node = ray.get_runtime_context().get_node_id()
        self.coordinator = ray.remote(coordinator).options(**on_driver_node()).remote() if coordinator else None
        self.actors = [ray.remote(role).options(**placement(spec)).remote() for spec in self.specs]

    def setup(self) -> list[dict]:
        info = super().setup()
        nodes = self.results([a.__ray_call__.remote(_node) for a in self.actors], "setting up")
        for i, node in zip(info, nodes):
            i.update(node)
        return info

    def call(self, rank: int, method: str, *args, returns: int = 1, **kwargs):
        return getattr(self.actors[rank], method).options(num_returns=returns).remote(*args, **kwargs)

    def coordinator_call(self, method: str, *args, returns: int = 1, **kwargs):
        return getattr(self.coordinator, method).options(num_returns=returns).remote(*args, **kwargs)

    def results(self, handles: list, doing: str, survivable: bool = False) -> list:
        try:
            return ray.get(handles, timeout=self.timeout_s)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, UserError):
                raise UserError(str(e.cause)) from None
            raise RunFailed(f"{self.owner} failed while {doing}: {str(e.cause).splitlines()[0]}") from None
        except ray.exceptions.RayActorError:
            if self.on_death:
                self.on_death()
            dead = self._dead_ranks()
            if dead and survivable:
                raise WorkersLost(dead) from None
            who = f"worker '{self.specs[dead[0]]['name']}'" if dead else self.coordinator_name
            raise RunFailed(f"{self.owner}: {who} died while {doing}") from None
        except ray.exceptions.GetTimeoutError:
            raise RunFailed(
                f"{self.owner}: no answer from the workers within {self.timeout_s:g} s while {doing}"
            ) from None

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
        if getattr(self, "connection", None):
            if self.connection.kept:  # the run's Ray stays up: this row's processes must not
                for actor in [*self.actors, *([self.coordinator] if self.coordinator else [])]:
                    ray.kill(actor, no_restart=True)
            self.connection.release()
            self.connection = None
