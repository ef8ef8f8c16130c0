"""Ray parameter server: single.py's loop with (1) on Ray actors, one per worker on its labelled
node, and (2)(3) on a server actor on the driver's node (the shared driver: parameter_server.py).

What is Ray's own here: how a flat buffer travels between nodes. Across nodes each buffer goes
through Ray's object store, put once by the process that made it (inside a list, so Ray passes
the reference rather than the value) and read zero-copy by the others; a call given the weights'
reference starts once they exist, so the next step's calls queue before the update (4).
Workers on the server's node use shared memory instead (the driver's).
"""

from __future__ import annotations

import ray

from hetbench.strategies.parameter_server import ParameterServerDriver
from hetbench.strategies.roles import ParameterServer, Replica


class RayReplica(Replica):
    def compute(self, weights: list | None, step: int, ticket: int | None = None, after: int | None = None):
        # (2a) the weights from the object store (in shared memory: already there)
        grad, compute_s = super().compute(None if self.shared else ray.get(weights[0]), step, ticket, after)
        # (2b) my gradient into the object store, put by me; in shared memory its slot's number
        return [grad if self.shared else ray.put(grad)], compute_s


class RayServer(ParameterServer):
    object_store = True  # whether any worker reads the weights from the object store

    def shared_by_all(self, by_value: bool = True) -> None:
        super().shared_by_all(by_value)
        self.object_store = by_value

    def reset(self, cfg: dict, seed: int) -> list:
        return self._put(super().reset(cfg, seed))

    def load_state(self, state: dict) -> list:
        return self._put(super().load_state(state))

    def apply(self, shares: list[float], *grads, ticket: int | None = None):
        # (2c) the gradients: [reference] lists from the object store, or slots of shared memory
        grads = [g[0] if isinstance(g, list) else g for g in grads]
        refs = [g for g in grads if isinstance(g, ray.ObjectRef)]
        fetched = dict(zip(refs, ray.get(refs)))
        weights, update_s = super().apply(shares, *[fetched.get(g, g) for g in grads], ticket=ticket)
        return self._put(weights), update_s

    def _put(self, weights) -> list:
        return [ray.put(weights) if self.object_store else None]


class RayParameterServer(ParameterServerDriver):
    name = "ray-ps"
    via = "ray"
    replica, server = RayReplica, RayServer
    by_value = "object store"
