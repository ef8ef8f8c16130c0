"""The answer first: which strategy and split to use on these machines, or that one machine alone is
best, and why each other row loses; derived from a run's records, never written by hand."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetbench.clock import median, median_interval
from hetbench.results.plots import label
from hetbench.results.record import FloorRecord, Record, RowRecord, Step, measured_floor, megabytes
from hetbench.step_rate import allreduce_that_pays, batch_that_pays, fewer_bytes_that_pay, smallest_sync_every
from hetbench.strategies.registry import BASELINE

ACCURACY_KEPT = 0.005  # run.accuracy_tolerance's default, for records from before the setting


@dataclass(frozen=True)
class Comparison:
    """One row against the best machine alone, in the terms of the rule (`pays`)."""

    record: RowRecord
    ratio: float  # its samples/s over the baseline's
    faster: bool  # samples/s beyond the spread: every repeat's figure above every one of the baseline's
    to_target: TargetTimes | None  # sooner, the same or later to the target; None: neither reached it
    lost: float  # how much worse its final test metric is than the baseline's (Metric.shortfall; 0 if not)
    tolerance: float  # run.accuracy_tolerance (loss_tolerance): what it may lose and still count as the same model

    @property
    def keeps_accuracy(self) -> bool:
        return self.lost <= self.tolerance + 1e-12

    def pays(self, by_time: bool) -> bool:
        """The rule: the row reaches the target sooner than the best machine alone, beyond the run's
        resolution and spread, and ends within the accuracy tolerance of it. Where neither the
        baseline nor any row reached the target (`by_time` False): samples/s beyond the repeats'
        ranges, within the tolerance."""
        if not self.keeps_accuracy:
            return False
        if by_time:
            return self.to_target is not None and self.to_target.kind == "sooner"
        return self.faster


def compare(record: RowRecord, base: RowRecord, alone: str) -> Comparison:
    """`record` against the baseline `base` (the best machine, `alone`), by the figures the rule reads."""
    mine, theirs, metric = record.final_accuracy, base.final_accuracy, base.metric
    tolerance = metric.tolerance(base.config)
    return Comparison(
        record=record,
        ratio=record.samples_per_s / base.samples_per_s,
        faster=_beyond_ranges(record, base),
        to_target=_to_target(record, base, alone),
        lost=metric.shortfall(mine, theirs) if mine is not None and theirs is not None else 0.0,
        tolerance=ACCURACY_KEPT if tolerance is None else tolerance,
    )


@dataclass(frozen=True)
class Judged:
    """A run's rows, each compared with the best machine alone: what the verdict and the link report
    read, so that nothing calls a row paying by another test."""

    base: RowRecord
    alone: str  # the baseline's machine, by its worker's name
    compared: list[Comparison]
    by_time: bool  # the rule compares times to target: the baseline or some row reached it

    def of(self, record: Record) -> Comparison | None:
        return next((c for c in self.compared if c.record is record), None)

    def pays(self, record: Record) -> bool:
        c = self.of(record)
        return c is not None and c.pays(self.by_time)


def judged(records: list[Record]) -> Judged | None:
    """The run's rows against its baseline; None without a baseline or a distributed row."""
    base = measured(records, BASELINE)
    rows = distributed(records)
    if not base or not rows:
        return None
    alone = base.reference.worker if base.reference else base.workers[0].name
    compared = [compare(r, base, alone) for r in rows]
    return Judged(base, alone, compared, any(c.to_target is not None for c in compared))


