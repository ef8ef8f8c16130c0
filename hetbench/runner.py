"""One `hetbench run`: the plan's measurement (plan.check: each worker alone and the floors, as
`hetbench plan` makes it), every planned row (scenarios.py; with plan.race worth, those the plan
names) through the training loop (training.py), the floors where the plan did not measure them;
records and tables as it goes (results/).

With repeats, the run goes in passes: repeat r of every row before repeat r + 1 of any, in the
planned order and then reversed (A B C, C B A, A B ...), so that no row always runs on the hottest
machine (a fanless Mac slows as it heats); each record says where its row ran (`run_order`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from hetbench.clock import median, now
from hetbench.cluster.joined import wait_for_workers
from hetbench.cluster.multinode import cluster_for_run
from hetbench.cluster.place import place
from hetbench.cluster.ray_connection import connect, ray_kept_for_the_run
from hetbench.config import Config, WorkerConfig, from_dict
from hetbench.errors import RunFailed, UserError
from hetbench.floor import FLOOR_NAME, FLOORS, measure_floor
from hetbench.plan import Alone, Measured, RowPlan, predict, predict_row, second_batch, to_race
from hetbench.plan import markdown as plan_markdown
from hetbench.progress import Progress
from hetbench.results.checkpoints import RunCheckpoints, from_saved, to_saved
from hetbench.results.output import RunOutput, reopened
from hetbench.results.record import FloorPath, FloorRecord, Planned, Record, Reference, RowRecord, from_json
from hetbench.results.records import RecordFile, environment, redacted
from hetbench.results.report import alone, markdown
from hetbench.results.rows import base_row, bracketed, failed_row, predicted_row, strategy_row
from hetbench.scenarios import Scenario, faults_for, planned, reference_first, skipped_features, wants_standalone
from hetbench.standalone import Brackets, measure_alone_and_together, measure_standalone, speeds
from hetbench.strategies import registry
from hetbench.strategies.parameter_server import ParameterServer
from hetbench.strategies.replica import Replica
from hetbench.training import Evaluator, Repeat, Schedule, train_repeat
from hetbench.workload import load_workload

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
    def planned(cls, scenario: Scenario, cfg: Config, standalone: dict | None, env: dict, out: RunOutput) -> RowRun:
        """The row as the run found it: new, or (resumed) its repeats from its checkpoint and the rest
        from its record (the one an interrupted pass left)."""
        row_cfg, reference = scenario.config(cfg, standalone)
        workload = load_workload(row_cfg.run).facts()
        base = base_row(scenario.strategy, row_cfg.as_dict(), scenario.fields(row_cfg), env, workload)
        row = cls(scenario, row_cfg, reference, base, record=record_of(out.records, scenario))
        saved = out.checkpoints.load(scenario.key) if out.checkpoints else None
        if row.record:
            row.finished = row.record.status != "ok" or len(row.record.repeat_samples_per_s) >= cfg.run.repeats
        if row.finished or not saved:
            return row
        row.repeats, row.resume = [from_saved(r) for r in saved["done"]], saved["progress"]
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
    strategy, schedule = cls(cfg.job(name)), Schedule.of(cfg.run, load_workload(cfg.run).metric)
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


def open_ray(cfg: Config) -> float | None:
    """Ray started (or joined) once, before any row, for the whole run (ray_kept_for_the_run), with a
    process per worker and one for a coordinator, torch imported and data loaded, that the rows hand
    on to each other (cluster/ray_hosts.py): no row's startup pays for either. Its seconds; None
    where no row uses Ray."""
    if not (cfg.floor.enabled or wants_standalone(cfg) or any(via(n) == "ray" for n in cfg.run.strategies)):
        return None
    started = now()
    connect(cfg.cluster, cfg.workers)
    job = cfg.job()  # no strategy's own: the processes serve every row
    place(cfg.cluster, cfg.workers, Replica, "starting the run's processes", job, coordinator=ParameterServer).close()
    return now() - started


def via(name: str) -> str | None:
    """The launcher a strategy's processes go through; None where it is unavailable (its row says why)."""
    try:
        return registry.load(name).via
    except ImportError:
        return None


