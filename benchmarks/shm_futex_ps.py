"""How low can a parameter server's sync overhead go on this host with no Ray or Dask call on its hot path?

    python benchmarks/shm_futex_ps.py [--batches 40 24] [--steps 100] [--rounds 3]

ray-ps's shared-memory hand-off (host_memory.py) between plain processes, with no Ray call at all,
to show what is left of a step's overhead (Linux x86-64). The server (this process) and one process
per worker map one file: a worker waits for weights version s, computes, leaves its gradient
(pre-scaled by its batch share) in its slot and sets its counter; the server waits for every
counter, sums, steps the optimizer, sets the version. Sync overhead =
step time - slowest compute, as in the tables, beside the gloo floor measured in the same run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time

import torch

from hetbench.clock import cv, median
from hetbench.config import load_config
from hetbench.data import cached_mnist
from hetbench.devices import keep_freed_memory
from hetbench.floor import measure_floor
from hetbench.gradients import FlatModel, batch_shares, count_parameters, weighted_sum
from hetbench.results.records import environment
from hetbench.strategies.base import BatchOrder, worker_slice
from hetbench.transport.host_memory import HostBuffers
from hetbench.workload import build_model, build_optimizer, dropout_keys, forward_backward

TIMINGS = 16  # bytes per worker: start and end of its last compute (float64 perf_counter, one clock here)

LIMIT_S = 60.0  # a hand-off this late means a process of the benchmark died


def timings(path: str, slots: int) -> torch.Tensor:
    return (
        torch.from_file(path, shared=True, size=TIMINGS * slots, dtype=torch.uint8).view(torch.float64).view(slots, 2)
    )


def worker(cfg: dict, rank: int, paths: tuple[str, str], steps: int) -> None:
    torch.set_num_threads(1)  # two workers on two cores, as workers_per_host gives them in local mode
    keep_freed_memory()
    batches = [w.batch for w in cfg.workers]
    shared, computes = (
        HostBuffers.attach(paths[0], count_parameters(build_model(cfg.run.dropout, 0)), len(batches), LIMIT_S),
        timings(paths[1], len(batches)),
    )
    flat = FlatModel(build_model(cfg.run.dropout, cfg.run.seed))
    images, labels = cached_mnist(cfg.run, announce=False)[0].tensors(torch.device("cpu"))
    share = batch_shares(batches)[rank]
    order = BatchOrder(len(labels), cfg.run.batch_size, cfg.run.seed)
    for step in range(steps):
        shared.wait_weights(step)
        flat.load_params(shared.weights)
        index = worker_slice(order(step), batches, rank)
        start = time.perf_counter()
        flat.zero_grad()
        forward_backward(flat.model, images[index], labels[index], dropout_keys(cfg.run.seed, step, index))
        computes[rank] = torch.tensor([start, time.perf_counter()], dtype=torch.float64)
        torch.mul(flat.grads, share, out=shared.gradient(rank))  # the rule's weight, applied here
        shared.publish_gradient(rank, step + 1)


def server_round(cfg: dict, steps: int, warmup: int) -> list[tuple[float, float, float]]:
    """(step s, sync overhead s, update s) per timed step of one run of `steps` steps."""
    slots = len(cfg.workers)
    shared = HostBuffers.create(count_parameters(build_model(cfg.run.dropout, 0)), slots, LIMIT_S)
    fd, timings_path = tempfile.mkstemp(prefix="hetbench-", dir="/dev/shm")
    os.close(fd)
    computes = timings(timings_path, slots)
    procs = []
    try:
        flat = FlatModel(build_model(cfg.run.dropout, cfg.run.seed), shared.weights)
        optimizer = build_optimizer(flat.optimizer_params(), cfg.run.optimizer, cfg.run.lr)
        procs = [
            mp.get_context("spawn").Process(target=worker, args=(cfg, r, (shared.path, timings_path), steps))
            for r in range(slots)
        ]
        for p in procs:
            p.start()
        timed, last = [], None
        for step in range(steps):
            for slot in range(slots):
                shared.wait_gradient(slot, step + 1)
            updating = time.perf_counter()
            weighted_sum([shared.gradient(s) for s in range(slots)], [1.0] * slots, out=flat.grads)
            optimizer.step()
            ended = (
                time.perf_counter()
            )  # the new weights are there: woken workers may start before we read a clock again
            shared.publish_weights(step + 1)
            if last is not None and step >= warmup:
                slowest = float((computes[:, 1] - computes[:, 0]).max())
                timed.append((ended - last, ended - last - slowest, ended - updating))
            last = ended
        return timed
    finally:
        shared.abandon(steps + 1)  # a worker still waiting (we failed) stops now
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        shared.unlink()
        os.unlink(timings_path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[40, 24], help="each worker's samples per step")
    ap.add_argument("--steps", type=int, default=100, help="timed steps per round (after 5 warm-up)")
    ap.add_argument("--rounds", type=int, default=3, help="runs, each with fresh processes")
    args = ap.parse_args()
    if not HostBuffers.can_hand_off():
        ap.error("the shared-memory hand-off needs Linux on x86-64")
    workers = ", ".join(f"{{batch: {b}}}" for b in args.batches)
    cfg = load_config(None, [f"workers=[{workers}]"])
    numel = count_parameters(build_model(cfg.run.dropout, cfg.run.seed))
    cached_mnist(cfg.run)  # load (and announce) the data once, before any clock runs
    rounds = [server_round(cfg, args.steps + 5, 5) for _ in range(args.rounds)]
    # two local processes, as the workers here
    floor = measure_floor(cfg.floor, cfg.cluster, cfg.workers, cfg.link, numel)[0]["allreduce_s"]
    steps, overheads, updates = (median([median([t[i] for t in r]) for r in rounds]) for i in range(3))
    per_round = [median([t[1] for t in r]) for r in rounds]
    env = environment()
    print(
        f"batches {args.batches}, {args.rounds} rounds x {args.steps} timed steps; torch {env['versions']['torch']}, "
        f"{env['cpu_count']} CPUs, commit {env['git_commit']}"
    )
    print(
        f"step {steps * 1e3:.1f} ms ({sum(args.batches) / steps:.0f} samples/s); sync overhead "
        f"{overheads * 1e3:.2f} ms (rounds {', '.join(f'{o * 1e3:.2f}' for o in per_round)}; CV {cv(per_round):.0%}), "
        f"of which the server's update {updates * 1e3:.2f} ms"
    )
    print(f"gloo-floor {floor * 1e3:.2f} ms: overhead {overheads / floor:.2f}x the floor (the issues' target <= 1.5x)")


if __name__ == "__main__":
    main()
