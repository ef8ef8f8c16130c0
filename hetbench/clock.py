"""The clock: every timing in hetbench reads it, after synchronizing the device."""

from __future__ import annotations

import math
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


def median_interval(values: list[float], coverage: float = 0.75) -> tuple[float, float]:
    """The narrowest order-statistic interval [x(k), x(n+1-k)] that holds the population's median
    with at least `coverage` (the sign test's binomial, no assumed distribution): the whole range
    for 3-5 values, narrowing as values are added. The whole range where none reaches `coverage`."""
    ordered, n = sorted(values), len(values)
    k = 1
    while k < (n + 1) / 2 and 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n >= coverage:
        k += 1  # [x(k+1), x(n-k)] still covers: narrow
    return ordered[k - 1], ordered[n - k]


def cv(values: list[float]) -> float | None:
    """Coefficient of variation (stdev / mean); 0 for a single value."""
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) < 2 or mean == 0:
        return 0.0
    return statistics.stdev(values) / mean
