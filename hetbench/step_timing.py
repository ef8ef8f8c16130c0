"""What one global step reports: where its time went, per worker and between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class CentralUpdate(NamedTuple):
    """A parameter server's update, as its server timed it."""

    seconds: float  # the whole update: the gradients combined, the optimizer step, the weights published
    optimizer_s: float  # of it, the optimizer step: single's own work, moved to the server


NO_UPDATE = CentralUpdate(0.0, 0.0)  # a step with no central update: every worker steps its own optimizer


@dataclass
class StepTiming:
    """One global step. comm = moving/combining gradients or weights; wait = idle for the slowest worker."""

    compute_s: dict[str, float]  # per worker name: forward + backward (+ local optimizer step)
    comm_s: float
    wait_s: float
    total_s: float  # wall time of the whole step, as the driver sees it
    update_s: float = 0.0  # part of comm: a central update (parameter server only)
    optimizer_s: float = 0.0  # of the update, its optimizer step: work single does too, not overhead
    # No barrier (ray-ps-async): what a worker waits beyond its compute for fresh weights, measured by
    # the workers themselves, in place of the step time left beyond the slowest compute
    overhead_s: float | None = None

    @classmethod
    def synchronous(cls, compute_s: dict[str, float], total_s: float, update: CentralUpdate = NO_UPDATE) -> StepTiming:
        """A barrier step: comm is what the slowest worker's compute leaves of it, wait the spread of compute."""
        slowest, fastest = max(compute_s.values()), min(compute_s.values())
        return cls(
            compute_s,
            comm_s=total_s - slowest,
            wait_s=slowest - fastest,
            total_s=total_s,
            update_s=update.seconds,
            optimizer_s=update.optimizer_s,
        )

    @property
    def sync_overhead_s(self) -> float:
        """What distribution costs this step: step time minus the slowest worker's compute and a
        central optimizer step, the work single's step does too (or, with no barrier, the workers'
        own wait for fresh weights: overhead_s)."""
        if self.overhead_s is not None:
            return self.overhead_s
        return max(0.0, self.total_s - max(self.compute_s.values()) - self.optimizer_s)
