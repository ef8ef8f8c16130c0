"""ray-ps's direct channel on loopback: tagged buffers both ways, stale ones dropped, strangers refused."""

import socket
import time

import numpy as np
import pytest
import torch

from hetbench.gradients import FlatModel, from_wire, to_wire
from hetbench.transport.direct import Channel, Listener, Silent, gave_up, given_up, hello


@pytest.fixture
def pair():
    """A server end and worker 'mac''s end, connected through a Listener as ray-ps connects them."""
    listener = Listener("127.0.0.1", 0, timeout_s=10)
    worker = Channel.connect(listener.address, hello(listener.secret, "mac"), timeout_s=10)
    server = listener.accept(["mac"])["mac"]
    listener.close()
    yield server, worker
    server.close()
    worker.close()


def test_buffers_cross_both_ways_in_their_wire_dtype(pair):
    server, worker = pair
    weights = torch.randn(1_250_000)  # ~the model's size: more than a socket buffer holds
    server.post(1, to_wire(weights, "float32"))  # as ray-ps's server pushes weights: from a thread
    server.post(2, to_wire(weights, "bfloat16"))
    assert torch.equal(from_wire(worker.receive(1)), weights)
    assert torch.equal(from_wire(worker.receive(2)), weights.to(torch.bfloat16).float())
    assert worker.send(7, np.arange(5, dtype=np.float16))
    assert server.receive(7).tolist() == [0, 1, 2, 3, 4]


def test_receive_drops_what_a_failed_attempt_left(pair):
    server, worker = pair
    for tag in (3, 4, 5):  # attempts 3 and 4 failed on the server's side; 5 is the one asked for
        worker.send(tag, np.full(3, tag, dtype=np.float32))
    assert server.receive(5).tolist() == [5, 5, 5]


def test_a_gradient_sent_in_parts_is_put_together_at_their_offsets(pair):
    server, worker = pair
    gradient = np.arange(10, dtype=np.float32)
    worker.send(3, np.full(10, -1, dtype=np.float32))  # a failed attempt's whole gradient: passed over
    for offset, size in ((7, 3), (0, 4), (4, 3)):  # as backward hands them: the last layer first
        worker.post(4, gradient[offset : offset + size].copy(), offset)
    assert server.gather(4, np.zeros(10, dtype=np.float32), poll_s=1).tolist() == gradient.tolist()
    worker.send(5, gradient[:4])
    worker.send(6, gradient[4:], 4)  # a newer attempt's part before buffer 5 is whole
    with pytest.raises(ConnectionError, match="cut short"):
        server.gather(5, np.zeros(10, dtype=np.float32), poll_s=1)


def test_a_gather_looks_at_the_sender_while_it_is_silent(pair):
    server, worker = pair
    worker.send(1, np.zeros(2, dtype=np.float32))  # half of buffer 1, then nothing
    looks = []

    def check():
        looks.append(1)
        if len(looks) == 3:
            raise RuntimeError("the worker's call failed")

    with pytest.raises(RuntimeError, match="call failed"):
        server.gather(1, np.zeros(4, dtype=np.float32), poll_s=0.05, check=check)
    assert len(looks) == 3


def test_a_wait_for_weights_ends_at_its_attempts_given_up_mark_and_passes_older_ones(pair):
    from hetbench.strategies.ray_ps import RayReplica

    server, worker = pair
    replica = RayReplica()
    replica.channel, replica.version = worker, 6  # it holds version 6 and waits for the next
    replica.flat = FlatModel(torch.nn.Linear(2, 1))  # 3 weights
    server.post(7, given_up(11))  # attempt 11's update never ran; no call waited for it
    server.post(7, np.full(3, 7, dtype=np.float32))  # the redo's weights, version 7
    assert replica.weights_in(None, after=12).tolist() == [7, 7, 7] and replica.version == 7
    server.post(8, given_up(13))
    with pytest.raises(ConnectionError, match="gave up step attempt 13"):
        replica.weights_in(None, after=13)
    assert replica.version == 7  # it still holds the weights it had
    assert [gave_up(to_wire(torch.ones(2), w)) for w in ("float32", "float16", "bfloat16")] == [None] * 3


def test_weights_sent_in_parts_are_taken_whole_and_an_abandoned_attempts_parts_dropped(pair):
    from hetbench.strategies.ray_ps import RayReplica

    server, worker = pair
    replica = RayReplica()
    replica.channel, replica.version = worker, 6
    replica.flat = FlatModel(torch.nn.Linear(4, 2))  # 10 weights: a weight matrix at 0, a bias at 8
    server.post(7, np.full(2, 1, dtype=np.float32), 8)  # attempt 11 sent the bias down, then failed
    server.post(7, given_up(11))
    server.post(7, np.full(2, 2, dtype=np.float32), 8)  # the redo (attempt 12), the last layer first
    server.post(7, np.full(8, 2, dtype=np.float32), 0)
    assert replica.weights_in(None, after=12).tolist() == [2] * 10 and replica.version == 7
    held = replica.held
    server.post(8, np.full(2, 3, dtype=np.float32), 8)  # attempt 13 fails after its first parameter
    server.post(8, given_up(13))
    with pytest.raises(ConnectionError, match="gave up step attempt 13"):
        replica.weights_in(None, after=13)
    assert replica.version == 7 and replica.held is held and held.tolist() == [2] * 10  # what it holds is whole
    server.post(9, np.full(2, 4, dtype=np.float32), 8)
    server.post(10, np.full(8, 5, dtype=np.float32), 0)  # a newer version before version 9 is whole
    with pytest.raises(ConnectionError, match="cut short"):
        replica.weights_in([None, 9])


