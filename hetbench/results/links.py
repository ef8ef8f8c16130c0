"""Across links: one run per link (e.g. hetero-links.yaml with --set link.profile=...) side by side,
so a user reads on which link adding the other machine starts to pay; and, where two runs share a
link, what the wire changes: a narrower dtype, or torch-ddp's PowerSGD. Every figure is a run's own,
beside that run's baseline."""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate

from hetbench.errors import UserError
from hetbench.floor import FLOOR_NAME as FLOOR
from hetbench.floor import FLOORS
from hetbench.metric import ACCURACY
from hetbench.results.plots import label, png
from hetbench.results.record import FloorRecord, Record, RowRecord, Settings, bits_per_s
from hetbench.results.records import atomic_write, atomic_write_bytes, hand_to_owner, provenance
from hetbench.results.report import ordered
from hetbench.results.verdict import distributed, judged, measured, ratio_range, verdict
from hetbench.results.whatif import floor_record
from hetbench.strategies.registry import BASELINE


def _base(run: list[Record]) -> RowRecord | None:
    return measured(run, BASELINE)


def _row(run: list[Record], name: str) -> Record | None:
    """The run's row that the tables call `name` (plots.label), if it has one."""
    return next((r for r in run if label(r) == name), None)


def _settings(run: list[Record]) -> Settings:
    """The run's config (every record of a run holds it)."""
    return run[0].config if run else Settings()


def _wire(run: list[Record]) -> str:
    """How the run's gradients travel: its wire dtype, or torch-ddp's PowerSGD where the run set it."""
    ddp = _settings(run).of("torch-ddp")
    if ddp.compression == "powersgd":
        return f"PowerSGD rank {ddp.powersgd_rank}"
    return _settings(run).wire_dtype


def link_rate(run: list[Record]) -> str | None:
    """The run's emulated link (tc's rate, e.g. 100mbit), from its floor or its config."""
    floor = floor_record(run)
    return (floor and floor.link_rate) or _settings(run).link_rate


def column(run: list[Record]) -> str:
    wire = _wire(run)
    if wire == "float32":
        return link_rate(run)
    return f"{link_rate(run)}, {wire}" + ("" if wire.startswith("PowerSGD") else " wire")


def by_link(runs: list[list[Record]]) -> list[list[Record]]:
    """Fastest link first; a run needs an emulated link and a baseline to take part."""
    for run in runs:
        if not link_rate(run) or not _base(run):
            raise UserError("--links needs, in each file, a run over an emulated link with a single row")
    return sorted(runs, key=lambda run: (-bits_per_s(link_rate(run)), _wire(run) != "float32"))


def _cell(record: Record | None, run: list[Record]) -> str:
    """samples/s, its ratio to the run's best machine alone and that ratio's range over the repeats;
    **pays** where the verdict's rule (verdict.Comparison.pays) recommends it over that machine."""
    base = _base(run)
    if record is None:
        return "-"
    if isinstance(record, FloorRecord):
        if not record.seconds:
            return record.status
        what = "all-reduce" if record.strategy == FLOOR else "round trip"
        return f"{record.seconds * 1000:,.0f} ms {what}"
    if not record.samples_per_s:  # failed or skipped
        return record.status
    if record.strategy == BASELINE:
        return f"{record.samples_per_s:,.0f}"
    ratio = record.samples_per_s / base.samples_per_s
    spread = ratio_range(record, base)
    within = f", {spread[0]:.2f}-{spread[1]:.2f}x" if spread else ""
    pays = judged(run).pays(record)
    return f"{record.samples_per_s:,.0f} ({ratio:.2f}x{within})" + (" **pays**" if pays else "")


def _labels(runs: list[list[Record]]) -> list[str]:
    return list(dict.fromkeys(label(r) for run in runs for r in ordered(run)))


def crossover(runs: list[list[Record]]) -> str:
    """samples/s of every row on every link, with its ratio to that run's best machine alone."""
    body = []
    for name in _labels(runs):
        body.append([name, *[_cell(_row(run, name), run) for run in runs]])
    return tabulate(body, headers=["samples/s (vs alone)", *map(column, runs)], tablefmt="github")


def to_target(runs: list[list[Record]]) -> str:
    """Seconds of training to the target (the first repeat's clock), and the final test metric."""

    def cell(record: Record | None) -> str:
        if not isinstance(record, RowRecord) or record.final_accuracy is None:
            return "-"
        seconds = record.time_to_target_s
        return ("not reached" if seconds is None else f"{seconds:,.0f} s") + f" ({_acc(record)})"

    names = [n for n in _labels(runs) if n not in FLOORS]
    body = [[n, *[cell(_row(run, n)) for run in runs]] for n in names]
    rows = [r for run in runs for r in run if isinstance(r, RowRecord)]
    final = "acc" if not rows or rows[0].metric.name == ACCURACY.name else rows[0].metric.label
    return tabulate(body, headers=[f"time to target (final {final})", *map(column, runs)], tablefmt="github")


