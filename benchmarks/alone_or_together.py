"""Does a worker compute as fast beside the others as alone? Each worker of a config timed alone
(as `hetbench plan` and the race's brackets time it), then every worker at once for as long as the
slowest (a faster one taking more steps, as a balanced synchronous row's shares compute), in rounds,
on the race's cluster and processes, at the equal split's share of the global batch. On two real
machines the two should agree; on one box the workers share its cores.

    python benchmarks/alone_or_together.py -c benchmarks/configs/hetero-local.yaml [--set ...] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from hetbench.cluster.ray_connection import use_ray_defaults

use_ray_defaults()  # before Ray is imported

from hetbench.clock import median  # noqa: E402
from hetbench.cluster.joined import wait_for_workers  # noqa: E402
from hetbench.cluster.multinode import cluster_for_run  # noqa: E402
from hetbench.cluster.place import place  # noqa: E402
from hetbench.cluster.ray_connection import ray_kept_for_the_run  # noqa: E402
from hetbench.config import load_config  # noqa: E402
from hetbench.errors import UserError  # noqa: E402
from hetbench.runner import open_ray  # noqa: E402
from hetbench.standalone import WARMUP_STEPS  # noqa: E402
from hetbench.strategies.replica import Replica  # noqa: E402


def rounds_of(cfg, rounds: int) -> dict[str, dict[str, list[float]]]:
    """'alone' and 'together' -> worker name -> ms a step at its share, one figure a round."""
    job = cfg.job()
    job = replace(job, run=replace(job.run, batch_size=cfg.run.batch_size // len(cfg.workers)))
    workers = place(job.cluster, job.workers, Replica, "timing", job)
    names = [w.name for w in job.workers]
    timed = {"alone": {n: [] for n in names}, "together": {n: [] for n in names}}
    steps, share = job.run.standalone_steps, job.run.batch_size
    try:
        for r in range(rounds):
            for rank in range(len(names)) if r % 2 == 0 else reversed(range(len(names))):
                (rate,) = workers.results([workers.call(rank, "alone", steps, WARMUP_STEPS)], "alone")
                timed["alone"][names[rank]].append(share / rate * 1e3)
            # together for as long as the slowest: a faster worker takes more steps (a balanced row's shares)
            slowest = max(median(timed["alone"][n]) for n in names)
            each = [max(round(steps * slowest / median(timed["alone"][n])), steps) for n in names]
            calls = [workers.call(rank, "alone", each[rank], WARMUP_STEPS) for rank in range(len(names))]
            for name, rate in zip(names, workers.results(calls, "together")):
                timed["together"][name].append(share / rate * 1e3)
    finally:
        workers.close()
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cfg = load_config(args.config, args.sets)
    with cluster_for_run(cfg.cluster, cfg.workers, cfg.link) as (joined, _, cluster), ray_kept_for_the_run():
        workers = wait_for_workers(joined, cfg.workers, cluster and cluster.check_alive)
        cfg = replace(cfg, cluster=joined, workers=workers)
        open_ray(cfg)
        timed = rounds_of(cfg, args.rounds)
    print(f"ms a step of {cfg.run.batch_size // len(cfg.workers)} (median, each round)")
    for name in timed["alone"]:
        alone, together = timed["alone"][name], timed["together"][name]
        print(
            f"{name}: alone {median(alone):.0f} {[round(t) for t in alone]}, together {median(together):.0f} "
            f"{[round(t) for t in together]} ({median(together) / median(alone) - 1:+.0%})"
        )


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