def run_floors(cfg: Config, env: dict) -> list[FloorRecord]:
    """The gloo-floor's and the ps-floor's records, from one measurement: both failed where the floor's
    processes failed, the ps-floor alone where it could not connect (measure_floor says so)."""
    base = {"config": redacted(cfg.as_dict()), "env": env}
    try:
        figures = measure_floor(cfg.floor, cfg.cluster, cfg.workers, cfg.link, load_workload(cfg.run).parameters)
    except RunFailed as e:
        figures = [{"status": "failed", "reason": str(e)}] * len(FLOORS)
    # floor.py's figures read as a record reads (record.from_json: the floors' JSON names)
    return [from_json({"strategy": name, **base, "status": "ok", **f}) for name, f in zip(FLOORS, figures)]


def plan_timings(on: Config, room_s: float | None = None) -> tuple[dict[str, list[float]], tuple[Alone, ...], str]:
    """Each worker alone at the global batch (samples/s, as `auto` splits by them) and at the equal
    split's share of it (plan.second_batch), then at that share with every worker training at once
    (standalone.measure_alone_and_together), unless those would pass `room_s` seconds; as
    plan.Alone too, and what was cut."""
    large = on.run.batch_size
    small = second_batch(large, len(on.workers))
    timed = measure_alone_and_together(on.job(), small, room_s)
    cut = "" if timed.small else f"the batch of {small} (a step's fixed cost taken as zero, and a row's steps as alone)"

    def seconds(rates: dict[str, list[float]], name: str, batch: int = small) -> tuple[float, ...]:
        return tuple(batch / rate for rate in rates.get(name, ()))

    alone = tuple(
        Alone(
            w.name,
            small,
            large,
            seconds(timed.small, w.name),
            seconds(timed.large, w.name, large),
            seconds(timed.free, w.name),
            seconds(timed.lockstep, w.name),
        )
        for w in on.workers
    )
    return timed.large, alone, cut


@dataclass(frozen=True)
class Planning:
    """What a plan predicts from, as measured at the start of `hetbench plan` or `hetbench run`:
    each worker alone (samples/s at the global batch, as `auto` splits by them; and as plan.Alone),
    the gradients' ready times, the floors' records, and what the budget cut."""

    rates: dict[str, list[float]]
    alone: tuple[Alone, ...]
    ready: tuple[tuple[float, int], ...]
    floors: list[FloorRecord]
    cut: str = ""
    seconds: float = 0.0

    def measured(self, cfg: Config, model_bytes: int) -> Measured:
        return measured_by(cfg, (self.alone, self.ready), self.floors, model_bytes, self.seconds, self.cut)


def measure_plan(on: Config, ready: tuple, env: dict) -> Planning:
    """The plan's measurement on the race's cluster (its processes started): each worker timed alone
    at two batches and together (plan.steps steps each), then the floors from the reference's node,
    within plan.seconds where it can be. `hetbench plan` and `hetbench run` both start with it."""
    started, budget = now(), on.plan.seconds
    timing = replace(on, run=replace(on.run, standalone_steps=on.plan.steps))
    rates, alone, cut = plan_timings(timing, budget)
    first, _ = reference_first(on, speeds(rates))
    if now() - started > budget * 3 / 4:  # the floors cut to the fewest transfers that still say much
        first = replace(first, floor=replace(first.floor, iterations=min(first.floor.iterations, 5)))
        cut = "; ".join(filter(None, [cut, f"the floors to {first.floor.iterations} transfers each"]))
    floors = run_floors(first, env)
    return Planning(rates, alone, ready, floors, cut, now() - started)


def plan(cfg: Config) -> str:
    """`hetbench plan`: the race's cluster and processes started as `run` starts them, then the plan's
    measurement (measure_plan) and every row predicted (plan.py); Markdown."""
    if len(cfg.workers) < 2:
        raise UserError("hetbench plan compares machines: give the config two workers or more")
    workload = load_workload(cfg.run)
    workload.preflight(cfg.run)
    started = now()
    ready = workload.gradients_ready(cfg.run)  # on this CPU, before the cluster competes for it
    with (
        cluster_for_run(cfg.cluster, cfg.workers, cfg.link) as (joined, _, cluster),
        ray_kept_for_the_run(),
    ):
        workers = wait_for_workers(joined, cfg.workers, cluster and cluster.check_alive)
        on = replace(cfg, cluster=joined, workers=workers)
        open_ray(on)
        planning = measure_plan(on, ready, environment())
    measured = replace(planning.measured(cfg, workload.parameters * 4), seconds=now() - started)
    return plan_markdown(cfg, measured, predict(cfg, measured))