def wire(runs: list[list[Record]]) -> str:
    """Two runs on one link that differ in their wire: each row's comm per step and bytes each way."""
    pairs = [
        (a, b)
        for a in runs
        for b in runs
        if link_rate(a) == link_rate(b) and _wire(a) == "float32" and _wire(b) != "float32"
    ]
    out = []
    for full, narrow in pairs:
        body = []
        for r in distributed(full):
            other = _row(narrow, label(r))
            if not isinstance(other, RowRecord) or not (r.step and r.step.comm_s):
                continue
            comm, comm2 = r.step.comm_s, (other.step and other.step.comm_s) or 0.0
            body.append(
                [
                    label(r),
                    f"{comm * 1000:,.0f} -> {comm2 * 1000:,.0f}",
                    f"{comm / comm2:.2f}x" if comm2 else "-",
                    f"{_mb(r)} -> {_mb(other)}",
                    f"{r.samples_per_s:,.0f} -> {other.samples_per_s or 0:,.0f}",
                    f"{_acc(r)} -> {_acc(other)}",
                ]
            )
        if body:
            headers = ["row", "comm ms a step", "comm lower by", "MB a step, most-loaded worker", "samples/s", "acc"]
            out.append(
                f"The wire on the {link_rate(full)} link, float32 -> {_wire(narrow)}:\n\n"
                + tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)
            )
    return "\n\n".join(out)


def _mb(record: RowRecord) -> str:
    sent = [w.wire_bytes_per_step for w in record.workers if w.wire_bytes_per_step]
    return f"{max(sent) / 1e6:.1f}" if sent else "-"


def _acc(record: RowRecord) -> str:
    return record.metric.format(record.final_accuracy) if record.final_accuracy is not None else "-"


def plot(runs: list[list[Record]]) -> bytes:
    """Each row's samples/s over its own run's best machine alone, against the link rate: lines for
    float32 wire, crosses for other wires (a narrower dtype, PowerSGD); the best machine alone is the line at 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8), layout="constrained")
    ax.axhline(1.0, color="0.4", linestyle="--", label="the best machine alone (each run's own)")
    for name in [n for n in _labels(runs) if n not in (BASELINE, *FLOORS)]:
        color = None
        for full in (True, False):
            rows = [(run, _row(run, name)) for run in runs if (_wire(run) == "float32") == full]
            points = [
                (bits_per_s(link_rate(run)) / 1e6, r.samples_per_s / _base(run).samples_per_s)
                for run, r in rows
                if r and r.trained
            ]
            if not points:
                continue
            xs, ys = zip(*sorted(points))
            if full:
                color = ax.plot(xs, ys, marker="o", label=name)[0].get_color()
            else:
                wires = sorted({_wire(run) for run in runs} - {"float32"})
                ax.scatter(xs, ys, marker="x", s=60, color=color, label=f"{name}, {'/'.join(wires)} wire")
    ax.set_xscale("log")
    ax.set_xlabel("link rate, Mbit/s (emulated, both ways; log scale)")
    ax.set_ylabel("samples/s over the best machine alone")
    ax.set_title("Does adding the other machine pay? Above 1 it does (same run's baseline)")
    ax.legend(fontsize=7)
    data = png(fig)
    plt.close(fig)
    return data


def what_ran(runs: list[list[Record]]) -> str:
    """One sentence from the records: the machines, the batch and the repeats every column shares."""
    rows = [r for run in runs for r in run if isinstance(r, RowRecord) and r.strategy != BASELINE and r.workers]
    if not rows:
        return ""
    row = rows[0]
    machines = " + ".join(w.name + (f" (slowed {w.slowdown:g}x)" if w.slowdown > 1 else "") for w in row.workers)
    return (
        f"Each column is one run of {machines}, global batch {row.config.batch_size}, "
        f"{row.config.repeats} repeats, over an emulated link (rate only). Ratios are to that run's "
        "own best machine alone, measured in the same run: the host's speed drifts between runs."
    )


def links_markdown(runs: list[list[Record]]) -> str:
    verdicts = "\n".join(f"- **{column(run)}**: {verdict(run)[0]}" for run in runs if verdict(run))
    sources = "\n".join(
        f"- **{column(run)}**: " + line.replace("\n", "\n  ") for run in runs if (line := provenance(run))
    )
    wires = wire(runs)
    return "\n\n".join(
        part
        for part in (
            what_ran(runs),
            "Each link's own verdict (the rows and reasons are in that run's table):\n\n" + verdicts,
            crossover(runs),
            to_target(runs),
            wires,
            f"Where each run comes from:\n\n{sources}" if sources else "",
        )
        if part
    )


def write_links(runs: list[list[Record]], results_dir: str, name: str) -> Path:
    """results/<name>.md and <name>-crossover.png, each run's own tables linked where they exist."""
    md = Path(results_dir) / f"{name}.md"
    try:
        atomic_write_bytes(Path(results_dir) / f"{name}-crossover.png", plot(runs))
        tables = [
            f"[{column(run)}]({own}.md)"
            for run in runs
            if (own := _settings(run).name) and (Path(results_dir) / f"{own}.md").exists()
        ]
        linked = f"\n\nEach run's full table, verdict and what-if: {', '.join(tables)}." if tables else ""
        picture = f"![crossover]({name}-crossover.png)"
        atomic_write(md, f"# hetbench: {name}\n\n{links_markdown(runs)}{linked}\n\n{picture}\n")
        hand_to_owner(results_dir)
    except OSError as e:
        raise UserError(f"results directory {results_dir} is not writable: {e.strerror or e}") from None
    return md
