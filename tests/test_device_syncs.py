"""What a timed step asks of its device: `hetbench.devices.synchronize` calls counted per step, in
each kind of worker's own step, in this process (a sync on a GPU stops the host from queueing the
next kernels; on this CPU it does nothing, so only counting shows it)."""

from unittest import mock

import pytest
import torch
import torch.distributed as dist

from hetbench.config import load_config
from hetbench.gradients import to_wire
from hetbench.transport.direct import Channel
from hetbench.transport.outbox import Outbox


@pytest.fixture
def syncs(monkeypatch):
    """Every device sync from here on, by the clock's hand or anyone's; and no /proc read allowed."""
    counted = []
    monkeypatch.setattr("hetbench.clock.synchronize", lambda device: counted.append(device))
    monkeypatch.setattr("hetbench.devices.synchronize", lambda device: counted.append(device))
    monkeypatch.setattr("hetbench.clock.cpu_wait", mock.Mock(side_effect=AssertionError("a /proc read")))
    return counted


def worker(cls, *overrides, strategy=None):
    made = cls()
    job = load_config(None, ["workers=[{batch: 8, device: cpu}]", "download=false", *overrides]).job(strategy)
    made.setup(job, 0, 1)
    made.reset(0)
    return made


def per_step(syncs, step, steps=3) -> list[int]:
    """The syncs of each of `steps` steps after a first (warm) one."""
    step(0)
    counts = []
    for n in range(1, steps + 1):
        before = len(syncs)
        step(n)
        counts.append(len(syncs) - before)
    return counts


def test_single_syncs_once_a_step_and_reads_no_cpu_wait_without_a_slowdown(syncs):
    from hetbench.strategies.single import OneDevice

    one = worker(OneDevice)
    assert per_step(syncs, one.train_step) == [1, 1, 1]  # the step's end: its stopwatch read


def test_a_ddp_rank_syncs_once_a_step_and_never_in_its_comm_hook(syncs):
    from hetbench.strategies.torch_ddp import DDPRank

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        rank = worker(DDPRank)
        in_hook = []
        allreduce = rank._allreduce

        def counted_hook(state, bucket):
            before = len(syncs)
            reduced = allreduce(state, bucket)
            in_hook.append(len(syncs) - before)
            return reduced

        rank._allreduce = counted_hook  # the hook is registered at reset
        rank.reset(0)
        assert per_step(syncs, rank.train_step) == [1, 1, 1]
        assert in_hook and set(in_hook) == {0}
        own_s, total_s = rank.train_step(4)
        assert 0 < own_s <= total_s
    finally:
        dist.destroy_process_group()


def test_a_streamed_parameter_server_worker_syncs_once_a_step_not_once_a_parameter(syncs):
    from hetbench.strategies.ray_ps import RayReplica

    replica = worker(RayReplica, strategy="ray-ps")
    replica.channel, replica.outbox = mock.create_autospec(Channel, instance=True), Outbox()
    weights = to_wire(replica.flat.params, "float32")
    assert per_step(syncs, lambda step: replica.streamed(weights, step, ticket=step)) == [1, 1, 1]
    assert replica.channel.post.call_count == 4 * len(replica.flat.spans)  # every parameter, each step
    assert replica.outbox.made == 4 * len(replica.flat.spans)  # none sent (a mock): none taken again


def test_a_parameter_server_and_a_local_sgd_worker_sync_once_a_step(syncs):
    from hetbench.strategies.ray_localsgd import LocalReplica

    replica = worker(LocalReplica, strategy="ray-localsgd")
    weights = to_wire(replica.flat.params, "float32")
    assert per_step(syncs, lambda step: replica.gradient_at(weights, step)) == [1, 1, 1]
    assert per_step(syncs, lambda step: replica.inner(None, 10 + step)) == [1, 1, 1]


def test_an_emulated_slower_worker_syncs_and_reads_its_cpu_wait_at_each_end_of_its_work(monkeypatch, syncs):
    from hetbench.strategies.single import OneDevice

    reads = []
    monkeypatch.setattr("hetbench.clock.cpu_wait", lambda: reads.append(1) or 0.0)
    one = worker(OneDevice, "workers=[{batch: 8, device: cpu, slowdown: 1.5}]")
    assert per_step(syncs, one.train_step, steps=1) == [2] and len(reads) == 4  # two steps, two ends each


def test_a_span_a_failure_left_open_is_not_counted_as_work():
    import time

    from hetbench.clock import Reading, Stopwatch

    watch = Stopwatch(torch.device("cpu"))
    watch.start()
    watch.stop()
    watch.start()  # the work raised: its span never stopped
    time.sleep(0.05)
    watch.start()
    watch.stop()
    reading = watch.read()
    assert reading.work_s < 0.01 and reading.span_s >= 0.05
    assert watch.read() == Reading(0.0, 0.0)  # read: nothing left
