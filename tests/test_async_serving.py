"""ray-ps-async's server serving its workers over their channels, without Ray: workers stood in by
threads on loopback channels that send what a ServingReplica sends (its figures, then its gradient)."""

import threading

import numpy as np
import pytest
import torch

from helpers import small_config
from hetbench.strategies.async_serving import ServingServer, too_far_ahead
from hetbench.transport.direct import Channel, Listener, Silent, hello

BATCHES = {"big": 40, "small": 24}  # a global batch of 64


class StandIn:
    """A worker's loop: weights in, a gradient of ones out (its size taken from the weights)."""

    def __init__(self, channel: Channel, batch: int, gradient_numel: int | None = None) -> None:
        self.channel, self.batch, self.numel = channel, batch, gradient_numel
        self.started_from: list[int] = []  # the versions it was sent
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                version, weights = self.channel.receive_tagged(0, 0.1)
            except Silent:
                continue
            except ConnectionError:
                return
            self.started_from.append(version)
            self.channel.post(version, np.array([0.01, 0.002, self.batch]))  # compute s, idle s, batch
            self.channel.post(version, np.ones(self.numel or weights.size, dtype=np.float32))


@pytest.fixture
def served(tmp_path):
    """A ServingServer with a fresh model and a channel to each of two stand-in workers."""
    server, workers, threads = ServingServer(), {}, torch.get_num_threads()
    server.object_store = False  # every worker has its channel
    server.reset(small_config(tmp_path), seed=0)  # (it takes every core, as in its own process)
    listener = Listener("127.0.0.1", 0, timeout_s=10)
    ends = {n: Channel.connect(listener.address, hello(listener.secret, n), timeout_s=10) for n in BATCHES}
    server.channels = listener.accept(list(BATCHES))
    listener.close()
    yield server, ends, workers
    for worker in workers.values():
        worker.stop.set()
    server.retire()
    for end in ends.values():
        end.close()
    torch.set_num_threads(threads)


def start(served, max_staleness=2, **numel):
    server, ends, workers = served
    first = server.start_serving(sum(BATCHES.values()), max_staleness)
    workers.update({n: StandIn(ends[n], b, numel.get(n)) for n, b in BATCHES.items()})
    return server, workers, first


def test_each_step_applies_one_global_batch_and_nothing_between_steps(served):
    server, workers, first = start(served)
    before = server.params().copy()
    step = server.run_step(64, timeout_s=10)
    assert step["done"] and not step["lost"] and step["failure"] is None
    applied = sum(len(c) for c in step["computes"].values())
    assert applied == len(step["staleness"]) >= 2  # 40 + 24 samples at least, each update's staleness kept
    assert sum(BATCHES[n] * len(c) for n, c in step["computes"].items()) >= 64
    assert not np.array_equal(server.params(), before)  # the updates ran on the master weights
    held = (server.version, server.params().copy())
    threading.Event().wait(0.3)  # the workers' next gradients arrive, and wait for the next step
    assert (server.version, server.params().tolist()) == (held[0], held[1].tolist())
    assert server.run_step(64, timeout_s=10)["done"] and server.version > held[0]
    assert all(w.started_from[0] == first for w in workers.values())  # both began from the first weights


def test_a_step_that_goes_on_applies_ahead_and_the_next_step_counts_it(served):
    server, _, _ = start(served)
    assert server.run_step(64, timeout_s=10, hold=False)["done"]
    went_on = server.version
    threading.Event().wait(0.3)  # the driver is away: the workers' next gradients are applied meanwhile
    ahead = server.version - went_on
    assert ahead >= 1 and server.budget <= 0  # at most one step's worth ahead: 64 samples and one overshoot
    assert server.budget > -64 - max(BATCHES.values())
    step = server.run_step(64, timeout_s=10)  # what was applied ahead counts here
    assert step["done"] and len(step["staleness"]) >= ahead
    held = server.version
    threading.Event().wait(0.3)  # held now: evaluation reads these weights
    assert server.version == held and server.budget == 0


@pytest.mark.parametrize("update_first,staleness", [(True, [0] * 6), (False, [0] + [1] * 5)])
def test_update_first_says_whether_a_worker_goes_on_from_its_own_gradient(served, update_first, staleness):
    server, ends, workers = served
    server.start_serving(64, max_staleness=100, update_first=update_first)
    workers["big"] = StandIn(ends["big"], 40)  # 'small' stays silent: only big's gradients are applied
    # without update_first each of big's gradients after its first was computed before its previous one was in
    assert [s for _ in range(3) for s in server.run_step(80, timeout_s=10)["staleness"]] == staleness


def test_a_worker_runs_at_most_max_staleness_versions_ahead(served):
    server, ends, workers = served
    first = server.start_serving(64, max_staleness=1)
    workers["big"] = StandIn(ends["big"], 40)  # 'small' takes its first weights and never answers
    ends["small"].receive_tagged(first, 5)
    step = server.run_step(100, timeout_s=1.0)
    assert not step["done"]  # 'big' gave 80 samples of 100, and is then held back
    assert workers["big"].started_from == [first, first + 1]  # one version ahead of 'small', no further
    assert step["staleness"] == [0, 0] and step["computes"] == {"big": [0.01, 0.01], "small": []}


def test_a_lost_worker_is_reported_and_the_step_goes_on_without_it(served):
    server, workers, _ = start(served)
    assert server.run_step(64, timeout_s=10)["done"]
    workers["small"].stop.set()
    workers["small"].channel.close()
    steps = [server.run_step(40, timeout_s=10) for _ in range(3)]
    assert ["small"] in [s["lost"] for s in steps] and all(s["done"] for s in steps)
    assert "small" not in server.started_from


def test_a_failing_update_ends_the_step_at_once_with_its_reason(served):
    server, _, _ = start(served, big=7, small=7)  # gradients of the wrong size
    step = server.run_step(64, timeout_s=60)
    assert not step["done"] and "failed: ValueError: a gradient of 7 values" in step["failure"]


def test_the_staleness_bound_the_server_and_the_driver_share():
    assert not too_far_ahead(5, [], max_staleness=0)  # nothing in flight: nobody to run ahead of
    assert not too_far_ahead(5, [4, 5], max_staleness=1)
    assert too_far_ahead(5, [3, 5], max_staleness=1)  # the oldest batch in flight started 2 versions back
    assert not too_far_ahead(5, [3, 5], max_staleness=2)


def test_a_rows_staleness_adds_up_over_its_starts():
    # a row starts anew for each repeat (runner.py's passes): the record's figures are over all of them
    from types import SimpleNamespace

    from hetbench.strategies.ray_ps_async import RayParameterServerAsync

    this_start = SimpleNamespace(staleness=[0, 1, 1], settings=SimpleNamespace(max_staleness=2))
    earlier = {"staleness": {"histogram": {"0": 2, "2": 1}, "max": 2}}  # as the record's JSON reads back
    (figures,) = RayParameterServerAsync.record_extras(this_start, earlier).values()
    assert figures == {"histogram": {0: 3, 1: 2, 2: 1}, "max": 2, "median": 1, "max_allowed": 2}
    assert RayParameterServerAsync.record_extras(this_start, {})["staleness"]["histogram"] == {0: 1, 1: 2}
