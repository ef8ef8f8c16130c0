"""The worker of every strategy: a configured worker's model copy, data and clock, in its own process."""

from __future__ import annotations

import os
import signal
import socket
import time

import torch

from hetbench.clock import Stopwatch
from hetbench.cluster.collective import operating_system
from hetbench.cluster.processes import machine_memory_mb, peak_rss_mb
from hetbench.config import Job, WorkerConfig
from hetbench.cores import usable_cores
from hetbench.devices import (
    check_precision,
    configure_threads,
    device_memory_mb,
    keep_freed_memory,
    node_device,
    set_precision,
)
from hetbench.gradients import FlatModel, from_wire, to_wire
from hetbench.optimizer import ScheduledOptimizer
from hetbench.strategies.base import BatchOrder, worker_slice
from hetbench.transport.host_memory import HostBuffers
from hetbench.workload import LoadedWorkload, load_workload


def ramp_of(spec: WorkerConfig) -> tuple[float, float, float] | None:
    """A worker's growing emulated slowdown, as the Stopwatch takes it; None where it has none."""
    if spec.slowdown_to is None:
        return None
    return spec.slowdown_to, spec.ramp_s, spec.ramp_start or time.time()


class Replica:
    """One configured worker's model copy and training data, inside the worker's own process.

    Every strategy that computes on remote workers runs this: the device is resolved here, on
    the worker's node, never on the driver. Ray and Dask make a role without arguments: `setup` is
    its constructor, and `reset` begins each repeat.
    """

    # from setup:
    job: Job  # the row's
    rank: int  # my place among the live workers
    spec: WorkerConfig  # my configured worker
    batches: list[int]  # every live worker's samples per step, in rank order
    device: torch.device
    watch: Stopwatch  # my device work's seconds, read once a step
    workload: LoadedWorkload  # what I train, imported on my machine
    inputs: torch.Tensor  # the training split, on my device, as it is stored (MNIST's: uint8)
    labels: torch.Tensor
    # from reset:
    seed: int
    order: BatchOrder  # the global batches' sample indices
    flat: FlatModel  # my model copy and its flat gradient
    # from attach, where I share the server's host:
    shared: HostBuffers | None = None
    slot = 0  # my gradient's slot there
    # from each compute:
    returned_at: float | None = None  # when my last `compute_after_idle` handed its gradient back
    samples = 0  # how many samples my last gradient was computed on (a re-split may land after it)
    # from reset, where I take the update myself (single, DDP ranks, local SGD's replicas):
    optimizer: ScheduledOptimizer
    # from begin_alone:
    optimizer_alone: ScheduledOptimizer
    steps_alone = 0  # steps trained alone since, the warmup's included

    def setup(self, job: Job, rank: int, threads_share: int) -> dict:
        configure_threads(job.run.threads, threads_share)
        keep_freed_memory()
        math = set_precision(job.run.precision)
        self.job, self.rank = job, rank
        self.spec = job.workers[rank]
        self.batches = [w.batch for w in job.workers]
        self.device = node_device(self.spec.name, self.spec.device)
        check_precision(self.device, job.run.precision, f"worker '{self.spec.name}'")
        self.workload = load_workload(job.run, announce=False)
        train = self.workload.train_split()
        self.inputs, self.labels = train.tensors(self.device)
        self.watch = Stopwatch(self.device, self.spec.slowdown, ramp_of(self.spec))
        return {
            "name": self.spec.name,
            "device": str(self.device),
            "node": self.spec.node,
            "host": socket.gethostname(),
            "os": operating_system(),  # what cluster.collective's auto chooses by
            "pid": os.getpid(),
            "threads": torch.get_num_threads(),
            "cores": usable_cores(),  # those this process may run on (its node's share, where pinned)
            "batch": self.spec.batch,
            "slowdown": self.spec.slowdown,
            "workload": self.workload.fingerprint(),  # the driver refuses workers that differ (check_same_workload)
            "data": train.fingerprint(),
            **math,  # the float32 math it trained in, and whether cuDNN autotuned
            "ram_mb": machine_memory_mb(),
            "device_memory_mb": device_memory_mb(self.device),  # its training set on the device, and torch's
        }

    def resplit(self, batches: list[int], rank: int) -> None:
        """After a worker was lost: the survivors' new batches, and my place among them."""
        self.batches, self.rank = batches, rank

    def learning_rate(self) -> float:
        """My own optimizer's next rate, where I step one (single's, a DDP rank's, a local-SGD replica's)."""
        return self.optimizer.lr

    def peak_rss_mb(self) -> float:
        return peak_rss_mb()

    def die(self) -> None:
        """Fault injection: this worker's process ends at once, as if its machine went away."""
        os.kill(os.getpid(), signal.SIGKILL)

    def reset(self, seed: int) -> None:
        self.watch.read()  # what a failed step left marked: not the next step's
        self.seed, self.returned_at = seed, None
        self.order = BatchOrder(len(self.labels), self.job.run.batch_size, seed, self.device)
        self.flat = FlatModel(self.workload.build_model(seed).to(self.device))

    def attach(self, path: str, numel: int, slots: int, slot: int) -> bool:
        """On the server's host: map its shared memory, where my weights come and my gradient goes."""
        self.shared, self.slot = HostBuffers.attach(path, numel, slots, self.job.cluster.step_timeout_s), slot
        return self.shared is not None

    def compute(self, weights, step: int, ticket: int | None = None, after: int | None = None):
        """(2a) load the new weights, (1) forward+backward on my slice, (2b) hand back my gradient.

        With shared memory the weights are already there and the gradient is left in my slot: what
        comes back is the slot's number. With a `ticket` the slot's counter says so too, and with
        `after` I first wait for that weights version (no call of anyone's orders mine then).
        """
        if not self.shared:
            return self.gradient_at(weights, step)
        if after is not None:
            self.shared.wait_weights(after)
        self.flat.load_params(self.shared.weights)
        self.local_step(step)
        compute_s = self.watch.read().work_s
        self.shared.gradient(self.slot).copy_(self.flat.grads)
        if ticket is not None:
            self.shared.publish_gradient(self.slot, ticket)
        return self.slot, compute_s

    def gradient_at(self, weights, step: int) -> tuple:
        """By value: as `computed_at`; (2b) my gradient in the wire dtype (it may be my gradient
        buffer itself), and the compute's seconds."""
        compute_s = self.computed_at(weights, step)
        return to_wire(self.flat.grads, self.job.run.wire_dtype), compute_s

    def computed_at(self, weights, step: int) -> float:
        """(2a) load `weights` (wire dtype), (1) forward+backward on my slice of global batch `step`
        into my gradient buffer; the compute's seconds."""
        self.flat.load_params(from_wire(weights))
        self.local_step(step)
        return self.watch.read().work_s

    def compute_after_idle(self, weights, step: int, ticket: int | None = None) -> tuple:
        """As `compute`, with the seconds since my previous one handed its gradient back: my gradient's
        way up, its update and the new weights' way down, all that kept me from computing (ray-ps-async's
        overhead); None for a repeat's first. One clock, this process's, at both ends. And the samples
        the gradient is of, which its weight must follow."""
        idle_s = self.idle_s()  # my weights have arrived (a launcher that fetches them does so first)
        gradient, compute_s = self.compute(weights, step, ticket)
        self.returned_at = time.perf_counter()
        return gradient, (compute_s, idle_s, self.samples)

    def idle_s(self) -> float | None:
        """Seconds since my last gradient left (`returned_at`); None for a repeat's first."""
        return time.perf_counter() - self.returned_at if self.returned_at is not None else None

    def alone(self, steps: int, warmup: int, batch: int | None = None) -> float:
        """This worker training alone on a whole global batch (forward, backward, update), the job's or
        `batch` samples: samples/s."""
        batches, rank = self.batches, self.rank
        try:
            self.begin_alone(warmup, batch)
            return self.batches[0] * steps / sum(self.alone_step() for _ in range(steps))
        finally:
            self.batches, self.rank = batches, rank

    def begin_alone(self, warmup: int, batch: int | None = None) -> None:
        """From here I train alone on a whole global batch (the job's, or `batch` samples), a step a
        call (`alone_step`): a fresh model and optimizer, then `warmup` steps untimed. Steps a call
        let a timing start every worker's steps together, as a synchronous row does after each sync."""
        batch = batch or self.job.run.batch_size
        self.reset(self.job.run.seed)
        self.batches, self.rank = [batch], 0  # my slice is now the whole batch
        self.order = BatchOrder(len(self.labels), batch, self.seed, self.device)
        self.optimizer_alone = self.workload.build_optimizer(self.flat.optimizer_params(), self.job.run)
        self.steps_alone = 0
        for _ in range(warmup):
            self.alone_step()

    def alone_step(self) -> float:
        """One more step alone (after `begin_alone`): its seconds, forward, backward and update."""
        self.local_step(self.steps_alone)
        self.work(self.optimizer_alone.step)
        self.steps_alone += 1
        return self.watch.read().span_s

    def my_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """My slice of global batch `step`: inputs (prepared from my stored copy), labels and dropout
        keys, gathered on my device."""
        index = worker_slice(self.order(step), self.batches, self.rank)
        keys = worker_slice(self.order.keys(step), self.batches, self.rank)
        return self.workload.prepare(self.inputs[index]), self.labels[index], keys

    def local_step(self, step: int) -> None:
        """(1) my slice of global batch `step` gathered, forward+backward into my flat gradient, on my
        stopwatch (gathering the batch is compute: it runs on my device, as a one-device loop's does)."""
        self.work(lambda: self.compute_gradient(step))

    def streamed_step(self, step: int, send) -> None:
        """As `local_step`, with (2b) each parameter's gradient handed to `send(offset, gradient)` as
        backward has it (the last layer's first), as DDP sends a bucket; the sending is off my
        stopwatch. An emulated slower device's delay is spread the same way: each hand-off comes
        after its share of the delay, as a slower device would produce that gradient later."""
        self.watch.start()

        def hand_off(offset: int, size: int) -> None:
            self.watch.stop()
            send(offset, self.flat.grads[offset : offset + size])
            self.watch.start()

        hooks = [
            param.register_post_accumulate_grad_hook(lambda _, o=offset, n=size: hand_off(o, n))
            for param, offset, size in self.flat.spans
        ]
        try:
            self.compute_gradient(step)
        finally:
            for hook in hooks:
                hook.remove()
        self.watch.stop()

    def compute_gradient(self, step: int) -> None:
        inputs, labels, keys = self.my_batch(step)
        self.samples = len(labels)
        self.zero_grad()
        self.forward_backward(self.flat.model, inputs, labels, keys)

    def zero_grad(self) -> None:
        """The gradients summed afresh into the flat buffer, which this worker sends."""
        self.flat.zero_grad()

    def forward_backward(self, model, inputs: torch.Tensor, labels: torch.Tensor, keys: torch.Tensor) -> None:
        """The workload's forward and backward in the run's precision (its loss scaled in fp16)."""
        run = self.job.run
        self.workload.forward_backward(model, inputs, labels, keys, run.precision, run.loss_scale)

    def work(self, device_work) -> None:
        """Run `device_work` on my stopwatch: its seconds on my device (slowed `slowdown` times when
        emulated) are read with the step's others, after one sync (`self.watch.read()`)."""
        self.watch.start()
        device_work()
        self.watch.stop()
