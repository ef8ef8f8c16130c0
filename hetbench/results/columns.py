"""The table's columns, each once: its name, how its value comes from a record, how it is written,
whether the default (narrow) table shows it, and what it means. The CSV and `--wide` show them all
in this order; a new column is one entry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hetbench.metric import ACCURACY
from hetbench.results.plots import scaling_figure
from hetbench.results.record import FloorRecord, Record, RowRecord, Step
from hetbench.strategies.registry import BASELINE


@dataclass(frozen=True)
class Row:
    """What a column reads: one record among its run's."""

    record: Record
    baseline: RowRecord | None  # the single row (measured), if the run has one
    own_floor_s: float | None  # the floor this row is judged against (its own pattern's)
    predicted: tuple  # (floor-predicted samples/s, measured over it), or (None, None)

    @property
    def ran(self) -> RowRecord | None:
        """The strategy row; None on a floor's."""
        return self.record if isinstance(self.record, RowRecord) else None

    @property
    def step(self) -> Step:
        return (self.ran and self.ran.step) or Step()

    @property
    def overhead_s(self) -> float | None:
        """A floor row's own figure; a strategy row's sync overhead; none for the baseline."""
        if isinstance(self.record, FloorRecord):
            return self.record.seconds
        return None if self.record.strategy == BASELINE else self.step.sync_overhead_s


