"""One `hetbench run`: every strategy in the config, the gloo floor, records and tables."""

from __future__ import annotations

import logging
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from hetbench.balance import balanced, resplit_due
from hetbench.clock import cv, median, now
from hetbench.cluster.joined import wait_for_workers
from hetbench.cluster.multinode import cluster_for_run
from hetbench.cluster.place import place
from hetbench.cluster.processes import peak_rss_mb
from hetbench.cluster.ray_connection import connect, ray_kept_for_the_run
from hetbench.data import Split, cached_mnist
from hetbench.errors import RunFailed, stop_if_interrupted
from hetbench.floor import FLOOR_NAME, measure_floor
from hetbench.gradients import WIRE_DTYPES, FlatModel, count_parameters
from hetbench.progress import Progress
from hetbench.results.checkpoints import RunCheckpoints, from_saved, to_saved
from hetbench.results.records import RecordFile, environment, redacted
from hetbench.results.report import alone, markdown, write_tables
from hetbench.schedule import repeat_steps
from hetbench.standalone import measure_standalone, speeds
from hetbench.step_timing import StepTiming
from hetbench.strategies import registry
from hetbench.strategies.base import Strategy
from hetbench.strategies.registry import BASELINE
from hetbench.strategies.roles import ParameterServer, Replica
from hetbench.workload import Net, accuracy

log = logging.getLogger(__name__)


class Evaluator:
    """Test accuracy of flat weights on the driver's CPU; its time never counts as training."""

    def __init__(self, test: Split, cfg: dict) -> None:
        self.images, self.labels = test.tensors("cpu")
        self.flat = FlatModel(Net(cfg["dropout"]))
        self.quick = min(cfg["eval_samples"], len(self.labels))
        self.final = min(cfg["test_samples"] or len(self.labels), len(self.labels))

    def __call__(self, weights: torch.Tensor, full: bool = False) -> float:
        self.flat.load_params(weights)
        n = self.final if full else self.quick
        return accuracy(self.flat.model, self.images[:n], self.labels[:n])


def train_repeat(
    strategy: Strategy,
    cfg: dict,
    evaluate: Evaluator | None,
    seed: int,
    bar,
    faults=(),
    save=None,
    resume: dict | None = None,
    cluster=None,
) -> dict:
    """Warm-up and timed steps from a fresh model (or from `resume`, a checkpoint of this repeat);
    accuracy checked every eval_every steps off the clock (never, without `evaluate`);
    `save(progress)` every checkpoint_every steps."""
    strategy.reset(seed)
    progress = {"next_step": 0, "train_s": 0.0, "timed": [], "curve": [], "time_to_target_s": None}
    if resume:
        strategy.load_state(resume["state"])
        progress = {k: resume[k] for k in progress}
        bar.update(progress["next_step"], resumed=True)
    timed, curve = progress["timed"], progress["curve"]
    clock, time_to_target = progress["train_s"], progress["time_to_target_s"]
    total = cfg["warmup_steps"] + cfg["steps"]
    window: list[StepTiming] = []  # the steps since the split last changed: the speeds a re-split goes by
    for step in range(progress["next_step"], total):
        stop_if_interrupted()
        for fault in faults:
            if fault["at_step"] == step:
                inject(strategy, fault, step, cluster)
        evaluating = evaluate is not None and ((step + 1) % cfg["eval_every"] == 0 or step + 1 == total)
        saving = save and (step + 1) % cfg["checkpoint_every"] == 0 and step + 1 < total
        rebalancing = strategy.rebalances and resplit_due(cfg, step, len(window) + 1)
        last = step + 1 == total  # nothing follows it: a step started past the end would hold the next reset
        pausing = last or evaluating or saving or rebalancing or any(fault["at_step"] == step + 1 for fault in faults)
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
        if step >= cfg["warmup_steps"]:
            timed.append(timing)
        if evaluating:
            acc = evaluate(strategy.weights())
            curve.append({"step": step + 1, "train_s": clock, "accuracy": acc})
            if time_to_target is None and acc >= cfg["target_accuracy"]:
                time_to_target = clock
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
    return {
        "samples_per_s": cfg["batch_size"] * len(timed) / timed_s,
        "timed": timed,
        "curve": curve,
        "time_to_target_s": time_to_target,
        "final_accuracy": evaluate(strategy.weights(), full=True) if evaluate else None,
    }


