"""The two roles of a parameter-server-style strategy: a Replica per worker, one ParameterServer."""

from __future__ import annotations

import os
import signal
import socket
import time

import torch

from hetbench.clock import cpu_wait, now
from hetbench.cluster.collective import operating_system
from hetbench.cluster.processes import peak_rss_mb
from hetbench.config import Job, WorkerConfig
from hetbench.cores import usable_cores
from hetbench.data import cached_mnist
from hetbench.devices import configure_threads, keep_freed_memory, resolve_device
from hetbench.gradients import FlatModel, count_parameters, from_wire, to_wire, weighted_sum
from hetbench.partial_step import Undo, step_only
from hetbench.step_timing import CentralUpdate
from hetbench.strategies.base import BatchOrder, worker_slice
from hetbench.train_state import load_train_state, train_state
from hetbench.transport.host_memory import HostBuffers
from hetbench.workload import build_model, build_optimizer, dropout_keys, forward_backward


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
    images: torch.Tensor  # the training split, on my device
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

    def setup(self, job: Job, rank: int, threads_share: int) -> dict:
        configure_threads(job.run.threads, threads_share)
        keep_freed_memory()
        self.job, self.rank = job, rank
        self.spec = job.workers[rank]
        self.batches = [w.batch for w in job.workers]
        self.device = resolve_device(self.spec.device)
        train = cached_mnist(job.run, announce=False)[0]
        self.images, self.labels = train.tensors(self.device)
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
            "data": train.fingerprint(),  # the driver refuses workers that differ (data.check_same_data)
        }

    def resplit(self, batches: list[int], rank: int) -> None:
        """After a worker was lost: the survivors' new batches, and my place among them."""
        self.batches, self.rank = batches, rank

    def peak_rss_mb(self) -> float:
        return peak_rss_mb()

    def die(self) -> None:
        """Fault injection: this worker's process ends at once, as if its machine went away."""
        os.kill(os.getpid(), signal.SIGKILL)

    def reset(self, seed: int) -> None:
        self.seed, self.returned_at = seed, None
        self.order = BatchOrder(len(self.labels), self.job.run.batch_size, seed, self.device)
        self.flat = FlatModel(build_model(self.job.run.dropout, seed).to(self.device))

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
        compute_s = self.local_step(step)
        self.shared.gradient(self.slot).copy_(self.flat.grads)
        if ticket is not None:
            self.shared.publish_gradient(self.slot, ticket)
        return self.slot, compute_s

    def gradient_at(self, weights, step: int) -> tuple:
        """By value: (2a) load `weights` (wire dtype), (1) forward+backward on my slice of global
        batch `step`; (2b) my gradient in the wire dtype (it may be my gradient buffer itself), and
        the compute's seconds."""
        self.flat.load_params(from_wire(weights))
        compute_s = self.local_step(step)
        return to_wire(self.flat.grads, self.job.run.wire_dtype), compute_s

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

    def alone(self, steps: int, warmup: int) -> float:
        """This worker training alone on the whole global batch (forward, backward, update): samples/s."""
        batches, rank = self.batches, self.rank
        self.batches, self.rank = [self.job.run.batch_size], 0  # my slice is now the whole batch
        try:
            self.reset(self.job.run.seed)
            optimizer = build_optimizer(self.flat.optimizer_params(), self.job.run.optimizer, self.job.run.lr)
            for step in range(warmup + steps):
                if step == warmup:
                    start = now(self.device)
                self.local_step(step)
                self.work(optimizer.step)
            return self.job.run.batch_size * steps / (now(self.device) - start)
        finally:
            self.batches, self.rank = batches, rank

    def my_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """My slice of global batch `step`: images, labels and dropout keys, gathered on my device."""
        index = worker_slice(self.order(step), self.batches, self.rank)
        return self.images[index], self.labels[index], dropout_keys(self.seed, step, index)

    def local_step(self, step: int) -> float:
        """(1) my slice of global batch `step` gathered, forward+backward into my flat gradient; its seconds
        (gathering the batch is compute: it runs on my device, as a one-device loop's does)."""
        return self.work(lambda: self.compute_gradient(step))

    def streamed_step(self, step: int, send) -> float:
        """As `local_step`, with (2b) each parameter's gradient handed to `send(offset, gradient)` as
        backward has it (the last layer's first), as DDP sends a bucket; the compute's seconds, not
        the sending's. An emulated slower device's delay is spread the same way: each hand-off comes
        after its share of the delay, as a slower device would produce that gradient later."""
        started, computed = [self.clock_in()], [0.0]

        def hand_off(offset: int, size: int) -> None:
            computed[0] += self.clock_out(started[0])
            send(offset, self.flat.grads[offset : offset + size])
            started[0] = self.clock_in()

        hooks = [
            param.register_post_accumulate_grad_hook(lambda _, o=offset, n=size: hand_off(o, n))
            for param, offset, size in self.flat.spans
        ]
        try:
            self.compute_gradient(step)
        finally:
            for hook in hooks:
                hook.remove()
        return computed[0] + self.clock_out(started[0])

    def compute_gradient(self, step: int) -> None:
        images, labels, keys = self.my_batch(step)
        self.samples = len(labels)
        self.flat.zero_grad()
        forward_backward(self.flat.model, images, labels, keys)

    def work(self, device_work) -> float:
        """Run `device_work`; its seconds on this worker's device, slowed `slowdown` times when emulated."""
        started = self.clock_in()
        device_work()
        return self.clock_out(started)

    def clock_in(self) -> tuple[float, float]:
        return now(self.device), cpu_wait()

    def clock_out(self, started: tuple[float, float]) -> float:
        """Seconds of device work since `clock_in`, slowed `slowdown` times when emulated.

        An emulated slower device takes `slowdown` times as long for the same work: we wait
        (slowdown - 1) x the work's own time. That excludes the time this thread waited for a CPU
        held by another process: on one box the emulated machines share cores, and multiplying those
        waits would slow the worker for the box's crowding, not for its device.
        """
        start, waited = started
        seconds = now(self.device) - start
        delay = (self.spec.slowdown - 1.0) * max(0.0, seconds - (cpu_wait() - waited))
        if delay > 0:
            slept_from = time.perf_counter()
            time.sleep(delay)
            # the wait as it elapsed: on a busy box a sleep ends late, and a streamed step sleeps at
            # every hand-off; what it overran by would otherwise read as the strategy's sync overhead
            delay = time.perf_counter() - slept_from
        return seconds + delay


