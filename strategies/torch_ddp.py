"""Plain PyTorch DistributedDataParallel: single.py's loop, one rank per configured worker.

What a user would write instead of Ray: the ranks are processes placed like any worker's
(cluster/placed.py: one on each labelled node), and from then on gradients go rank to rank in
DDP's own group: gloo, or hetbench's TCP group between operating systems (cluster/collective.py).
Nothing but "take a step" and the step's timings passes through the driver.

Differs from single.py in (1)-(3): (1) each rank computes on its own slice of the global batch;
(2) DDP all-reduces the gradient bucket by bucket while backward still runs, through our comm hook:
each bucket is pre-scaled by the rank's batch share b_i/B and summed, so every rank holds the
sample-weighted mean (DDP's own average would weight a 40-sample slice like a 24-sample one);
(3) every rank takes the same optimizer step.

With `compression: powersgd` the bucket goes through torch's own PowerSGD hook instead, pre-scaled
the same way: low-rank factors of each gradient matrix, with the hook's error feedback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
from torch.nn.parallel import DistributedDataParallel

from hetbench.cluster.collective import Joined, join_group, rendezvous
from hetbench.cluster.place import place
from hetbench.config import Job, setting
from hetbench.devices import gloo_takes
from hetbench.errors import UserError
from hetbench.gradients import WIRE_DTYPES, batch_shares, powersgd_fraction, weighted_allreduce, weighted_powersgd
from hetbench.step_timing import StepTiming
from hetbench.strategies.base import Strategy
from hetbench.strategies.replica import Replica
from hetbench.strategies.single import OneDevice
from hetbench.workload import load_workload

NAME = "torch-ddp"


class DDPRank(Replica):
    """One rank: a worker's process, device and slice, in DDP's group."""

    powersgd_rank: int | None = None  # set by compress(): PowerSGD's rank, or None for the plain bucket
    powersgd_start: int  # set by compress(): PowerSGD's first compressed step
    store = None  # rank 0's rendezvous store, from listen() until retire()
    # from reset:
    ddp: DistributedDataParallel  # my model in DDP, whose comm hook is _allreduce
    staging: dict[int, torch.Tensor]  # bucket index -> its CPU buffer, reused every step
    powersgd: PowerSGDState | None  # PowerSGD's state (its error feedback), where it compresses

    def listen(self, master: str, world: int) -> int:
        """Rank 0: the group's rendezvous, held open at `master`; the port the others join at."""
        self.store = rendezvous(master, world, self.job.cluster.step_timeout_s)
        return self.store.port

    def join(self, master: str, port: int, world: int) -> Joined:
        cluster = self.job.cluster
        return join_group(
            master,
            port,
            self.rank,
            world,
            cluster.step_timeout_s,
            self.store,
            collective=cluster.collective,
            joined=bool(cluster.ray_address),
            connect_timeout_s=cluster.connect_timeout_s,
            device=self.device.type,
        )

    def compress(self, powersgd_rank: int | None, powersgd_start: int) -> None:
        """From the next reset on: buckets through PowerSGD at this rank (None: as they are), plain
        all-reduces before step `powersgd_start`."""
        self.powersgd_rank, self.powersgd_start = powersgd_rank, powersgd_start

    def retire(self) -> None:
        """The row is over: out of the group, as this process serves the next row."""
        if dist.is_initialized():
            dist.destroy_process_group()
        self.store = None

    def reset(self, seed: int) -> None:
        super().reset(seed)
        # PowerSGD: the model in one bucket. The hook chains its all-reduces in callbacks, which gloo
        # would order differently on each rank with several buckets in flight (a collective mismatch)
        one_bucket = {"bucket_cap_mb": 64} if self.powersgd_rank else {}
        # every rank built the same model from the seed: DDP need not broadcast it (gloo takes no MPS tensors);
        # nor batch norm's statistics each step: the evaluator recomputes them (workload.recompute_batch_norm)
        self.ddp = DistributedDataParallel(self.flat.model, init_sync=False, broadcast_buffers=False, **one_bucket)
        self.ddp.register_comm_hook(None, self._allreduce)
        self.staging: dict[int, torch.Tensor] = {}
        # PowerSGD's state per repeat: plain all-reduces before its start (at least 2 steps: DDP may
        # rebuild its buckets after step 1), the same random projections on every rank from the seed
        self.powersgd = self.powersgd_rank and PowerSGDState(
            None,
            matrix_approximation_rank=self.powersgd_rank,
            start_powerSGD_iter=self.powersgd_start,
            random_seed=seed,
        )
        self.optimizer = self.workload.build_optimizer(self.flat.optimizer_params(), self.job.run)

    def train_step(self, step: int) -> tuple[float, float]:
        """My own work's seconds (gathering my slice, compute and update, as on one device) and the
        whole step's: my stopwatch stops while a bucket is all-reduced, and is read once, at the end."""
        self.watch.start()
        inputs, labels, keys = self.my_batch(step)
        self.flat.zero_grad()
        # (1) forward + backward on my slice; (2) runs inside backward, in _allreduce, bucket by bucket
        self.forward_backward(self.ddp, inputs, labels, keys)
        # (3) the same optimizer step on every rank
        self.work(self.optimizer.step)
        reading = self.watch.read()
        return reading.work_s, reading.span_s

    def _allreduce(self, _state, bucket):  # unannotated: DDP checks the annotations, which are strings here
        """(2) one bucket, as backward fills it: x my batch share, SUM over the group in the wire
        dtype, staged on CPU (gloo takes no MPS tensors); DDP copies the result into the gradients."""
        self.watch.stop()  # my compute so far (an emulated slow device waits here)
        share, buffer = batch_shares(self.batches)[self.rank], bucket.buffer()
        if self.powersgd:
            staging = None if gloo_takes(buffer.device) else self._staging(bucket.index(), buffer, "float32")
            reduced = weighted_powersgd(bucket, share, self.powersgd, staging)
        else:
            wire = self.job.run.wire_dtype
            reduced = weighted_allreduce(buffer, share, wire, self._staging(bucket.index(), buffer, wire))
        if not bucket.is_last():  # after the last bucket backward only waits for the all-reduces
            self.watch.start()
        return reduced

    def _staging(self, index: int, buffer: torch.Tensor, dtype: str) -> torch.Tensor:
        """Bucket `index`'s CPU buffer in `dtype`, made once and reused every step (DDP waits for
        every bucket's all-reduce before the next step can fill it); pinned under CUDA."""
        staging = self.staging.get(index)
        if staging is None or staging.numel() != buffer.numel():
            pinned = buffer.device.type == "cuda"
            staging = torch.empty(buffer.numel(), dtype=WIRE_DTYPES[dtype], pin_memory=pinned)
            self.staging[index] = staging
        return staging

    weights, state, load_state = OneDevice.weights, OneDevice.state, OneDevice.load_state