def repeat_plan(cfg: dict, evaluate: Evaluator, r: int) -> tuple[dict, Evaluator | None]:
    """Repeat r's config and evaluator (schedule.repeat_steps)."""
    steps, evaluated = repeat_steps(cfg, r)
    return {**cfg, "steps": steps}, evaluate if evaluated else None


def inject(strategy: Strategy, fault: dict, step: int, cluster=None) -> None:
    """A configured fault, for real: a worker's process, or a whole local node's processes, end now;
    the strategy's next step finds its workers lost."""
    log.info("%s: injecting fault at step %d: kill %s '%s'", strategy.name, step, fault["kill"], fault["target"])
    if fault["kill"] == "node":
        cluster.kill_node(fault["target"])
    elif fault["kill"] == "link":
        cluster.cut_link(fault["target"])
    else:
        strategy.kill_worker(fault["target"])
    strategy.events.append({"step": step, "injected": f"kill {fault['kill']} {fault['target']}"})


def faults_for(cls: type[Strategy], cfg: dict) -> tuple[list[dict], dict]:
    """The faults this strategy gets (in its first repeat), and what the record says of them."""
    if not cfg["faults"] or not cls.distributed:
        return [], {}
    if not cls.survives_worker_loss:
        reason = f"{cls.name} does not survive a lost worker yet: faults not injected"
        log.info(reason)
        return [], {"faults_skipped": reason}
    return cfg["faults"], {}


def step_summary(timed: list[StepTiming], exchange_every: int = 1) -> dict:
    """The typical step: the median, or a round's mean where only every `exchange_every`-th step exchanges."""
    typical = median if exchange_every == 1 else statistics.fmean
    return {
        "compute_s": typical([max(t.compute_s.values()) for t in timed]),
        "comm_s": typical([t.comm_s for t in timed]),
        "wait_s": typical([t.wait_s for t in timed]),
        "total_s": typical([t.total_s for t in timed]),
        "sync_overhead_s": typical([t.sync_overhead_s for t in timed]),
        "update_s": typical([t.update_s for t in timed]),
        "exchange_every": exchange_every,
    }


