"""The `gloo-floor` reference: a raw torch.distributed gloo all-reduce of the model's flat buffer.

Two processes, the same number of floats as the CNN; every strategy's sync overhead is judged
against this figure, measured in the same run. With link emulation, rank 1 runs inside the
emulated remote node's namespace, so the floor is what that link allows.

Run as `python -m hetbench.floor RANK MASTER_IP PORT NUMEL ITERATIONS TIMEOUT_S`: prints JSON.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import timedelta

from hetbench.clock import cv, median

FLOOR_NAME = "gloo-floor"
WARMUP = 5  # all-reduces that warm the connection up, untimed


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def allreduce_times(rank: int, master: str, port: int, numel: int, iterations: int, timeout_s: float) -> list[float]:
    import time

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=timeout_s)
    )
    try:
        buffer = torch.randn(numel)
        times = []
        for i in range(WARMUP + iterations):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
        return times
    finally:
        dist.destroy_process_group()


def measure_floor(numel: int, iterations: int, timeout_s: float, link=None) -> dict:
    """Median and CV of one all-reduce of `numel` float32s between two gloo processes (over `link` if given)."""
    master = link.host_ip if link else "127.0.0.1"
    args = [master, str(free_port(master)), str(numel), str(iterations), str(timeout_s)]
    prefixes = [[], link.prefix() if link else []]
    envs = [{**os.environ, **(link.gloo_env(inside=rank == 1) if link else {})} for rank in range(2)]
    procs = [
        subprocess.Popen(
            [*prefix, sys.executable, "-m", "hetbench.floor", str(rank), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank, (prefix, env) in enumerate(zip(prefixes, envs))
    ]
    try:
        outputs = [p.communicate(timeout=timeout_s) for p in procs]
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"gloo-floor: the two all-reduce processes did not finish within {timeout_s:g} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)
    for p, (_, err) in zip(procs, outputs):
        if p.returncode != 0:
            raise RuntimeError(f"gloo-floor: an all-reduce process failed: {err.strip().splitlines()[-1:]}")
    times = [json.loads(out) for out, _ in outputs]
    # A collective ends when the slower rank has its result: take the max per iteration.
    per_iteration = [max(a, b) for a, b in zip(*times)]
    return {
        "allreduce_s": median(per_iteration),
        "allreduce_cv": cv(per_iteration),
        "numel": numel,
        "bytes": numel * 4,
        "iterations": iterations,
        "link": {"rate": link.rate} if link else None,
    }


if __name__ == "__main__":
    rank, master, port, numel, iterations, timeout_s = sys.argv[1:7]
    print(json.dumps(allreduce_times(int(rank), master, int(port), int(numel), int(iterations), float(timeout_s))))
