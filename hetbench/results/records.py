"""The record: one JSON object per strategy and scenario, written atomically, never over another run's file."""

from __future__ import annotations

import copy
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from importlib import metadata
from pathlib import Path

from hetbench.cores import usable_cores
from hetbench.devices import AUTOCAST, available_devices, describe, resolve_device
from hetbench.errors import UserError
from hetbench.identity import code_hash
from hetbench.inputs import load_json, read_text
from hetbench.metric import METRICS
from hetbench.results.record import Record, RecordError, from_json, megabytes, to_json

SECRET_KEYS = ("token", "password", "secret")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


CODE_PATHS = (":/hetbench", ":/strategies", ":/benchmarks", ":/deploy")  # what runs; results/ and docs/ do not


def git_dirty() -> bool | None:
    """Whether the checkout's code had uncommitted changes to tracked files (None: not a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return bool(out.stdout.strip()) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(records: list[Record]) -> str:
    """The commit and command that measured these records, when and on what, and the workload they
    trained; '' for records that carry no environment."""
    env = next((r.env for r in records if r.env), None)
    if not env:
        return ""
    code = f"commit {env.git_commit[:7]}" if env.git_commit else f"code {str(env.code_hash)[:8]}"
    if env.git_dirty:
        code += " with uncommitted changes"
    command = f" with\n`hetbench {' '.join(env.argv[1:])}`" if env.argv else ""
    when = str(env.time or "")[:10]
    versions = f"torch {env.version('torch')}, ray {env.version('ray')}"
    measured = f"Measured at {code} on {env.host}, {when} ({env.usable_cores} usable cores; {versions}){command}."
    # one paragraph in Markdown, in lines a reader can follow: the command whole on its own line
    lines = [measured, _wrapped(trained(records)), _wrapped(devices(records))]
    return "\n".join(filter(None, lines))


def _wrapped(sentence: str) -> str:
    return textwrap.fill(sentence, width=110, break_long_words=False, break_on_hyphens=False)


def devices(records: list[Record]) -> str:
    """ "Devices: ..." of the rows' workers; where all were CPUs, that a GPU desk differs: its step
    computes far faster, so the same link costs it a larger share (the answer may not carry over)."""
    kinds = sorted({str(w.device).split(":")[0] for r in records for w in getattr(r, "workers", ()) if w.device})
    if kinds == ["cpu"]:
        return "Devices: CPUs only; on a GPU desk a step computes far faster and the link weighs more."
    return f"Devices: {', '.join(kinds)}." if kinds else ""


def trained(records: list[Record]) -> str:
    """ "Workload: NAME (N parameters, M MB a step)." where the records name it (those from before
    the workload seam trained the MNIST CNN and say nothing); one with its own optimizer names it
    (the run's `optimizer` and `lr` do not apply), its scheduler, and the precision where not fp32; an
    inexact one says why."""
    facts = next((r.workload for r in records if getattr(r, "workload", None)), None)
    if facts is None:
        return ""
    inexact = f"; not exact, compared by repeats, not paired by seed: {facts.inexact}" if facts.inexact else ""
    size = f"{facts.parameters:,} parameters, {megabytes(facts.model_bytes)} a step"
    if facts.input_shape is not None:  # records from before it was kept: not said
        size += f", input {facts.input_shape}"
    own = f", its own {facts.optimizer}" if facts.optimizer else ""
    if facts.scheduler:
        own += f", its {facts.scheduler} stepped once per update"
    schedule = next((r.config.lr_schedule for r in records if r.config.lr_schedule), "")
    if schedule:
        own += f", the learning rate on {schedule}"
    if facts.batch_norm_layers:
        own += f", its {facts.batch_norm_layers} batch norm layers' statistics recomputed at each check"
    if facts.metric not in METRICS:
        own += f", judged by its own {facts.metric}"
    precision = next((r.config.precision for r in records if r.config.precision != "fp32"), None)
    if precision:
        own += f", in {precision}" + (" autocast" if precision in AUTOCAST else "")
    return f"Workload: {facts.name} ({size}{own}{inexact})."


def environment() -> dict:
    """What the figures were measured on (the driver's view; workers report their own devices)."""
    return {
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in ("torch", "ray", "dask", "distributed", "numpy", "hetbench")},
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),  # of them, those this process may run on (affinity, cpuset)
        "devices": [describe(resolve_device(d)) for d in available_devices()],
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),  # the commit alone does not name the code that ran
        "code_hash": code_hash(),  # the same on every machine running this code, .git or not
        "argv": sys.argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def redacted(cfg: dict) -> dict:
    """The config as recorded: anything that looks like a secret is replaced."""

    def walk(value, key=""):
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if value is not None and any(s in key.lower() for s in SECRET_KEYS):
            return "<redacted>"
        return value

    return walk(copy.deepcopy(cfg))


