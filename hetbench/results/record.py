"""A run's records as types: a strategy row's (RowRecord) and a floor's (FloorRecord), with their
parts. `from_json` is the one place a record's JSON is read, checked and upgraded from every older
form; `to_json` the one place it is written. Everything else reads attributes."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from hetbench.clock import median
from hetbench.config import RENAMED, SECTIONS
from hetbench.floor import FLOOR_NAME, FLOORS
from hetbench.metric import ACCURACY, Metric, named
from hetbench.optimizer import RunSchedule
from hetbench.training import CurvePoint
from hetbench.workload import WorkloadFacts

SCHEMA_VERSION = 2  # 1: the untyped records before this module (no "schema" key)


class RecordError(ValueError):
    """A record that cannot be read: one phrase saying what is wrong with it."""


@dataclass(frozen=True)
class StrategySettings:
    """What the results read of a strategy's own section of the config."""

    compression: str = "none"  # torch-ddp's: none | powersgd
    powersgd_rank: int | None = None
    sync_every: int | None = None  # ray-localsgd's exchange interval


@dataclass(frozen=True)
class Settings:
    """The row's config as recorded (Config.as_dict, redacted): the figures the results read, and the
    whole of it as it was written (`recorded`), which to_json writes back unchanged."""

    recorded: dict = field(default_factory=dict, repr=False)
    name: str | None = None
    batch_size: int | None = None
    seed: int | None = None
    repeats: int | None = None
    eval_every: int | None = None
    target_accuracy: float | None = None
    accuracy_tolerance: float | None = None  # None: a record from before the setting
    target_loss: float | None = None  # a workload judged by its test loss (metric.LOSS)
    loss_tolerance: float | None = None
    target_metric: float | None = None  # a workload judged by a metric of its own (metric.own)
    metric_tolerance: float | None = None
    wire_dtype: str = "float32"
    precision: str = "fp32"  # the workers' math: fp32 | tf32 | bf16, fp16 (autocast)
    lr_schedule: str = ""  # the config's learning-rate schedule in words (optimizer.RunSchedule); "": none
    link_rate: str | None = None  # tc's rate of the emulated link, e.g. 100mbit
    strategies: dict[str, StrategySettings] = field(default_factory=dict)

    def of(self, strategy: str) -> StrategySettings:
        return self.strategies.get(strategy, StrategySettings())

    @classmethod
    def from_json(cls, config: dict | None) -> Settings:
        config = config or {}
        return cls(
            recorded=config,
            name=config.get("name"),
            batch_size=config.get("batch_size"),
            seed=config.get("seed"),
            repeats=config.get("repeats"),
            eval_every=config.get("eval_every"),
            target_accuracy=config.get("target_accuracy"),
            accuracy_tolerance=config.get("accuracy_tolerance"),
            target_loss=config.get("target_loss"),
            loss_tolerance=config.get("loss_tolerance"),
            target_metric=config.get("target_metric"),
            metric_tolerance=config.get("metric_tolerance"),
            wire_dtype=config.get("wire_dtype") or "float32",
            precision=config.get("precision") or "fp32",
            lr_schedule=str(
                RunSchedule.of(
                    *(
                        config.get(k) or d
                        for k, d in (("lr_warmup_steps", 0), ("lr_decay", "none"), ("warmup_steps", 0), ("steps", 0))
                    )
                )
            ),  # fmt: skip
            link_rate=(config.get("link") or {}).get("rate"),
            strategies={
                RENAMED.get(name, name): StrategySettings(**_known(StrategySettings, own))
                for name, own in config.items()
                if isinstance(own, dict) and name not in SECTIONS
            },
        )


@dataclass(frozen=True)
class Env:
    """What the figures were measured on (records.environment)."""

    python: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)  # package -> version
    host: str | None = None
    platform: str | None = None
    cpu_count: int | None = None
    usable_cores: int | None = None
    devices: list = field(default_factory=list)
    git_commit: str | None = None
    git_dirty: bool | None = None
    code_hash: str | None = None
    argv: list[str] = field(default_factory=list)
    time: str | None = None

    def version(self, package: str) -> str | None:
        return self.versions.get(package)

    @classmethod
    def from_json(cls, env: dict | None) -> Env | None:
        return cls(**_known(cls, env)) if env else None


