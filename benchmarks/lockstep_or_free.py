"""Does a synchronous row's alignment slow its workers more than timing them together shows? The
plan times every worker at once, each free-running (standalone.measure_alone_and_together). In a
synchronous row every step starts together after the sync, so an emulated slower machine's real
compute (its first 1/slowdown of the step, the rest a wait) lands on the faster one's compute
every step, where free-running it overlaps that only 1/slowdown of the time. Per round, at the
equal split's share: each worker alone one step a call; all at once one step a call, each step
started together (lockstep); all at once free-running (the plan's).

    python benchmarks/lockstep_or_free.py -c benchmarks/configs/hetero-local.yaml [--set ...] [--rounds 3]
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

WAYS = ("alone", "lockstep", "free")


def rounds_of(cfg, rounds: int) -> dict[str, dict[str, list[float]]]:
    """way -> worker name -> ms a step at its share, the median step of each round."""
    job = cfg.job()
    job = replace(job, run=replace(job.run, batch_size=cfg.run.batch_size // len(cfg.workers)))
    workers = place(job.cluster, job.workers, Replica, "timing", job)
    names, share, steps = [w.name for w in job.workers], job.run.batch_size, job.run.standalone_steps
    ranks = range(len(names))
    timed = {way: {n: [] for n in names} for way in WAYS}

    def one_step_each(at_once: list[int]) -> list[float]:  # one step (a fresh model) on each, started together
        rates = workers.results([workers.call(r, "alone", 1, 0) for r in at_once], "a step")
        return [share / rate * 1e3 for rate in rates]

    try:
        workers.results([workers.call(r, "alone", 1, WARMUP_STEPS) for r in ranks], "warming up")
        for _ in range(rounds):
            for rank in ranks:
                alone = [one_step_each([rank])[0] for _ in range(steps)]
                timed["alone"][names[rank]].append(median(alone))
            lockstep = [one_step_each(list(ranks)) for _ in range(steps)]
            for rank in ranks:
                timed["lockstep"][names[rank]].append(median([step[rank] for step in lockstep]))
            slowest = max(median(timed["alone"][n]) for n in names)
            each = [max(round(steps * slowest / median(timed["alone"][n])), steps) for n in names]
            rates = workers.results([workers.call(r, "alone", each[r], WARMUP_STEPS) for r in ranks], "free")
            for name, rate in zip(names, rates):
                timed["free"][name].append(share / rate * 1e3)
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
    print(f"ms a step of {cfg.run.batch_size // len(cfg.workers)} (median of each round's)")
    for name in timed["alone"]:
        alone = median(timed["alone"][name])
        said = [f"{way} {median(timed[way][name]):.0f} {[round(t) for t in timed[way][name]]}" for way in WAYS]
        over = ", ".join(f"{way} {median(timed[way][name]) / alone - 1:+.0%}" for way in WAYS[1:])
        print(f"{name}: {'; '.join(said)} ({over} over alone)")


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
