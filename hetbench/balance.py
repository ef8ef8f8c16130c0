"""How the global batch is split among workers: once per scenario (equal, proportional, auto:
scenarios.balanced) and again during a run by the speeds the workers show (auto's end of warm-up,
rebalance_every)."""

from __future__ import annotations

from hetbench.errors import UserError

REBALANCE_MIN_SHIFT = 0.02  # re-split only when some worker's batch moves by this share of the global batch


def split_batch(total: int, weights: list[float]) -> list[int]:
    """Integer split of `total` proportional to `weights` that sums exactly (largest remainder)."""
    if total < len(weights):
        raise UserError(f"batch_size {total} is smaller than the number of workers ({len(weights)})")
    scale = total / sum(weights)
    exact = [w * scale for w in weights]
    parts = [max(1, int(x)) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    i = 0
    while sum(parts) != total:
        j = order[i % len(order)]
        step = 1 if sum(parts) < total else -1
        if parts[j] + step >= 1:
            parts[j] += step
        i += 1
    return parts


def speed_split(global_batch: int, batches: list[int], computes: list[list[float]]) -> list[int] | None:
    """A new split by each worker's speed over a window (its batch over its fastest compute), or None
    to keep the split. Repeated, this settles where every worker's compute takes as long, fixed
    per-step costs included, which a split by speeds measured alone cannot see. The fastest, not
    the median: what disturbs a compute only adds to it, and a fresh process's first steps are
    slowed by its own start (a Ray Train group's ranks computed 3.4x, 1.9x, 1.5x their pace in the
    first three of five warm-up steps, the mac's less: the median put 70 samples of 256 on it, the
    fastest 58, and the steps after 62). A worker with no compute in the window (async) gives no
    speed to go by; small shifts are noise."""
    if not all(computes):
        return None
    new = split_batch(global_batch, [b / min(c) for b, c in zip(batches, computes)])
    if max(abs(n - b) for n, b in zip(new, batches)) < REBALANCE_MIN_SHIFT * global_batch:
        return None
    return new


def resplit_event(warmup_steps: int, step: int, split: dict[str, int]) -> dict:
    """The record of a new split; one made in warm-up is auto's own, not a rebalance_every one."""
    return {"step": step, "rebalanced": split, **({"in_warmup": True} if step < warmup_steps else {})}
