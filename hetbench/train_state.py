"""One process's model, optimizer and learning-rate schedule as CPU tensors, and back: what
checkpoints and --resume keep."""

from __future__ import annotations

import copy

import torch

from hetbench.optimizer import ScheduledOptimizer


def train_state(flat, optimizer: ScheduledOptimizer) -> dict:
    """Model and optimizer (with its schedule's place) of one process, as CPU tensors (what a
    strategy's state() returns): a snapshot, since state_dict() hands out the optimizer's live
    tensors, on any device (a driver without that device still saves it; load_state_dict moves the
    state back to the parameters')."""
    return {"weights": flat.params.detach().to("cpu", copy=True), "optimizer": cpu_copy(optimizer.state_dict())}


def cpu_copy(value):
    """A deep copy with every tensor on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: cpu_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(cpu_copy(v) for v in value)
    return copy.deepcopy(value)


def load_train_state(flat, optimizer: ScheduledOptimizer, state: dict) -> None:
    flat.load_params(state["weights"].to(flat.params.device))
    optimizer.load_state_dict(state["optimizer"])
