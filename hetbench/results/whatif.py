"""What if the link or the batch were different: predicted samples/s of each synchronous strategy,
from what this run measured (each worker's speed alone, the strategy's overhead beyond the floor,
the floor itself). Predictions, printed as such beside the measured rows; never a measurement."""

from __future__ import annotations

import textwrap

from tabulate import tabulate

from hetbench.config import LINK_PROFILES
from hetbench.floor import FLOOR_NAME as FLOOR
from hetbench.results.plots import label
from hetbench.results.record import FloorRecord, Record, RowRecord, Step, bits_per_s, measured_floor, megabytes
from hetbench.results.verdict import distributed, measured
from hetbench.step_rate import samples_per_s
from hetbench.strategies.registry import BASELINE

BATCH_FACTORS = (1, 4)  # the configured global batch, and four times it


LINKS = {  # column -> bits per second: the link profiles a run can emulate
    name if name == rate else f"{name} ({rate})": bits_per_s(rate) for name, rate in LINK_PROFILES.items()
}


def floor_on(floor: FloorRecord, rate: float) -> float:
    """The floor's all-reduce on a link of `rate`: its fixed part (the measured time less the
    measured link's transfer, when the link was emulated) plus the model's bytes at that rate."""
    fixed = floor.fixed_s
    return (floor.seconds if fixed is None else fixed) + floor.bytes * 8 / rate


def predicted(record: RowRecord, floor: FloorRecord, batch: int, rate: float | None) -> float | None:
    """Samples/s at `batch` over `rate` (None: this run's own link): the batch split as the row split
    it (the slowest share sets the compute), the strategy's transfers at the floor's time on that
    link, and its own overhead beyond the floor (and beyond waiting for the slow worker) as measured
    in this run."""
    speeds = [w.standalone_samples_per_s for w in record.workers]
    shares = [w.batch for w in record.workers]
    step, transfers = record.step or Step(), record.floor_transfers
    if not speeds or not all(speeds) or not all(shares) or not transfers or step.sync_overhead_s is None:
        return None
    compute = max(batch * share / sum(shares) / speed for share, speed in zip(shares, speeds))
    own = max(step.sync_overhead_s - (step.wait_s or 0.0) - transfers * floor.seconds, 0.0)
    allreduce = floor.seconds if rate is None else floor_on(floor, rate)
    return samples_per_s(batch, compute, transfers, allreduce, own)


def checked(records: list[RowRecord], floor: FloorRecord) -> str:
    """Each measured row against one prediction of it, in a table: the plan's at the run's start
    where it made one (before any row: each strategy at its floor), else the what-if model's (at its
    own link and batch, with its own overhead as measured here); the error, and where the step went,
    predicted/measured ms (each worker's compute, or a synchronous row's slowest, and the rest of a
    synchronous step: the link, the strategy's own overhead). Then what the plan ran through."""
    body = []
    for r in records:
        batch = r.config.batch_size
        guess, by = (r.plan.samples_per_s, "plan") if r.plan else (predicted(r, floor, batch, None), "model")
        if not guess or not r.samples_per_s:
            continue
        compute, rest = _where(r)
        body.append([label(r), f"{guess:,.0f}", by, f"{r.samples_per_s:,.0f}", _error(guess, r.samples_per_s)])
        body[-1] += [compute or "-", rest or "-"]
    if not body:
        return ""
    headers = ["row", "predicted samples/s", "by", "measured", "error", "compute ms (predicted/measured)", "rest ms"]
    table = tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)
    return f"Each row against a prediction of it (samples/s):\n\n{table}\n\n{_plan_notes(records)}".strip()


def _plan_notes(records: list[RowRecord]) -> str:
    """What `plan` in the table ran through, and each row's error at other speeds, in short lines."""
    planned = [r for r in records if r.plan and r.samples_per_s]
    if not planned:
        return "model: each worker's speed alone, the floor, and the row's own overhead as measured here."
    timed = "before any row"
    if any(r.plan.at_row for r in planned):
        timed = "with each worker at its speed alone around the row"
    lines = [f"plan: predicted from this run's timings {timed}, each strategy at its floor."]
    for way, lockstep in (("in lockstep", True), ("at their own pace", False)):
        if rows := [r for r in planned if r.plan.sharing and r.plan.lockstep == lockstep]:
            each = ", ".join(f"{n} {f:.2f}x" for n, f in rows[0].plan.sharing.items())
            lines.append(f"Its workers as much slower as beside the others at the start, {way}: {each}.")
    if started := next((r.plan.timed_alone_s for r in planned if r.plan.timed_alone_s), None):
        each = ", ".join(f"{n} {'/'.join(f'{s * 1e3:,.0f}' for s in steps)}" for n, steps in started.items())
        lines.append(f"Their steps alone at the start, the global batch's/the equal share's, ms: {each}.")
    for speeds, kept in (("the row's", "at_row_samples_per_s"), ("the start's", "at_start_samples_per_s")):
        if each := [f"{label(r)} {_error(v, r.samples_per_s)}" for r in planned if (v := getattr(r.plan, kept))]:
            lines.append(f"The same plan with each worker at {speeds} speeds: {', '.join(each)}.")
    return "\n".join(textwrap.fill(line, 100, break_on_hyphens=False) for line in lines)


