"""The shared-memory buffers a parameter server and the workers on its node exchange through."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hetbench.transport import host_memory
from hetbench.transport.host_memory import HostBuffers

LIMIT_S = 60.0  # no hand-off here takes a second


def test_a_second_mapping_sees_what_the_first_writes_even_after_the_name_is_gone():
    server = HostBuffers.create(numel=1000, slots=2, limit_s=LIMIT_S)
    worker = HostBuffers.attach(server.path, 1000, 2, LIMIT_S)
    try:
        worker.gradient(1).fill_(3.0)
        server.weights.copy_(torch.arange(1000.0))
        server.unlink()
        assert torch.equal(worker.weights, torch.arange(1000.0))
        assert torch.equal(server.gradient(1), torch.full((1000,), 3.0))
        assert not server.gradient(0).any()  # slots do not overlap
        assert HostBuffers.attach(server.path, 1000, 2, LIMIT_S) is None  # a late process cannot find it any more
    finally:
        server.unlink()


def test_without_usable_shared_memory_there_are_no_buffers(tmp_path, monkeypatch):
    monkeypatch.setattr(host_memory, "SHM_DIR", str(tmp_path / "missing"))
    assert HostBuffers.create(numel=1000, slots=1, limit_s=LIMIT_S) is None


@pytest.mark.skipif(not HostBuffers.can_hand_off(), reason="the futex hand-off is built for Linux x86-64 only")
def test_a_wait_ends_when_its_counter_reaches_the_ticket_or_the_attempt_is_given_up():
    server = HostBuffers.create(numel=10, slots=2, limit_s=LIMIT_S)
    worker = HostBuffers.attach(server.path, 10, 2, LIMIT_S)
    server.unlink()
    with ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(server.wait_gradient, 1, 3)
        time.sleep(0.2)
        worker.publish_gradient(1, 2)  # an older ticket: still waiting
        time.sleep(0.2)
        assert not waiting.done()
        worker.publish_gradient(1, 3)
        waiting.result(timeout=5)
        server.wait_gradient(1, 2)  # already past: returns at once
        stuck = pool.submit(worker.wait_weights, 4)
        time.sleep(0.2)
        server.abandon(4)
        with pytest.raises(host_memory.Abandoned):
            stuck.result(timeout=5)
    server.publish_weights(5)
    worker.wait_weights(5)  # a later attempt is not given up
    assert int(worker.counters[host_memory.VERSION]) == 5
