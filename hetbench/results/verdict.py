"""The answer first: which strategy and split to use on these machines, or that one machine alone is
best, and why each other row loses; derived from a run's records, never written by hand."""

from __future__ import annotations

from hetbench.clock import median, median_interval
from hetbench.floor import FLOOR_NAME as FLOOR
from hetbench.results.plots import label
from hetbench.strategies.registry import BASELINE

ACCURACY_KEPT = 0.005  # a row's final test accuracy this far under the baseline's still counts as the same


def verdict(records: list[dict]) -> list[str]:
    """The verdict's lines: the answer, then one line per other row."""
    base = measured(records, BASELINE)
    rows = [r for r in records if r["strategy"] not in (BASELINE, FLOOR) and r.get("samples_per_s")]
    if not base or not rows:
        return []
    floor = next((r for r in records if r["strategy"] == FLOOR and r.get("allreduce_s")), None)
    alone = (base.get("reference") or {}).get("worker") or base["workers"][0]["name"]
    best = max(rows, key=lambda r: r["samples_per_s"])
    noise = max(base.get("samples_per_s_cv") or 0.0, best.get("samples_per_s_cv") or 0.0)
    if best["samples_per_s"] > base["samples_per_s"] * (1 + noise):
        lines = [
            f"Verdict: use {label(best)} on {_machines(best)}: {best['samples_per_s']:,.0f} samples/s, "
            f"{best['samples_per_s'] / base['samples_per_s']:.2f}x {alone} alone ({base['samples_per_s']:,.0f})"
            f"{_to_target(best, base, alone)}{_accuracy_lost(best, base, alone)}."
        ]
    else:
        ratio = best["samples_per_s"] / base["samples_per_s"]
        spread = f", within the runs' spread of {noise:.0%}" if ratio > 1 else ""
        lines = [
            f"Verdict: keep to {alone} alone ({base['samples_per_s']:,.0f} samples/s): no strategy beats it "
            f"here (best: {label(best)}, {ratio:.2f}x{spread}){_accuracy_lost(best, base, alone)}."
        ]
        if change := what_would_change_it(best, base, floor):
            lines.append(f"  What would change it: {change}.")
    lines += [
        f"  {label(r)}: {r['samples_per_s'] / base['samples_per_s']:.2f}x, {why_it_loses(r, floor)}"
        f"{_accuracy_lost(r, base, alone)}"
        for r in rows
        if r is not best
    ]
    return lines


def why_it_loses(record: dict, floor: dict | None) -> str:
    """The largest part of its step beyond the slowest worker's compute: idling for the slow worker,
    the link (its transfers of the model at the floor's time), or its own overhead beyond both."""
    step = record.get("step") or {}
    total, overhead, wait = step.get("total_s"), step.get("sync_overhead_s"), step.get("wait_s") or 0.0
    if not total or overhead is None:
        return "no step timings in its record"
    link = (record.get("floor_transfers") or 0) * floor["allreduce_s"] if floor else 0.0
    parts = {
        "waits for the slow worker": wait,
        "link-bound": min(link, overhead),
        "overhead": max(overhead - link, 0.0),
    }
    reason = max(parts, key=parts.get)
    ms = parts[reason] * 1000
    if reason == "waits for the slow worker":
        return f"waits for the slow worker: the fastest idles {ms:.0f} ms of each {total * 1000:.0f} ms step"
    if reason == "link-bound":
        return (
            f"link-bound: moving the model {record['floor_transfers']}x a step takes {ms:.0f} ms of each "
            f"{total * 1000:.0f} ms step at the floor's {floor['allreduce_s'] * 1000:.1f} ms"
        )
    return f"overhead: {ms:.0f} ms a step beyond compute and the link's share, of {total * 1000:.0f} ms"


def what_would_change_it(best: dict, base: dict, floor: dict | None) -> str | None:
    """From the measured speeds alone and the floor: the global batch from which an all-reduce over
    this link pays, and the all-reduce time at which it pays at this batch."""
    speeds = [w.get("standalone_samples_per_s") for w in best.get("workers", [])]
    if not floor or not all(speeds):
        return None
    together, one = sum(speeds), base["samples_per_s"]
    if together <= one * 1.001:
        return "nothing on this link or batch: the other machines add no speed even with a free link"
    gain = 1 / one - 1 / together  # seconds per sample saved by splitting the batch, before syncing
    allreduce = floor["allreduce_s"]
    batch = (best.get("config") or {}).get("batch_size") or base["split"][0]
    pays_at = allreduce / gain
    needed = batch * gain
    return (
        f"with one all-reduce a step (the {allreduce * 1000:.0f} ms floor of this link), a global batch "
        f"above {pays_at:,.0f} (now {batch}), or at this batch a link whose all-reduce of the model takes "
        f"under {needed * 1000:.0f} ms"
    )