class RecordFile:
    """results/raw/<time>-<name>-<n>.json, reserved with O_EXCL, then replaced atomically as records arrive."""

    def __init__(self, results_dir: str, name: str) -> None:
        raw = Path(results_dir) / "raw"
        try:
            raw.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"results directory {raw} is not writable: {e.strerror}") from None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1000):
            path = raw / f"{stamp}-{name}-{n}.json"
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                break
            except FileExistsError:
                continue
            except OSError as e:
                raise UserError(f"results directory {raw} is not writable: {e.strerror}") from None
        else:
            raise UserError(f"could not reserve a new record file in {raw}")
        self.path = path
        self.records: list[Record] = []

    @classmethod
    def reopen(cls, path: Path) -> RecordFile:
        """An interrupted run's record file, to continue: its failed records are dropped (run again)."""
        out = cls.__new__(cls)
        out.path = Path(path)
        out.records = [r for r in read_records([str(path)]) if r.status != "failed"] if out.path.exists() else []
        return out

    def discard(self) -> None:
        """Remove the reservation of a run that wrote nothing."""
        if not self.records:
            self.path.unlink(missing_ok=True)

    def add(self, record: Record, replacing: Record | None = None) -> None:
        """`record` written, in `replacing`'s place where that is one of the file's records."""
        at = next((i for i, r in enumerate(self.records) if r is replacing), None) if replacing else None
        if at is None:
            self.records.append(record)
        else:
            self.records[at] = record
        self.save()

    def save(self) -> None:
        atomic_write(self.path, json.dumps([to_json(r) for r in self.records], indent=2, default=str) + "\n")


def atomic_write(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Temp file in the same directory, fsync, rename: readers see the old or the new file, never half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_records(paths: list[str]) -> list[Record]:
    """Every record of the files, each checked as it loads (one sentence, UserError, for a file
    that is not JSON, repeats a key, nests too deep or holds something else: record.from_json)."""
    records: list[Record] = []
    for p in paths:
        try:
            data = load_json(read_text(p, "record file"), f"record file {p}")
        except ValueError as e:
            raise UserError(str(e)) from None
        items = data if isinstance(data, list) else [data]
        if not all(isinstance(r, dict) and isinstance(r.get("strategy"), str) for r in items):
            raise UserError(f"record file {p} does not hold hetbench records")
        for n, item in enumerate(items):
            try:
                records.append(from_json(item))
            except RecordError as e:
                raise UserError(f"record file {p}, record {n + 1} ({item['strategy']}): {e}") from None
    return records


def hand_to_owner(results_dir: str) -> None:
    """Run as root (a container) in a results directory someone else owns (compose's bind-mounted
    ./results): what root wrote there goes to that directory's owner, who can then edit and delete it."""
    root = Path(results_dir)
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not root.is_dir():
        return
    owner = root.stat()
    if owner.st_uid == 0:
        return
    for path in [root, *root.rglob("*")]:
        if path.lstat().st_uid == 0:
            os.lchown(path, owner.st_uid, owner.st_gid)
