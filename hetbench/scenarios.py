"""A run's rows as data: which strategy, with which batch split, on which reference machine."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from hetbench.balance import split_batch
from hetbench.config import Config
from hetbench.strategies.base import Strategy
from hetbench.strategies.registry import BASELINE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scenario:
    """One row: a strategy and the balance it splits the batch by (None: the baseline, the whole
    batch on the reference worker's device)."""

    strategy: str
    balance: str | None

    @property
    def label(self) -> str:
        """As the progress line and the log name it."""
        return self.strategy if self.balance is None else f"{self.strategy} [{self.balance}]"

    @property
    def key(self) -> str:
        """Its name in checkpoints: the strategy, and the balance it ran with."""
        return self.strategy if self.balance is None else f"{self.strategy}-{self.balance}"

    def config(self, cfg: Config, standalone: dict | None) -> tuple[dict, dict | None]:
        """The row's config (the split it runs with, or the reference worker first), and for the
        baseline what the record says of its reference."""
        if self.strategy == BASELINE:
            return reference_first(cfg, standalone)
        return balanced(cfg, self.balance, standalone), None

    def fields(self, cfg: Config) -> dict:
        """What tells its record apart, from the row's config: the batch split (the baseline: the whole
        batch on one device)."""
        if self.strategy == BASELINE:
            return {"balance": None, "split": [cfg.run.batch_size]}
        return {"balance": cfg.run.balance[0], "split": [w.batch for w in cfg.workers]}


def balanced(cfg: Config, balance: str, standalone: dict[str, float] | None = None) -> Config:
    """The config of one balance scenario: every worker's batch set, the global batch unchanged.

    equal: as validated (the configured batches, else an equal split); proportional: by each
    worker's `speed` (default 1 / slowdown); auto: by samples/s measured alone (`standalone`), which
    the runner corrects at the end of warm-up (training.Schedule.resplits).
    """
    out = replace(cfg, run=replace(cfg.run, balance=(balance,)))
    if balance == "equal":
        return out
    if balance == "proportional":
        speeds = [w.speed or 1.0 / w.slowdown for w in cfg.workers]
    else:
        speeds = [standalone[w.name] for w in cfg.workers]
    batches = split_batch(cfg.run.batch_size, speeds)
    return out.with_workers(replace(w, batch=b) for w, b in zip(cfg.workers, batches))


def planned(cfg: Config) -> list[Scenario]:
    """In run order: each distributed strategy once per balance, the baseline once."""
    return [
        Scenario(name, None) if name == BASELINE else Scenario(name, balance)
        for name in cfg.run.strategies
        for balance in ([None] if name == BASELINE else cfg.run.balance)
    ]


def reference_first(cfg: Config, standalone: dict | None) -> tuple[dict, dict]:
    """The config with the reference machine's worker first, where the baseline runs (the fastest
    worker alone, measured in this run, else the first configured one), and what the record says of it."""
    workers = cfg.workers
    if not standalone:
        return cfg, {"worker": workers[0].name, "chosen_by": "first configured worker"}
    best = max(workers, key=lambda w: standalone[w.name])  # the first of equals
    reordered = [best, *(w for w in workers if w is not best)]
    return cfg.with_workers(reordered), {"worker": best.name, "chosen_by": "fastest alone in this run"}


def wants_standalone(cfg: Config) -> bool:
    """Whether each worker is timed alone around the rows (auto's split, scaling efficiency)."""
    return (
        bool(cfg.run.standalone_steps) and len(cfg.workers) > 1 and any(name != BASELINE for name in cfg.run.strategies)
    )


def skipped_features(cls: type[Strategy], cfg: Config) -> dict:
    """What the config asks that this strategy cannot do yet, as the record's notes (and a log line each)."""
    notes = {}
    if cfg.run.faults and cls.distributed and not cls.survives_worker_loss:
        notes["faults_skipped"] = f"{cls.name} does not survive a lost worker yet: faults not injected"
    if cfg.run.checkpoint_every and not cls.resumable:
        notes["checkpoints_skipped"] = (
            f"{cls.name} keeps no checkpoint within a repeat: --resume keeps its finished repeats and trains "
            "the unfinished one again from its start"
        )
    if cfg.run.rebalance_every and cls.distributed and not cls.rebalances:
        notes["rebalance_skipped"] = (
            f"{cls.name} cannot re-split its batch between steps yet: rebalance_every not applied"
        )
    for note in notes.values():
        log.info(note)
    return notes


def faults_for(cls: type[Strategy], cfg: Config) -> list[dict]:
    """The faults this strategy gets, in its first repeat."""
    return cfg.run.faults if cls.distributed and cls.survives_worker_loss else []