@dataclass(frozen=True)
class Worker:
    """One worker of a row: where it ran and with what batch, as the strategy reported it, and its
    figures in the run (rows.worker_figures, rows.scaling)."""

    name: str
    device: str | None = None
    batch: int | None = None
    node: str | None = None
    slowdown: float = 1.0  # an emulated slow worker's factor
    collective: str | None = None  # gloo | tcp: the torch.distributed group it formed on
    transport: str | None = None  # how its gradients reached a parameter server
    lost_at_step: int | None = None  # a worker killed by a fault
    compute_s: float | None = None  # its median compute in the steps it was in
    samples_per_s: float | None = None  # what it delivers in the run
    compute_samples_per_s: float | None = None  # what it could alone
    wire_bytes_per_step: float | None = None  # sent and received between machines, by value
    standalone_samples_per_s: float | None = None  # timed alone in the same run
    ram_mb: float | None = None  # its machine's memory
    device_memory_mb: float | None = None  # its device's allocator's, once its training set was there (MPS, CUDA)
    facts: dict = field(default_factory=dict)  # the rest it reported (host, pid, threads, ...), kept as is

    @classmethod
    def from_json(cls, data: dict) -> Worker:
        """A worker as a strategy reports it (worker_info) or a record holds it."""
        if not isinstance(data.get("name"), str):
            raise RecordError("a worker has no name")
        known = _known(cls, data)
        return cls(**known, facts={k: v for k, v in data.items() if k not in known})


@dataclass(frozen=True)
class Step:
    """The typical step (rows.step_summary), seconds."""

    compute_s: float | None = None  # the slowest worker's
    comm_s: float | None = None
    wait_s: float | None = None  # the fastest worker idling for the slowest
    total_s: float | None = None
    sync_overhead_s: float | None = None
    update_s: float | None = None
    optimizer_s: float | None = None
    exchange_every: int = 1


@dataclass(frozen=True)
class Reference:
    """The machine a run's single row ran on, and why."""

    worker: str
    chosen_by: str | None = None


DRIFT = 0.15  # a worker's speed alone moved this much across a row: flagged (a shared box's single timings move ~10%)


@dataclass(frozen=True)
class AloneTimings:
    """A worker's samples/s alone around a row: just before and just after it (`whole_run`: records
    from before the brackets, timed at the start and the end of the run)."""

    before: list[float]
    after: list[float]
    whole_run: bool = False


@dataclass(frozen=True)
class Planned:
    """The row as `hetbench plan` predicts it (plan.py), from the same run's alone timings (at its
    start, at two batches) and floors: samples/s at the strategy's floor, from the timings' slowest
    to their fastest; the median over the row's repeats, each at the split it ended at."""

    samples_per_s: float
    low: float
    high: float
    compute_s: float | None = None  # of its step, the slowest share's alone (median timings); the rest
    # is its link. None: an asynchronous row, or a record from before it was kept
    at_row: bool = False  # samples_per_s with each worker at its speed alone around the row (records from
    # d054204 to c78365f); else, as since, at the speeds timed at the run's start
    sharing: dict[str, float] = field(default_factory=dict)  # worker -> its step with every worker training
    # at once over its step alone, timed at the run's start (plan.Alone.sharing); empty: not timed
    lockstep: bool = False  # `sharing` timed with every step started together, as a synchronous row's
    # workers step; else each at its own pace (an asynchronous row's, and every row's in older records)
    worker_compute_s: dict[str, float] = field(default_factory=dict)  # worker -> its share's step alone,
    # stretched as above (median timings; the median over the repeats): which worker's compute the plan
    # missed, against each worker's compute_s. Empty in older records
    timed_alone_s: dict[str, list[float]] = field(default_factory=dict)  # worker -> its step alone at the
    # global batch and at the equal split's share (medians, seconds) as timed at the run's start: the line
    # the prediction ran through. Empty in older records
    at_start_samples_per_s: float | None = None  # in an `at_row` record, the prediction at the speeds timed
    # at the run's start (what a plan made before the race said). None: not kept, or not an `at_row` record
    at_row_samples_per_s: float | None = None  # the same prediction with each worker's timings rescaled to
    # its speed alone around the row (its brackets), which follows the hour but carries the noise of the
    # start's timing and of the brackets'. None: the row was not bracketed, or an older record
    vs_alone: float | None = None  # samples_per_s over the best worker alone as the same timings predict it:
    # the ratio `hetbench plan` prints, beside the measured row over the measured single row. None: older


