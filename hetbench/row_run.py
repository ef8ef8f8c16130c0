"""One row of a run across its passes (RowRun): each pass its strategy started, one repeat trained
(training.py), closed, and the row's record over its repeats so far written in place of the last
(results/rows.py); an interrupted row goes on from its checkpoint (--resume)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from hetbench.clock import now
from hetbench.config import Config
from hetbench.errors import RunFailed, UserError
from hetbench.progress import Progress
from hetbench.race import Race
from hetbench.results.checkpoints import RunCheckpoints, from_saved, to_saved
from hetbench.results.output import RunOutput
from hetbench.results.record import FloorRecord, Record, Reference, RowRecord
from hetbench.results.rows import base_row, bracketed, failed_row, strategy_row
from hetbench.scenarios import Scenario, faults_for, skipped_features
from hetbench.standalone import Brackets
from hetbench.strategies import registry
from hetbench.training import Evaluator, Repeat, Schedule, train_repeat
from hetbench.workload import WorkloadFacts

log = logging.getLogger(__name__)


@dataclass
class RowRun:
    """One row across the run's passes: what the repeats it trained so far add up to, and its
    record as it stands (written after each pass, replaced by the next)."""

    scenario: Scenario
    cfg: Config  # the row's own: its split
    reference: dict | None  # the baseline's: which machine it ran on
    base: RowRecord  # what its record starts with (rows.base_row)
    repeats: list[Repeat] = field(default_factory=list)
    resume: dict | None = None  # a checkpoint of its next repeat, part-trained before an interruption
    notes: dict = field(default_factory=dict)  # what its record says of how it ran (resumed_at, ...)
    startups: list[float] = field(default_factory=list)  # its strategy's start, each pass
    places: list[int] = field(default_factory=list)  # where it ran in each pass, 1 the first
    events: list[dict] = field(default_factory=list)  # each pass's, with its repeat
    before: dict[str, list[float]] = field(default_factory=dict)  # its workers alone just before each pass
    after: dict[str, list[float]] = field(default_factory=dict)  # and just after
    record: RowRecord | None = None  # the latest written
    finished: bool = False  # every repeat trained, or it failed or was skipped

    @classmethod
    def planned(
        cls, scenario: Scenario, cfg: Config, standalone: dict | None, env: dict, out: RunOutput, facts: WorkloadFacts
    ) -> RowRun:
        """The row as the run found it: new, or (resumed) its repeats from its checkpoint and the rest
        from its record (the one an interrupted pass left). `facts`: the workload it trains."""
        row_cfg, reference = scenario.config(cfg, standalone)
        base = base_row(scenario.strategy, row_cfg.as_dict(), scenario.fields(row_cfg), env, facts)
        row = cls(scenario, row_cfg, reference, base, record=record_of(out.records, scenario))
        saved = out.checkpoints.load(scenario.key) if out.checkpoints else None
        if row.record:
            row.finished = row.record.status != "ok" or len(row.record.repeat_samples_per_s) >= cfg.run.repeats
        if row.finished:
            log.info("%s: recorded before the run was interrupted, not run again", scenario.label)
        if row.finished or not saved:
            return row
        row.repeats, row.resume = [from_saved(r) for r in saved["done"]], saved["progress"]
        if row.repeats:
            log.info("%s: going on from repeat %d", scenario.label, len(row.repeats) + 1)
        if saved.get("under_way", True):  # the interrupt cut its repeat short (else its next pass had not begun)
            row.notes["resumed_at"] = {"repeat": len(row.repeats), "step": row.resume["next_step"] if row.resume else 0}
        if kept := row.record:  # what its record holds of the passes that trained those repeats
            passes = len(row.repeats)
            row.startups, row.places = kept.repeat_startup_s[:passes], kept.run_order[:passes]
            row.events = [e for e in kept.events if e.get("repeat", 0) < passes]
            for name, t in (kept.standalone_timings or {}).items():
                row.before[name], row.after[name] = t.before[:passes], t.after[:passes]
        return row

    def timed_alone(self, before: dict, after: dict) -> tuple[dict, dict]:
        """This pass's timings of its workers alone (standalone.Brackets) added to its earlier
        passes': every pass's, pair by pair."""
        for name in before:
            self.before.setdefault(name, []).extend(before[name])
            self.after.setdefault(name, []).extend(after[name])
        return self.before, self.after

    def write(self, record: RowRecord, out: RunOutput, repeats: int) -> None:
        """A pass of it ended in `record`: written in place of the last one; its checkpoint removed
        once nothing of it is left to train."""
        self.finished = record.status != "ok" or len(self.repeats) >= repeats
        out.add(record, self.scenario.key if self.finished else None, replacing=self.record)
        self.record = record


def run_repeat(
    row: RowRun,
    r: int,
    evaluate: Evaluator,
    standalone: dict | None = None,
    checkpoints: RunCheckpoints | None = None,
    cluster=None,
    label: str | None = None,
) -> RowRecord:
    """One pass of a row: its strategy started (its startup timed apart), repeat `r` trained, closed;
    the row's record over every repeat so far (results/rows.py)."""
    name, cfg = row.scenario.strategy, row.cfg
    try:
        cls = registry.load(name)
    except ImportError as e:
        return replace(row.base, status="skipped", reason=str(e))
    strategy, schedule = cls(cfg.job(name)), Schedule.of(cfg.run, evaluate.metric)
    faults = faults_for(cls, cfg) if r == 0 else ()  # the first repeat's: each fault once a row
    try:
        started = now()
        strategy.start()
        row.startups.append(now() - started)
        with Progress(label or name, schedule.total(r), cfg.run.repeats) as bar:
            bar.repeat(r)
            kept = saver(checkpoints, row.scenario.key, row.repeats) if checkpoints else None
            if kept and not row.resume:  # under way: an interrupt from here on cuts this repeat short
                kept(None)
            resume = from_saved(row.resume, finished=False) if row.resume else None
            row.repeats.append(
                train_repeat(
                    strategy,
                    schedule,
                    repeat=r,
                    evaluate=evaluate,
                    bar=bar,
                    seed=cfg.run.seed + r,
                    samples_per_step=cfg.run.batch_size,
                    faults=faults,
                    save=kept if cls.resumable else None,
                    resume=resume,
                    cluster=cluster,
                )
            )
        row.resume = None
        if kept:  # the repeats it trained, kept until its last pass is recorded
            kept(None, under_way=False)
        workers = strategy.worker_info()
        earlier = row.record.extras if row.record else {}  # its earlier passes'
        extras = {**skipped_features(cls, cfg), **row.notes, **strategy.record_extras(earlier)}
    finally:
        strategy.close()
        for fault in faults:  # a killed or cut-off node comes back for the scenarios after this one
            if fault.kill in ("node", "link"):
                cluster.revive(fault.target)
    row.events += [{**event, "repeat": r} for event in strategy.events]
    return strategy_row(row.base, strategy, workers, row.repeats, row.startups, standalone, extras, row.events)


