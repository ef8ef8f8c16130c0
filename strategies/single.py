"""The single-device baseline: a plain PyTorch training loop on the whole global batch.

Every distributed strategy is a diff of this file: the same model, data order and
optimizer, with steps (1)-(3) below spread over workers.

The loop runs where the reference machine's worker runs (the runner puts it first in the
config's workers: the fastest one alone), in a process placed on its node like any worker's,
with its device and the threads it has in the distributed rows. "vs baseline" then answers
whether adding the other machines pays over the best one alone, not over the driver's CPU.
"""

from __future__ import annotations

import torch

from hetbench.cluster.place import place
from hetbench.config import Job
from hetbench.step_timing import StepTiming
from hetbench.strategies.base import Strategy
from hetbench.strategies.replica import Replica
from hetbench.train_state import load_train_state, train_state


class OneDevice(Replica):
    """The baseline's process: one worker's node, device and thread budget; its slice is the whole batch."""

    def setup(self, job: Job, rank: int, threads_share: int) -> dict:
        info = super().setup(job, rank, threads_share)
        self.batches, self.rank = [job.run.batch_size], 0
        return {**info, "batch": job.run.batch_size}

    def reset(self, seed: int) -> None:
        super().reset(seed)
        self.optimizer = self.workload.build_optimizer(self.flat.optimizer_params(), self.job.run)

    def zero_grad(self) -> None:
        """As the example's loop: the gradients left to autograd (set to None), not summed into the
        flat buffer, which one device sends nowhere."""
        self.optimizer.zero_grad()

    def train_step(self, step: int) -> float:
        """The step's seconds on my device: marked on its queue at both ends, read after one sync."""
        self.watch.start()
        # (1) compute: forward + backward on this step's whole batch
        self.compute_gradient(step)
        # (2) combine: nothing to combine on one device
        # (3) update
        self.optimizer.step()
        self.watch.stop()
        return self.watch.read().work_s

    def weights(self) -> torch.Tensor:
        return self.flat.params.detach().to("cpu", copy=True)

    def state(self) -> dict:
        return train_state(self.flat, self.optimizer)

    def load_state(self, state: dict) -> None:
        load_train_state(self.flat, self.optimizer, state)


class Single(Strategy):
    name = "single"
    distributed = False
    resumable = True

    def start(self) -> None:
        self.placed = place(self.job.cluster, self.job.workers, OneDevice, self.name, self.job, ranks=[0])
        self.info = self.placed.info

    def reset(self, seed: int) -> None:
        self._do("reset", seed)

    def step(self, step: int, then: int | None = None) -> StepTiming:
        # the step's time on the device, read in its own process: a call to it is not part of training
        elapsed = self._do("train_step", step)
        return StepTiming({self.info[0]["name"]: elapsed}, comm_s=0.0, wait_s=0.0, total_s=elapsed)

    def state(self) -> dict:
        return self._do("state")

    def load_state(self, state: dict) -> None:
        self._do("load_state", state)

    def weights(self) -> torch.Tensor:
        return self._do("weights")

    def learning_rate(self) -> float:
        return self._do("learning_rate")

    def worker_info(self) -> list[dict]:
        return self.info

    def close(self) -> None:
        if self.placed:
            self.placed.close()

    def _do(self, method: str, *args):
        (value,) = self.placed.results([self.placed.call(0, method, *args)], f"calling {method}")
        return value
