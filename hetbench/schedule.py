"""Which steps a repeat trains, and which of them are evaluated."""

from __future__ import annotations


def repeat_steps(cfg: dict, r: int) -> tuple[int, bool]:
    """Repeat r's steps after warm-up, and whether its accuracy is checked: every repeat trains all
    `steps`, evaluated; with speed_steps, those after the first time only that many, unevaluated
    (samples/s needs no accuracy)."""
    if r == 0 or not cfg["speed_steps"]:
        return cfg["steps"], True
    return cfg["speed_steps"], False
