"""Where a ray-ps step's time goes beyond its workers' compute: each hop of one step, timed.

    python benchmarks/ps_step_trace.py [-c CONFIG] [--set key=value ...] [--steps 40] [--out FILE]

ray-ps's own roles, each hop stamped on the host's monotonic clock (one clock for every process:
the emulated nodes share this host, so the stamps of two processes compare). For the worker off
the server's node (its gradient and weights go over its direct channel) and the step:

    computed -> returned        its last gradient posted up its channel, the call's result back to Ray
    computed -> updating        its gradient up (posted during backward, parameter by parameter); the
                                update starts once every gradient is in
    updating -> updated         the gradients combined; the optimizer step (single's work too)
    updated -> server returned  the new weights posted down every channel
    server returned -> computing  its weights received and loaded, its next compute starts

Beside them, in the same run, the ps-floor (the model up and back down that same channel, no Ray
call): the least a parameter server's step can add. Medians over the steps after `--warmup`.
"""

from __future__ import annotations

import argparse
import json
import time
from statistics import median

import torch
from script_cluster import HETERO_LOCAL_SPLIT, cluster_of, run_script

from hetbench.cluster.ray_connection import use_ray_defaults
from hetbench.errors import UserError

HOPS = [
    ("computed", "returned", "gradient posted, call returns"),
    ("computed", "updating", "gradients in, update starts"),
    ("updating", "updated", "combine + optimizer step"),
    ("updated", "server_returned", "weights posted down"),
    ("server_returned", "next_computing", "weights received, loaded"),
]


def traced_strategy(server_threads: int | None):
    """ray-ps with its two roles stamping their hops (defined here, after Ray's defaults are set);
    the server's update on `server_threads` torch threads (None: as ray-ps sets them)."""
    from hetbench.strategies.ray_ps import RayParameterServer, RayReplica, RayServer

    class TracedReplica(RayReplica):
        marks: dict  # step -> {hop: stamp}

        def reset(self, seed: int) -> None:
            super().reset(seed)
            self.marks = {}

        def compute(self, weights, step: int, ticket: int | None = None, after: int | None = None):
            self.marks.setdefault(step, {})
            out = super().compute(weights, step, ticket, after)
            self.marks[step]["returned"] = time.perf_counter()
            return out

        def local_step(self, step: int) -> float:
            return self.stamped(step, lambda: super(TracedReplica, self).local_step(step))

        def streamed_step(self, step: int, send) -> float:
            return self.stamped(step, lambda: super(TracedReplica, self).streamed_step(step, send))

        def stamped(self, step: int, compute) -> float:
            self.marks[step]["computing"] = time.perf_counter()
            seconds = compute()
            self.marks[step]["computed"] = time.perf_counter()
            return seconds

        def traced(self) -> dict:
            return self.marks

    class TracedServer(RayServer):
        marks: list  # per update, in step order: {hop: stamp}
        putting = 0.0  # when the last update's weights began to go out

        def reset(self, job, seed: int) -> list:
            self.marks = []
            weights = super().reset(job, seed)
            if server_threads:
                torch.set_num_threads(server_threads)
            return weights

        def apply(self, shares, *grads, ticket=None):
            weights, update = super().apply(shares, *grads, ticket=ticket)
            self.marks.append(
                {
                    "updating": self.putting - update.seconds,
                    "updated": self.putting,
                    "server_returned": time.perf_counter(),
                    "optimizer_s": update.optimizer_s,
                }
            )
            return weights, update

        def _put(self, weights, posted: bool = False) -> list:
            self.putting = time.perf_counter()
            return super()._put(weights, posted)

        def traced(self) -> list:
            return self.marks

    class Traced(RayParameterServer):
        replica, server = TracedReplica, TracedServer

    return Traced


def trace(cfg, steps: int, server_threads: int | None) -> tuple[list[dict], list[dict], list, int]:
    """`steps` steps of the traced ray-ps, each queued before the last one ended as the runner does:
    every worker's stamps, the server's, the driver's step timings, and the rank off the server's node."""
    strategy = traced_strategy(server_threads)(cfg.job("ray-ps"))
    try:
        strategy.start()
        far = [r for r, direct in enumerate(strategy.direct) if direct]
        if not far:
            raise SystemExit("no worker has a direct channel to the server: nothing crosses a link to trace")
        strategy.reset(cfg.run.seed)
        timings = [strategy.step(step, step + 1 if step + 1 < steps else None) for step in range(steps)]
        calls = [strategy.placed.call(r, "traced") for r in range(len(strategy.info))]
        workers = strategy.placed.results(calls, "reading the traces")
        return workers, strategy._server("traced"), timings, far[0]
    finally:
        strategy.close()