def test_a_closed_end_is_an_error_not_a_wait(pair):
    server, worker = pair
    worker.close()
    with pytest.raises(ConnectionError, match="closed"):
        server.receive(1)
    with pytest.raises(ConnectionError, match="closed"):  # and stays one
        server.receive(1)
    big = np.zeros(8_000_000, dtype=np.float32)  # more than the kernel buffers: a send must notice
    assert not server.send(1, big) and server.broken


def test_a_silent_end_times_out():
    listener = Listener("127.0.0.1", 0, timeout_s=0.5)
    worker = Channel.connect(listener.address, hello(listener.secret, "mac"), timeout_s=0.5)
    server = listener.accept(["mac"])["mac"]
    try:
        with pytest.raises(Silent, match="within 0.5 s"):  # a ConnectionError, told apart from a closed end
            server.receive(1)
        with pytest.raises(Silent, match="within 0.05 s"):  # a wait of the caller's own
            server.receive(1, timeout_s=0.05)
        with pytest.raises(Silent):  # parts that stop coming: the whole buffer's wait is bounded too
            server.gather(1, np.zeros(2, dtype=np.float32), poll_s=0.1)
        worker.send(4, np.ones(2, dtype=np.float32))
        assert server.receive_tagged(2)[0] == 4
    finally:
        for end in (server, worker, listener):
            end.close()


def test_only_the_named_workers_with_the_runs_secret_are_accepted():
    listener = Listener("127.0.0.1", 0, timeout_s=1)
    stranger = socket.create_connection(listener.address)
    stranger.sendall(hello(b"x" * 16, "mac"))  # the right name, not the run's secret
    unnamed = Channel.connect(listener.address, hello(listener.secret, "desk2"), timeout_s=1)
    mac = Channel.connect(listener.address, hello(listener.secret, "mac"), timeout_s=1)
    try:
        accepted = listener.accept(["mac"])
        assert list(accepted) == ["mac"]
        assert stranger.recv(1) == b""  # closed on it
        accepted["mac"].close()
    finally:
        for end in (stranger, unnamed, mac, listener):
            end.close()


def test_an_unreachable_server_is_none_not_an_error():
    listener = Listener("127.0.0.1", 0, timeout_s=1)
    address = listener.address
    listener.close()
    assert Channel.connect(address, b"", timeout_s=1) is None


def given_back(outbox, timeout_s: float = 10.0) -> bool:
    """Whether every buffer the outbox posted came back free within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with outbox.lock:
            if sum(len(free) for free in outbox.free.values()) == outbox.made:
                return True
        time.sleep(0.001)
    return False


def test_an_outbox_posts_what_its_source_held_and_reuses_each_buffer_once_every_channel_sent_it():
    from hetbench.transport.outbox import Outbox

    listener = Listener("127.0.0.1", 0, timeout_s=10)
    workers = [Channel.connect(listener.address, hello(listener.secret, n), timeout_s=10) for n in ("a", "b")]
    ends = listener.accept(["a", "b"])
    listener.close()
    try:
        outbox, weights = Outbox(), torch.arange(1_250_000, dtype=torch.float32)
        for version in range(1, 4):
            outbox.post(list(ends.values()), version, weights, "float32")
            weights += 1  # the master weights move on at once: what was posted does not
            for worker in workers:
                assert worker.receive(version)[:2].tolist() == [version - 1, version]
            assert given_back(outbox)  # a receiver can have it before the sender's thread calls back
        assert outbox.made == 1  # a steady stream of posts, sent before the next: one buffer in all
        part = weights[10:20]
        outbox.post([ends["a"]], 4, part, "bfloat16", offset=10)  # a part, in another dtype: its own buffer
        tag, offset, array = workers[0].receive_part(4)
        assert (tag, offset) == (4, 10) and torch.equal(from_wire(array), part.to(torch.bfloat16).float())
        assert outbox.made == 2
    finally:
        for channel in [*workers, *ends.values()]:
            channel.close()


def test_a_buffer_down_a_channel_not_yet_sent_is_not_taken_again():
    from unittest import mock

    from hetbench.transport.outbox import Outbox

    stuck = mock.create_autospec(Channel, instance=True)  # posted, never sent: its callback never comes
    outbox = Outbox()
    outbox.post([stuck], 1, torch.ones(4), "float32")
    outbox.post([stuck], 2, torch.zeros(4), "float32")
    first, second = (call.args[1] for call in stuck.post.call_args_list)
    assert outbox.made == 2 and first.tolist() == [1, 1, 1, 1] and second.tolist() == [0, 0, 0, 0]
    stuck.post.call_args_list[0].args[3]()  # the first is sent now
    outbox.post([stuck], 3, torch.full((4,), 3.0), "float32")
    assert outbox.made == 2 and first.tolist() == [3, 3, 3, 3]  # its memory carries the next post
