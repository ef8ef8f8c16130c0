"""Comparison tables from records: baseline first, a relative column, sync overhead beside the gloo floor."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from tabulate import tabulate

from hetbench.errors import UserError
from hetbench.floor import FLOOR_NAME as FLOOR
from hetbench.floor import FLOORS
from hetbench.floor import PS_FLOOR_NAME as PS_FLOOR
from hetbench.results.plots import scaling_figure, write_plots
from hetbench.results.records import atomic_write, hand_to_owner, provenance
from hetbench.results.verdict import measured, verdict
from hetbench.results.whatif import whatif
from hetbench.strategies.registry import BASELINE

COLUMNS = [
    "strategy",
    "balance",
    "workers",
    "samples/s",
    "CV",
    "vs baseline",
    "scaling eff",
    "compute ms",
    "comm ms",
    "update ms",
    "optimizer ms",
    "wait ms",
    "sync overhead ms",
    "vs floor",
    "floor-predicted samples/s",
    "vs predicted",
    "test acc",
    "time to target s",
    "steps to target",
    "startup s",
    "status",
]


def ordered(records: list[dict]) -> list[dict]:
    """Baseline rows first, then the floors, then the rest in the order they ran."""
    rank = {BASELINE: 0, FLOOR: 1, PS_FLOOR: 1}
    return sorted(records, key=lambda r: rank.get(r["strategy"], 2))


def _ms(seconds):
    return None if seconds is None else seconds * 1000


def _floor_path(record: dict) -> str:
    """Where the floor's two processes ran: between which workers' nodes, over which link."""
    path = record.get("path")
    link = (record.get("link") or {}).get("rate")
    over = f" over an emulated {link} link" if link else ""
    if not path:  # a record from before the floor was placed on the workers' nodes
        return f"2 processes{over}" if link else "2 local processes"
    a, b = path["between"]
    if path["ips"][0] == path["ips"][1]:
        return f"{a} <-> {b}, one host ({path['ips'][0]})"
    return f"{a} ({path['ips'][0]}) <-> {b} ({path['ips'][1]}){over}"


def floor_seconds(record: dict) -> float | None:
    """A floor row's figure: one all-reduce (gloo-floor), one round trip (ps-floor)."""
    return record.get("allreduce_s") or record.get("roundtrip_s")


def own_floor_s(record: dict, records: list[dict]) -> float | None:
    """The floor a row is judged against: its own pattern's (records from before the ps-floor: gloo's)."""
    name = record["strategy"] if record["strategy"] in FLOORS else record.get("floor", FLOOR)
    return next((floor_seconds(r) for r in records if r["strategy"] == name and floor_seconds(r)), None)


def _workers(record: dict) -> str:
    if record["strategy"] in FLOORS:
        return _floor_path(record) + (f" [{record['collective']}]" if record.get("collective") else "")
    workers = record.get("workers", [])
    collective = next((w["collective"] for w in workers if w.get("collective")), None)
    return ", ".join(
        f"{w['name']}:{w.get('device', '?')}x{w.get('batch', '?')}"
        + (f" (slowed {w['slowdown']:g}x)" if w.get("slowdown", 1.0) > 1.0 else "")
        + (f" (lost at step {w['lost_at_step']})" if "lost_at_step" in w else "")
        for w in workers
    ) + (f" [{collective}]" if collective else "")


def _balance(record: dict) -> str | None:
    resplits = sum(1 for event in record.get("events", []) if "rebalanced" in event and not event.get("in_warmup"))
    return f"{record.get('balance')}, re-split {resplits}x" if resplits else record.get("balance")