def measured_by(
    cfg: Config, planning: tuple, floors: list[FloorRecord], model_bytes: int, seconds: float = 0.0, cut: str = ""
) -> Measured:
    """plan.Measured from `planning` (the alone timings, the gradients' ready times) and the floors' records."""
    timed_alone, ready = planning
    allreduce, roundtrip = (f.seconds if f.status == "ok" else None for f in floors)
    beside = beside_server(cfg.workers, floors[1].path)
    return Measured(
        tuple(timed_alone), allreduce, roundtrip, model_bytes, seconds, cut, ready=ready, beside_server=beside
    )


def beside_server(workers: tuple[WorkerConfig, ...], path: FloorPath | None) -> frozenset[str]:
    """The workers on the driver's node, where a parameter server runs, when the floor's two ends had
    addresses of their own (a link between them): their round trips are on loopback. Where the ends
    shared one address (every node on one machine), the ps-floor's is the trip every worker makes."""
    if path is None or path.driver_end is None or len(set(path.ips)) < 2:
        return frozenset()
    return frozenset(w.name for w in workers if w.node == path.nodes[path.driver_end])


def predicted_per_repeat(cfg: Config, measured: Measured, record: RowRecord, shares: list[tuple]) -> list:
    """`record`'s row predicted from `measured` at each repeat's split (`shares`, in worker order):
    each split once, listed for every repeat that ended at it."""
    predicted = {
        split: predict_row(cfg, measured, record.strategy, record.balance, list(split)) for split in set(shares)
    }
    return [predicted[split] for split in shares]


def planned_rows(cfg: Config, planning: tuple, floors: list[FloorRecord], records: list[Record]):
    """The run's row records that the plan predicts, each with its prediction (plan.check): from
    `planning`, the alone timings and the gradients' ready times at the run's start, and its
    floors, at each repeat's split (auto's re-split may end repeats at different ones: the median
    of their predictions, against the median of the repeats measured): what `hetbench plan` run just
    before the race would have said. A bracketed row is also predicted with each worker's timings
    rescaled to its speed alone around the row (`at_row_samples_per_s`): on a shared box a worker's
    speed alone moves between rows, but the rescaling, by the brackets' timing of the global batch
    over the start's, moved the prediction further off than the hour did in two races of three
    (shapes-local at 3450b2b: -25..-13% at the row's speeds, -5..+7% at the start's; hetero-local at
    c78365f: 0..+38% and -5..+30%)."""
    measured = measured_by(cfg, planning, floors, floors[0].bytes or 0)
    names = [a.name for a in measured.alone]  # the configured workers, in order
    for record in records:
        if not isinstance(record, RowRecord) or not record.trained or record.balance is None:
            continue
        lost = any(w.lost_at_step is not None for w in record.workers)
        splits = record.repeat_splits(names)
        if lost or any(set(s) != set(names) or None in s.values() for s in splits):
            continue  # a worker lost to a fault: not the pattern the plan predicts
        shares = [tuple(s[n] for n in names) for s in splits]
        rows = predicted_per_repeat(cfg, measured, record, shares)
        if not all(rows):
            continue
        planned = planned_of(rows, measured.alone, samples_per_s_at_row(cfg, measured, record, shares))
        yield record, replace(record, plan=planned)


def planned_of(rows: list[RowPlan], timed_alone: tuple[Alone, ...], at_row: float | None = None) -> Planned:
    """A record's plan from its row's predictions (one a split it ended a repeat at): their medians
    and range, against the best alone as `hetbench plan` says it (vs_alone), and what they ran
    through, timed once at the run's start: a synchronous row's workers in lockstep, an asynchronous
    one's at their own pace."""
    sync, names = rows[0].synchronous, [a.name for a in timed_alone]
    return Planned(
        median([row.samples_per_s[1] for row in rows]),
        min(row.samples_per_s[0] for row in rows),
        max(row.samples_per_s[2] for row in rows),
        median([row.compute_s for row in rows]) if sync else None,
        sharing={a.name: a.sharing(sync) for a in timed_alone if a.free_s},
        lockstep=sync,
        worker_compute_s={name: median([row.shares_s[i] for row in rows]) for i, name in enumerate(names)},
        timed_alone_s={a.name: [median(s) for s in (a.large_s, a.small_s) if s] for a in timed_alone},
        at_row_samples_per_s=at_row,
        vs_alone=median([row.vs_alone[1] for row in rows]),
    )