def _where(record: RowRecord) -> tuple[str, str]:
    """Where a row's step went, predicted/measured ms: each worker's compute (the slowest's alone in
    records from before each was kept) and, for a synchronous row, the rest of its step (the link,
    a strategy's own overhead): which worker, and which side, the plan missed on. ("", ""): not known."""
    plan, step, batch = record.plan, record.step, record.config.batch_size
    if not plan:
        return "", ""
    measured = {w.name: w.compute_s for w in record.workers}
    each = [f"{n} {p * 1e3:.0f}/{measured[n] * 1e3:.0f}" for n, p in plan.worker_compute_s.items() if measured.get(n)]
    if not (plan.compute_s and step and step.compute_s and step.total_s and batch):
        return ", ".join(each), ""
    each = each or [f"{plan.compute_s * 1e3:.0f}/{step.compute_s * 1e3:.0f}"]
    rest = (batch / plan.samples_per_s - plan.compute_s, step.total_s - step.compute_s)
    return ", ".join(each), f"{rest[0] * 1e3:.0f}/{rest[1] * 1e3:.0f}"


def whatif(records: list[Record]) -> str:
    """The what-if table (Markdown), or "" when the run lacks what it needs (the floor's bytes,
    the workers' speeds alone, a baseline)."""
    floor = floor_record(records)
    base = measured(records, BASELINE)
    rows = distributed(records)
    if not floor or not base or not rows:
        return ""
    configured = rows[0].config.batch_size or base.split[0]
    body = []
    for factor in BATCH_FACTORS:
        batch = configured * factor
        body.append([BASELINE, batch, *[f"{base.samples_per_s:,.0f}" for _ in LINKS]])
        for r in rows:
            cells = [predicted(r, floor, batch, rate) for rate in LINKS.values()]
            if any(c is None for c in cells):
                continue
            body.append([label(r), batch, *[f"{c:,.0f} ({c / base.samples_per_s:.2f}x)" for c in cells]])
    if len(body) == len(BATCH_FACTORS):
        return ""
    table = tabulate(body, headers=["predicted samples/s", "batch", *LINKS], tablefmt="github", disable_numparse=True)
    said = (
        "What if (predictions from this run's measurements, not measured): the batch split as each row "
        "split it, at the workers' speeds alone, each strategy's transfers of the model at the floor's "
        "all-reduce time on that link "
        f"(its fixed part plus the {megabytes(floor.bytes)} at the link's rate), and its own overhead "
        "beyond the floor as measured here. The single row stays as measured (per-sample cost taken as "
        "constant)."
    )
    check = checked(rows, floor)
    return textwrap.fill(said, 100, break_on_hyphens=False) + "\n\n" + table + (f"\n\n{check}" if check else "")


def against(base: list[Record], linked: list[Record]) -> str:
    """The model validated: `base` (a run on its own link) predicts every synchronous row of
    `linked` (the same machines over an emulated link, its floor naming the rate), beside what
    `linked` measured, with the error. "" when either lacks what that needs."""
    floor = floor_record(base)
    linked_floor = floor_record(linked)
    rate = bits_per_s(linked_floor.link_rate) if linked_floor else None
    if not floor or not rate:
        return ""
    body = []
    if linked_floor:
        guess = floor_on(floor, rate)
        body.append(
            [
                FLOOR,
                "-",
                f"{guess * 1e3:.0f} ms",
                f"{linked_floor.seconds * 1e3:.0f} ms",
                _error(guess, linked_floor.seconds),
            ]
        )
    for row in [r for r in linked if r.trained]:
        model = next((r for r in base if r.trained and (r.strategy, r.balance) == (row.strategy, row.balance)), None)
        batch = row.config.batch_size
        guess = predicted(model, floor, batch, rate) if model and batch else None
        if guess:
            body.append(
                [
                    row.strategy,
                    row.balance or "-",
                    f"{guess:,.0f}",
                    f"{row.samples_per_s:,.0f}",
                    _error(guess, row.samples_per_s),
                ]
            )
    if len(body) <= 1:
        return ""
    headers = ["row", "balance", "predicted", "measured", "error"]
    return (
        f"The what-if model checked: predicted from the run on its own link, measured over the emulated "
        f"{linked_floor.link_rate} link (samples/s; the floor's all-reduce in ms).\n\n"
        + tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)
    )


def floor_record(records: list[Record]) -> FloorRecord | None:
    """The run's measured gloo-floor with its bytes, if it has one."""
    floor = measured_floor(records)
    return floor if floor and floor.bytes else None


def _error(guess: float, measured: float) -> str:
    return f"{(guess - measured) / measured:+.0%}"