def measured(records: list[dict], name: str) -> dict | None:
    """The row of strategy `name` that measured a throughput, if the run has one."""
    return next((r for r in records if r["strategy"] == name and r.get("samples_per_s")), None)


def _machines(record: dict) -> str:
    return " + ".join(f"{w['name']} ({w.get('device', '?')}, batch {w.get('batch', '?')})" for w in record["workers"])


def _to_target(record: dict, base: dict, alone: str) -> str:
    mine, theirs = record.get("time_to_target_s"), base.get("time_to_target_s")
    target = record.get("target_accuracy")
    if mine is None or theirs is None or target is None:
        return ""
    mine_at, theirs_at = f"{mine:.0f} s{_steps(record)}", f"{theirs:.0f} s{_steps(base)}"
    if pairs := seeded_pairs(record, base):
        gain, margin = paired_gain(pairs)
        of = f"the median of {len(pairs)} repeats on the same seeds"
        within = f"{gain:+.1f} s, {of}, within {margin:.1f} s"
        beyond = f": {abs(gain):.1f} s {'sooner' if gain > 0 else 'later'}, {of}, beyond {margin:.1f} s"
    else:
        gain, margin = theirs - mine, max(uncertainty(record), uncertainty(base))
        within, beyond = f"within {margin:.1f} s", ""
    if abs(gain) <= margin:  # a gain this run cannot tell from its resolution and spread
        return (
            f"; {target:.0%} test accuracy in the same training time as {alone} alone, as far as this run "
            f"can tell ({mine_at} and {theirs_at}: {within})"
        )
    return f"; {target:.0%} test accuracy after {mine_at} of training against {theirs_at} for {alone} alone{beyond}"


def _accuracy_lost(record: dict, base: dict, alone: str) -> str:
    """ "; it ends 2.1 points under ...": where the row's final test accuracy falls short of the
    baseline's by more than ACCURACY_KEPT (stale or compressed gradients can buy speed with it)."""
    mine, theirs = record.get("final_accuracy"), base.get("final_accuracy")
    if mine is None or theirs is None or theirs - mine <= ACCURACY_KEPT:
        return ""
    return (
        f"; it ends {(theirs - mine) * 100:.1f} points under {alone} alone in test accuracy "
        f"({mine:.1%} against {theirs:.1%})"
    )


def paired_gain(pairs: list[tuple]) -> tuple[float, float]:
    """From repeats on the same seeds: the median of the pairs' gains (the baseline's time less the
    row's), and the margin it must exceed to count, the widest checks around a crossing plus the
    width of the gains' 75% interval for their median (their whole range for 3-5 pairs, narrower
    with more, so that repeats added resolve a smaller gain)."""
    gains = [theirs - mine for mine, theirs, _, _ in pairs]
    widest = max(max(my_bracket, their_bracket) for _, _, my_bracket, their_bracket in pairs)
    low, high = median_interval(gains)
    return median(gains), widest + high - low


def seeded_pairs(record: dict, base: dict) -> list[tuple[float, float, float, float]] | None:
    """Each evaluated repeat beside the baseline's on the same seed (the same initial weights and
    batch order and dropout masks; a row whose arithmetic differs, compressed or stale, parts from
    the baseline's curve): (its time to target, the baseline's, the seconds since the check before
    each). None where they cannot be paired: other seeds, other repeat counts, a repeat that did
    not reach the target, or records from before the brackets."""
    times = [record.get("repeat_time_to_target_s") or [], base.get("repeat_time_to_target_s") or []]
    brackets = [record.get("repeat_target_bracket_s") or [], base.get("repeat_target_bracket_s") or []]
    seeds = [(r.get("config") or {}).get("seed") for r in (record, base)]
    columns = [*times, *brackets]
    if seeds[0] != seeds[1] or len(times[0]) < 2 or len({len(c) for c in columns}) != 1:
        return None
    pairs = list(zip(*columns))
    return None if any(None in pair for pair in pairs) else pairs


def _steps(record: dict) -> str:
    """ " (44 steps)": the median steps to target beside the seconds, where the record has them."""
    steps = record.get("steps_to_target")
    return f" ({steps:g} steps)" if steps is not None else ""


def uncertainty(record: dict) -> float:
    """Seconds within which two times to target cannot be told apart: the widest interval between
    the two checks the target was crossed between (fine near the target: training.Schedule.near),
    plus the spread of the evaluated repeats' times. Records from before the brackets: one
    eval_every interval of training."""
    times = [t for t in record.get("repeat_time_to_target_s") or [] if t is not None]
    spread = max(times) - min(times) if len(times) > 1 else 0.0
    brackets = [b for b in record.get("repeat_target_bracket_s") or [] if b is not None]
    if brackets:
        return max(brackets) + spread
    config = record.get("config") or {}
    every, batch, rate = config.get("eval_every"), config.get("batch_size"), record.get("samples_per_s")
    return (every * batch / rate if every and batch and rate else 0.0) + spread