@dataclass(frozen=True)
class RowRecord:
    """One strategy row of a run (rows.strategy_row): ok, failed or skipped."""

    strategy: str
    status: str = "ok"  # ok | failed | skipped
    reason: str | None = None  # why it failed or was skipped
    config: Settings = field(default_factory=Settings)
    env: Env | None = None
    workload: WorkloadFacts | None = None  # what it trained; None: a record from before the seam (mnist-cnn)
    balance: str | None = None  # equal | proportional | auto; None for the baseline
    split: list[int] | None = None  # each worker's batch
    workers: tuple[Worker, ...] = ()
    samples_per_s: float | None = None  # median over repeats
    samples_per_s_cv: float | None = None
    repeat_samples_per_s: list[float] = field(default_factory=list)
    repeat_timed_steps: list[int] = field(default_factory=list)
    floor_transfers: float | None = None  # float32 all-reduces of the model a step, as the floor times them
    floor: str | None = None  # the floor its sync overhead is judged against
    table_note: str | None = None
    scaling_efficiency: float | None = None
    standalone_sum_samples_per_s: float | None = None
    final_accuracy: float | None = (
        None  # the test metric (`metric`: accuracy or a loss), median of the evaluated repeats
    )
    time_to_target_s: float | None = None
    repeat_time_to_target_s: list[float | None] = field(default_factory=list)
    repeat_target_bracket_s: list[float | None] = field(default_factory=list)
    steps_to_target: float | None = None
    repeat_steps_to_target: list[int | None] = field(default_factory=list)
    evaluated_repeats: int | None = None
    target_accuracy: float | None = None  # the metric's target (a loss, for a loss workload)
    startup_s: float | None = None  # median over the repeats: the row's strategy starts before each
    repeat_startup_s: list[float] = field(default_factory=list)
    driver_peak_rss_mb: float | None = None
    step: Step | None = None
    accuracy_curve: tuple[CurvePoint, ...] = ()
    standalone_timings: dict[str, AloneTimings] | None = None
    cluster_startup_s: float | None = None
    ray_startup_s: float | None = None  # once for the run, before every row
    reference: Reference | None = None
    run_order: list[int] = field(default_factory=list)  # its place in each pass of the run (runner.py), 1 the first
    events: list[dict] = field(default_factory=list)  # what happened during the row (rebalanced, lost, ...)
    plan: Planned | None = None  # the plan's prediction of it (plan.check); None: not predicted
    extras: dict = field(default_factory=dict)  # a strategy's own figures and the row's notes, kept as is

    @property
    def trained(self) -> bool:
        """It measured a throughput."""
        return bool(self.samples_per_s)

    @property
    def metric(self) -> Metric:
        """What final_accuracy, the curve and the target measure (records from before: accuracy)."""
        return named(self.workload.metric, self.workload.higher_is_better) if self.workload else ACCURACY

    @property
    def workload_name(self) -> str:
        """What the row trained, as tables call it (records from before the seam: the only workload)."""
        return self.workload.name if self.workload else "mnist-cnn"

    @property
    def resplits(self) -> int:
        """Times rebalance_every re-split the batch after the warm-up."""
        return sum(1 for e in self.events if "rebalanced" in e and not e.get("in_warmup"))

    def repeat_splits(self, names: list[str]) -> list[dict[str, int]]:
        """Each repeat's split as it ended, worker name -> batch: the row's own (`split`, in the order
        of `names`, the configured workers) until a re-split within that repeat moved it; each pass
        starts its strategy anew, so one repeat's re-split does not carry into the next. Records from
        before events named their repeat: every repeat at the workers' last batches."""
        repeats = max(len(self.repeat_samples_per_s), 1)  # a trained row trained once at least
        resplits = [e for e in self.events if "rebalanced" in e]
        if not self.split or any("repeat" not in e for e in resplits):
            return [{w.name: w.batch for w in self.workers}] * repeats
        ends = [dict(zip(names, self.split)) for _ in range(repeats)]
        for event in resplits:  # in the order they happened: the last of a repeat is where it ended
            if event["repeat"] < repeats:
                ends[event["repeat"]] = dict(event["rebalanced"])
        return ends

    @property
    def drifted(self) -> dict[str, float]:
        """Each worker whose speed alone moved by DRIFT or more across the row, with its change (-0.18:
        18% slower after): timed just before and just after each pass of it (standalone.Brackets),
        the median of the passes' changes, and every pass's the same way (so not one pass's noise).
        The machine changed under the row, as a fanless Mac does when it heats. None measured across
        a run's whole length."""
        moved = {}
        for name, t in (self.standalone_timings or {}).items():
            if t.whole_run or not t.before or len(t.before) != len(t.after):
                continue
            changes = [a / b - 1 for b, a in zip(t.before, t.after)]
            change = median(changes)
            if abs(change) >= DRIFT and all((c < 0) == (change < 0) for c in changes):
                moved[name] = change
        return moved

    def drift_phrase(self) -> str | None:
        """`drifted` as the verdict says it: "mac slowed 18% during this row"."""
        said = [f"{name} {'slowed' if c < 0 else 'sped up'} {abs(c):.0%}" for name, c in self.drifted.items()]
        return f"{' and '.join(said)} during this row" if said else None


