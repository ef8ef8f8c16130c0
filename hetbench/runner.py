"""One `hetbench run`: every planned row (scenarios.py), each through the training loop (training.py),
then the gloo floor; records and tables as it goes (results/)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from hetbench.clock import now
from hetbench.cluster.joined import wait_for_workers
from hetbench.cluster.multinode import cluster_for_run
from hetbench.cluster.place import place
from hetbench.cluster.ray_connection import connect, ray_kept_for_the_run
from hetbench.config import Config, WorkerConfig, from_dict
from hetbench.data import cached_mnist
from hetbench.errors import RunFailed
from hetbench.floor import FLOOR_NAME, FLOORS, measure_floor
from hetbench.gradients import count_parameters
from hetbench.progress import Progress
from hetbench.results.checkpoints import RunCheckpoints, from_saved, to_saved
from hetbench.results.output import RunOutput, reopened
from hetbench.results.record import FloorRecord, Record, Reference, RowRecord, from_json
from hetbench.results.records import RecordFile, environment, redacted
from hetbench.results.report import alone, markdown
from hetbench.results.rows import base_row, bracketed, failed_row, strategy_row
from hetbench.scenarios import Scenario, faults_for, planned, reference_first, skipped_features, wants_standalone
from hetbench.standalone import Brackets, measure_standalone, speeds
from hetbench.strategies import registry
from hetbench.strategies.parameter_server import ParameterServer
from hetbench.strategies.replica import Replica
from hetbench.training import Evaluator, Repeat, Schedule, train_repeat
from hetbench.workload import Net

log = logging.getLogger(__name__)


def run_strategy(
    scenario: Scenario,
    cfg: Config,
    base: RowRecord,
    evaluate: Evaluator,
    standalone: dict | None = None,
    checkpoints: RunCheckpoints | None = None,
    cluster=None,
    label: str | None = None,
) -> RowRecord:
    """One row: the strategy started (its startup timed apart), its repeats, closed; its record,
    which starts as `base` (results/rows.py)."""
    name = scenario.strategy
    try:
        cls = registry.load(name)
    except ImportError as e:
        return replace(base, status="skipped", reason=str(e))
    strategy, schedule = cls(cfg.job(name)), Schedule.of(cfg.run)
    faults, notes = faults_for(cls, cfg), skipped_features(cls, cfg)
    saved = checkpoints.load(scenario.key) if checkpoints else None
    if saved:
        notes["resumed_at"] = {"repeat": len(saved["done"]), "step": saved["progress"]["next_step"]}
    try:
        started = now()
        strategy.start()
        startup_s = now() - started
        lengths = [schedule.total(r) for r in range(cfg.run.repeats)]
        repeats = [from_saved(r) for r in saved["done"]] if saved else []
        with Progress(label or name, sum(lengths), cfg.run.repeats) as bar:
            if repeats:
                bar.update(sum(lengths[: len(repeats)]), resumed=True)
            for r in range(len(repeats), cfg.run.repeats):
                bar.repeat(r)
                save = saver(checkpoints, scenario.key, repeats) if checkpoints and cls.resumable else None
                resume = from_saved(saved["progress"], finished=False) if saved and len(saved["done"]) == r else None
                first = faults if r == 0 else ()
                repeats.append(
                    train_repeat(
                        strategy,
                        schedule,
                        repeat=r,
                        evaluate=evaluate,
                        bar=bar,
                        seed=cfg.run.seed + r,
                        samples_per_step=cfg.run.batch_size,
                        faults=first,
                        save=save,
                        resume=resume,
                        cluster=cluster,
                    )
                )
        workers, extras = strategy.worker_info(), {**notes, **strategy.record_extras()}
    finally:
        strategy.close()
        for fault in faults:  # a killed or cut-off node comes back for the scenarios after this one
            if fault.kill in ("node", "link"):
                cluster.revive(fault.target)
    return strategy_row(base, strategy, workers, repeats, startup_s, standalone, extras)


def saver(checkpoints: RunCheckpoints, key: str, done: list[Repeat]):
    """Saves the scenario's finished repeats and the current one's progress (model + optimizer + step)."""

    def save(progress: dict) -> None:
        checkpoints.save(key, {"done": [to_saved(r) for r in done], "progress": to_saved(progress)})

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
        figures = measure_floor(cfg.floor, cfg.cluster, cfg.workers, cfg.link, count_parameters(Net()))
    except RunFailed as e:
        figures = [{"status": "failed", "reason": str(e)}] * len(FLOORS)
    # floor.py's figures read as a record reads (record.from_json: the floors' JSON names)
    return [from_json({"strategy": name, **base, "status": "ok", **f}) for name, f in zip(FLOORS, figures)]


def run(cfg: Config, resumed: RecordFile | None = None, standalone: dict | None = None) -> RecordFile:
    """Run every planned row, then the floor; a failed row is recorded with its reason and the run goes
    on (RunFailed at the end says so). Interrupted or refused, the records so far are kept.

    `resumed`: an interrupted run's records; what they hold is not run again.
    """
    registry.check_names(cfg.run.strategies)
    env = environment()
    _, test = cached_mnist(cfg.run)  # bad data is refused before any file is reserved
    evaluate = Evaluator(test, cfg.run)
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
            workers = ramps_started(wait_for_workers(joined, cfg.workers))
            cluster_cfg = replace(cfg, cluster=joined, workers=workers)
            ray_startup_s = open_ray(cluster_cfg)
            brackets = Brackets(cluster_cfg.job(), wants_standalone(cluster_cfg))
            if standalone is None and brackets.enabled:  # auto's split (a resumed run splits as this one did)
                standalone = speeds(measure_standalone(cluster_cfg.job()))
                out.save_run(cfg.as_dict(), standalone)
            rows = planned(cluster_cfg)
            for n, scenario in enumerate(rows, 1):
                row_cfg, reference = scenario.config(cluster_cfg, standalone)
                if recorded(out.records, scenario):
                    log.info("%s: recorded before the run was interrupted, not run again", scenario.label)
                    continue
                log.debug("running %s", scenario.label)
                where = f"[{n}/{len(rows)}] {scenario.label}"  # the progress line's
                judged = brackets.before(scenario.strategy != registry.BASELINE)  # its workers timed alone first
                base = base_row(scenario.strategy, row_cfg.as_dict(), scenario.fields(row_cfg), env)
                try:
                    # a judged row's scaling is against its brackets, computed once they are timed
                    alone_speeds = None if judged else standalone
                    record = run_strategy(
                        scenario, row_cfg, base, evaluate, alone_speeds, out.checkpoints, cluster, where
                    )
                except RunFailed as e:  # one failed row: recorded with its reason, and the run goes on
                    out.add(failed_row(base, str(e)))
                    failed.append(str(e))
                    log.warning("%s failed: %s; going on with the next row", scenario.label, e)
                    continue
                if judged and record.status == "ok":
                    record = bracketed(record, *brackets.after())
                record = replace(
                    record,
                    cluster_startup_s=cluster_startup_s,
                    ray_startup_s=ray_startup_s,  # once for the run, before every row: no row's startup
                    reference=Reference(**reference) if reference else None,
                )
                out.add(record, scenario.key)
                if record.status == "skipped":
                    log.info("skipped %s: %s", scenario.label, record.reason)
            if line := alone(out.records).strip():
                log.info(line)
            if cfg.floor.enabled and not recorded(out.records, Scenario(FLOOR_NAME, None)):
                for record in run_floors(reference_first(cluster_cfg, standalone)[0], env):  # from the reference's node
                    out.add(record)
    finally:
        out.close()
    print(markdown(out.records))
    if failed:  # the tables and the verdict hold the rows that finished; the exit status says the rest
        raise RunFailed(failed[0] if len(failed) == 1 else f"{len(failed)} rows failed, the first: {failed[0]}")
    return out.file


def ramps_started(workers: tuple[WorkerConfig, ...]) -> tuple[WorkerConfig, ...]:
    """Each growing emulated slowdown with no start of its own starts now, the run's start: every
    process of the run, and every row's record, reads the same clock for it."""
    started = time.time()
    return tuple(
        replace(w, ramp_start=started) if w.slowdown_to is not None and w.ramp_start is None else w for w in workers
    )


def recorded(records: list[Record], scenario: Scenario) -> bool:
    """Whether this row's record is already in the run (a resumed run skips it)."""
    return any(
        r.strategy == scenario.strategy and (isinstance(r, FloorRecord) or r.balance == scenario.balance)
        for r in records
    )


def resume_run(run_id: str, results_dir: str) -> RecordFile:
    """`hetbench run --resume RUN`: RUN is a record file (results/raw/RUN.json) or its name."""
    saved, standalone, records = reopened(run_id, results_dir)
    log.info("resuming run %s", records.path.stem)
    return run(from_dict(saved, registry.declared()), records, standalone)