def verdict(records: list[Record]) -> list[str]:
    """The verdict's lines: the answer, then one line per other row (docs/design.md, "The verdict's rule")."""
    run = judged(records)
    if run is None:
        return []
    base, alone, compared, by_time = run.base, run.alone, run.compared, run.by_time
    floor = measured_floor(records)
    paying = [c for c in compared if c.pays(by_time)]
    fastest = max(compared, key=lambda c: c.ratio)
    base_figures = f"{base.samples_per_s:,.0f} samples/s"
    if paying:
        chosen = max(paying, key=lambda c: (c.to_target.gain_s, c.ratio) if by_time else (c.ratio,))
        r = chosen.record
        figures = f"{r.samples_per_s:,.0f} samples/s, {chosen.ratio:.2f}x {alone} alone ({base.samples_per_s:,.0f})"
        if by_time:
            answer = f"{chosen.to_target.answer}; {figures}"
        else:
            answer = f"{figures}, beyond the repeats' ranges; no row reached {_target(r)} in this run"
        lines = [f"Verdict: use {label(r)} on {_machines(r)}: {answer}{_drifted(r)}."]
    else:
        same = [c for c in compared if c.to_target and c.to_target.kind == "same" and c.keeps_accuracy]
        chosen = max(same, key=lambda c: c.ratio) if same else None  # a row that matches the time, named
        if same:
            answer = f"{label(chosen.record)} {chosen.to_target.answer}"
        else:
            beats = f"reaches {_target(fastest.record)} sooner" if by_time else "beats it beyond the repeats' ranges"
            answer = f"no strategy {beats} here (best samples/s: {label(fastest.record)}, {fastest.ratio:.2f}x)"
        lines = [f"Verdict: keep to {alone} alone ({base_figures}): {answer}{_drifted(chosen and chosen.record)}."]
        if change := what_would_change_it(fastest.record, base, floor):
            lines.append(f"  What would change it: {change[0]}.")
            lines += [f"  On this link and batch: {each}." for each in change[1:]]
    for c in compared:
        if c is chosen:
            continue
        why = _also(c, chosen, by_time, floor) if any(c is p for p in paying) else _why_not(c, floor, alone)
        lines.append(f"  {label(c.record)}: {why}{_drifted(c.record)}")
    lines += plan_lines(records, compared)
    if base.workload and not base.workload.exact:
        lines.append(
            f"  Not exact ({base.workload.name}): {base.workload.inexact}; compared by repeats, not paired by seed."
        )
    return lines


def plan_lines(records: list[Record], compared: list[Comparison]) -> list[str]:
    """The plan beside the race: each raced row's ratio as the plan at the run's start predicted it,
    against the measured (its error); the rows predicted only (plan.race worth), as predicted."""
    lines = []
    checked = [c for c in compared if c.record.plan and c.record.plan.vs_alone]
    if checked:
        each = [f"{label(c.record)} {c.record.plan.vs_alone:.2f}x ({plan_error(c):+.0%})" for c in checked]
        lines.append(f"  The plan at the start, against the race: {', '.join(each)}.")
    unraced = [r for r in records if isinstance(r, RowRecord) and r.status == "predicted" and r.plan]
    if unraced:
        each = [f"{label(r)} {r.plan.vs_alone:.2f}x ({r.reason.split(':')[0]})" for r in unraced]
        lines.append(f"  Predicted, not raced: {', '.join(each)}.")
    return lines


def plan_error(c: Comparison) -> float:
    """How far the plan's ratio of a raced row is off its measured ratio (+: the plan said faster)."""
    return c.record.plan.vs_alone / c.ratio - 1


def _drifted(record: RowRecord | None) -> str:
    """A row measured while a machine changed under it says so: its figures are of that machine."""
    phrase = record and record.drift_phrase()
    return f" (flagged: {phrase})" if phrase else ""


def _also(c: Comparison, chosen: Comparison, by_time: bool, floor: FloorRecord | None) -> str:
    """A row the rule recommends too, but less than the answer: its gain beside the answer's, then
    where its step goes."""
    if by_time:
        theirs = chosen.to_target
        answer = f"{theirs.gain_s:.1f} s" if math.isfinite(theirs.gain_s) else theirs.short
        pays = f"also pays ({c.to_target.short}; the answer: {answer})"
    else:
        pays = f"also pays beyond the repeats' ranges (the answer: {chosen.ratio:.2f}x)"
    return f"{c.ratio:.2f}x, {pays}; {why_it_loses(c.record, floor)}"


