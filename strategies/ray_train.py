"""Ray Train: torch-ddp's ranks (DDPRank: DDP with our weighted comm hook), started, watched and
restarted by a TorchTrainer, one rank per configured worker. (It was `ray-train-gloo` until its
group could be hetbench's TCP one, between Linux and macOS: configs may still say that.)

What a Ray Train user writes: the trainer forms the process group (gloo, or hetbench's TCP group
across operating systems: cluster/collective.py) and runs the loop in each rank; the
model goes into DistributedDataParallel (as `ray.train.torch.prepare_model` does). (1)-(3) are
torch-ddp's, in DDPRank.train_step: each rank computes on its own slice, DDP all-reduces each
gradient bucket pre-scaled by the rank's batch share b_i/B, every rank takes the same optimizer
step. What differs is who runs the loop: the ranks run the runner's Schedule on their own, and
send their per-step timings (and rank 0 its weights at evaluation steps) to a small collector
actor that the driver reads step by step; (4) they re-split among themselves.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass

import ray
import torch

from hetbench.balance import resplit_event, speed_split
from hetbench.clock import now
from hetbench.cluster import collective
from hetbench.cluster.placed import workers_per_host
from hetbench.cluster.processes import peak_rss_mb
from hetbench.cluster.ray_connection import connect, on_driver_node
from hetbench.config import Job, WorkerConfig, setting
from hetbench.errors import RunFailed, quiet_loggers
from hetbench.gradients import from_buffer
from hetbench.step_timing import StepTiming
from hetbench.strategies.base import Strategy
from hetbench.strategies.ray_train_collector import CollectorActor
from hetbench.strategies.torch_ddp import DDPRank
from hetbench.training import Schedule
from hetbench.workload import check_same_workload

log = logging.getLogger(__name__)


@ray.remote(num_cpus=0)
def kill_process(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def gathered_split(job: Job, rank: DDPRank, window: list[float]) -> list[int] | None:
    """(4) rebalance_every: every rank gathers every rank's computes over the window and derives
    the same new split from them (or None: keep it), so no driver round trip is needed."""
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (rank.rank, window))
    return speed_split(job.run.batch_size, rank.batches, [computes for _, computes in sorted(gathered)])


def assign_ranks(workers: tuple[WorkerConfig, ...], labels_by_rank: list[set]) -> list[int]:
    """Configured worker per rank: the first free one labelled for the rank's node, else the first
    free unlabelled one, else the first free one. Every rank computes the same list."""
    free, chosen = list(range(len(workers))), []
    for labels in labels_by_rank:
        pick = next((i for i in free if workers[i].node in labels), None)
        if pick is None:
            pick = next((i for i in free if not workers[i].node), free[0])
        free.remove(pick)
        chosen.append(pick)
    return chosen


def node_labels() -> list[str]:
    """The custom resources (placement labels among them) of the node this process runs on."""
    node = ray.get_runtime_context().get_node_id()
    return sorted(next((n["Resources"] for n in ray.nodes() if n["NodeID"] == node), {}))


def train_loop(config: dict) -> None:
    import ray.train
    import torch.distributed as dist

    job, collector, joined = config["job"], config["collector"], config["joined"]
    world_rank = ray.train.get_context().get_world_rank()
    labels_by_rank = [None] * dist.get_world_size()
    dist.all_gather_object(labels_by_rank, node_labels())
    index = assign_ranks(job.workers, [set(labels) for labels in labels_by_rank])[world_rank]
    rank = DDPRank()  # this rank's worker: device resolved here, on its own node; the group is Ray Train's
    info = rank.setup(job, index, workers_per_host(job.cluster, job.workers, job.workers[index], joined))
    here = {"rank": world_rank, "node_id": ray.get_runtime_context().get_node_id()}
    joined_as = {"gloo_interface": os.environ.get("GLOO_SOCKET_IFNAME"), "collective": collective.formed}
    collector.record.remote(("ready",), world_rank, {**info, **here, **joined_as})
    # Ray Train restarts the whole group after a lost rank: every start begins where the driver is,
    # from the latest state rank 0 kept (every checkpoint_every steps, else eval_every, when faults
    # are configured or checkpoints asked for; otherwise from the repeat's start)
    begun = ray.get(collector.begin.remote(world_rank, job.cluster.step_timeout_s))
    if begun is None:  # the driver stopped before it named a repeat
        return
    repeat, first_step, state, near = begun
    schedule, every = Schedule.of(job.run, rank.workload.metric), job.run.checkpoint_every or job.run.eval_every
    keep_state = world_rank == 0 and bool(job.run.faults or job.run.checkpoint_every)
    while repeat is not None:
        rank.reset(job.run.seed + repeat)
        if state is not None:
            rank.load_state(state)
        window: list[float] = []  # my computes since the split last changed
        for step in range(first_step, schedule.total(repeat)):
            start = time.perf_counter()  # the device is idle: the last train_step read its stopwatch
            # (1)-(3) as torch-ddp's ranks: my own work is my compute and update, as on one device
            own_s, _ = rank.train_step(step)
            window.append(own_s)
            split = None
            if schedule.resplits(step, len(window)):  # (4) a new split by the speeds in the run
                split, window = gathered_split(job, rank, window), []
                if split is not None:
                    rank.resplit(split, index)
            step_s = time.perf_counter() - start
            evaluated = schedule.evaluates(repeat, step, near)
            # the driver makes the step's timing of them (StepTiming.synchronous), as for torch-ddp
            timing = {"compute_s": own_s, "total_s": step_s, "peak_rss_mb": peak_rss_mb()}
            if world_rank == 0:
                timing["lr"] = rank.learning_rate()  # the rate the next update takes: the curve's
                if split is not None:
                    timing["split"] = {w.name: b for w, b in zip(job.workers, split)}
            weights = rank.weights().numpy() if evaluated and world_rank == 0 else None
            collector.record.remote((repeat, step), world_rank, timing, weights)
            # the driver evaluates between steps, as for every strategy: wait, off the clock, so
            # its evaluation never competes with training for the cores
            if keep_state and schedule.due(every, repeat, step):
                collector.save_state.remote(repeat, step + 1, rank.state())
            if evaluated:
                stop, near = ray.get(collector.hold.remote((repeat, step), job.cluster.step_timeout_s))
                if stop:
                    return
        # the driver's next repeat, if it goes on to one in this start (the runner's rows train one)
        repeat = ray.get(collector.next_repeat.remote(repeat, job.cluster.step_timeout_s))
        first_step, state, near = 0, None, False
    dist.barrier()


@dataclass(frozen=True)
class TrainOptions:
    max_failures: int = setting(1, "Ray Train restarts its group after a lost rank this often")


class RayTrain(Strategy):
    name = "ray-train"
    options = TrainOptions
    table_note = "ray-train: one all-reduce per step, so its link prediction counts one floor transfer."
    floor_transfers = 1.0
    overlap = "buckets"  # torch-ddp's ranks: DDP's
    survives_worker_loss = True  # by Ray Train's own failure handling: the group restarts from a state
    resumable = True  # from the state rank 0 keeps at every checkpoint step (Collector.state_at)
    # 0.35 of a core on the stand-in's box in its rows, against 0.18 in other rows (4a78ec6's probe)
    beside_workers = "Ray Train's controller and helper actors"
    rebalances = True  # in the ranks' own loop (gathered_split), at the steps the runner would

    def __init__(self, job: Job) -> None:
        super().__init__(job)
        self.timeout_s = job.cluster.step_timeout_s
        self.cluster = None  # the Ray connection, the collector actor, Ray Train's storage and its fit thread
        self.collector = None
        self.storage: str | None = None
        self.fit: threading.Thread | None = None
        self.held: tuple | None = None  # the (repeat, step) the ranks wait at, until the driver evaluated
        self.snapshot = None  # the weights rank 0 sent with the latest step: at the steps it checks, else None
        self.lr: float | None = None  # the learning rate rank 0 said with the latest step
        self.failure: BaseException | None = None  # what ended Ray Train's fit, for the next wait to report
        self.starts = 0  # how often Ray Train started the group (a restart after a lost rank adds one)
        self.repeat = 0  # the repeat the ranks run now
        self.last_step = -1  # the driver's latest step of it

    def start(self) -> None:
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from hetbench.strategies.ray_train_backend import CollectiveTorchConfig

        quiet_loggers("ray.train", "ray.util.state", "ray.data")  # PlacementGroupCleaner / State API chatter
        workers = self.job.workers
        self.cluster = connect(self.job.cluster, self.job.workers)
        self.collector = CollectorActor.options(**on_driver_node()).remote(len(workers))
        self.storage = tempfile.mkdtemp(prefix="hetbench-train-")
        joined = bool(self.job.cluster.ray_address)
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"job": self.job, "collector": self.collector, "joined": joined},
            torch_config=CollectiveTorchConfig(
                timeout_s=int(self.timeout_s),
                collective=self.job.cluster.collective,
                joined=joined,
                connect_timeout_s=self.job.cluster.connect_timeout_s,
            ),
            scaling_config=ScalingConfig(
                num_workers=len(workers),
                use_gpu=False,
                resources_per_worker={"CPU": 0.01},
                placement_strategy="SPREAD" if joined else "PACK",
            ),
            run_config=RunConfig(
                name=f"hetbench-{uuid.uuid4().hex[:12]}",
                storage_path=self.storage,
                failure_config=FailureConfig(max_failures=self.settings.max_failures),
            ),
        )
        self.fit = threading.Thread(target=self._fit, args=(trainer,), daemon=True)
        self.fit.start()
        self.starts = 1
        self._read_ready()

    def _read_ready(self) -> None:
        ready = self._wait(("ready",))[0]
        self.info = [ready[r] for r in sorted(ready)]
        # the ranks load their workload and data on their own nodes, as placed workers do
        check_same_workload(self.info)

    def _fit(self, trainer) -> None:
        try:
            trainer.fit()
        except BaseException as e:  # reported by the next wait
            self.failure = e

    def _wait(self, key: tuple):
        waited = 0.0
        while waited < self.timeout_s:
            got = ray.get(self.collector.wait.remote(key, 2.0))
            if got is not None:
                return got
            if not self.fit.is_alive():
                reason = str(self.failure).strip().splitlines()[-1] if self.failure else "training ended early"
                raise RunFailed(f"{self.name}: the training group stopped at {key}: {reason}")
            waited += 2.0
        hint = (
            "; the group never formed: can each node reach the other's 6390-6399 and ephemeral ports? "
            "(docs/deployment.md: Ports)"
        )
        why = hint if key == ("ready",) else ""
        raise RunFailed(f"{self.name}: no step finished within {self.timeout_s:g} s at {key}{why}")

    def reset(self, seed: int) -> None:
        self._release()
        self.repeat = seed - self.job.run.seed  # the ranks run the same repeats, seeded alike
        self.snapshot, self.last_step = None, -1

    def _release(self) -> None:
        """Let the ranks go on past the last evaluation step: the driver has evaluated by now."""
        if self.held is not None:
            self.collector.release.remote(self.held, self.near_target)
            self.held = None

    def step(self, step: int, then: int | None = None) -> StepTiming:
        started = now()
        self._release()
        timings, snapshot, starts, resumed_from = self._wait((self.repeat, step))
        self.snapshot, self.last_step, self.lr = snapshot, step, timings[0].get("lr")
        if snapshot is not None:
            self.held = (self.repeat, step)
        total = max(t["total_s"] for t in timings.values())
        if starts > self.starts:  # Ray Train restarted the group during this step: it costs the step
            self.starts, total = starts, now() - started
            self._read_ready()
            self.events.append({"step": step, "restarted_from_step": resumed_from, "restarts": starts - 1})
            log.info("%s: Ray Train restarted the group; it went on from step %s", self.name, resumed_from)
        split = next((t["split"] for t in timings.values() if "split" in t), None)
        if split is not None:  # the ranks re-split themselves after this step (gathered_split)
            self.events.append(resplit_event(self.job.run.warmup_steps, step, split))
            for info in self.info:
                info["batch"] = split[info["name"]]
        compute_s = {self.info[r]["name"]: t["compute_s"] for r, t in timings.items()}
        for r, t in timings.items():
            self.info[r]["peak_rss_mb"] = t["peak_rss_mb"]
        return StepTiming.synchronous(compute_s, total)

    def rebalance(self, step: int, timings: list[StepTiming]) -> None:
        """Nothing to do here: the ranks re-split themselves after the same step (train_loop)."""

    def kill_worker(self, name: str) -> None:
        """End the rank's process on its own node (the Ray Train worker actor), as a lost machine would."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        info = next(i for i in self.info if i["name"] == name)
        where = NodeAffinitySchedulingStrategy(info["node_id"], soft=False)
        ray.get(kill_process.options(scheduling_strategy=where).remote(info["pid"]), timeout=self.timeout_s)

    def state(self) -> dict:
        """Rank 0's model and optimizer after the driver's latest step (it keeps one at every
        checkpoint step, whichever step the ranks have run ahead to)."""
        next_step = self.last_step + 1
        kept = ray.get(self.collector.state_at.remote(self.repeat, next_step, self.timeout_s))
        if kept is None:
            raise RunFailed(
                f"{self.name}: rank 0 kept no state after step {self.last_step} within {self.timeout_s:g} s"
            )
        return {"next_step": next_step, "rank": kept}

    def load_state(self, state: dict) -> None:
        """The ranks begin this repeat from `state` (they begin once the driver waits for its step)."""
        ray.get(
            self.collector.resume_from.remote(self.repeat, state["next_step"], state["rank"], self.near_target),
            timeout=self.timeout_s,
        )

    def weights(self) -> torch.Tensor:
        if self.snapshot is None:  # the ranks' Schedule and the runner's went apart: no stale weights
            raise RunFailed(f"{self.name}: rank 0 sent no weights with the step the runner checks")
        return from_buffer(self.snapshot)

    def learning_rate(self) -> float | None:
        return self.lr

    def worker_info(self) -> list[dict]:
        return [dict(i) for i in self.info]

    def close(self) -> None:
        collector, fit = self.collector, self.fit
        if collector is not None:
            try:
                ray.get(collector.request_stop.remote(), timeout=5)
            except Exception:  # the cluster may be gone already
                pass
        if fit is not None:
            fit.join(timeout=30)
        if self.cluster:
            if fit is not None and fit.is_alive():  # a group that would not stop: Ray goes with it
                self.cluster.close()
            elif self.cluster.kept and collector is not None:  # the run's Ray stays up: the collector must not
                ray.kill(collector, no_restart=True)
            self.cluster.release()
        if self.storage:
            shutil.rmtree(self.storage, ignore_errors=True)