@dataclass(frozen=True)
class FloorPath:
    """Where a floor's two processes ran."""

    between: list[str]
    nodes: list[str | None] = field(default_factory=list)
    ips: list[str | None] = field(default_factory=list)
    interfaces: list | None = None
    systems: list[str | None] = field(default_factory=list)
    driver_end: int | None = None  # the end on the driver's node (the all-reduce's rank 0, the ps-floor's
    # listener, where ray-ps's server runs); None: neither end was, or a record from before it was kept


def megabytes(count: float) -> str:
    """A byte count as tables write it: "4.8 MB"; under 0.1 MB to two significant figures."""
    mb = count / 1e6
    return f"{mb:.1f} MB" if mb >= 0.1 else f"{mb:.2g} MB"


@dataclass(frozen=True)
class FloorRecord:
    """A floor (floor.py): the gloo-floor's one all-reduce, or the ps-floor's one round trip."""

    strategy: str  # gloo-floor | ps-floor
    status: str = "ok"
    reason: str | None = None
    config: Settings = field(default_factory=Settings)
    env: Env | None = None
    seconds: float | None = None  # median of one all-reduce (gloo-floor) or one round trip (ps-floor)
    cv: float | None = None
    collective: str | None = None
    numel: int | None = None
    bytes: int | None = None
    iterations: int | None = None
    path: FloorPath | None = None  # None: a record from before the floor ran on the workers' nodes
    link: dict | None = None  # the emulated link's settings (LinkConfig's set values)

    @property
    def link_rate(self) -> str | None:
        return (self.link or {}).get("rate")

    @property
    def fixed_s(self) -> float | None:
        """The part of its time that no fewer bytes would save: the measured time less the model's
        transfer at the emulated link's rate; None where the link was not emulated (no rate to split by)."""
        rate = bits_per_s(self.link_rate)
        if self.seconds is None or not rate or not self.bytes:
            return None
        return max(self.seconds - self.bytes * 8 / rate, 0.0)

    @property
    def trained(self) -> bool:
        return False

    @property
    def _key(self) -> str:
        return figure_name(self.strategy)


def bits_per_s(text: str | None) -> float | None:
    """tc's rate ('100mbit', '1gbit', '500kbit') in bits per second."""
    if not text:
        return None
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return None


