"""The optimizer that takes a global update wherever it runs, stepped with the workload's learning-rate
schedule: single's, a parameter server's, each DDP rank's, each local-SGD replica's inner one."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LRScheduler


class ScheduledOptimizer:
    """An optimizer and its scheduler (or none), stepped as one: the schedule advances once per
    optimizer step, so after k global updates every synchronous row's learning rate is single's.

    With a `loss_scale` (fp16's: every worker's loss was multiplied by it before backward) the
    gradient is divided by it first, and an update whose gradient is not finite (an overflow on some
    worker) is skipped, the schedule with it. Every synchronous update site sees the same combined
    gradient, so single, the server and every DDP rank skip the same steps. The scale is fixed, not
    grown and cut as torch's GradScaler does: each worker would have to learn of every skip to keep
    one scale."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None = None, loss_scale: float = 1.0
    ) -> None:
        self.optimizer, self.scheduler, self.loss_scale = optimizer, scheduler, loss_scale

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def lr(self) -> float:
        """The learning rate the next update takes (its first parameter group's)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def step(self) -> None:
        if self.loss_scale != 1.0 and not self._unscaled():
            return  # an overflow: no update, and the schedule waits for the next
        self.optimizer.step()
        self.advance()

    def _unscaled(self) -> bool:
        """The gradients divided by the loss scale; whether all are finite (one sync of the device)."""
        grads = [p.grad for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        torch._foreach_mul_(grads, 1.0 / self.loss_scale)
        return bool(torch.stack([g.isfinite().all() for g in grads]).all())

    def advance(self) -> None:
        """The schedule's step alone: after an update taken a parameter at a time (partial_step.step_only)."""
        if self.scheduler is not None:
            self.scheduler.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        """Both states: a checkpoint resumes the schedule where it was, not from its start."""
        scheduler = self.scheduler.state_dict() if self.scheduler is not None else None
        return {"optimizer": self.optimizer.state_dict(), "scheduler": scheduler}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])


class RunSchedule:
    """The config's schedule (`lr_warmup_steps`, `lr_decay`) as LambdaLR's factor of the update: a
    linear rise over the warm-up, then none, a cosine or a line down to 0 at update `total`."""

    def __init__(self, warmup: int, decay: str, total: int) -> None:
        self.warmup, self.decay, self.total = warmup, decay, total

    @classmethod
    def of(cls, lr_warmup_steps: int, lr_decay: str, warmup_steps: int, steps: int) -> RunSchedule:
        """From the run's settings: it ends with an evaluated repeat's warm-up and timed steps."""
        return cls(lr_warmup_steps, lr_decay, warmup_steps + steps)

    def __call__(self, update: int) -> float:
        if update < self.warmup:
            return (update + 1) / self.warmup
        if self.decay == "none":
            return 1.0
        done = min(1.0, (update - self.warmup) / max(1, self.total - self.warmup))
        return 0.5 * (1 + math.cos(math.pi * done)) if self.decay == "cosine" else 1.0 - done

    def __str__(self) -> str:
        rise = f"{self.warmup} updates' warm-up" if self.warmup else ""
        fall = f"{self.decay} decay to 0 at update {self.total}" if self.decay != "none" else ""
        return " then ".join(part for part in (rise, fall) if part)
