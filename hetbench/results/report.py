"""Comparison tables from records: baseline first, a relative column, sync overhead beside the gloo floor."""

from __future__ import annotations

import csv
import io
import textwrap
from pathlib import Path

from tabulate import tabulate

from hetbench.errors import UserError
from hetbench.floor import FLOOR_NAME as FLOOR
from hetbench.floor import PS_FLOOR_NAME as PS_FLOOR
from hetbench.results.columns import Column, Row, columns, headed_for
from hetbench.results.plots import label, write_plots
from hetbench.results.record import FloorRecord, Record, RowRecord, measured_floor
from hetbench.results.records import atomic_write, hand_to_owner, provenance
from hetbench.results.verdict import measured, verdict
from hetbench.results.whatif import whatif
from hetbench.step_rate import samples_per_s
from hetbench.strategies.registry import BASELINE


def ordered(records: list[Record]) -> list[Record]:
    """Baseline rows first, then the floors, then the rest in the order they ran."""
    rank = {BASELINE: 0, FLOOR: 1, PS_FLOOR: 1}
    return sorted(records, key=lambda r: rank.get(r.strategy, 2))


def _floor_path(record: FloorRecord) -> str:
    """Where the floor's two processes ran: between which workers' nodes, over which link."""
    path, link = record.path, record.link_rate
    over = f" over an emulated {link} link" if link else ""
    if not path:  # a record from before the floor was placed on the workers' nodes
        return f"2 processes{over}" if link else "2 local processes"
    a, b = path.between
    if path.ips[0] == path.ips[1]:
        return f"{a} <-> {b}, one host ({path.ips[0]})"
    return f"{a} ({path.ips[0]}) <-> {b} ({path.ips[1]}){over}"


def own_floor_s(record: Record, records: list[Record]) -> float | None:
    """The floor a row is judged against: its own pattern's (records from before the ps-floor: gloo's)."""
    name = record.strategy if isinstance(record, FloorRecord) else record.floor or FLOOR
    floor = measured_floor(records, name)
    return floor.seconds if floor else None


def _workers(record: Record) -> str:
    if isinstance(record, FloorRecord):
        return _floor_path(record) + (f" [{record.collective}]" if record.collective else "")
    collective = next((w.collective for w in record.workers if w.collective), None)
    return ", ".join(
        f"{w.name}:{w.device or '?'}x{w.batch or '?'}"
        + (f" (slowed {w.slowdown:g}x)" if w.slowdown > 1.0 else "")
        + (f" (lost at step {w.lost_at_step})" if w.lost_at_step is not None else "")
        for w in record.workers
    ) + (f" [{collective}]" if collective else "")


def _balance(record: Record) -> str | None:
    if isinstance(record, FloorRecord):
        return None
    return f"{record.balance}, re-split {record.resplits}x" if record.resplits else record.balance


TABLE: list[Column] = columns(_workers, _balance)
COLUMNS = [c.name for c in TABLE]  # the CSV's header and --wide's


def rows(records: list[Record]) -> list[list]:
    """Each record's value in every column (columns.py), the baseline first."""
    records = ordered(records)
    baseline = measured(records, BASELINE)
    floor = measured_floor(records)
    return [[c.value(Row(r, baseline, own_floor_s(r, records), _predicted(r, floor))) for c in TABLE] for r in records]


def _predicted(record: Record, floor: FloorRecord | None) -> tuple:
    """What the link allows: the global batch over (slowest compute + the strategy's floor transfers
    x the floor all-reduce of the same run), and measured / that (Strategy.floor_transfers)."""
    if isinstance(record, FloorRecord) or not floor or not record.floor_transfers or not record.samples_per_s:
        return None, None
    compute, batch = record.step and record.step.compute_s, record.config.batch_size
    if not compute or not batch:
        return None, None
    predicted = samples_per_s(batch, compute, record.floor_transfers, floor.seconds)
    return predicted, record.samples_per_s / predicted


def _narrow(cells: dict) -> list[str]:
    """A row of formatted cells as the narrow table's (a column shown with the one beside it)."""
    shown = []
    for c in TABLE:
        if c.narrow:
            beside = cells[c.beside] if c.beside else "-"
            shown.append(cells[c.name] if beside == "-" else c.beside_form.format(cells[c.name], beside))
    return shown


def markdown(records: list[Record], wide: bool = False) -> str:
    """The comparison table, verdict first; `wide`: every column of the CSV."""
    formatted = [{c.name: c.cell(v) for v, c in zip(row, TABLE)} for row in rows(records)]
    if wide:
        headers, body = COLUMNS, [[cells[c] for c in COLUMNS] for cells in formatted]
    else:
        headers, body = [c.header for c in TABLE if c.narrow], [_narrow(cells) for cells in formatted]
    table = tabulate(body, headers=headed_for(headers, records), tablefmt="github", disable_numparse=True)
    answer = "\n".join(verdict(records))
    return f"{answer}\n\n{table}" if answer else table