def run_strategy(
    name: str,
    cfg: dict,
    evaluate: Evaluator,
    env: dict,
    standalone: dict | None = None,
    checkpoints: RunCheckpoints | None = None,
    cluster=None,
    label: str | None = None,
) -> dict:
    base = {"strategy": name, "config": redacted(cfg), "env": env, **scenario(name, cfg)}
    try:
        cls = registry.load(name)
    except ImportError as e:
        return {**base, "status": "skipped", "reason": str(e), "workers": []}
    strategy = cls(cfg)
    faults, notes = faults_for(cls, cfg)
    key = scenario_key(name, cfg)
    saved = checkpoints.load(key) if checkpoints else None
    if saved:
        notes["resumed_at"] = {"repeat": len(saved["done"]), "step": saved["progress"]["next_step"]}
    if cfg["checkpoint_every"] and not cls.resumable:
        notes["checkpoints_skipped"] = f"{name} cannot be resumed with --resume yet: no checkpoint of it is kept"
        log.info(notes["checkpoints_skipped"])
    if cfg["rebalance_every"] and cls.distributed and not cls.rebalances:
        notes["rebalance_skipped"] = f"{name} cannot re-split its batch between steps yet: rebalance_every not applied"
        log.info(notes["rebalance_skipped"])
    try:
        started = now()
        strategy.start()
        startup_s = now() - started
        plans = [repeat_plan(cfg, evaluate, r) for r in range(cfg["repeats"])]
        lengths = [c["warmup_steps"] + c["steps"] for c, _ in plans]
        repeats = [from_saved(r) for r in saved["done"]] if saved else []
        with Progress(label or name, sum(lengths), cfg["repeats"]) as bar:
            if repeats:
                bar.update(sum(lengths[: len(repeats)]), resumed=True)
            for r in range(len(repeats), cfg["repeats"]):
                bar.repeat(r)
                save = saver(checkpoints, key, repeats) if checkpoints and cls.resumable else None
                resume = from_saved(saved["progress"]) if saved and len(saved["done"]) == r else None
                repeat_cfg, repeat_eval = plans[r]
                repeats.append(
                    train_repeat(
                        strategy,
                        repeat_cfg,
                        repeat_eval,
                        cfg["seed"] + r,
                        bar,
                        faults if r == 0 else (),
                        save,
                        resume,
                        cluster,
                    )
                )
        workers = strategy.worker_info()
        extras = strategy.record_extras()
    finally:
        strategy.close()
        for fault in faults:  # a killed or cut-off node comes back for the scenarios after this one
            if fault["kill"] in ("node", "link"):
                cluster.revive(fault["target"])
    timed = [t for r in repeats for t in r["timed"]]
    for w in workers:
        mine = [t for t in timed if w["name"] in t.compute_s]  # a lost worker: the steps it was in
        if not mine:
            continue
        compute = median([t.compute_s[w["name"]] for t in mine])
        w["compute_s"] = compute
        w["samples_per_s"] = w["batch"] / median([t.total_s for t in mine])  # what it delivers in the run
        w["compute_samples_per_s"] = w["batch"] / compute  # what it could alone
    transfers, width = strategy.floor_transfers, WIRE_DTYPES[cfg["wire_dtype"]].itemsize
    model_bytes = count_parameters(Net()) * width
    for w in workers:  # what each worker's step sends and receives between machines, by value
        by_value = transfers and w.get("transport") != "shared memory"
        w["wire_bytes_per_step"] = transfers * model_bytes if by_value else 0
    evaluated = [r for r in repeats if r["final_accuracy"] is not None]
    reached = [r["time_to_target_s"] for r in evaluated if r["time_to_target_s"] is not None]
    samples_per_s = median([r["samples_per_s"] for r in repeats])
    return {
        **base,
        "status": "ok",
        "workers": workers,
        "samples_per_s": samples_per_s,
        # in float32 all-reduces of the model, as the floor times them: a narrower wire moves less
        "floor_transfers": transfers and transfers * width / torch.float32.itemsize,
        "table_note": cls.table_note or None,
        **scaling(name, workers, samples_per_s, standalone),
        "samples_per_s_cv": cv([r["samples_per_s"] for r in repeats]),
        "repeat_samples_per_s": [r["samples_per_s"] for r in repeats],
        "repeat_timed_steps": [len(r["timed"]) for r in repeats],
        "final_accuracy": median([r["final_accuracy"] for r in evaluated]),
        "time_to_target_s": median(reached) if len(reached) == len(evaluated) else None,
        "evaluated_repeats": len(evaluated),  # accuracy and time to target are theirs
        "target_accuracy": cfg["target_accuracy"],
        "startup_s": startup_s,
        "driver_peak_rss_mb": peak_rss_mb(),  # the workers' own peaks are in `workers`, where they report one
        "step": step_summary(timed, strategy.exchange_every),
        "accuracy_curve": repeats[0]["curve"],
        **notes,
        **extras,
    }


def saver(checkpoints: RunCheckpoints, key: str, done: list[dict]):
    """Saves the scenario's finished repeats and the current one's progress (model + optimizer + step)."""

    def save(progress: dict) -> None:
        checkpoints.save(key, {"done": [to_saved(r) for r in done], "progress": to_saved(progress)})

    return save


def scenario_key(name: str, cfg: dict) -> str:
    """One scenario's name in checkpoints and records: the strategy, and the balance it ran with."""
    balance = scenario(name, cfg)["balance"]
    return name if balance is None else f"{name}-{balance}"