@dataclass(frozen=True)
class DDPOptions:
    compression: Literal["none", "powersgd"] = setting(
        "none", "none: buckets go in wire_dtype | powersgd: torch's PowerSGD hook, float32 low-rank factors"
    )
    powersgd_rank: int = setting(4, "PowerSGD's matrix approximation rank: lower sends less, approximates coarser")
    powersgd_start: int = setting(
        2, "PowerSGD's first compressed step (torch's start_powerSGD_iter, >= 2): plain all-reduces before it"
    )


class TorchDDP(Strategy):
    name = NAME
    options = DDPOptions
    table_note = "torch-ddp: PyTorch DDP, no Ray between the ranks; one all-reduce per step."
    floor_transfers = 1.0
    overlap = "buckets"  # PowerSGD's one bucket waits for backward's end: __init__
    resumable = True  # PowerSGD's error feedback is not checkpointed: a resumed run starts it afresh
    rebalances = True

    @classmethod
    def check_options(cls, options: DDPOptions) -> None:
        if options.powersgd_rank < 1:  # config.py has checked it is an int
            raise UserError(f"config key '{NAME}.powersgd_rank' must be a whole number >= 1")
        if options.powersgd_start < 2:  # torch's hook needs 2 plain steps for its error feedback
            raise UserError(f"config key '{NAME}.powersgd_start' must be a whole number >= 2")

    def __init__(self, job: Job) -> None:
        super().__init__(job)
        self.powersgd_rank = self.settings.powersgd_rank if self.settings.compression == "powersgd" else None
        self.overlap = "" if self.powersgd_rank else "buckets"
        if self.powersgd_rank:  # the factors' share of the model, in float32 whatever wire_dtype says
            self.floor_transfers = powersgd_fraction(load_workload(job.run).build_model(0), self.powersgd_rank)
            self.wire_dtype = "float32"
            self.table_note = (
                f"torch-ddp: PowerSGD at rank {self.powersgd_rank} sends {self.floor_transfers:.1%} of the "
                f"model per step from step {self.settings.powersgd_start}, the whole model before it (its link "
                "prediction counts that share of a floor transfer)."
            )

    def start(self) -> None:
        # (0) one process per worker on its labelled node, then DDP's group between them
        self.placed = place(self.job.cluster, self.job.workers, DDPRank, self.name, self.job)
        self.info = self.placed.info
        self._set_split([info["batch"] for info in self.info])
        master = self.info[0]["node_ip"]
        world = len(self.info)
        (port,) = self.placed.results([self.placed.call(0, "listen", master, world)], "opening the rendezvous")
        joined = self._each("join", master, port, world, doing="forming the group (docs/deployment.md: Ports)")
        self._each("compress", self.powersgd_rank, self.settings.powersgd_start)
        for info, joined_as in zip(self.info, joined):
            info["gloo_interface"], info["collective"] = joined_as.interface, joined_as.collective

    def reset(self, seed: int) -> None:
        self._each("reset", seed)

    def step(self, step: int, then: int | None = None) -> StepTiming:
        # each rank's times, read in its own process: a call to it is not part of training
        timings = self._each("train_step", step)
        compute_s = {info["name"]: own for info, (own, _) in zip(self.info, timings)}
        return StepTiming.synchronous(compute_s, max(total for _, total in timings))

    def push_split(self) -> None:
        self.placed.each("resplit", [(self.batches, rank) for rank in range(len(self.info))], "re-splitting")

    def state(self) -> dict:
        return self._rank0("state")

    def load_state(self, state: dict) -> None:
        self._each("load_state", state)

    def weights(self) -> torch.Tensor:
        return self._rank0("weights")

    def learning_rate(self) -> float:
        return self._rank0("learning_rate")

    def worker_info(self) -> list[dict]:
        return self.info

    def close(self) -> None:
        if self.placed:
            self.placed.close()

    def _each(self, method: str, *args, doing: str = "") -> list:
        return self.placed.each(method, [args] * len(self.info), doing or f"calling {method}")

    def _rank0(self, method: str):
        (value,) = self.placed.results([self.placed.call(0, method)], f"calling {method}")
        return value
