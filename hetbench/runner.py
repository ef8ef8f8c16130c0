"""One `hetbench run`, top to bottom: the race's cluster opened (race.py), the plan's measurement
at its start (planning.py: each worker alone and the floors, as `hetbench plan` makes it), every
planned row (scenarios.py; with plan.race worth, those the plan names) in passes (row_run.py), the
floors where the plan did not measure them, each raced row checked against the plan; records and
tables as it goes (results/).

With repeats, the run goes in passes: repeat r of every row before repeat r + 1 of any, in the
planned order and then reversed (A B C, C B A, A B ...), so that no row always runs on the hottest
machine (a fanless Mac slows as it heats); each record says where its row ran (`run_order`)."""

from __future__ import annotations

import logging

from hetbench.config import Config, from_dict
from hetbench.errors import RunFailed
from hetbench.floor import FLOOR_NAME
from hetbench.planning import measure_plan, planned_rows, record_plan
from hetbench.race import opened, run_floors
from hetbench.results.output import RunOutput, reopened
from hetbench.results.records import RecordFile, environment
from hetbench.results.report import alone, markdown
from hetbench.row_run import RowRun, record_of, run_pass
from hetbench.scenarios import Scenario, planned, reference_first, wants_standalone
from hetbench.standalone import Brackets, measure_standalone, speeds
from hetbench.strategies import registry
from hetbench.training import Evaluator
from hetbench.workload import load_workload

log = logging.getLogger(__name__)


def run(cfg: Config, resumed: RecordFile | None = None, standalone: dict | None = None) -> RecordFile:
    """The plan's measurement, then every planned row it races (the others recorded as predicted),
    then the floors if the plan did not measure them; a failed row is recorded with its reason and
    the run goes on (RunFailed at the end says so). Interrupted or refused, the records so far are
    kept. `resumed`: an interrupted run's records; what they hold is not run again."""
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
        with opened(cfg) as race:
            on = race.cfg
            brackets = Brackets(on.job(), wants_standalone(on))
            planning = None  # the plan's measurement (plan.check), made at the start as `hetbench plan` makes it
            if standalone is None and brackets.enabled:  # auto's split (a resumed run splits as this one did)
                if cfg.plan.check and cfg.floor.enabled:
                    planning = measure_plan(on, workload.gradients_ready(cfg.run), env, workload.parameters)
                    standalone = speeds(planning.rates)
                else:
                    standalone = speeds(measure_standalone(on.job()))
            rows = [RowRun.planned(s, on, standalone, env, out, workload.facts()) for s in planned(on)]
            if planning:
                record_plan(on, planning, rows, out, workload)
            out.save_run(cfg.as_dict(), standalone)
            for r in range(cfg.run.repeats):
                order = rows if r % 2 == 0 else rows[::-1]  # no row always last, on the hottest machine
                for n, row in enumerate(order, 1):
                    if row.finished or len(row.repeats) != r:  # done, or this pass's trained before an interrupt
                        continue
                    if reason := run_pass(row, r, n, race, brackets, standalone, evaluate, out):
                        failed.append(reason)
            if table := alone(out.records).strip():
                log.info(table)
            if cfg.floor.enabled and not planning and not record_of(out.records, Scenario(FLOOR_NAME, None)):
                for record in run_floors(reference_first(on, standalone)[0], env, workload.parameters):
                    out.add(record)  # measured from the reference's node
            if planning:  # each row raced beside what the plan said of it
                timed = (planning.alone, planning.ready)
                for record, checked in planned_rows(on, timed, planning.floors, out.records):
                    out.add(checked, replacing=record)
    finally:
        out.close()
    print(markdown(out.records))
    if failed:  # the tables and the verdict hold the rows that finished; the exit status says the rest
        raise RunFailed(failed[0] if len(failed) == 1 else f"{len(failed)} rows failed, the first: {failed[0]}")
    return out.file


def resume_run(run_id: str, results_dir: str) -> RecordFile:
    """`hetbench run --resume RUN`: RUN is a record file (results/raw/RUN.json) or its name."""
    saved, standalone, records = reopened(run_id, results_dir)
    log.info("resuming run %s", records.path.stem)
    return run(from_dict(saved, registry.declared()), records, standalone)
