"""The `gloo-floor` reference: a raw torch.distributed gloo all-reduce of the model's flat buffer.

Two local processes, the same number of floats as the CNN; every strategy's sync
overhead is judged against this figure, measured in the same run.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import socket
from datetime import timedelta

from .clock import cv, median

FLOOR_NAME = "gloo-floor"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _allreduce_worker(rank: int, port: int, numel: int, iterations: int, timeout_s: float, results) -> None:
    import time

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=timeout_s))
    try:
        buffer = torch.randn(numel)
        times = []
        for i in range(5 + iterations):  # the first 5 warm the connection up
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            if i >= 5:
                times.append(time.perf_counter() - start)
        results.put((rank, times))
    finally:
        dist.destroy_process_group()


def measure_floor(numel: int, iterations: int, timeout_s: float) -> dict:
    """Median and CV of one all-reduce of `numel` float32s between two local gloo processes."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_allreduce_worker, args=(rank, port, numel, iterations, timeout_s, results),
                         daemon=True) for rank in range(2)]
    for p in procs:
        p.start()
    try:
        times = {}
        for _ in procs:
            rank, values = results.get(timeout=timeout_s)
            times[rank] = values
    except queue.Empty:
        raise RuntimeError(f"gloo-floor: the two all-reduce processes did not finish within {timeout_s:g} s") from None
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    # A collective ends when the slower rank has its result: take the max per iteration.
    per_iteration = [max(a, b) for a, b in zip(times[0], times[1])]
    return {"allreduce_s": median(per_iteration), "allreduce_cv": cv(per_iteration),
            "numel": numel, "bytes": numel * 4, "iterations": iterations}