class ParameterServer:
    """Master weights and the optimizer, on CPU (a Ray actor in ray-ps, the client in dask-sync).
    `reset` makes them for each repeat."""

    shared: HostBuffers | None = None  # from share_with, where workers share my host
    wire: str  # what the weights travel in
    flat: FlatModel
    optimizer: torch.optim.Optimizer
    chunks: dict[int, list[torch.Tensor]]  # each parameter's offset -> the optimizer's chunks of it

    def share_with(self, job: Job, slots: int) -> tuple[str, int] | None:
        """Shared memory for `slots` workers on this host: the file's path and the weights' size, or None."""
        self.shared = HostBuffers.create(
            count_parameters(build_model(job.run.dropout, 0)), slots, job.cluster.step_timeout_s
        )
        return (self.shared.path, self.shared.numel) if self.shared else None

    def shared_by_all(self, by_value: bool = True) -> None:
        """Every worker that could has mapped the shared memory: its name goes (nothing to leave behind).
        `by_value`: whether some worker is not among them (and is sent the weights by value)."""
        if self.shared:
            self.shared.unlink()

    def reset(self, job: Job, seed: int):
        # The update runs while every worker waits for it: give it all of this host's cores.
        configure_threads(0)
        keep_freed_memory()  # the optimizer's 4.7 MB temporaries otherwise page-fault afresh every step
        self.wire = job.run.wire_dtype
        # the master weights live where the workers on this host read them: publishing them is free
        self.flat = FlatModel(build_model(job.run.dropout, seed), self.shared and self.shared.weights)
        chunks = self.flat.optimizer_params()
        self.optimizer = build_optimizer(chunks, job.run.optimizer, job.run.lr)
        self.chunks = self.flat.chunks_of(chunks)  # each parameter's offset -> its chunks, to step it alone
        return to_wire(self.flat.params, self.wire)

    def state(self) -> dict:
        return train_state(self.flat, self.optimizer)

    def load_state(self, state: dict):
        load_train_state(self.flat, self.optimizer, state)
        return to_wire(self.flat.params, self.wire)

    def apply(self, shares: list[float], *grads, ticket: int | None = None, check=None):
        """(2c) the gradients (arrays, or slots of shared memory) weighted by their batch shares,
        (3) one optimizer step; new weights out. With a `ticket`, each slot's gradient is waited
        for on its counter (`check` may end that wait) and the new weights are announced on the
        version counter."""
        self._wait_for_slots(grads, ticket, check)
        start = time.perf_counter()
        grads = [self.shared.gradient(g) if isinstance(g, int) else from_wire(g) for g in grads]
        weighted_sum(grads, shares, out=self.flat.grads)
        stepping = time.perf_counter()
        self.optimizer.step()
        optimizer_s = time.perf_counter() - stepping
        return self._published(ticket), CentralUpdate(time.perf_counter() - start, optimizer_s)

    def apply_by_parameter(self, shares: list[float], grads: list, arrived, publish, ticket: int | None = None):
        """As `apply`, a parameter at a time, as DDP reduces a bucket: `arrived` yields (each parameter's
        offset, when the last of it came in) once every worker's gradient of it is in `grads` (buffers
        that fill as its parts come), and that parameter is combined, stepped and handed to
        `publish(offset, size)` while the others still come. The update is timed from when the last
        gradient came in; its optimizer seconds are those after it. Should `arrived` fail part-way,
        the weights and the optimizer's state are put back as they were (the step is redone without it)."""
        self._wait_for_slots(grads, ticket)
        last_in, stepped = time.perf_counter(), []  # (when, seconds) of each parameter's optimizer step
        grads = [self.shared.gradient(g) if isinstance(g, int) else g for g in grads]
        sizes = {offset: size for _, offset, size in self.flat.spans}
        undo = Undo(self.optimizer)
        try:
            for offset, came_in in arrived:
                last_in, end = max(last_in, came_in), offset + sizes[offset]
                parts = [g[offset:end] if isinstance(g, torch.Tensor) else from_wire(g[offset:end]) for g in grads]
                weighted_sum(parts, shares, out=self.flat.grads[offset:end])
                undo.keep(self.chunks[offset])
                stepping = time.perf_counter()
                step_only(self.optimizer, self.chunks[offset])
                stepped.append((stepping, time.perf_counter() - stepping))
                publish(offset, end - offset)
        except BaseException:
            undo.restore()
            raise
        weights = self._published(ticket)
        optimizer_s = sum(max(0.0, min(seconds, at + seconds - last_in)) for at, seconds in stepped)
        return weights, CentralUpdate(time.perf_counter() - last_in, optimizer_s)

    def _wait_for_slots(self, grads: list, ticket: int | None, check=None) -> None:
        for g in grads:
            if ticket is not None and isinstance(g, int):
                self.shared.wait_gradient(g, ticket, check)

    def _published(self, ticket: int | None):
        """The new weights announced to the workers in shared memory, and as they leave by value."""
        if ticket is not None:
            self.shared.publish_weights(ticket)
        return to_wire(self.flat.params, self.wire)

    def params(self):
        return self.flat.params.numpy()
