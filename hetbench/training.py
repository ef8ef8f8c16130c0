"""The training loop every row runs, and its Schedule: which steps a repeat trains, and which of them
are timed, evaluated, checkpointed and re-split. ray-train's ranks run their own loop, on the
same Schedule."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from hetbench.clock import now
from hetbench.config import Fault, RunConfig
from hetbench.data import Split
from hetbench.errors import stop_if_interrupted
from hetbench.gradients import FlatModel
from hetbench.metric import ACCURACY, Metric
from hetbench.step_timing import StepTiming
from hetbench.workload import LoadedWorkload, batch_norms, recompute_batch_norm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Schedule:
    warmup_steps: int  # untimed steps first (they still train)
    steps: int  # timed steps of an evaluated repeat
    speed_steps: int  # timed steps of the repeats after the evaluated ones, unevaluated; 0 = all evaluated
    evaluated_repeats: int  # with speed_steps: how many repeats, first, check the test metric
    eval_every: int  # the test metric every N steps
    fine_eval_every: int  # near the target, until it is reached: every N steps; 0 = eval_every throughout
    fine_within: float  # how near is near (Metric.near: fine_eval_within)
    target: float  # the metric's target: once reached, checks go back to eval_every
    checkpoint_every: int  # a checkpoint every N steps; 0 = none
    rebalance_every: int  # a new split by the workers' speeds every N steps; 0 = never
    auto_balance: bool  # the split came from speeds measured alone: corrected once, at warm-up's end
    metric: Metric = ACCURACY  # the workload's: which way the target is

    @classmethod
    def of(cls, run: RunConfig, metric: Metric = ACCURACY) -> Schedule:
        return cls(
            warmup_steps=run.warmup_steps,
            steps=run.steps,
            speed_steps=run.speed_steps,
            evaluated_repeats=run.evaluated_repeats,
            eval_every=run.eval_every,
            fine_eval_every=run.fine_eval_every,
            fine_within=run.fine_eval_within,
            target=metric.target(run),
            checkpoint_every=run.checkpoint_every,
            rebalance_every=run.rebalance_every,
            auto_balance=run.balance == ("auto",),
            metric=metric,
        )

    def evaluated(self, repeat: int) -> bool:
        """Every repeat's metric is checked; with speed_steps the first `evaluated_repeats` only
        (samples/s needs none; the time to target's spread needs several)."""
        return repeat < self.evaluated_repeats or not self.speed_steps

    def total(self, repeat: int) -> int:
        return self.warmup_steps + (self.steps if self.evaluated(repeat) else self.speed_steps)

    def timed(self, step: int) -> bool:
        return step >= self.warmup_steps

    def evaluates(self, repeat: int, step: int, near: bool = False) -> bool:
        """After `step`: every eval_every steps, and at the end, of an evaluated repeat; `near` the
        target (Schedule.near), every fine_eval_every steps as well."""
        if not self.evaluated(repeat):
            return False
        every = [self.eval_every] + ([self.fine_eval_every] if near and self.fine_eval_every else [])
        return any((step + 1) % n == 0 for n in every) or step + 1 == self.total(repeat)

    def near(self, curve: list[CurvePoint]) -> bool:
        """Whether the checks go fine after this curve: its last figure is within reach of the target,
        which no check of the repeat has reached yet. The time to target is known to the interval
        between two checks: fine checks where it is crossed make that interval a step or two."""
        if not (self.fine_eval_every and curve):
            return False
        reached = any(self.metric.reached(point.accuracy, self.target) for point in curve)
        return not reached and self.metric.near(curve[-1].accuracy, self.target, self.fine_within)

    def due(self, every: int, repeat: int, step: int) -> bool:
        """After `step`, every `every` steps, unless the repeat ends there (its end is recorded anyway)."""
        return bool(every) and (step + 1) % every == 0 and step + 1 < self.total(repeat)

    def checkpoints(self, repeat: int, step: int) -> bool:
        return self.due(self.checkpoint_every, repeat, step)

    def resplits(self, step: int, window_steps: int) -> bool:
        """Whether the split is re-derived after `step`, `window_steps` steps since it last changed
        (this one included): every rebalance_every steps, and for `auto` once at the end of warm-up.
        auto's first split comes from each worker timed alone; in the run the workers share the
        machine (and pay per-step costs) as they did not alone, and the warm-up steps show it."""
        if 0 < self.rebalance_every <= window_steps:
            return True
        return self.auto_balance and step == self.warmup_steps - 1


class Evaluator:
    """The workload's test metric of flat weights on the driver's CPU; its time never counts as training."""

    def __init__(self, workload: LoadedWorkload, run: RunConfig) -> None:
        test: Split = workload.test_split()
        inputs, self.labels = test.tensors("cpu")
        self.inputs = workload.prepare(inputs)  # once: every evaluation reads them
        self.flat = FlatModel(workload.build_model(0))  # evaluated in eval mode: dropout plays no part
        self.metric, self.score = workload.metric, workload.score
        self.quick = min(run.eval_samples, len(self.labels))
        self.final = min(run.test_samples or len(self.labels), len(self.labels))
        self.batch = run.batch_size
        self.norm_inputs = None  # with batch norm: the training samples its statistics are recomputed over
        if batch_norms(self.flat.model):
            stored, _ = workload.train_split().tensors("cpu")
            self.norm_inputs = workload.prepare(stored[: run.batch_norm_samples])

    def __call__(self, weights: torch.Tensor, full: bool = False) -> float:
        self.flat.load_params(weights)
        if self.norm_inputs is not None:
            recompute_batch_norm(self.flat.model, self.norm_inputs, self.batch)
        n = self.final if full else self.quick
        return self.metric.measure(self.flat.model, self.inputs[:n], self.labels[:n], self.score)


@dataclass(frozen=True)
class CurvePoint:
    """One accuracy check of a repeat."""

    step: int  # the steps trained before it
    train_s: float  # the training clock then, evaluation excluded
    accuracy: float  # the test metric on the quick check's samples: accuracy, or the test loss (Metric)
    lr: float | None = None  # the learning rate the next update takes (Strategy.learning_rate); None: not said


@dataclass(frozen=True)
class Repeat:
    """One repeat's results (train_repeat): what a row's record is computed from (results/rows.py)."""

    samples_per_s: float  # over its timed steps
    timed: list[StepTiming]
    curve: list[CurvePoint]
    time_to_target_s: float | None  # the training clock at the first check at or above the target
    final_accuracy: float | None  # the metric on the whole test set; None where the repeat is not evaluated


def train_repeat(
    strategy,
    schedule: Schedule,
    *,
    repeat: int,
    evaluate: Evaluator | None,
    bar,
    seed: int,
    samples_per_step: int,
    faults=(),
    save=None,
    resume: dict | None = None,
    cluster=None,
) -> Repeat:
    """One repeat of a started strategy (strategies/base.py): warm-up and timed steps from a fresh
    model (or from `resume`, a checkpoint of this repeat); accuracy checked off the clock where the
    schedule says (never, without `evaluate`); `save(progress)` at its checkpoints; `faults`
    injected at their steps."""
    strategy.reset(seed)
    progress = {"next_step": 0, "train_s": 0.0, "timed": [], "curve": [], "time_to_target_s": None}
    if resume:
        progress = {k: resume[k] for k in progress}
        strategy.near_target = schedule.near(progress["curve"])  # as where it stopped, for ranks that read it
        strategy.load_state(resume["state"])
        bar.update(progress["next_step"], resumed=True)
    timed, curve = progress["timed"], progress["curve"]
    clock, time_to_target = progress["train_s"], progress["time_to_target_s"]
    total = schedule.total(repeat)
    window: list[StepTiming] = []  # the steps since the split last changed: the speeds a re-split goes by
    for step in range(progress["next_step"], total):
        stop_if_interrupted()
        for fault in faults:
            if fault.at_step == step:
                inject(strategy, fault, step, cluster)
        evaluating = evaluate is not None and schedule.evaluates(repeat, step, schedule.near(curve))
        saving = save is not None and schedule.checkpoints(repeat, step)
        rebalancing = strategy.rebalances and schedule.resplits(step, len(window) + 1)
        last = step + 1 == total  # nothing follows it: a step started past the end would hold the next reset
        pausing = last or evaluating or saving or rebalancing or any(fault.at_step == step + 1 for fault in faults)
        seen = len(strategy.events)
        timing = strategy.step(step, None if pausing else step + 1)
        disruptions = [event for event in strategy.events[seen:] if "rebalanced" not in event]
        for event in disruptions:  # what a loss or restart cost: the whole step it happened in
            event["step_s"] = timing.total_s
        window = [] if disruptions else [*window, timing]  # a loss re-split it
        if rebalancing and window:
            started = now()
            strategy.rebalance(step, window)
            # telling the workers their new batches is training time: it counts in this step
            spent = now() - started
            timing = replace(timing, comm_s=timing.comm_s + spent, total_s=timing.total_s + spent)
            window = []
        clock += timing.total_s  # the training clock: warm-up steps train too, so they count here
        if schedule.timed(step):
            timed.append(timing)
        if evaluating:
            acc = evaluate(strategy.weights())
            curve.append(CurvePoint(step + 1, clock, acc, strategy.learning_rate()))
            if time_to_target is None and schedule.metric.reached(acc, schedule.target):
                time_to_target = clock
            strategy.near_target = schedule.near(curve)  # for ranks that run the schedule themselves
        if saving:
            save(
                {
                    "next_step": step + 1,
                    "train_s": clock,
                    "timed": timed,
                    "curve": curve,
                    "time_to_target_s": time_to_target,
                    "state": strategy.state(),
                }
            )
        bar.update(1)
    timed_s = sum(t.total_s for t in timed)
    evaluated = evaluate is not None and schedule.evaluated(repeat)
    return Repeat(
        samples_per_s=samples_per_step * len(timed) / timed_s,
        timed=timed,
        curve=curve,
        time_to_target_s=time_to_target,
        final_accuracy=evaluate(strategy.weights(), full=True) if evaluated else None,
    )


def inject(strategy, fault: Fault, step: int, cluster=None) -> None:
    """A configured fault, for real: a worker's process, or a whole local node's processes, end now;
    the strategy's next step finds its workers lost."""
    log.info("%s: injecting fault at step %d: kill %s '%s'", strategy.name, step, fault.kill, fault.target)
    if fault.kill == "node":
        cluster.kill_node(fault.target)
    elif fault.kill == "link":
        cluster.cut_link(fault.target)
    else:
        strategy.kill_worker(fault.target)
    strategy.events.append({"step": step, "injected": f"kill {fault.kill} {fault.target}"})
