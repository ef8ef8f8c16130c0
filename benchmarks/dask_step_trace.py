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

import argparse
import json
import time
from statistics import median

from ps_step_trace import hops
from script_cluster import cluster_of, run_script

from hetbench.cluster.ray_connection import use_ray_defaults
from hetbench.errors import UserError

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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-c", "--config", default="benchmarks/configs/hetero-local.yaml", help="a run config (default: %(default)s)"
    )
    parser.add_argument("--set", action="append", default=[], help="key=value, as `hetbench run --set`")
    parser.add_argument("--steps", type=int, default=40, help="steps traced (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out (default: %(default)s)")
    parser.add_argument("--out", default=None, help="where to write the JSON record (default: print only)")
    args = parser.parse_args()
    if args.steps < args.warmup + 3:
        raise UserError("--steps must leave at least 3 steps after --warmup")
    use_ray_defaults()  # as the CLI does, before Ray is imported (the cluster's Ray nodes start too)
    from hetbench.config import load_config
    from hetbench.floor import measure_floor
    from hetbench.gradients import count_parameters
    from hetbench.results.records import environment
    from hetbench.strategies import registry
    from hetbench.workload import Net

    # hetero-local's auto split, as its runs settle it (the runner's standalone timings are not here)
    split = ["balance=[equal]", "workers.0.batch=192", "workers.1.batch=64"]
    cfg = load_config(args.config, [*split, *args.set], registry.declared())
    with cluster_of(cfg) as cfg:
        worker, server, timings, far = trace(cfg, args.steps)
        _, ps = measure_floor(cfg.floor, cfg.cluster, cfg.workers, cfg.link, count_parameters(Net()))
    seconds = hops(worker, server, args.warmup, HOPS)
    overhead = median(t.sync_overhead_s for t in timings[args.warmup :])
    print(f"dask-sync, {cfg.workers[far].name}'s hops (median of {len(server) - 1 - args.warmup} steps, ms):")
    for label, values in seconds.items():
        print(f"  {label:36s} {median(values) * 1000:8.2f}")
    print(f"  {'sync overhead (the driver)':36s} {overhead * 1000:8.2f}")
    print(f"  {'ps-floor (no Dask call)':36s} {ps['roundtrip_s'] * 1000:8.2f}  CV {ps['roundtrip_cv']:.0%}")
    if args.out:
        record = {
            "hops_s": seconds,
            "sync_overhead_s": [t.sync_overhead_s for t in timings],
            "ps_floor": ps,
            "far_worker": cfg.workers[far].name,
            "env": environment(),
            "config": cfg.as_dict(),
        }
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1, default=str)


if __name__ == "__main__":
    run_script(main)