def reference_first(cfg: dict, standalone: dict | None) -> tuple[dict, dict]:
    """The config with the reference machine's worker first, where the baseline runs (the fastest
    worker alone, measured in this run, else the first configured one), and what the record says of it."""
    workers = cfg["workers"]
    if not standalone:
        return cfg, {"worker": workers[0]["name"], "chosen_by": "first configured worker"}
    best = max(workers, key=lambda w: standalone[w["name"]])  # the first of equals
    reordered = [best, *(w for w in workers if w is not best)]
    return {**cfg, "workers": reordered}, {"worker": best["name"], "chosen_by": "fastest alone in this run"}


def scenario(name: str, cfg: dict) -> dict:
    """What distinguishes this row: the batch split (baseline: the whole batch on one device)."""
    if name == BASELINE:
        return {"balance": None, "split": [cfg["batch_size"]]}
    return {"balance": cfg["balance"][0], "split": [w["batch"] for w in cfg["workers"]]}


def scaling(name: str, workers: list[dict], samples_per_s: float, standalone: dict | None) -> dict:
    """Scaling efficiency: measured throughput over the sum of the workers' throughputs alone."""
    if name == BASELINE or not standalone:
        return {}
    for w in workers:
        w["standalone_samples_per_s"] = standalone[w["name"]]
    alone = sum(w["standalone_samples_per_s"] for w in workers)
    return {"standalone_sum_samples_per_s": alone, "scaling_efficiency": samples_per_s / alone}


def rescale(out: RecordFile, at_start: dict, at_end: dict) -> None:
    """Scaling efficiency against each worker timed alone at the start and at the end of the run (the
    median of both): the rows ran in between, so the machine's drift moves their reference with them."""
    reference = speeds(at_start, at_end)
    timings = {name: {"start": at_start[name], "end": at_end[name]} for name in at_start}
    for record in out.records:
        if "scaling_efficiency" in record:
            record.update(
                scaling(record["strategy"], record["workers"], record["samples_per_s"], reference),
                standalone_timings=timings,
            )
    out.save()
    if line := alone(out.records).strip():
        log.info(line)


def scenarios(cfg: dict) -> list[tuple[str, str | None]]:
    """(strategy, balance) in run order: each distributed strategy once per balance, the baseline once."""
    return [
        (name, None) if name == BASELINE else (name, balance)
        for name in cfg["strategies"]
        for balance in ([None] if name == BASELINE else cfg["balance"])
    ]


def wants_standalone(cfg: dict) -> bool:
    return (
        bool(cfg["standalone_steps"])
        and len(cfg["workers"]) > 1
        and any(name != BASELINE for name in cfg["strategies"])
    )


def open_ray(cfg: dict) -> float | None:
    """Ray started (or joined) once, before any row, for the whole run (ray_kept_for_the_run), with a
    process per worker and one for a coordinator, torch imported and data loaded, that the rows hand
    on to each other (cluster/ray_hosts.py): no row's startup pays for either. Its seconds; None
    where no row uses Ray."""
    if not (cfg["floor"]["enabled"] or wants_standalone(cfg) or any(via(n) == "ray" for n in cfg["strategies"])):
        return None
    started = now()
    connect(cfg)
    place(cfg, Replica, "starting the run's processes", coordinator=ParameterServer).close()
    return now() - started


def via(name: str) -> str | None:
    """The launcher a strategy's processes go through; None where it is unavailable (its row says why)."""
    try:
        return registry.load(name).via
    except ImportError:
        return None


def run_floor(cfg: dict, env: dict) -> dict:
    base = {"strategy": FLOOR_NAME, "config": redacted(cfg), "env": env, "workers": []}
    try:
        figures = measure_floor(cfg, count_parameters(Net()))
    except RunFailed as e:
        return {**base, "status": "failed", "reason": str(e)}
    return {**base, "status": "ok", **figures}


