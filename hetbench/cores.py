"""The cores this process may run on: what its threads and a Ray node it starts may take."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: its affinity (a container's cpuset, `taskset`), not the
    machine's count, which os.cpu_count() gives; that count where the OS keeps no affinity (macOS)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
