"""An optimizer step taken a few parameters at a time, and put back when the rest never comes.

A parameter server that steps each parameter as soon as every worker's gradient of it is in
(parameter_server.ParameterServer.apply_by_parameter) takes one optimizer step in pieces. Every optimizer here
is elementwise, so the pieces add up to the whole step exactly; torch skips a parameter whose
gradient is None, which is how a piece leaves the others alone.
"""

from __future__ import annotations

import torch


def step_only(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """optimizer.step() on `params` alone (each of them one of the optimizer's own)."""
    chosen = {id(p) for p in params}
    hidden = [(p, p.grad) for group in optimizer.param_groups for p in group["params"] if id(p) not in chosen]
    for p, _ in hidden:
        p.grad = None
    try:
        optimizer.step()
    finally:
        for p, grad in hidden:
            p.grad = grad


class Undo:
    """What `keep` was given, as it was then: its values and its optimizer state, put back by `restore`."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.kept: list[tuple[torch.Tensor, torch.Tensor, dict | None]] = []

    def keep(self, params: list[torch.Tensor]) -> None:
        for p in params:
            state = self.optimizer.state.get(p)
            saved = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()} if state else None
            self.kept.append((p, p.detach().clone(), saved))

    def restore(self) -> None:
        for p, values, state in reversed(self.kept):
            p.detach().copy_(values)
            if state is None:
                self.optimizer.state.pop(p, None)
            else:
                self.optimizer.state[p] = state
        self.kept = []