def _why_not(c: Comparison, floor: FloorRecord | None, alone: str) -> str:
    """Why a row is not the answer: where it wins samples/s, what that costs it; else what it loses to."""
    accuracy = "" if c.keeps_accuracy else c.record.metric.worse(c.lost)
    times = c.to_target.short if c.to_target and c.to_target.kind != "sooner" else ""
    if c.ratio > 1 and (times or accuracy):
        trade = f" ({_trade(c.record)})" if _trade(c.record) else ""
        return f"{c.ratio:.2f}x the samples/s, but {' and '.join(filter(None, [times, accuracy]))}{trade}"
    said = f"; {times}" if times else ""
    lost = f"; it ends {accuracy} than {alone} alone" if accuracy else ""
    return f"{c.ratio:.2f}x, {why_it_loses(c.record, floor)}{said}{lost}"


def why_it_loses(record: RowRecord, floor: FloorRecord | None) -> str:
    """The largest part of its step beyond the slowest worker's compute: idling for the slow worker,
    the link (its transfers of the model at the floor's time), or its own overhead beyond both."""
    step = record.step or Step()
    total, overhead, wait = step.total_s, step.sync_overhead_s, step.wait_s or 0.0
    if not total or overhead is None:
        return "no step timings in its record"
    link = (record.floor_transfers or 0) * floor.seconds if floor else 0.0
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
            f"link-bound: moving the model {record.floor_transfers}x a step takes {ms:.0f} ms of each "
            f"{total * 1000:.0f} ms step at the floor's {floor.seconds * 1000:.1f} ms"
        )
    return f"overhead: {ms:.0f} ms a step beyond compute and the link's share, of {total * 1000:.0f} ms"


def what_would_change_it(best: RowRecord, base: RowRecord, floor: FloorRecord | None) -> list[str]:
    """From the measured speeds alone and the floor: the global batch from which an all-reduce over
    this link pays, and the all-reduce time at which it pays at this batch; then, where this link is
    too slow at this batch, what would pay on it (one sentence each)."""
    speeds = [w.standalone_samples_per_s for w in best.workers]
    if not floor or not all(speeds):
        return []
    together, one = sum(speeds), base.samples_per_s
    if together <= one * 1.001:
        return ["nothing on this link or batch: the other machines add no speed even with a free link"]
    allreduce = floor.seconds
    batch = best.config.batch_size or base.split[0]
    pays_at = batch_that_pays(allreduce, one, together)
    needed = allreduce_that_pays(batch, one, together)
    size = megabytes(floor.bytes) if floor.bytes else "model"
    compute = ", ".join(
        f"{w.name} ({w.device or '?'}) {1000 / s:.2f} ms" for w, s in zip(best.workers, speeds, strict=True)
    )
    larger = (
        f"{best.workload_name} moves {size} a step and computes a sample in {compute} alone: with one all-reduce "
        f"a step (the {allreduce * 1000:.0f} ms floor of this link), a global batch above {pays_at:,.0f} "
        f"(now {batch}), or at this batch a link whose all-reduce of its {size} takes under {needed * 1000:.0f} ms"
    )
    return [larger] + ([on_this_link(allreduce, needed, floor.fixed_s)] if allreduce > needed else [])


def on_this_link(allreduce: float, needed: float, fixed: float | None) -> str:
    """On a link too slow at this batch: every how many steps an all-reduce pays (its time over the
    compute the other machines save), and how many times fewer bytes would (the floor's time beyond
    its fixed part, known where the link was emulated)."""
    said = f"one all-reduce every {smallest_sync_every(allreduce, needed)} steps (ray-localsgd's sync_every)"
    if fixed is None:
        return said
    if needed <= fixed:
        return f"{said}; no fewer bytes would do: this link's fixed {fixed * 1000:.0f} ms alone is more"
    return f"{said}, or {fewer_bytes_that_pay(allreduce, needed, fixed):.1f}x fewer bytes (a bfloat16 wire halves them)"