def figure_name(floor: str) -> str:
    """What a floor's one figure is called in its JSON (`<name>_s`, `<name>_cv`): the gloo-floor's
    all-reduce, the ps-floor's round trip."""
    return "allreduce" if floor == FLOOR_NAME else "roundtrip"


Record = RowRecord | FloorRecord


def measured_floor(records: list[Record], name: str = FLOOR_NAME) -> FloorRecord | None:
    """The run's floor `name` that measured a figure, if it has one."""
    return next((r for r in records if isinstance(r, FloorRecord) and r.strategy == name and r.seconds), None)


# ---- reading: every form a record has been written in ----

# A figure's name says its unit: a value under a name ending so is a number (or null, or a list of them).
FIGURE_SUFFIXES = ("_s", "_cv", "_ms", "per_s", "accuracy", "efficiency", "_mb", "_bytes")
TEXT_KEYS = ("strategy", "status", "reason", "balance", "name", "device", "node")
LIST_KEYS = ("workers", "curve", "accuracy_curve", "events")
OBJECT_KEYS = (  # a record's parts, at its top level
    "config",
    "env",
    "step",
    "reference",
    "path",
    "link",
    "standalone_timings",
    "workload",
)


def record_problem(value, key: str = "") -> str | None:
    """What makes a record's value the wrong type for its name, as a phrase; None when it is sound."""
    leaf = key.rsplit(".", 1)[-1]
    if key in OBJECT_KEYS and value is not None and not isinstance(value, dict):
        return f"{key} must be an object, got {type(value).__name__} {value!r:.40}"
    if isinstance(value, dict):
        for k, v in value.items():
            if problem := record_problem(v, f"{key}.{k}" if key else str(k)):
                return problem
        return None
    if isinstance(value, list):
        if leaf in LIST_KEYS and not all(isinstance(v, dict) for v in value):
            return f"{key} must be a list of objects"
        if leaf.endswith(FIGURE_SUFFIXES) and not all(_figure(v) for v in value):
            return f"{key} must be a list of numbers"
        for i, v in enumerate(value):
            if isinstance(v, dict) and (problem := record_problem(v, f"{key}[{i}]")):
                return problem
        return None
    if leaf in LIST_KEYS and value is not None:
        return f"{key} must be a list, got {type(value).__name__} {value!r:.40}"
    if leaf.endswith(FIGURE_SUFFIXES) and not _figure(value):
        return f"{key} must be a number, got {type(value).__name__} {value!r:.40}"
    if leaf in TEXT_KEYS and value is not None and not isinstance(value, str):
        return f"{key} must be text, got {type(value).__name__} {value!r:.40}"
    return None