def run(cfg: dict, resumed: RecordFile | None = None, standalone: dict | None = None) -> RecordFile:
    """Run every configured strategy, then the floor; a failing strategy keeps the records before it.

    `resumed`: an interrupted run's records; what they hold is not run again.
    """
    registry.check_names(cfg["strategies"])
    env = environment()
    _, test = cached_mnist(cfg)  # bad data is refused before any file is reserved
    evaluate = Evaluator(test, cfg)
    out = resumed or RecordFile(cfg["results_dir"], cfg["name"])
    checkpoints = RunCheckpoints(cfg["results_dir"], out.path.stem) if cfg["checkpoint_every"] else None
    try:
        if checkpoints:
            checkpoints.save_run(cfg, standalone)
        with cluster_for_run(cfg) as (cluster_cfg, cluster_startup_s, cluster), ray_kept_for_the_run():
            if cluster_startup_s is not None:
                log.info("local-multinode cluster up in %.1f s", cluster_startup_s)
            cluster_cfg = wait_for_workers(cluster_cfg)
            ray_startup_s = open_ray(cluster_cfg)
            at_start = None  # each worker's timings alone at the start (a resumed run has only their medians)
            if standalone is None and wants_standalone(cluster_cfg):
                at_start = measure_standalone(cluster_cfg)
                standalone = speeds(at_start)
                if checkpoints:  # a resumed run splits as this one did
                    checkpoints.save_run(cfg, standalone)
            planned = scenarios(cluster_cfg)
            for n, (name, balance) in enumerate(planned, 1):
                scenario_cfg, reference = cluster_cfg, None
                if name == BASELINE:
                    scenario_cfg, reference = reference_first(cluster_cfg, standalone)
                elif balance is not None:
                    scenario_cfg = balanced(cluster_cfg, balance, standalone)
                label = name if balance is None else f"{name} [{balance}]"
                if recorded(out.records, name, scenario_cfg):
                    log.info("%s: recorded before the run was interrupted, not run again", label)
                    continue
                log.debug("running %s", label)
                try:
                    where = f"[{n}/{len(planned)}] {label}"  # the progress line's
                    record = run_strategy(name, scenario_cfg, evaluate, env, standalone, checkpoints, cluster, where)
                except RunFailed as e:  # keep what failed in the records too, then end the run
                    out.add(
                        {
                            "strategy": name,
                            "status": "failed",
                            "reason": str(e),
                            "workers": [],
                            "config": redacted(scenario_cfg),
                            "env": env,
                            **scenario(name, scenario_cfg),
                        }
                    )
                    raise
                record["cluster_startup_s"] = cluster_startup_s
                record["ray_startup_s"] = ray_startup_s  # once for the run, before every row: no row's startup
                if reference:
                    record["reference"] = reference
                out.add(record)
                if checkpoints:  # recorded: its checkpoint is no longer needed
                    checkpoints.remove(scenario_key(name, scenario_cfg))
                if record["status"] == "skipped":
                    log.info("skipped %s: %s", label, record["reason"])
            if at_start:
                rescale(out, at_start, measure_standalone(cluster_cfg))
            if cfg["floor"]["enabled"] and not recorded(out.records, FLOOR_NAME, cfg):
                out.add(run_floor(reference_first(cluster_cfg, standalone)[0], env))  # from the reference's node
    finally:
        if out.records:
            write_tables(out.records, cfg["results_dir"], cfg["name"])
        else:
            out.discard()  # refused before any record (e.g. an unreachable cluster): no empty file left
    print(markdown(out.records))
    return out


def recorded(records: list[dict], name: str, cfg: dict) -> bool:
    """Whether this scenario's record is already in the run (a resumed run skips it)."""
    balance = None if name == FLOOR_NAME else scenario(name, cfg)["balance"]
    return any(r["strategy"] == name and r.get("balance") == balance for r in records)


def resume_run(run_id: str, results_dir: str) -> RecordFile:
    """`hetbench run --resume RUN`: RUN is a record file (results/raw/RUN.json) or its name."""
    path = Path(run_id)
    if path.suffix == ".json":
        results_dir, run_id = str(path.parent.parent), path.stem
    cfg, standalone = RunCheckpoints(results_dir, run_id).load_run()
    cfg["results_dir"] = results_dir
    log.info("resuming run %s", run_id)
    return run(cfg, RecordFile.reopen(Path(results_dir) / "raw" / f"{run_id}.json"), standalone)