def rows(records: list[dict]) -> list[list]:
    records = ordered(records)
    baseline = measured(records, BASELINE)
    floor = next((r for r in records if r["strategy"] == FLOOR and r.get("allreduce_s")), None)
    table = []
    for r in records:
        step = r.get("step") or {}
        overhead = floor_seconds(r) if r["strategy"] in FLOORS else step.get("sync_overhead_s")
        if r["strategy"] == BASELINE:
            overhead = None
        own = own_floor_s(r, records)
        table.append(
            [
                r["strategy"],
                _balance(r),
                _workers(r),
                r.get("samples_per_s"),
                r.get("samples_per_s_cv", r.get("allreduce_cv", r.get("roundtrip_cv"))),
                r["samples_per_s"] / baseline["samples_per_s"] if baseline and r.get("samples_per_s") else None,
                scaling_figure(r),
                _ms(step.get("compute_s")),
                _ms(step.get("comm_s")),
                _ms(step.get("update_s")) if step.get("update_s") else None,
                _ms(step.get("optimizer_s")) if step.get("optimizer_s") else None,
                _ms(step.get("wait_s")),
                _ms(overhead),
                overhead / own if own and overhead is not None else None,
                *_predicted(r, floor),
                r.get("final_accuracy"),
                r.get("time_to_target_s"),
                r.get("steps_to_target"),
                r.get("startup_s"),
                r.get("status", "ok") + (f": {r['reason']}" if r.get("reason") else ""),
            ]
        )
    return table


def _predicted(record: dict, floor: dict | None) -> tuple:
    """What the link allows: the global batch over (slowest compute + the strategy's floor transfers
    x the floor all-reduce of the same run), and measured / that (Strategy.floor_transfers)."""
    step = record.get("step") or {}
    batch = (record.get("config") or {}).get("batch_size")
    transfers = record.get("floor_transfers")
    if not floor or not transfers or not step.get("compute_s") or not record.get("samples_per_s") or not batch:
        return None, None
    predicted = batch / (step["compute_s"] + transfers * floor["allreduce_s"])
    return predicted, record["samples_per_s"] / predicted


def _fmt(value, column: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if column in ("CV", "test acc", "scaling eff"):
            return f"{value:.1%}"
        if column.startswith("vs "):
            return f"{value:.2f}x"
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


# The default table: what answers "which way pays" (every column stays in the CSV and --wide)
NARROW = [
    "strategy",
    "balance",
    "workers",
    "samples/s ± CV",
    "vs baseline",
    "scaling eff",
    "sync overhead ms (vs floor)",
    "test acc",
    "time to target s",
    "status",
]


def _narrow(cells: dict) -> list[str]:
    """A row of formatted wide cells as the NARROW columns (two of them pair a figure with its spread or ratio)."""

    def pair(figure: str, extra: str, form: str) -> str:
        return cells[figure] if cells[extra] == "-" else form.format(cells[figure], cells[extra])

    paired = {
        "samples/s ± CV": pair("samples/s", "CV", "{} ± {}"),
        "sync overhead ms (vs floor)": pair("sync overhead ms", "vs floor", "{} ({})"),
    }
    return [paired.get(c, cells.get(c)) for c in NARROW]


def markdown(records: list[dict], wide: bool = False) -> str:
    """The comparison table, verdict first; `wide`: every column of the CSV."""
    formatted = [{c: _fmt(v, c) for v, c in zip(row, COLUMNS)} for row in rows(records)]
    if wide:
        headers, body = COLUMNS, [[cells[c] for c in COLUMNS] for cells in formatted]
    else:
        headers, body = NARROW, [_narrow(cells) for cells in formatted]
    table = tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)
    answer = "\n".join(verdict(records))
    return f"{answer}\n\n{table}" if answer else table