def _figure(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _known(cls, data: dict) -> dict:
    """The entries of `data` that are fields of `cls`."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _timings(data: dict) -> dict[str, AloneTimings]:
    out = {}
    for name, t in data.items():
        if not isinstance(t, dict):
            raise RecordError(f"standalone_timings.{name} must be an object")
        if "start" in t:  # before the brackets: timed at the start and the end of the run
            out[name] = AloneTimings(t["start"], t["end"], whole_run=True)
        else:
            out[name] = AloneTimings(t["before"], t["after"])
    return out


def from_json(data: dict) -> Record:
    """A record from its JSON object, of any schema so far; RecordError (one phrase) where its
    structure or a value's type is wrong, or its schema is newer than this code reads."""
    if not isinstance(data, dict) or not isinstance(data.get("strategy"), str):
        raise RecordError("it is not a hetbench record")
    schema = data.get("schema", 1)
    if not isinstance(schema, int) or isinstance(schema, bool) or not 1 <= schema <= SCHEMA_VERSION:
        raise RecordError(f"schema {schema!r} is not one this hetbench reads (1 to {SCHEMA_VERSION}): a newer one?")
    if problem := record_problem(data):
        raise RecordError(problem)
    try:
        return _floor(data) if data["strategy"] in FLOORS else _row(data)
    except (TypeError, KeyError) as e:  # a part missing a field it must have
        raise RecordError(f"a part of it is incomplete ({e})") from None


def _floor(data: dict) -> FloorRecord:
    key = figure_name(data["strategy"])
    path = data.get("path")
    return FloorRecord(
        strategy=data["strategy"],
        status=data.get("status", "ok"),
        reason=data.get("reason"),
        config=Settings.from_json(data.get("config")),
        env=Env.from_json(data.get("env")),
        seconds=data.get(f"{key}_s"),
        cv=data.get(f"{key}_cv"),
        collective=data.get("collective"),
        numel=data.get("numel"),
        bytes=data.get("bytes"),
        iterations=data.get("iterations"),
        path=FloorPath(**_known(FloorPath, path)) if path else None,
        link=data.get("link"),
    )


def _row(data: dict) -> RowRecord:
    known = _known(RowRecord, data)
    known.pop("extras", None)
    parts = {
        "strategy": RENAMED.get(data["strategy"], data["strategy"]),  # an old name reads as today's
        "config": Settings.from_json(data.get("config")),
        "env": Env.from_json(data.get("env")),
        "workers": tuple(Worker.from_json(w) for w in data.get("workers") or []),
        "step": Step(**_known(Step, data["step"])) if data.get("step") else None,
        "plan": Planned(**_known(Planned, data["plan"])) if data.get("plan") else None,
        "accuracy_curve": tuple(CurvePoint(**_known(CurvePoint, p)) for p in data.get("accuracy_curve") or []),
        "standalone_timings": _timings(data["standalone_timings"]) if data.get("standalone_timings") else None,
        "reference": Reference(**_known(Reference, data["reference"])) if data.get("reference") else None,
        "workload": WorkloadFacts(**_known(WorkloadFacts, data["workload"])) if data.get("workload") else None,
        "events": list(data.get("events") or []),
    }
    lists = ("repeat_samples_per_s", "repeat_timed_steps", "repeat_time_to_target_s")
    lists += ("repeat_target_bracket_s", "repeat_steps_to_target", "repeat_startup_s", "run_order")
    parts |= {name: list(data.get(name) or []) for name in lists}
    extras = {k: v for k, v in data.items() if k not in known and k != "schema"}
    return RowRecord(**{**known, **parts, "extras": extras})


# ---- writing ----


def to_json(record: Record) -> dict:
    """The record as one JSON object, the form from_json reads: today's schema, its figures under
    the names earlier records used; a row's every field (null where it has none), a floor's and a
    worker's set ones."""
    if isinstance(record, FloorRecord):
        return _drop_none(
            {
                "schema": SCHEMA_VERSION,
                "strategy": record.strategy,
                "status": record.status,
                "reason": record.reason,
                "config": record.config.recorded,
                "env": _plain(record.env),
                f"{record._key}_s": record.seconds,
                f"{record._key}_cv": record.cv,
                "collective": record.collective,
                "numel": record.numel,
                "bytes": record.bytes,
                "iterations": record.iterations,
                "path": _plain(record.path),
                "link": record.link,
            }
        )
    out = {"schema": SCHEMA_VERSION}
    for f in fields(RowRecord):
        value = getattr(record, f.name)
        if f.name == "extras":
            out.update(value)
        elif f.name == "config":
            out["config"] = value.recorded
        elif f.name == "workers":
            out["workers"] = [_worker_json(w) for w in value]
        elif f.name == "standalone_timings" and value:
            out[f.name] = {name: _timings_json(t) for name, t in value.items()}
        else:
            out[f.name] = _plain(value)
    return out


def _worker_json(worker: Worker) -> dict:
    out = {f.name: getattr(worker, f.name) for f in fields(Worker) if f.name != "facts"}
    return _drop_none({**out, **worker.facts})


def _timings_json(t: AloneTimings) -> dict:
    return {"start": t.before, "end": t.after} if t.whole_run else {"before": t.before, "after": t.after}


def _plain(value):
    """A part as JSON values: dataclasses as objects (None fields left out), tuples as lists."""
    if value is None:
        return None
    if hasattr(value, "__dataclass_fields__"):
        return _drop_none({f.name: _plain(getattr(value, f.name)) for f in fields(value)})
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _drop_none(data: dict) -> dict:
    return {k: v for k, v in data.items() if v is not None}
