"""The clock: every timing in hetbench reads it, after synchronizing the device (or marking its queue)."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Reading:
    """What a Stopwatch read: the seconds its device worked, and from its first start to its last stop."""

    work_s: float
    span_s: float


class Stopwatch:
    """A worker's seconds of device work in a step: the spans between start() and stop(), summed and
    read once, after one device sync.

    A span's ends are marks on the device's queue (CUDA or MPS timing events), so marking syncs
    nothing: the host goes on queueing kernels, and a DDP bucket's or a streamed gradient's hand-off
    costs no sync. On a CPU, whose work is done when each call returns, the host clock is the mark.
    On MPS a timed event commits its command buffer (torch records it with syncEvent): a flush, not
    a wait.

    An emulated slower device (`slowdown` > 1) takes `slowdown` times as long for the same work:
    each stop syncs, reads the span and waits until the span has lasted `slowdown` x its own time.
    Its own time leaves out what this thread spent runnable, waiting for a CPU that another
    process or thread held (Linux's schedstat), and that wait is part of the span: on one box the
    emulated machines share cores, and a machine of its own would not have waited for them, so the
    box's crowding shows only where it outlasts the emulated wait. The CPU wait is read only then:
    no /proc read per step otherwise.
    """

    def __init__(self, device: torch.device, slowdown: float = 1.0, ramp: tuple[float, float, float] | None = None):
        """`ramp`: (to, over_s, from_unix_s): the factor grows from `slowdown` to `to` over `over_s`
        seconds from that wall-clock time (the run's start: every process of the run agrees on it)."""
        self.device, self.base, self.ramp = device, slowdown, ramp
        self.slowed = slowdown > 1.0 or (ramp is not None and ramp[0] > 1.0)  # fixed: a span's ends match
        self.events = device.type in ("cuda", "mps")
        self.marks: list = []  # start, stop, start, stop ... since the last read
        self.pool: list = []  # timing events, made once and recorded again every step
        self.slowed_s = 0.0  # the slowed spans' seconds since the last read (they are read as they end)
        self.started: tuple[float, float] | None = None  # a slowed span's (host clock, CPU wait) at its start

    @property
    def slowdown(self) -> float:
        """The emulated factor now."""
        if self.ramp is None:
            return self.base
        to, over_s, since = self.ramp
        return self.base + (to - self.base) * min(1.0, max(0.0, (time.time() - since) / over_s))

    def start(self) -> None:
        if len(self.marks) % 2:  # a span a failure left open (a step redone): dropped
            self._drop(self.marks.pop())
        if self.slowed:
            self.started = (now(self.device), cpu_wait())
            self.marks.append(self.started[0])
        else:
            self.marks.append(self._mark())

    def stop(self) -> None:
        if not self.slowed:
            self.marks.append(self._mark())
            return
        start, waited = self.started
        seconds = now(self.device) - start
        own = max(0.0, seconds - (cpu_wait() - waited))  # less its wait for a CPU something else held
        delay = max(0.0, self.slowdown * own - seconds)
        if delay > 0:
            slept_from = time.perf_counter()
            time.sleep(delay)
            # the wait as it elapsed: on a busy box a sleep ends late, and a streamed step sleeps at
            # every hand-off; what it overran by would otherwise read as the strategy's sync overhead
            delay = time.perf_counter() - slept_from
        self.slowed_s += seconds + delay
        self.marks.append(time.perf_counter())

    def read(self) -> Reading:
        """The spans since the last read (one device sync; none where nothing was marked), then none."""
        marks, work_s = self.marks, self.slowed_s
        self.marks, self.slowed_s = [], 0.0
        if len(marks) % 2:
            self._drop(marks.pop())
        if not marks:
            return Reading(0.0, 0.0)
        if self.slowed:  # host clocks, read after a sync at each end
            return Reading(work_s, marks[-1] - marks[0])
        synchronize(self.device)
        if self.events:
            seconds = [a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])]
            self.pool.extend(marks)
        else:
            seconds = [b - a for a, b in zip(marks, marks[1:])]
        return Reading(sum(seconds[::2]), sum(seconds))

    def _mark(self):
        if not self.events:
            return time.perf_counter()
        event = self.pool.pop() if self.pool else self._event()
        event.record()
        return event

    def _drop(self, mark) -> None:
        if self.events:
            self.pool.append(mark)

    def _event(self):
        if self.device.type == "cuda":
            return torch.cuda.Event(enable_timing=True)
        return torch.mps.Event(enable_timing=True)