def to_csv(records: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows(records):
        writer.writerow(["" if v is None else v for v in row])
    return out.getvalue()


def write_tables(records: list[dict], results_dir: str, name: str) -> tuple[Path, Path]:
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


def _sourced(records: list[dict]) -> str:
    return f"{line}\n\n" if (line := provenance(records)) else ""


def alone(records: list[dict]) -> str:
    """The scaling reference's own figures: each worker's timings alone, in run order, just before and
    after each row they judge (a timing between two rows serves both); records from before the
    brackets were timed at the start and the end of the run."""
    around = [r["standalone_timings"] for r in records if r.get("standalone_timings")]
    if not around:
        return ""
    if "start" in next(iter(around[0].values())):
        return (
            "alone, samples/s (each timing; start of the run -> end): "
            + "; ".join(f"{name} {_each(t['start'])} -> {_each(t['end'])}" for name, t in around[0].items())
            + "\n\n"
        )
    return (
        "alone, samples/s (each worker timed just before and after each row it judges, in run order): "
        + "; ".join(f"{name} {' -> '.join(_each(rates) for rates in _in_order(around, name))}" for name in around[0])
        + "\n\n"
    )


def _in_order(around: list[dict], name: str) -> list[list[float]]:
    """`name`'s timings around the rows, each once: a row's before is the last row's after when none ran between."""
    timings: list[list[float]] = []
    for bracket in around:
        if not timings or bracket[name]["before"] != timings[-1]:
            timings.append(bracket[name]["before"])
        timings.append(bracket[name]["after"])
    return timings


def _each(rates: list[float]) -> str:
    return "/".join(f"{rate:.0f}" for rate in rates)


def legend(records: list[dict]) -> str:
    """The columns explained, then each strategy's own note (Strategy.table_note) where it has a row."""
    notes = dict.fromkeys(r["table_note"] for r in records if r.get("table_note"))
    if any(r.get("evaluated_repeats", 0) < len(r.get("repeat_timed_steps", [])) for r in records):
        notes[SPEED_STEPS_NOTE] = None
    return "\n".join([LEGEND, *notes])


SPEED_STEPS_NOTE = "test acc and time to target: the evaluated repeats' (speed_steps timed the others only)."


LEGEND = """\
The CSV and `hetbench report --wide` hold every column: compute, comm, update, optimizer and wait ms,
floor-predicted samples/s, startup s. vs baseline: over the best machine alone (the single row).
samples/s: global training throughput, median over repeats (CV across them); warm-up steps excluded.
compute / comm / wait: per-step medians of the slowest worker's compute, of moving and combining
gradients or weights (update: the part of comm a parameter server spends combining the gradients
and stepping; optimizer: of that, the optimizer step), and of the fastest worker idling for the
slowest. sync overhead = step time - slowest compute - a parameter server's optimizer step (work
single's step does too; records without an optimizer figure counted it as overhead) (ray-ps-async,
with no barrier: a worker's own wait for fresh weights after each batch);
balance: how the global batch was split (equal; proportional to configured speeds; auto: to the
speeds measured alone, then once more by those of the warm-up steps, where the workers share the
machine; "re-split Nx": rebalance_every re-split it N times more by the speeds measured in the run;
the workers column shows the last split). scaling eff: samples/s over the sum of the workers' samples/s when each
trains alone on the whole batch in the same run (the median of its timings just before and just after the
row; auto's split uses those at the run's start; "drift": above 100%, which says the machine's speed moved
between those timings and the row, not that the row beat its workers). "(slowed Nx)" marks an emulated slow worker.
[gloo] / [tcp]: the collective a torch.distributed group formed on (cluster.collective; auto: gloo where
every rank runs one operating system on a device gloo takes, else hetbench's TCP group, as between Linux and macOS).
floor-predicted samples/s: global batch / (slowest compute + k x the gloo-floor all-reduce of the
same run, over the same link), k = the strategy's transfers of the model per step (1 for an
all-reduce, 2 for a parameter server: gradient up, then weights down): what the link allows a
synchronous strategy;
vs predicted: the measured samples/s over it.
on the gloo-floor row it is one raw gloo all-reduce of the model's 4.8 MB flat buffer between the
reference worker's node and the next worker's (the workers' own path), measured in the same run; on
the ps-floor row one round trip of that buffer over a direct TCP channel between the same two
processes, up and back down (a parameter server's gradient up, then weights down). "vs floor"
divides a row's sync overhead by its own pattern's floor: the ps-floor for the parameter-server rows
(ray-ps, ray-ps-async, ray-localsgd, dask-sync), the gloo-floor for the others. startup s: a row's
own processes and data; Ray starts once per run, before the rows (ray_startup_s in the records).
time to target: training clock (evaluation excluded) until the test accuracy first reached the
config's target_accuracy, median over the evaluated repeats; steps to target (--wide, CSV): the same
in steps. Accuracy is checked every eval_every steps, and every fine_eval_every steps once it is
within fine_eval_within of the target: the crossing is known to that interval. The verdict pairs each
evaluated repeat with the baseline's on the same seed, and claims a time gain only where the pairs'
median gain exceeds the widest check interval around a crossing plus the gains' spread (their range
for 3-5 repeats; with more, the width of the 75% interval for their median)."""
