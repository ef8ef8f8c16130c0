"""A row's record from its repeats: medians and spread, the typical step, each worker's figures,
scaling efficiency against the workers timed alone."""

from __future__ import annotations

import statistics
from dataclasses import replace

from hetbench.clock import cv, median
from hetbench.cluster.processes import peak_rss_mb
from hetbench.gradients import WIRE_DTYPES
from hetbench.metric import ACCURACY, Metric
from hetbench.results.record import AloneTimings, Env, Planned, RowRecord, Settings, Step, Worker
from hetbench.results.records import redacted
from hetbench.standalone import speeds
from hetbench.step_rate import in_float32
from hetbench.step_timing import StepTiming
from hetbench.strategies.base import Strategy
from hetbench.strategies.registry import BASELINE
from hetbench.training import CurvePoint, Repeat
from hetbench.workload import WorkloadFacts


def base_row(name: str, config: dict, fields: dict, env: dict, workload: WorkloadFacts) -> RowRecord:
    """What every row's record starts with, whatever became of it: the row's config as records keep it
    (Config.as_dict), the workload it trains, and `fields`, what tells the row apart (Scenario.fields:
    balance, split)."""
    settings = Settings.from_json(redacted(config))
    return RowRecord(strategy=name, config=settings, env=Env.from_json(env), workload=workload, **fields)


def failed_row(base: RowRecord, reason: str) -> RowRecord:
    return replace(base, status="failed", reason=reason)


def predicted_row(base: RowRecord, batches: dict[str, int], verdict: str, planned: Planned) -> RowRecord:
    """A row the run did not race (plan.race worth): the split the plan predicted it at (worker name
    -> batch), its words, its prediction."""
    workers = [Worker(name=name, batch=batch) for name, batch in batches.items()]
    split = list(batches.values())
    return replace(base, status="predicted", reason=verdict, split=split, workers=workers, plan=planned)


def strategy_row(
    base: RowRecord,
    strategy: Strategy,
    workers: list[dict],
    repeats: list[Repeat],
    startups: list[float],
    standalone: dict | None,
    extras: dict,
    events: list[dict],
) -> RowRecord:
    """The record of a row's repeats so far: `workers` as its strategy reported them before it closed
    after the last (its attributes are still read); `startups`, the strategy's start before each;
    `extras`, its own figures and the row's notes; `events`, what happened in them."""
    metric = base.metric
    target = metric.target(base.config)
    timed = [t for r in repeats for t in r.timed]
    measured = worker_figures(workers, timed, strategy.floor_transfers, strategy.wire_dtype, base.workload.parameters)
    evaluated = [r for r in repeats if r.final_accuracy is not None]
    reached = [r.time_to_target_s for r in evaluated if r.time_to_target_s is not None]
    steps = [steps_to_target(r.curve, target, metric) for r in evaluated]
    samples_per_s = median([r.samples_per_s for r in repeats])
    transfers, width = strategy.floor_transfers, WIRE_DTYPES[strategy.wire_dtype].itemsize
    return replace(
        base,
        status="ok",
        workers=measured,
        samples_per_s=samples_per_s,
        # in float32 all-reduces of the model, as the floor times them: a narrower wire moves less
        floor_transfers=transfers and in_float32(transfers, width),
        floor=strategy.floor_name,  # the floor its sync overhead is judged against
        table_note=strategy.table_note or None,
        **scaling(strategy.name, measured, samples_per_s, standalone),
        samples_per_s_cv=cv([r.samples_per_s for r in repeats]),
        repeat_samples_per_s=[r.samples_per_s for r in repeats],
        repeat_timed_steps=[len(r.timed) for r in repeats],
        final_accuracy=median([r.final_accuracy for r in evaluated]),
        time_to_target_s=median(reached) if len(reached) == len(evaluated) else None,
        repeat_time_to_target_s=[r.time_to_target_s for r in evaluated],  # its spread: verdict.uncertainty
        # per evaluated repeat, the training seconds between the check before the target and the one
        # that reached it: the crossing lies somewhere inside (verdict.uncertainty)
        repeat_target_bracket_s=[target_bracket_s(r.curve, target, metric) for r in evaluated],
        # the same in steps, at the curve's resolution: a synchronous step is one single-device step
        # on the union batch, so steps should match the baseline's in expectation
        steps_to_target=median(steps) if None not in steps else None,
        repeat_steps_to_target=steps,
        evaluated_repeats=len(evaluated),  # accuracy and time to target are theirs
        target_accuracy=target,
        startup_s=median(startups),
        repeat_startup_s=list(startups),
        driver_peak_rss_mb=peak_rss_mb(),  # the workers' own peaks are in `workers`, where they report one
        step=step_summary(timed, strategy.exchange_every),
        accuracy_curve=tuple(repeats[0].curve),
        events=list(events),
        extras=extras,
    )


