"""A step's speed, in one formula and its inversions.

A step computes (a synchronous one waits for its slowest share), moves the model `transfers` times
at the link's all-reduce time, and spends its strategy's own overhead beyond both: its samples/s is
its batch over that sum. Transfers are counted in float32 all-reduces of the model, what the floor
times: a narrower wire moves fewer bytes. The inversions answer what would make splitting pay. The
plan, the table's floor column, the what-if and the verdict each call it with their own figures;
it imports nothing of hetbench.
"""

from __future__ import annotations

import math

FLOAT32_BYTES = 4  # the floor times the model's float32 buffer


def in_float32(transfers: float, width: int) -> float:
    """`transfers` of the model in a wire dtype of `width` bytes, as float32 transfers."""
    return transfers * width / FLOAT32_BYTES


def samples_per_s(batch: float, compute_s: float, transfers: float = 0.0, allreduce_s: float = 0.0, own_s: float = 0.0):
    """A step of `batch` samples: `compute_s`, then `transfers` all-reduces of `allreduce_s` each,
    then `own_s` of the strategy's own."""
    return batch / (compute_s + transfers * allreduce_s + own_s)


def batch_that_pays(allreduce_s: float, one: float, together: float, transfers: float = 1.0) -> float:
    """The global batch above which machines adding up to `together` samples/s, with `transfers`
    all-reduces a step, beat the best one alone at `one` samples/s (each sample moved off it saves
    1/one - 1/together seconds)."""
    return transfers * allreduce_s / (1 / one - 1 / together)


def allreduce_that_pays(batch: float, one: float, together: float) -> float:
    """At `batch`, the all-reduce time under which one all-reduce a step still pays."""
    return batch * (1 / one - 1 / together)


def fewer_bytes_that_pay(allreduce_s: float, needed_s: float, fixed_s: float) -> float:
    """How many times fewer bytes bring an all-reduce of `allreduce_s` under `needed_s`, where
    `fixed_s` of it does not move with the bytes (the link's fixed part)."""
    return (allreduce_s - fixed_s) / (needed_s - fixed_s)


def smallest_sync_every(round_s: float, spare_s: float) -> int:
    """The fewest steps between exchanges of `round_s` on the link for a round to beat the best
    alone, where a local step leaves `spare_s` of the best alone's step (positive)."""
    return max(1, math.floor(round_s / spare_s) + 1)
