"""Dask synchronous data parallelism: single.py's loop with (1) on Dask actors, one per worker on
its own Dask worker, and (2)(3) here, on the client (the shared driver: parameter_server.py).

What is Dask's own here: the server is this process, so a step sends each worker off this host
the new weights by value and gets its gradient back over TCP before the update; workers on this
host leave theirs in shared memory and answer once the update is done. Actors, not tasks: the
task path (scatter, submit, gather) costs several times their overhead per step (docs/design.md).
"""

from __future__ import annotations

from hetbench.clock import now
from hetbench.cluster.dask_placed import Done
from hetbench.errors import WorkersLost
from hetbench.strategies.parameter_server import ParameterServerDriver
from hetbench.strategies.replica import Replica


class DaskReplica(Replica):
    def compute(self, weights, step: int, ticket: int | None = None, after: int | None = None):
        answer = super().compute(weights, step, ticket, after)
        if ticket is not None:
            # answer once the update is done: an answer reaching the client while it updates takes the
            # GIL from the update (the client's event loop thread reads it)
            self.shared.wait_weights(ticket)
        return answer


class DaskSync(ParameterServerDriver):
    name = "dask-sync"
    via = "dask"
    replica = DaskReplica
    by_value = "tcp"
    calls_wait_for_weights = False  # a call is sent the weights themselves, once `_apply` made them

    def _apply(self, grads: list, ticket: int | None) -> tuple:
        # (2b) the gradients sent by value first: the server is this process
        by_value = iter(
            self.placed.results([g for g in grads if not isinstance(g, int)], "gathering gradients", survivable=True)
        )
        grads = [g if isinstance(g, int) else next(by_value) for g in grads]
        # (2c) (3) the sample-weighted rule and the optimizer step, here; the slots are waited for
        deadline = now() + self.job.cluster.step_timeout_s
        weights, update = self.placed.coordinator.apply(
            self.shares, *grads, ticket=ticket, check=lambda: self._check(ticket, deadline)
        )
        return Done(weights), Done(update)

    def _check(self, ticket: int, deadline: float) -> None:
        """While the server waits in shared memory: a call that failed, or whose worker the scheduler
        dropped, ends the wait (WorkersLost); so does a gradient not in by the step timeout."""
        self.placed.results(
            [c[1] for c in self.calls if self.placed.settled(c[1])], "waiting for a gradient", survivable=True
        )
        if now() > deadline:
            raise WorkersLost(
                [r for r, slot in enumerate(self.slots) if slot is not None and not self.host.gradient_in(slot, ticket)]
            )
