"""Does a forward+backward cost more inside a Dask worker? Same batch, one thread, three places, one run.

    python benchmarks/dask_compute.py [--batch 40] [--steps 30] [--rounds 5]

Rows: a plain process (the baseline's compute), a Dask worker as its nanny starts it
(MALLOC_TRIM_THRESHOLD_=65536), and a Dask worker after hetbench's keep_freed_memory().
The target is the fixed Dask row within 10% of the plain one.
"""

from __future__ import annotations

import argparse
import logging

import torch


def compute_ms(batch: int, steps: int, fixed: bool) -> float:
    """Median forward+backward of the hetbench CNN on `batch` samples, one torch thread."""
    from hetbench.clock import median, now
    from hetbench.devices import keep_freed_memory
    from hetbench.workload import build_model, dropout_keys, forward_backward

    torch.set_num_threads(1)
    if fixed:
        keep_freed_memory()
    model = build_model(0.25, seed=0)
    images, labels = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    times = []
    for step in range(steps):
        start = now()
        model.zero_grad()
        forward_backward(model, images, labels, dropout_keys(0, step, torch.arange(batch)))
        times.append(now() - start)
    return 1000 * median(times[5:])


def main() -> None:
    from distributed import Client, LocalCluster

    from hetbench.clock import cv, median
    from hetbench.cluster.nodes import dask_workers

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--batch", type=int, default=40, help="samples per forward+backward")
    ap.add_argument("--steps", type=int, default=30, help="steps per round (the first 5 are warm-up)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, each place once per round")
    args = ap.parse_args()
    rows = {"plain process": [], "dask worker, as started": [], "dask worker, hetbench fix": []}
    # One worker per place, so the unfixed worker never inherits the fix.
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        as_started, fixed = sorted(dask_workers(client))
        for _ in range(args.rounds):
            rows["plain process"].append(compute_ms(args.batch, args.steps, fixed=False))
            rows["dask worker, as started"].append(
                client.submit(compute_ms, args.batch, args.steps, False, workers=[as_started], pure=False).result()
            )
            rows["dask worker, hetbench fix"].append(
                client.submit(compute_ms, args.batch, args.steps, True, workers=[fixed], pure=False).result()
            )
    plain = median(rows["plain process"])
    print(f"forward+backward, batch {args.batch}, 1 thread, {args.rounds} rounds")
    print(f"{'where':<28}{'median ms':>10}{'CV':>8}{'vs plain':>10}")
    for name, values in rows.items():
        print(f"{name:<28}{median(values):>10.1f}{cv(values):>8.1%}{median(values) / plain:>10.2f}")


if __name__ == "__main__":
    main()
