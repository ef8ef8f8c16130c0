"""Where a dask-sync step's time goes beyond its workers' compute: each hop of one step, timed.

    python benchmarks/dask_step_trace.py [-c CONFIG] [--set key=value ...] [--steps 40] [--out FILE]

ps_step_trace.py's counterpart for dask-sync, whose server is the client itself. Its roles stamp
each hop on the host's monotonic clock (the emulated nodes share this host). For the worker off
the client's node (weights and gradient by value, over Dask's TCP) and the step:

    computed -> answered        its gradient made ready to send (the wire dtype)
    answered -> gathered        Dask: the call's answer, the gradient in it, to the client
    gathered -> updating        the gradients of the workers in shared memory waited for
    updating -> updated         combined, the optimizer step (single's work too), published
    updated -> next sent        the client ends the step and sends the next call, weights in it
    next sent -> next called    Dask: the call, the weights in it, to the worker
    next called -> next computing  the weights loaded

Beside them, in the same run, the ps-floor (the model up and back down a direct TCP channel, no
Dask call). Medians over the steps after `--warmup`.
"""

from __future__ import annotations

import time

from ps_step_trace import traced_main
from script_cluster import run_script

HOPS = [
    ("computed", "answered", "gradient made ready to send"),
    ("answered", "gathered", "Dask: the gradient to the client"),
    ("gathered", "updating", "shared-memory gradients waited for"),
    ("updating", "updated", "combine + optimizer step, published"),
    ("updated", "next_sent", "the step ends, the next call sent"),
    ("next_sent", "next_called", "Dask: the call, weights in it, over"),
    ("next_called", "next_computing", "weights loaded"),
]


def traced_strategy():
    """dask-sync with the far worker, the client and its server stamping their hops."""
    from hetbench.strategies.dask_sync import DaskReplica, DaskSync
    from hetbench.strategies.roles import ParameterServer

    class TracedReplica(DaskReplica):
        marks: dict  # step -> {hop: stamp}

        def reset(self, seed: int) -> None:
            super().reset(seed)
            self.marks = {}

        def compute(self, weights, step: int, ticket: int | None = None, after: int | None = None):
            self.marks[step] = {"called": time.perf_counter()}
            out = super().compute(weights, step, ticket, after)
            self.marks[step]["answered"] = time.perf_counter()
            return out

        def local_step(self, step: int) -> float:
            self.marks[step]["computing"] = time.perf_counter()
            seconds = super().local_step(step)
            self.marks[step]["computed"] = time.perf_counter()
            return seconds

        def traced(self) -> dict:
            return self.marks

    class TracedServer(ParameterServer):
        marks: list  # per update, in step order: {hop: stamp}

        def reset(self, job, seed: int):
            self.marks = []
            return super().reset(job, seed)

        def apply(self, shares, *grads, ticket=None, check=None):
            self.marks.append({"gathered": time.perf_counter()})
            weights, update = super().apply(shares, *grads, ticket=ticket, check=check)
            self.marks[-1].update(updating=self.marks[-1]["updated"] - update.seconds, optimizer_s=update.optimizer_s)
            return weights, update

        def _published(self, ticket):
            weights = super()._published(ticket)
            self.marks[-1]["updated"] = time.perf_counter()
            return weights

    class Traced(DaskSync):
        replica, server = TracedReplica, TracedServer
        sent: dict  # rank -> {step: when its call was sent}

        def _compute(self, rank: int, step: int, ticket: int, after: int | None = None) -> tuple:
            self.sent.setdefault(rank, {})[step] = time.perf_counter()
            return super()._compute(rank, step, ticket, after)

    return Traced


def trace(cfg, steps: int) -> tuple[dict, list[dict], list, int]:
    """`steps` steps of the traced dask-sync, as the runner runs them: the far worker's stamps (with
    the client's sends), the server's, the driver's step timings, and the far worker's rank."""
    strategy = traced_strategy()(cfg.job("dask-sync"))
    strategy.sent = {}
    try:
        strategy.start()
        far = [r for r, slot in enumerate(strategy.slots) if slot is None]
        if not far:
            raise SystemExit("every worker shares the client's memory: nothing crosses a link to trace")
        strategy.reset(cfg.run.seed)
        timings = [strategy.step(step, step + 1 if step + 1 < steps else None) for step in range(steps)]
        (worker,) = strategy.placed.results([strategy.placed.call(far[0], "traced")], "reading the trace")
        for step, sent in strategy.sent[far[0]].items():
            worker[step]["sent"] = sent
        return worker, strategy.placed.coordinator.marks, timings, far[0]
    finally:
        strategy.close()


def main() -> None:
    traced_main(__doc__, "dask-sync", lambda cfg, args: trace(cfg, args.steps), HOPS)


if __name__ == "__main__":
    run_script(main)
