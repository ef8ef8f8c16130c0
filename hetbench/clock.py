"""The clock: every timing in hetbench reads it, after synchronizing the device."""

from __future__ import annotations

import statistics
import time

import torch

from hetbench.devices import synchronize


def now(device: torch.device | None = None) -> float:
    """Monotonic seconds, read only after the device has finished its queued work."""
    if device is not None:
        synchronize(device)
    return time.perf_counter()


def cpu_wait() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU that something else held
    (Linux's schedstat); 0.0 where the kernel does not say (macOS)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def cv(values: list[float]) -> float | None:
    """Coefficient of variation (stdev / mean); 0 for a single value."""
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) < 2 or mean == 0:
        return 0.0
    return statistics.stdev(values) / mean