def samples_per_s_at_row(cfg: Config, measured: Measured, record: RowRecord, shares: list[tuple]) -> float | None:
    """`record`'s row predicted with each worker's timings rescaled to its speed alone around the row
    (its brackets), the median over its repeats' splits; None where it was not bracketed."""
    if not record.standalone_timings:
        return None
    around = {w.name: w.standalone_samples_per_s for w in record.workers}
    alone = tuple(a.at_speed(around[a.name]) if around.get(a.name) else a for a in measured.alone)
    rows = predicted_per_repeat(cfg, replace(measured, alone=alone), record, shares)
    return median([row.samples_per_s[1] for row in rows]) if all(rows) else None


def run(cfg: Config, resumed: RecordFile | None = None, standalone: dict | None = None) -> RecordFile:
    """The plan's measurement, then every planned row it races (the others recorded as predicted),
    then the floors if the plan did not measure them; a failed row is recorded with its reason and
    the run goes on (RunFailed at the end says so). Interrupted or refused, the records so far are kept.

    `resumed`: an interrupted run's records; what they hold is not run again.
    """
    registry.check_names(cfg.run.strategies)
    env = environment()
    # a workload that cannot be loaded, or its bad data, is refused before any file is reserved
    workload = load_workload(cfg.run)
    workload.preflight(cfg.run)
    evaluate = Evaluator(workload, cfg.run)
    out = RunOutput(cfg.run, resumed)
    failed: list[str] = []  # the reasons of the rows that failed; the run went on past each
    try:
        out.save_run(cfg.as_dict(), standalone)
        with (
            cluster_for_run(cfg.cluster, cfg.workers, cfg.link) as (joined, cluster_startup_s, cluster),
            ray_kept_for_the_run(),
        ):
            if cluster_startup_s is not None:
                log.info("local-multinode cluster up in %.1f s", cluster_startup_s)
            workers = ramps_started(wait_for_workers(joined, cfg.workers, cluster and cluster.check_alive))
            cluster_cfg = replace(cfg, cluster=joined, workers=workers)
            ray_startup_s = open_ray(cluster_cfg)
            brackets = Brackets(cluster_cfg.job(), wants_standalone(cluster_cfg))
            planning = None  # the plan's measurement (plan.check), made at the start as `hetbench plan` makes it
            if standalone is None and brackets.enabled:  # auto's split (a resumed run splits as this one did)
                if cfg.plan.check and cfg.floor.enabled:
                    planning = measure_plan(cluster_cfg, workload.gradients_ready(cfg.run), env)
                    rates = planning.rates
                else:
                    rates = measure_standalone(cluster_cfg.job())
                standalone = speeds(rates)
            rows = [RowRun.planned(s, cluster_cfg, standalone, env, out) for s in planned(cluster_cfg)]
            if planning:
                record_floors(planning.floors, out)
                measured = planning.measured(cluster_cfg, workload.parameters * 4)
                predicted = predict(cluster_cfg, measured)
                out.write_plan(plan_markdown(cluster_cfg, measured, predicted))
                if cfg.plan.race == "worth":
                    record_unraced(rows, predicted, measured.alone, out, cfg.run.repeats)
            out.save_run(cfg.as_dict(), standalone)
            for row in rows:
                if row.finished:
                    log.info("%s: recorded before the run was interrupted, not run again", row.scenario.label)
                elif row.repeats:
                    log.info("%s: going on from repeat %d", row.scenario.label, len(row.repeats) + 1)
            for r in range(cfg.run.repeats):
                order = rows if r % 2 == 0 else rows[::-1]  # no row always last, on the hottest machine
                for n, row in enumerate(order, 1):
                    if row.finished or len(row.repeats) != r:  # done, or this pass's trained before an interruption
                        continue
                    log.debug("running %s, repeat %d", row.scenario.label, r + 1)
                    row.places.append(n)
                    where = f"[{n}/{len(rows)}] {row.scenario.label}"  # the progress line's
                    # its workers timed alone first, where they judge it
                    judged = brackets.before(row.scenario.strategy != registry.BASELINE)
                    try:
                        # a judged row's scaling is against its brackets, computed once they are timed
                        alone_speeds = None if judged else standalone
                        record = run_repeat(row, r, evaluate, alone_speeds, out.checkpoints, cluster, where)
                    except UserError:  # bad input fails every row alike: one sentence, exit 2
                        raise
                    except Exception as e:  # noqa: BLE001 (whatever a row raises, it is one failed row)
                        reason = str(e) if isinstance(e, RunFailed) else failure(row.scenario.strategy, e)
                        row.write(failed_row(row.base, reason), out, cfg.run.repeats)
                        failed.append(reason)
                        log.warning("%s failed: %s; going on with the next row", row.scenario.label, reason)
                        log.debug("%s's failure", row.scenario.label, exc_info=True)
                        continue
                    if judged and record.status == "ok":
                        record = bracketed(record, *row.timed_alone(*brackets.after()))
                    record = replace(
                        record,
                        cluster_startup_s=cluster_startup_s,
                        ray_startup_s=ray_startup_s,  # once for the run, before every row: no row's startup
                        reference=Reference(**row.reference) if row.reference else None,
                        run_order=list(row.places),
                    )
                    row.write(record, out, cfg.run.repeats)
                    if record.status == "skipped":
                        log.info("skipped %s: %s", row.scenario.label, record.reason)
            if line := alone(out.records).strip():
                log.info(line)
            if cfg.floor.enabled and not planning and not record_of(out.records, Scenario(FLOOR_NAME, None)):
                record_floors(run_floors(reference_first(cluster_cfg, standalone)[0], env), out)  # the reference's node
            if planning:  # each row raced beside what the plan said of it
                timed = (planning.alone, planning.ready)
                for record, checked in planned_rows(cluster_cfg, timed, planning.floors, out.records):
                    out.add(checked, replacing=record)
    finally:
        out.close()
    print(markdown(out.records))
    if failed:  # the tables and the verdict hold the rows that finished; the exit status says the rest
        raise RunFailed(failed[0] if len(failed) == 1 else f"{len(failed)} rows failed, the first: {failed[0]}")
    return out.file


