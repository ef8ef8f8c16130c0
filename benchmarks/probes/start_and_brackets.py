"""Do the race's two ways of timing a worker alone agree? The start's (`measure_alone_and_together`:
both batches, mirrored, on actors placed once) and a row's brackets (`measure_standalone`: fresh
actors, one timing each), one after the other on the race's cluster, in rounds. Samples/s.

    python benchmarks/probes/start_and_brackets.py benchmarks/configs/hetero-local.yaml workload=shapes-resnet
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from hetbench.cluster.ray_connection import use_ray_defaults

use_ray_defaults()  # before Ray is imported

from hetbench.cluster.joined import wait_for_workers  # noqa: E402
from hetbench.cluster.multinode import cluster_for_run  # noqa: E402
from hetbench.cluster.ray_connection import ray_kept_for_the_run  # noqa: E402
from hetbench.config import load_config  # noqa: E402
from hetbench.race import open_ray  # noqa: E402
from hetbench.standalone import measure_alone_and_together, measure_standalone  # noqa: E402


def main(config: str, sets: list[str], rounds: int = 2) -> None:
    cfg = load_config(config, sets)
    with cluster_for_run(cfg.cluster, cfg.workers, cfg.link) as (joined, _, cluster), ray_kept_for_the_run():
        workers = wait_for_workers(joined, cfg.workers, cluster and cluster.check_alive)
        cfg = replace(cfg, cluster=joined, workers=workers)
        open_ray(cfg)
        job, ranks = cfg.job(), list(range(len(cfg.workers)))
        for r in range(rounds):
            started = time.time()
            start = measure_alone_and_together(job, cfg.run.batch_size // len(ranks))
            print(
                f"round {r}, as the start: {start.large} at the global batch, {start.small} at the equal share "
                f"({time.time() - started:.0f} s)",
                flush=True,
            )
            for order in (ranks, ranks[::-1]):
                started = time.time()
                print(
                    f"  as a bracket, in order {order}: {measure_standalone(job, order)} "
                    f"({time.time() - started:.0f} s)",
                    flush=True,
                )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