def worker_figures(
    workers: list[dict], timed: list[StepTiming], transfers: float | None, wire_dtype: str, parameters: int
) -> tuple[Worker, ...]:
    """Each worker as reported, with its compute, what it delivers in the run and could alone, and
    its bytes on the wire (`parameters`: the workload model's)."""
    model_bytes = parameters * WIRE_DTYPES[wire_dtype].itemsize
    out = []
    for w in map(Worker.from_json, workers):
        by_value = transfers and w.transport != "shared memory"
        # what each worker's step sends and receives between machines, by value
        w = replace(w, wire_bytes_per_step=transfers * model_bytes if by_value else 0)
        # a lost worker: the steps it was in; with no barrier (ray-ps-async), those it finished a
        # batch in: over a slow link a slow worker may finish none in most steps (its compute 0 there)
        mine = [t for t in timed if t.compute_s.get(w.name, 0.0) > 0]
        if mine:
            compute = median([t.compute_s[w.name] for t in mine])
            w = replace(
                w,
                compute_s=compute,
                samples_per_s=w.batch / median([t.total_s for t in mine]),  # what it delivers in the run
                compute_samples_per_s=w.batch / compute,  # what it could alone
            )
        out.append(w)
    return tuple(out)


def step_summary(timed: list[StepTiming], exchange_every: int = 1) -> Step:
    """The typical step: the median, or a round's mean where only every `exchange_every`-th step exchanges."""
    typical = median if exchange_every == 1 else statistics.fmean
    return Step(
        compute_s=typical([max(t.compute_s.values()) for t in timed]),
        comm_s=typical([t.comm_s for t in timed]),
        wait_s=typical([t.wait_s for t in timed]),
        total_s=typical([t.total_s for t in timed]),
        sync_overhead_s=typical([t.sync_overhead_s for t in timed]),
        update_s=typical([t.update_s for t in timed]),
        optimizer_s=typical([t.optimizer_s for t in timed]),
        exchange_every=exchange_every,
    )


def steps_to_target(curve: list[CurvePoint], target: float, metric: Metric = ACCURACY) -> int | None:
    """The first evaluated step whose test metric reached `target`; None if none did."""
    return next((point.step for point in curve if metric.reached(point.accuracy, target)), None)


def target_bracket_s(curve: list[CurvePoint], target: float, metric: Metric = ACCURACY) -> float | None:
    """The training seconds from the last check short of `target` (or the start) to the first that
    reached it; None if none reached it."""
    before = 0.0
    for point in curve:
        if metric.reached(point.accuracy, target):
            return point.train_s - before
        before = point.train_s
    return None


def scaling(name: str, workers: tuple[Worker, ...], samples_per_s: float, standalone: dict | None) -> dict:
    """Scaling efficiency: measured throughput over the sum of the workers' throughputs alone; the
    workers with their own figure alone. The fields a record takes (none for the baseline)."""
    if name == BASELINE or not standalone:
        return {}
    workers = tuple(replace(w, standalone_samples_per_s=standalone[w.name]) for w in workers)
    alone_sum = sum(w.standalone_samples_per_s for w in workers)
    return {
        "workers": workers,
        "standalone_sum_samples_per_s": alone_sum,
        "scaling_efficiency": samples_per_s / alone_sum,
    }


def bracketed(record: RowRecord, before: dict, after: dict) -> RowRecord:
    """A new record: `record` with its scaling efficiency against each worker timed alone just before
    and just after the row (the median of both: standalone.Brackets), so the machine's drift moves
    the reference with the row; the row's own record (strategy_row) computed none."""
    return replace(
        record,
        **scaling(record.strategy, record.workers, record.samples_per_s, speeds(before, after)),
        standalone_timings={name: AloneTimings(before[name], after[name]) for name in before},
    )
