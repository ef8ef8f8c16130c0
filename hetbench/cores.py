"""The cores this process may run on: what its threads and a Ray node it starts may take."""

from __future__ import annotations

import os

from hetbench.errors import UserError


def usable_cores() -> int:
    """The cores this process may run on: its affinity (a container's cpuset, `taskset`), not the
    machine's count, which os.cpu_count() gives; that count where the OS keeps no affinity (macOS)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def core_shares(count: int) -> list[list[int]]:
    """The cores this process may run on, cut into `count` shares in order, as equal as they divide
    (the first shares take one more): one per emulated machine, as real ones have cores of their own."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:
        raise UserError("cluster.pin_nodes needs Linux's CPU affinity, which this OS does not offer") from None
    if len(cores) < count:
        raise UserError(f"cluster.pin_nodes: {count} nodes need a core each, and this process may use {len(cores)}")
    size, extra = divmod(len(cores), count)
    shares, start = [], 0
    for i in range(count):
        end = start + size + (i < extra)
        shares.append(cores[start:end])
        start = end
    return shares