def measured(records: list[Record], name: str) -> RowRecord | None:
    """The row of strategy `name` that measured a throughput, if the run has one."""
    return next((r for r in records if r.strategy == name and r.trained), None)


def distributed(records: list[Record]) -> list[RowRecord]:
    """The rows other than the baseline that measured a throughput."""
    return [r for r in records if r.strategy != BASELINE and r.trained]


def _machines(record: RowRecord) -> str:
    return " + ".join(f"{w.name} ({w.device or '?'}, batch {w.batch or '?'})" for w in record.workers)


@dataclass(frozen=True)
class TargetTimes:
    """A row's time to the target against the baseline's."""

    kind: str  # sooner | same | later, beyond (or within) the run's resolution and spread
    gain_s: float  # the baseline's time less the row's (inf / -inf: only one of them reached it)
    answer: str  # the clause that says it, after "Verdict: use ROW on ...: " or "keep to ...: ROW "
    short: str  # the same in a few words, for a row's own line ("1.8 s later to 90%")


def _to_target(record: RowRecord, base: RowRecord, alone: str) -> TargetTimes | None:
    """Sooner, the same or later to the target than the baseline, by the seed-paired gain beyond
    its margin where the repeats pair (paired_gain), else by the gap beyond both rows' resolution
    and spread (uncertainty); None where neither reached the target or a record has no target."""
    mine, theirs = record.time_to_target_s, base.time_to_target_s
    target = record.target_accuracy or base.target_accuracy
    if target is None or (mine is None and theirs is None):
        return None
    at, at_full = base.metric.short(target), base.metric.at(target)
    if theirs is None:
        return TargetTimes(
            "sooner",
            float("inf"),
            f"{at_full} after {mine:.0f} s{_steps(record)} of training, "
            f"where {alone} alone did not reach it in the run",
            f"reaches {at}, where {alone} alone does not",
        )
    theirs_at = f"{theirs:.0f} s{_steps(base)}"
    if mine is None:
        return TargetTimes("later", -float("inf"), "", f"does not reach {at} ({alone} alone: {theirs_at})")
    mine_at = f"{mine:.0f} s{_steps(record)}"
    if pairs := seeded_pairs(record, base):
        gain, margin = paired_gain(pairs)
        of = f"the median of {len(pairs)} repeats on the same seeds"
        within = f"{gain:+.1f} s, {of}, within {margin:.1f} s"
        beyond = f": {abs(gain):.1f} s {'sooner' if gain > 0 else 'later'}, {of}, beyond {margin:.1f} s"
    else:
        gain, margin = theirs - mine, max(uncertainty(record), uncertainty(base))
        within, beyond = f"within {margin:.1f} s", f", beyond {margin:.1f} s" if margin else ""
    if abs(gain) <= margin:  # a gain this run cannot tell from its resolution and spread
        return TargetTimes(
            "same",
            gain,
            f"reaches {at_full} in the same training time as {alone} alone, as far as this run "
            f"can tell ({mine_at} and {theirs_at}: {within})",
            f"reaches {at} in the same time, within {margin:.1f} s",
        )
    kind = "sooner" if gain > 0 else "later"
    return TargetTimes(
        kind,
        gain,
        f"{at_full} after {mine_at} of training against {theirs_at} for {alone} alone{beyond}",
        f"{abs(gain):.1f} s {kind} to {at}",
    )


def ratio_range(record: RowRecord, base: RowRecord) -> tuple[float, float] | None:
    """The lowest and highest of the row's repeats' samples/s over the baseline's median (2+ repeats)."""
    mine = record.repeat_samples_per_s
    if len(mine) < 2:
        return None
    return min(mine) / base.samples_per_s, max(mine) / base.samples_per_s


