"""The single-device baseline: a plain PyTorch training loop on the whole global batch.

Every distributed strategy is a diff of this file: the same model, data order and
optimizer, with steps (1)-(3) below spread over workers.
"""

from __future__ import annotations

import torch

from hetbench.clock import now
from hetbench.data import cached_mnist
from hetbench.devices import configure_threads, keep_freed_memory, resolve_device
from hetbench.gradients import FlatModel
from hetbench.results.checkpoints import load_train_state, train_state
from hetbench.strategies.base import StepTiming, Strategy, step_indices
from hetbench.workload import build_model, build_optimizer, forward_backward


class Single(Strategy):
    name = "single"
    distributed = False
    resumable = True

    def start(self) -> None:
        configure_threads(self.cfg["threads"])
        keep_freed_memory()  # as every worker process does (roles.Replica): the same allocator for all
        worker = self.cfg["workers"][0]  # the baseline runs where the first worker would
        self.worker_name = worker["name"]
        self.device = resolve_device(worker["device"])
        train, _ = cached_mnist(self.cfg)
        self.images, self.labels = train.tensors(self.device)

    def reset(self, seed: int) -> None:
        model = build_model(self.cfg["dropout"], seed).to(self.device)
        self.flat = FlatModel(model)
        self.optimizer = build_optimizer(self.flat.optimizer_params(), self.cfg["optimizer"], self.cfg["lr"])
        self.seed = seed

    def step(self, step: int, then: int | None = None) -> StepTiming:
        index = torch.from_numpy(step_indices(len(self.labels), self.cfg["batch_size"], self.seed, step))
        index = index.to(self.device)
        start = now(self.device)
        # (1) compute: forward + backward on this step's whole batch
        self.flat.zero_grad()
        forward_backward(self.flat.model, self.images[index], self.labels[index])
        # (2) combine: nothing to combine on one device
        # (3) update
        self.optimizer.step()
        elapsed = now(self.device) - start
        return StepTiming({self.worker_name: elapsed}, comm_s=0.0, wait_s=0.0, total_s=elapsed)

    def state(self) -> dict:
        return train_state(self.flat, self.optimizer)

    def load_state(self, state: dict) -> None:
        load_train_state(self.flat, self.optimizer, state)

    def weights(self) -> torch.Tensor:
        return self.flat.params.detach().to("cpu", copy=True)

    def worker_info(self) -> list[dict]:
        worker = self.cfg["workers"][0]
        return [
            {
                "name": self.worker_name,
                "device": str(self.device),
                "node": worker["node"],
                "batch": self.cfg["batch_size"],
                "slowdown": 1.0,
            }
        ]