def to_csv(records: list[Record]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(headed_for(COLUMNS, records))
    for row in rows(records):
        writer.writerow(["" if v is None else v for v in row])
    return out.getvalue()


def write_tables(records: list[Record], results_dir: str, name: str) -> tuple[Path, Path]:
    """results/<name>.md (with the plots linked) and .csv; the plots themselves beside them."""
    md_path, csv_path = Path(results_dir) / f"{name}.md", Path(results_dir) / f"{name}.csv"
    try:
        md_path.parent.mkdir(parents=True, exist_ok=True)
        pictures = "".join(f"\n![{p.stem}]({p.name})\n" for p in write_plots(records, results_dir, name))
        predictions = f"{text}\n\n" if (text := whatif(records)) else ""
        atomic_write(
            md_path,
            f"# hetbench: {name}\n\n{_sourced(records)}{markdown(records)}\n\n{predictions}{alone(records)}"
            f"{legend(records)}\n{pictures}",
        )
        atomic_write(csv_path, to_csv(records))
        hand_to_owner(results_dir)  # the run's records, tables and plots: the last files a run writes
    except OSError as e:
        raise UserError(f"results directory {results_dir} is not writable: {e.strerror or e}") from None
    return md_path, csv_path


def _sourced(records: list[Record]) -> str:
    return f"{line}\n\n" if (line := provenance(records)) else ""


def alone(records: list[Record]) -> str:
    """The scaling reference's own figures, a table: each worker's timings alone, in run order, just
    before and after each row they judge (a timing between two rows serves both, shown once);
    records from before the brackets were timed at the start and the end of the run."""
    around = [(label(r), r.standalone_timings) for r in records if isinstance(r, RowRecord) and r.standalone_timings]
    if not around:
        return ""
    names = list(around[0][1])
    moments: list[tuple[str, dict[str, list[float]]]] = []  # (when, each worker's timing then)
    if next(iter(around[0][1].values())).whole_run:
        title = "Each worker alone, samples/s (each timing; at the start of the run and at its end):"
        timings = around[0][1]
        moments = [("the run's start", {n: t.before for n, t in timings.items()})]
        moments.append(("the run's end", {n: t.after for n, t in timings.items()}))
    else:
        title = "Each worker alone, samples/s (timed just before and after each row it judges, in run order):"
        for row, timings in around:
            before = {n: t.before for n, t in timings.items()}
            if not moments or moments[-1][1] != before:
                moments.append((f"before {row}", before))
            moments.append((f"after {row}", {n: t.after for n, t in timings.items()}))
    body = [[when, *(_each(rates.get(n, [])) for n in names)] for when, rates in moments]
    table = tabulate(body, headers=["timed", *names], tablefmt="github", disable_numparse=True)
    return f"{title}\n\n{table}\n\n"


def _each(rates: list[float]) -> str:
    return "/".join(f"{rate:.0f}" for rate in rates)


def legend(records: list[Record]) -> str:
    """The columns explained, then each strategy's own note (Strategy.table_note) where it has a row."""
    ran = [r for r in records if isinstance(r, RowRecord)]
    notes = dict.fromkeys(r.table_note for r in ran if r.table_note)
    if any((r.evaluated_repeats or 0) < len(r.repeat_timed_steps) for r in ran):
        notes[SPEED_STEPS_NOTE] = None
    notes.update(dict.fromkeys(resumed_note(r) for r in ran if "resumed_at" in r.extras))
    return "\n".join([LEGEND, *notes])


def resumed_note(row: RowRecord) -> str:
    """How an interrupted row went on (hetbench run --resume): from its checkpoint, or its unfinished
    repeat trained again from its start (a strategy that keeps no checkpoint within a repeat)."""
    at = row.extras["resumed_at"]
    repeat = f"repeat {at['repeat'] + 1}"
    how = f"from its checkpoint after step {at['step']}" if at["step"] else "trained again from its start"
    return f"{label(row)}: resumed after an interrupt, {repeat} {how}."


SPEED_STEPS_NOTE = "test acc and time to target: the evaluated repeats' (speed_steps timed the others only)."


# What the columns do not say themselves: the floor rows, the accuracy checks, the verdict's pairing.
NOTES = """\
On the gloo-floor row: one raw all-reduce of the model's flat buffer (4 bytes a parameter) between
the reference worker's node and the next worker's (the workers' own path), measured in the same
run; on the ps-floor row one round trip of that buffer over a direct TCP channel between the same two
processes, up and back down (a parameter server's gradient up, then weights down).
Accuracy (a loss workload's test loss) is checked every eval_every steps, and every fine_eval_every
steps once it is within fine_eval_within of the target: the crossing is known to that interval. The verdict pairs each
evaluated repeat with the baseline's on the same seed, and claims a time gain only where the pairs'
median gain exceeds the widest check interval around a crossing plus the gains' spread (their range
for 3-5 repeats; with more, the width of the 75% interval for their median)."""

LEGEND = "\n".join(
    [
        "The CSV and `hetbench report --wide` hold every column; the table shows those that answer.",
        *(textwrap.fill(f"{c.name}: {c.legend}.", 100) for c in TABLE if c.legend),
        NOTES,
    ]
)