@dataclass(frozen=True)
class Column:
    name: str
    value: Callable[[Row], object]
    form: str = "number"  # number | percent | ratio | text: how a float is written
    narrow: bool = False  # shown in the default table
    beside: str | None = None  # in the narrow table, the column written beside this one ...
    beside_form: str = "{} ({})"  # ... this way (its header too)
    legend: str = ""  # what it means, for the tables' legend

    def cell(self, value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            if self.form == "percent":
                return f"{value:.1%}"
            if self.form == "ratio":
                return f"{value:.2f}x"
            return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
        return str(value)

    @property
    def header(self) -> str:
        """Its narrow table's header (the wide one is the name)."""
        return self.beside_form.format(self.name, self.beside) if self.beside else self.name


def _ms(seconds):
    return None if seconds is None else seconds * 1000


def _positive_ms(seconds):
    return _ms(seconds) if seconds else None


def _final_metric(row: Row):
    """Accuracy as a float (written as a percentage); a test loss, or a workload's own metric, written
    as its metric writes it."""
    r = row.ran
    if r is None or r.final_accuracy is None or r.metric.name == ACCURACY.name:
        return r and r.final_accuracy
    return r.metric.format(r.final_accuracy)


def headed_for(names: list[str], records: list[Record]) -> list[str]:
    """Column names as the table of these records heads them: the metric's column is its workload's."""
    metric = next((r.metric for r in records if isinstance(r, RowRecord)), ACCURACY)
    return [metric.column if name == ACCURACY.column else name for name in names]


def _vs_baseline(row: Row):
    r, base = row.ran, row.baseline
    return r.samples_per_s / base.samples_per_s if base and r and r.samples_per_s else None


def _vs_floor(row: Row):
    overhead = row.overhead_s
    return overhead / row.own_floor_s if row.own_floor_s and overhead is not None else None


def _status(row: Row) -> str:
    r = row.record
    facts = getattr(r, "workload", None)  # floors train nothing
    inexact = facts and not facts.exact and r.status == "ok"
    return r.status + (f": {r.reason}" if r.reason else "") + (", not exact" if inexact else "")


def _drift(record) -> str | None:
    return ", ".join(f"{name} {change:+.0%}" for name, change in record.drifted.items()) or None


def _cv(row: Row):
    return row.ran.samples_per_s_cv if row.ran else row.record.cv


def _plan_vs_baseline(row: Row) -> float | None:
    """The plan's own ratio, over its own best alone; in older records, over the measured single row."""
    plan, base = row.ran and row.ran.plan, row.baseline and row.baseline.samples_per_s
    if plan and plan.vs_alone:
        return plan.vs_alone
    return plan.samples_per_s / base if plan and base else None


def columns(workers: Callable[[Record], str], balance: Callable[[Record], str | None]) -> list[Column]:
    """Every column in order; `workers` and `balance` write those two cells (report.py owns them)."""
    return [
        Column("strategy", lambda row: row.record.strategy, "text", narrow=True),
        Column(
            "balance",
            lambda row: balance(row.record),
            "text",
            narrow=True,
            legend="how the global batch was split (equal; proportional to configured speeds; auto: to the speeds "
            "measured alone, then once more by those of the warm-up steps; 're-split Nx': rebalance_every "
            "re-split it N times more); the workers column shows the last split",
        ),
        Column(
            "workers",
            lambda row: workers(row.record),
            "text",
            narrow=True,
            legend="each worker's device and batch; '(slowed Nx)' an emulated slow worker; [gloo] / [tcp] the "
            "collective its torch.distributed group formed on (auto: gloo where every rank runs one operating "
            "system on a device gloo takes, else hetbench's TCP group, as between Linux and macOS)",
        ),
        Column(
            "samples/s",
            lambda row: row.ran and row.ran.samples_per_s,
            narrow=True,
            beside="CV",
            beside_form="{} ± {}",
            legend="global training throughput, median over repeats (CV across them); warm-up steps excluded",
        ),
        Column("CV", _cv, "percent"),
        Column(
            "vs baseline",
            _vs_baseline,
            "ratio",
            narrow=True,
            beside="plan",
            legend="samples/s over the best machine alone (the single row)",
        ),
        Column(
            "plan",
            _plan_vs_baseline,
            "ratio",
            legend="what `hetbench plan` predicted for the row over the best machine alone, from this run's "
            "own measurement at its start: each worker alone (at the global batch and a smaller one) and the "
            "floors, the strategy at its floor (plan.check); a row not raced (plan.race worth) has this only; "
            "in records without plan.vs_alone, over the single row",
        ),
        Column(
            "plan samples/s",
            lambda row: row.ran and row.ran.plan and row.ran.plan.samples_per_s,
            legend="that prediction in samples/s (its range: the record's plan.low to plan.high)",
        ),
        Column(
            "scaling eff",
            lambda row: row.ran and scaling_figure(row.ran),
            "percent",
            narrow=True,
            legend="samples/s over the sum of the workers' samples/s when each trains alone on the whole batch in "
            "the same run (the median of its timings just before and after the row); 'drift': above 100%, the "
            "machine's speed moved between those timings and the row",
        ),
        Column(
            "compute ms",
            lambda row: _ms(row.step.compute_s),
            legend="per-step median of the slowest worker's compute",
        ),
        Column(
            "comm ms",
            lambda row: _ms(row.step.comm_s),
            legend="of moving and combining gradients or weights",
        ),
        Column(
            "update ms",
            lambda row: _positive_ms(row.step.update_s),
            legend="the part of comm a parameter server spends combining the gradients and stepping",
        ),
        Column(
            "optimizer ms",
            lambda row: _positive_ms(row.step.optimizer_s),
            legend="of that, the optimizer step",
        ),
        Column("wait ms", lambda row: _ms(row.step.wait_s), legend="the fastest worker idling for the slowest"),
        Column(
            "sync overhead ms",
            lambda row: _ms(row.overhead_s),
            narrow=True,
            beside="vs floor",
            legend="step time - slowest compute - a parameter server's optimizer step (work single's step does "
            "too) (ray-ps-async, with no barrier: a worker's own wait for fresh weights after each batch); on a "
            "floor row, its own figure",
        ),
        Column(
            "vs floor",
            _vs_floor,
            "ratio",
            legend="a row's sync overhead over its own pattern's floor: the ps-floor for the parameter-server rows "
            "(ray-ps, ray-ps-async, ray-localsgd, dask-sync), the gloo-floor for the others",
        ),
        Column(
            "floor-predicted samples/s",
            lambda row: row.predicted[0],
            legend="global batch / (slowest compute + k x the gloo-floor all-reduce of the same run), k = the "
            "strategy's transfers of the model per step (1 for an all-reduce, 2 for a parameter server): what "
            "the link allows a synchronous strategy",
        ),
        Column("vs predicted", lambda row: row.predicted[1], "ratio", legend="the measured samples/s over it"),
        Column(ACCURACY.column, _final_metric, "percent", narrow=True),  # a loss workload's: headed_for
        Column(
            "time to target s",
            lambda row: row.ran and row.ran.time_to_target_s,
            narrow=True,
            legend="training clock (evaluation excluded) until the test accuracy first reached target_accuracy (a "
            "loss workload's test loss, target_loss), median over the evaluated repeats",
        ),
        Column("steps to target", lambda row: row.ran and row.ran.steps_to_target, legend="the same in steps"),
        Column(
            "startup s",
            lambda row: row.ran and row.ran.startup_s,
            legend="a row's own processes and data (Ray starts once per run, before the rows: ray_startup_s)",
        ),
        Column(
            "drift",
            lambda row: row.ran and _drift(row.ran),
            "text",
            legend="a worker whose speed alone, timed just before and just after the row, moved 15% or more "
            "(mac -18%: the machine changed under the row, as a fanless Mac does when it heats)",
        ),
        Column("status", _status, "text", narrow=True, beside="drift"),  # "not exact": the provenance line says why
    ]