def record_floors(floors: list[FloorRecord], out: RunOutput) -> None:
    """The floors' records, in place of any an interrupted run recorded."""
    kept = {r.strategy: r for r in out.records if isinstance(r, FloorRecord)}
    for record in floors:
        out.add(record, replacing=kept.get(record.strategy))


def record_unraced(rows: list[RowRun], predicted: list[RowPlan], alone: tuple[Alone, ...], out, repeats: int) -> None:
    """plan.race worth: every row but the baseline and those the plan names to race (plan.to_race)
    recorded as predicted, not raced. A row the plan cannot predict (its floor failed) is raced."""
    raced = {(r.strategy, r.balance) for r in to_race(predicted)}
    plans = {(r.strategy, r.balance): r for r in predicted}
    for row in rows:
        key = (row.scenario.strategy, row.scenario.balance)
        if row.finished or row.repeats or key in raced or key not in plans:
            continue
        plan, names = plans[key], [a.name for a in alone]  # its split in the configured workers' order
        record = predicted_row(row.base, dict(zip(names, plan.split)), plan.verdict, planned_of([plan], alone))
        row.write(record, out, repeats)


def failure(strategy: str, e: BaseException) -> str:
    """What a row raised beyond its strategy's own sentences (RunFailed), as one: its kind and the
    first line of its message (a Ray task's: the exception the task raised)."""
    cause = getattr(e, "cause", None)  # ray.exceptions.RayTaskError's
    e = cause if isinstance(cause, BaseException) else e
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return f"{strategy} raised {type(e).__name__}" + (f": {first}" if first else "")


def ramps_started(workers: tuple[WorkerConfig, ...]) -> tuple[WorkerConfig, ...]:
    """Each growing emulated slowdown with no start of its own starts now, the run's start: every
    process of the run, and every row's record, reads the same clock for it."""
    started = time.time()
    return tuple(
        replace(w, ramp_start=started) if w.slowdown_to is not None and w.ramp_start is None else w for w in workers
    )


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


def resume_run(run_id: str, results_dir: str) -> RecordFile:
    """`hetbench run --resume RUN`: RUN is a record file (results/raw/RUN.json) or its name."""
    saved, standalone, records = reopened(run_id, results_dir)
    log.info("resuming run %s", records.path.stem)
    return run(from_dict(saved, registry.declared()), records, standalone)