def saver(checkpoints: RunCheckpoints, key: str, done: list[Repeat]):
    """Saves the row's finished repeats, whether the next one is under way, and its progress (model +
    optimizer + step; None where it kept none)."""

    def save(progress: dict | None, under_way: bool = True) -> None:
        kept = to_saved(progress) if progress else None
        checkpoints.save(key, {"done": [to_saved(r) for r in done], "progress": kept, "under_way": under_way})

    return save


def run_pass(row: RowRun, r: int, n: int, race: Race, brackets: Brackets, standalone, evaluate, out) -> str | None:
    """Pass `r` of a row, the `n`th to run in it: its workers timed alone around it where they judge
    it, its repeat trained, its record written; where the row failed, whatever it raised, its
    reason (the run goes on: one failed row is one row)."""
    log.debug("running %s, repeat %d", row.scenario.label, r + 1)
    row.places.append(n)
    repeats = row.cfg.run.repeats
    judged = brackets.before(row.scenario.strategy != registry.BASELINE)  # its workers timed alone first
    try:
        label = f"[{n}/{race.rows}] {row.scenario.label}"  # the progress line's
        # a judged row's scaling is against its brackets, computed once they are timed
        record = run_repeat(row, r, evaluate, None if judged else standalone, out.checkpoints, race.cluster, label)
    except UserError:  # bad input fails every row alike: one sentence, exit 2
        raise
    except Exception as e:  # noqa: BLE001 (whatever a row raises, it is one failed row)
        reason = str(e) if isinstance(e, RunFailed) else failure(row.scenario.strategy, e)
        row.write(failed_row(row.base, reason), out, repeats)
        log.warning("%s failed: %s; going on with the next row", row.scenario.label, reason)
        log.debug("%s's failure", row.scenario.label, exc_info=True)
        return reason
    if judged and record.status == "ok":
        record = bracketed(record, *row.timed_alone(*brackets.after()))
    record = replace(
        record,
        cluster_startup_s=race.cluster_startup_s,
        ray_startup_s=race.ray_startup_s,  # once for the run, before every row: no row's startup
        reference=Reference(**row.reference) if row.reference else None,
        run_order=list(row.places),
    )
    row.write(record, out, repeats)
    if record.status == "skipped":
        log.info("skipped %s: %s", row.scenario.label, record.reason)
    return None


def failure(strategy: str, e: BaseException) -> str:
    """What a row raised beyond its strategy's own sentences (RunFailed), as one: its kind and the
    first line of its message (a Ray task's: the exception the task raised)."""
    cause = getattr(e, "cause", None)  # ray.exceptions.RayTaskError's
    e = cause if isinstance(cause, BaseException) else e
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return f"{strategy} raised {type(e).__name__}" + (f": {first}" if first else "")


def record_of(records: list[Record], scenario: Scenario) -> Record | None:
    """This row's record in the run, if it has one (a resumed run goes on from it)."""
    return next(
        (
            r
            for r in records
            if r.strategy == scenario.strategy and (isinstance(r, FloorRecord) or r.balance == scenario.balance)
        ),
        None,
    )
