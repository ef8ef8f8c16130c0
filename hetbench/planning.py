"""The plan made on the race's own cluster: its measurement (`hetbench plan`'s, and the start of
`hetbench run`'s: each worker alone and together, then the floors), the plan command, and each
raced row's record checked against it (plan.check); with plan.race worth, the rows it does not name
recorded as predicted. The arithmetic is plan.py's."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hetbench.clock import median, now
from hetbench.config import Config, WorkerConfig
from hetbench.errors import UserError
from hetbench.plan import Alone, Measured, RowPlan, predict, predict_row, second_batch, to_race
from hetbench.plan import markdown as plan_markdown
from hetbench.race import opened, run_floors
from hetbench.results.output import RunOutput
from hetbench.results.record import FloorPath, FloorRecord, Planned, Record, RowRecord
from hetbench.results.records import environment
from hetbench.results.rows import predicted_row
from hetbench.row_run import RowRun
from hetbench.scenarios import reference_first
from hetbench.standalone import measure_alone_and_together, speeds
from hetbench.workload import LoadedWorkload, load_workload


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


def measure_plan(on: Config, ready: tuple, env: dict, parameters: int) -> Planning:
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
    floors = run_floors(first, env, parameters)
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
    with opened(cfg) as race:
        planning = measure_plan(race.cfg, ready, environment(), workload.parameters)
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


def record_plan(cfg: Config, planning: Planning, rows: list[RowRun], out: RunOutput, workload: LoadedWorkload):
    """The plan a run made at its start, in its results: its floors' records, NAME-plan.md as `hetbench
    plan` writes it, and (plan.race worth) every row it does not name recorded as predicted."""
    kept = {r.strategy: r for r in out.records if isinstance(r, FloorRecord)}  # an interrupted run's
    for record in planning.floors:
        out.add(record, replacing=kept.get(record.strategy))
    measured = planning.measured(cfg, workload.parameters * 4)
    predicted = predict(cfg, measured)
    out.write_plan(plan_markdown(cfg, measured, predicted))
    if cfg.plan.race == "worth":
        record_unraced(rows, predicted, measured.alone, out, cfg.run.repeats)


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
    over the start's, moved the prediction further off than the machine did in two races of three
    (shapes-local: -25..-13% at the row's speeds, -5..+7% at the start's; hetero-local: 0..+38% and
    -5..+30%)."""
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