def hops(worker: dict, server: list[dict], first: int, hop_list: list = HOPS) -> dict[str, list[float]]:
    """Each hop's seconds per step, from step `first` to the last but one (its next call is the next
    step's): `hop_list` of (stamp, stamp, label), a stamp of the worker's next step named next_*."""
    seconds: dict[str, list[float]] = {label: [] for _, _, label in hop_list}
    seconds.update({"compute (slowed)": [], "optimizer step": [], "gap between computes": []})
    for step in range(first, len(server) - 1):
        now, after = worker[step], worker[step + 1]
        stamps = {**now, **server[step], **{f"next_{k}": v for k, v in after.items()}}
        for start, end, label in hop_list:
            seconds[label].append(stamps[end] - stamps[start])
        seconds["compute (slowed)"].append(now["computed"] - now["computing"])
        seconds["optimizer step"].append(server[step]["optimizer_s"])
        seconds["gap between computes"].append(after["computing"] - now["computed"])
    return seconds


def traced_main(doc: str, name: str, trace, hop_list: list, *options) -> None:
    """A trace script's command line: `trace(cfg, args)` -> (the far worker's stamps, the server's,
    the step timings, the far rank) on the config's cluster, beside the ps-floor; the hops of
    `hop_list` printed (and kept with --out). `options`: (flags, add_argument's keywords) of its own."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument(
        "-c", "--config", default="benchmarks/configs/hetero-local.yaml", help="a run config (default: %(default)s)"
    )
    parser.add_argument("--set", action="append", default=[], help="key=value, as `hetbench run --set`")
    parser.add_argument("--steps", type=int, default=40, help="steps traced (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out (default: %(default)s)")
    for flags, keywords in options:
        parser.add_argument(*flags, **keywords)
    parser.add_argument("--out", default=None, help="where to write the JSON record (default: print only)")
    args = parser.parse_args()
    if args.steps < args.warmup + 3:
        raise UserError("--steps must leave at least 3 steps after --warmup")
    use_ray_defaults()  # as the CLI does, before Ray is imported (it reads them then): token auth
    from hetbench.config import load_config
    from hetbench.floor import measure_floor
    from hetbench.gradients import count_parameters
    from hetbench.results.records import environment
    from hetbench.strategies import registry
    from hetbench.workload import Net

    cfg = load_config(args.config, [*HETERO_LOCAL_SPLIT, *args.set], registry.declared())
    with cluster_of(cfg) as cfg:
        worker, server, timings, far = trace(cfg, args)
        _, ps = measure_floor(cfg.floor, cfg.cluster, cfg.workers, cfg.link, count_parameters(Net()))
    seconds = hops(worker, server, args.warmup, hop_list)
    overhead = median(t.sync_overhead_s for t in timings[args.warmup :])
    print(f"{name}, {cfg.workers[far].name}'s hops (median of {len(server) - 1 - args.warmup} steps, ms):")
    for label, values in seconds.items():
        print(f"  {label:36s} {median(values) * 1000:8.2f}")
    print(f"  {'sync overhead (the driver)':36s} {overhead * 1000:8.2f}")
    print(f"  {'ps-floor (no ' + name + ' call)':36s} {ps['roundtrip_s'] * 1000:8.2f}  CV {ps['roundtrip_cv']:.0%}")
    if args.out:
        record = {
            "hops_s": seconds,
            "sync_overhead_s": [t.sync_overhead_s for t in timings],
            "ps_floor": ps,
            "far_worker": cfg.workers[far].name,
            "args": vars(args),
            "env": environment(),
            "config": cfg.as_dict(),
        }
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1, default=str)


def main() -> None:
    def traced(cfg, args) -> tuple:
        workers, server, timings, far = trace(cfg, args.steps, args.server_threads)
        return workers[far], server, timings, far

    threads = (["--server-threads"], dict(type=int, default=None, help="the update's threads (default: ray-ps's)"))
    traced_main(__doc__, "ray-ps", traced, HOPS, threads)


if __name__ == "__main__":
    run_script(main)
