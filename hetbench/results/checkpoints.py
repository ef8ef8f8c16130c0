"""Checkpoints: a run's config, and per scenario its model + optimizer + step every N steps.

Under <results_dir>/checkpoints/<run>/, where <run> is the record file's name (results/raw/<run>.json):
run.json holds the resolved config (and the standalone speeds `auto` split by), so `hetbench run
--resume <run>` repeats nothing already recorded and continues the interrupted scenario from its
last checkpoint. Batch order comes from (seed, step) alone and dropout's masks from (seed, step,
sample), so the resumed run follows the uninterrupted run's trajectory exactly.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from hetbench.errors import UserError
from hetbench.inputs import load_json, read_text
from hetbench.results.records import atomic_write, atomic_write_bytes, redacted
from hetbench.step_timing import StepTiming
from hetbench.training import CurvePoint, Repeat


class RunCheckpoints:
    def __init__(self, results_dir: str, run: str) -> None:
        self.dir = Path(results_dir) / "checkpoints" / run

    def save_run(self, config: dict, standalone: dict | None) -> None:
        """The run's config as kept (Config.as_dict) and the speeds `auto` split by, for --resume."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"checkpoint directory {self.dir} is not writable: {e.strerror}") from None
        saved = {"config": redacted(config), "standalone": standalone}
        atomic_write(self.dir / "run.json", json.dumps(saved, indent=2))

    def load_run(self) -> tuple[dict, dict | None]:
        if not (self.dir / "run.json").exists():
            raise UserError(
                f"run {self.dir.name} kept no checkpoints ({self.dir / 'run.json'} is missing; "
                "runs keep them with checkpoint_every > 0)"
            )
        where = self.dir / "run.json"
        try:
            saved = load_json(read_text(where, "checkpoint file"), f"checkpoint file {where}")
        except ValueError as e:
            raise UserError(str(e)) from None
        if not (isinstance(saved, dict) and isinstance(saved.get("config"), dict) and "standalone" in saved):
            raise UserError(f"checkpoint file {where} does not hold a run's config and speeds")
        if saved["standalone"] is not None and not isinstance(saved["standalone"], dict):
            raise UserError(f"checkpoint file {where}: its speeds must be an object or null")
        return saved["config"], saved["standalone"]

    def save(self, key: str, payload: dict) -> None:
        """`payload` as tensors and plain data, read back weights-only before it replaces the last one:
        a checkpoint that --resume could not read is never written."""
        buffer = io.BytesIO()
        torch.save(plain(payload), buffer)
        written = buffer.getvalue()
        torch.load(io.BytesIO(written), weights_only=True)  # raises here, while the run can still say why
        atomic_write_bytes(self.dir / f"{key}.pt", written)

    def load(self, key: str) -> dict | None:
        path = self.dir / f"{key}.pt"
        if not path.exists():
            return None
        try:
            return torch.load(path, weights_only=True)  # tensors and plain data: a file cannot run code
        except pickle.UnpicklingError as e:
            found = re.search(r"GLOBAL (\S+)", str(e))
            inside = f"a {found[1]}" if found else "objects other than tensors and plain data"
            raise UserError(
                f"checkpoint {path} cannot be read: it holds {inside}, and a checkpoint is read as tensors "
                "and plain data only (torch.load weights_only), so that a file cannot run code"
            ) from None
        except Exception as e:  # truncated or foreign file: say which
            raise UserError(f"checkpoint {path} cannot be read: {str(e).strip().splitlines()[0]}") from None

    def remove(self, key: str) -> None:
        (self.dir / f"{key}.pt").unlink(missing_ok=True)


def plain(value):
    """`value` with numpy's scalars as Python numbers and its arrays as tensors, in any dict, list or
    tuple: what torch.load(weights_only=True) reads (a numpy float in a timing would stop it)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    return value


def to_saved(repeat: Repeat | dict) -> dict:
    """A repeat's results, finished (Repeat) or in progress (train_repeat's progress dict), as plain
    values: a checkpoint loads with weights_only, which takes no classes of ours."""
    if isinstance(repeat, Repeat):
        return asdict(repeat)
    return {**repeat, "timed": [asdict(t) for t in repeat["timed"]], "curve": [asdict(p) for p in repeat["curve"]]}


def from_saved(saved: dict, finished: bool = True) -> Repeat | dict:
    """to_saved's inverse: a Repeat, or (`finished` False) a repeat's progress to resume from."""
    parts = {**saved, "timed": [StepTiming(**t) for t in saved["timed"]]}
    parts["curve"] = [CurvePoint(**p) for p in saved["curve"]]
    return Repeat(**parts) if finished else parts
