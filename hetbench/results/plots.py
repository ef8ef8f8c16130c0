"""The pictures beside the tables: throughput, where each step's time goes, accuracy against time.

Each is readable without the table: titled, axes labelled with units, the baseline marked, and
emulated slow workers or links named in the title.
"""

from __future__ import annotations

from pathlib import Path

from hetbench.floor import FLOOR_NAME, PS_FLOOR_NAME
from hetbench.metric import ACCURACY
from hetbench.results.record import FloorRecord, Record, RowRecord, Step, measured_floor
from hetbench.results.records import atomic_write_bytes
from hetbench.strategies.registry import BASELINE


def scaling_figure(record: RowRecord) -> float | str | None:
    """Scaling efficiency, or "drift" above 100%: no row trains faster than its workers each alone
    added up, so such a figure says the machine's speed moved between the timings alone and the row."""
    efficiency = record.scaling_efficiency
    return "drift" if efficiency is not None and efficiency > 1.0 else efficiency


def label(record: Record) -> str:
    balance = record.balance if isinstance(record, RowRecord) else None
    return record.strategy + (f" [{balance}]" if balance else "")


def emulated(records: list[Record]) -> str:
    """What was emulated in these records, for titles: slowed workers and the link."""
    rows = [r for r in records if isinstance(r, RowRecord)]
    slowed = sorted({f"{w.name} slowed {w.slowdown:g}x" for r in rows for w in r.workers if w.slowdown > 1.0})
    links = sorted({r.link_rate for r in records if isinstance(r, FloorRecord)} - {None})
    parts = slowed + [f"{rate} link" for rate in links]
    return f" (emulated: {', '.join(parts)})" if parts else ""


def write_plots(records: list[Record], results_dir: str, name: str) -> list[Path]:
    """PNG files under results_dir; none when no record has figures to plot."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    trained = [r for r in records if r.status == "ok" and r.trained]
    if not trained:
        return []
    trained.sort(key=lambda r: r.strategy != BASELINE)
    note = emulated(records)
    paths = []
    for suffix, draw in (("throughput", _throughput), ("step", _step_breakdown), ("accuracy", _accuracy)):
        fig, ax = plt.subplots(figsize=(9, 4.8), layout="constrained")
        draw(ax, trained, records)
        ax.set_title(ax.get_title() + (f"\n{note.strip()}" if note else ""), fontsize=10)
        path = Path(results_dir) / f"{name}-{suffix}.png"
        atomic_write_bytes(path, png(fig))
        plt.close(fig)
        paths.append(path)
    return paths


def png(fig) -> bytes:
    import io

    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=110)
    return out.getvalue()


def _throughput(ax, trained: list[RowRecord], records: list[Record]) -> None:
    labels = [label(r) for r in trained]
    values = [r.samples_per_s for r in trained]
    colors = ["0.55" if r.strategy == BASELINE else "tab:blue" for r in trained]
    bars = ax.barh(labels, values, color=colors)
    for bar, r in zip(bars, trained):
        eff = scaling_figure(r)
        if eff == "drift":
            alone = "  (drift: the workers alone were timed at another speed)"
        else:
            alone = f"  ({eff:.0%} of the workers alone)" if eff else ""
        ax.annotate(
            f" {r.samples_per_s:,.0f}" + alone,
            (bar.get_width(), bar.get_y() + bar.get_height() / 2),
            va="center",
            fontsize=8,
        )
    ax.invert_yaxis()
    ax.set_xlabel("training throughput, samples/s (median over repeats; higher is better)")
    ax.set_xlim(0, max(values) * 1.45)
    ax.set_title("Throughput per strategy and batch split (grey: single-device baseline)")


def _step_breakdown(ax, trained: list[RowRecord], records: list[Record]) -> None:
    labels = [label(r) for r in trained]
    steps = [r.step or Step() for r in trained]
    # the fastest worker computes, then waits for the slowest, then all move gradients/weights:
    # so the three segments add up to the step time
    parts = (
        ("compute (fastest worker)", "tab:green", [(s.compute_s or 0) - (s.wait_s or 0) for s in steps]),
        ("waiting for the slowest worker", "tab:red", [s.wait_s or 0 for s in steps]),
        ("comm (moving, combining)", "tab:orange", [s.comm_s or 0 for s in steps]),
    )
    left = [0.0] * len(trained)
    for name, color, seconds in parts:
        widths = [max(0.0, x) * 1000 for x in seconds]
        ax.barh(labels, widths, left=left, color=color, label=name)
        left = [a + b for a, b in zip(left, widths)]
    ends = [*left]
    for name, style, what in ((FLOOR_NAME, ":", "all-reduce"), (PS_FLOOR_NAME, "--", "round trip")):
        if floor := measured_floor(records, name):
            ax.axvline(floor.seconds * 1000, color="k", linestyle=style, label=f"{name} {what}")
            ends.append(floor.seconds * 1000)
    ax.invert_yaxis()
    ax.set_xlim(0, max(ends, default=0) * 1.05 or 1)  # bars end at their data: autoscale left no margin there
    ax.set_xlabel("ms per global step (medians)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # beside the bars, never over one
    ax.set_title("Where each step's time goes")


def _accuracy(ax, trained: list[RowRecord], records: list[Record]) -> None:
    palette = [
        "tab:blue",
        "tab:orange",
        "tab:green",
        "tab:red",
        "tab:purple",
        "tab:brown",
        "tab:pink",
        "tab:olive",
        "tab:cyan",
        "navy",
        "gold",
    ]  # grey is the baseline's
    others = iter(palette * 3)
    for r in trained:
        curve = r.accuracy_curve
        ax.plot(
            [p.train_s for p in curve],
            [p.accuracy for p in curve],
            marker="o",
            markersize=3,
            label=label(r),
            color="0.4" if r.strategy == BASELINE else next(others),
        )
    metric = trained[0].metric if trained else ACCURACY  # one run, one workload
    target = next((r.target_accuracy for r in trained if r.target_accuracy), None)
    if target:
        ax.axhline(target, color="k", linestyle=":", label=f"target {metric.short(target)}")
    ax.set_xlabel("training clock, s (evaluation excluded; first repeat)")
    ax.set_ylabel(metric.label)
    ax.legend(fontsize=8)
    ax.set_title(f"{metric.label.capitalize()} against training time")
