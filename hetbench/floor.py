"""The `gloo-floor` reference: a raw torch.distributed gloo all-reduce of the model's flat buffer.

Two processes, placed like workers (cluster/placed.py): one on the reference worker's node, one
on the first worker on another node (a desk and a Mac: across their link; in local-multinode
across the emulated one; on one box, two processes there). The same number of floats as the CNN;
every strategy's sync overhead is judged against this figure, measured in the same run, over the
path the workers' traffic takes. The record says which path that was.
"""

from __future__ import annotations

import socket
import time
from dataclasses import asdict

from hetbench.clock import cv, median
from hetbench.cluster.addresses import free_port
from hetbench.cluster.gloo import join_group
from hetbench.cluster.place import place
from hetbench.config import Config

FLOOR_NAME = "gloo-floor"
WARMUP = 5  # all-reduces that warm the connection up, untimed


def allreduce_times(rank: int, master: str, port: int, numel: int, iterations: int, timeout_s: float) -> dict:
    """The seconds of each timed all-reduce, and the interface this end's gloo used."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    interface = join_group(master, port, rank, 2, timeout_s)
    try:
        buffer = torch.randn(numel)
        times = []
        for i in range(WARMUP + iterations):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
        return {"times": times, "interface": interface}
    finally:
        dist.destroy_process_group()


class FloorEnd:
    """One end of the floor's all-reduce, in a process on a worker's node."""

    def setup(self, cfg: Config, rank: int, threads_share: int) -> dict:
        spec = cfg.workers[rank]
        return {"name": spec.name, "node": spec.node, "host": socket.gethostname()}

    def free_port(self, host: str) -> int:
        return free_port(host)

    def allreduce_times(self, *args) -> dict:
        return allreduce_times(*args)


def floor_ranks(cfg: Config) -> list[int]:
    """The two workers whose nodes the floor runs between: the first, and the first on another node
    (else the second; a lone worker's node twice)."""
    workers = cfg.workers
    other = [r for r, w in enumerate(workers) if w.node != workers[0].node]
    return [0, (other or [min(1, len(workers) - 1)])[0]]


def measure_floor(cfg: Config, numel: int) -> dict:
    """Median and CV of one all-reduce of `numel` float32s between the two workers' nodes."""
    iterations, timeout_s = cfg.floor.iterations, cfg.floor.timeout_s
    ends = place(cfg, FloorEnd, FLOOR_NAME, ranks=floor_ranks(cfg))
    try:
        master = ends.info[0]["node_ip"]
        (port,) = ends.results([ends.call(0, "free_port", master)], "choosing a port")
        args = (master, port, numel, iterations, timeout_s)
        measured = ends.results([ends.call(r, "allreduce_times", r, *args) for r in range(2)], "measuring")
    finally:
        ends.close()
    # A collective ends when the slower rank has its result: take the max per iteration.
    per_iteration = [max(a, b) for a, b in zip(*(m["times"] for m in measured))]
    return {
        "allreduce_s": median(per_iteration),
        "allreduce_cv": cv(per_iteration),
        "numel": numel,
        "bytes": numel * 4,
        "iterations": iterations,
        "path": {
            "between": [i["name"] for i in ends.info],
            "nodes": [i["node"] for i in ends.info],
            "ips": [i["node_ip"] for i in ends.info],
            "interfaces": [m["interface"] for m in measured],
        },
        "link": {key: value for key, value in asdict(cfg.link).items() if value} or None,
    }