def _beyond_ranges(record: RowRecord, base: RowRecord) -> bool:
    """samples/s beyond the spread: with two repeats or more on each side, every one of the row's
    above every one of the baseline's (the repeats' ranges do not overlap)."""
    mine, theirs = record.repeat_samples_per_s, base.repeat_samples_per_s
    return len(mine) >= 2 and len(theirs) >= 2 and min(mine) > max(theirs)


def _trade(record: RowRecord) -> str:
    """What the row trades arithmetic for speed with, where it does: what may cost it accuracy."""
    config, name = record.config, record.strategy
    own = config.of(name)
    trades = []
    if own.compression == "powersgd":
        trades.append(f"PowerSGD rank {own.powersgd_rank}")
    if name == "ray-ps-async":
        trades.append("stale gradients")
    if name == "ray-localsgd":
        trades.append(f"an exchange every {own.sync_every} steps")
    if config.wire_dtype != "float32":
        trades.append(f"{config.wire_dtype} on the wire")
    return ", ".join(trades)


def _target(record: RowRecord) -> str:
    target = record.target_accuracy
    return record.metric.short(target) if target is not None else "the target"


def paired_gain(pairs: list[tuple]) -> tuple[float, float]:
    """From repeats on the same seeds: the median of the pairs' gains (the baseline's time less the
    row's), and the margin it must exceed to count, the widest checks around a crossing plus the
    width of the gains' 75% interval for their median (their whole range for 3-5 pairs, narrower
    with more, so that repeats added resolve a smaller gain)."""
    gains = [theirs - mine for mine, theirs, _, _ in pairs]
    widest = max(max(my_bracket, their_bracket) for _, _, my_bracket, their_bracket in pairs)
    low, high = median_interval(gains)
    return median(gains), widest + high - low


def seeded_pairs(record: RowRecord, base: RowRecord) -> list[tuple[float, float, float, float]] | None:
    """Each evaluated repeat beside the baseline's on the same seed (the same initial weights and
    batch order and dropout masks; a row whose arithmetic differs, compressed or stale, parts from
    the baseline's curve): (its time to target, the baseline's, the seconds since the check before
    each). None where they cannot be paired: other seeds, other repeat counts, a repeat that did
    not reach the target, records from before the brackets, or a workload whose dropout is not
    keyed by sample (its masks differ with the batch's split)."""
    times = [record.repeat_time_to_target_s, base.repeat_time_to_target_s]
    brackets = [record.repeat_target_bracket_s, base.repeat_target_bracket_s]
    seeds = [r.config.seed for r in (record, base)]
    columns = [*times, *brackets]
    inexact = any(r.workload and not r.workload.exact for r in (record, base))  # its trajectories part
    if inexact or seeds[0] != seeds[1] or len(times[0]) < 2 or len({len(c) for c in columns}) != 1:
        return None
    pairs = list(zip(*columns))
    return None if any(None in pair for pair in pairs) else pairs


def _steps(record: RowRecord) -> str:
    """ " (44 steps)": the median steps to target beside the seconds, where the record has them."""
    steps = record.steps_to_target
    return f" ({steps:g} steps)" if steps is not None else ""


def uncertainty(record: RowRecord) -> float:
    """Seconds within which two times to target cannot be told apart: the widest interval between
    the two checks the target was crossed between (fine near the target: training.Schedule.near),
    plus the spread of the evaluated repeats' times. Records from before the brackets: one
    eval_every interval of training."""
    times = [t for t in record.repeat_time_to_target_s if t is not None]
    spread = max(times) - min(times) if len(times) > 1 else 0.0
    brackets = [b for b in record.repeat_target_bracket_s if b is not None]
    if brackets:
        return max(brackets) + spread
    every, batch, rate = record.config.eval_every, record.config.batch_size, record.samples_per_s
    return (every * batch / rate if every and batch and rate else 0.0) + spread
