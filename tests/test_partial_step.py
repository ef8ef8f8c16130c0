"""A parameter server's update a parameter at a time: the same step as the whole, put back if cut short."""

import time

import pytest
import torch

from helpers import small_config
from hetbench.strategies.parameter_server import ParameterServer

SHARES = [0.75, 0.25]


def server(tmp_path, optimizer: str) -> ParameterServer:
    made = ParameterServer()
    made.reset(small_config(tmp_path, "dropout=0", f"optimizer={optimizer}").job(), seed=0)
    return made


def gradients(numel: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=generator) for _ in SHARES]


def arrivals(ps: ParameterServer):
    """Each parameter's offset as a streamed backward sends them (the last layer's first), and when."""
    return [(offset, 0.0) for _, offset, _ in reversed(ps.flat.spans)]


@pytest.mark.parametrize("optimizer", ["adadelta", "sgd", "adam"])
def test_a_parameter_at_a_time_is_the_whole_update_each_sent_once_stepped(tmp_path, optimizer):
    whole, pieces = server(tmp_path, optimizer), server(tmp_path, optimizer)
    published = []
    for step in range(2):  # the second step starts from the optimizer state the first left
        grads = gradients(whole.flat.params.numel(), seed=step)
        whole.apply(SHARES, *[g.numpy() for g in grads])

        def publish(offset, size):  # this parameter is stepped already, as the whole update steps it
            stepped = torch.equal(pieces.flat.params[offset : offset + size], whole.flat.params[offset : offset + size])
            published.append((offset, size, stepped))

        pieces.apply_by_parameter(SHARES, [g.numpy() for g in grads], arrivals(pieces), publish)
    assert torch.equal(pieces.flat.params, whole.flat.params)
    assert [(o, s) for o, s, _ in published] == [(o, s) for _, o, s in reversed(pieces.flat.spans)] * 2
    assert all(stepped for _, _, stepped in published)
    states = (ps.optimizer.optimizer.state_dict()["state"] for ps in (pieces, whole))
    torch.testing.assert_close(*states)


@pytest.mark.parametrize("stepped_before", [False, True])
def test_an_update_cut_short_leaves_the_weights_and_the_optimizer_as_they_were(tmp_path, stepped_before):
    ps = server(tmp_path, "adadelta")
    if stepped_before:  # the optimizer has state to put back; else it must have none again
        ps.apply(SHARES, *[g.numpy() for g in gradients(ps.flat.params.numel(), seed=0)])
    weights, state = ps.flat.params.clone(), ps.optimizer.optimizer.state_dict()
    state = {k: {n: v.clone() for n, v in s.items()} for k, s in state["state"].items()}

    def cut_short():
        yield from arrivals(ps)[:3]  # fc2's weights and bias and fc1's bias stepped, then the worker is lost
        raise ConnectionError("the worker's call failed")

    grads = [g.numpy() for g in gradients(ps.flat.params.numel(), seed=1)]
    with pytest.raises(ConnectionError, match="call failed"):
        ps.apply_by_parameter(SHARES, grads, cut_short(), lambda offset, size: None)
    assert torch.equal(ps.flat.params, weights)
    torch.testing.assert_close(ps.optimizer.optimizer.state_dict()["state"], state, rtol=0, atol=0)


def test_the_update_is_timed_from_when_the_last_gradient_came_in(tmp_path):
    ps = server(tmp_path, "adadelta")
    grads = [g.numpy() for g in gradients(ps.flat.params.numel(), seed=0)]

    def streamed():  # each part comes in 50 ms after the last, while the server works on it
        for offset, _ in arrivals(ps):
            time.sleep(0.05)
            yield offset, time.perf_counter()

    _, update = ps.apply_by_parameter(SHARES, grads, streamed(), lambda offset, size: None)
    assert 0 < update.optimizer_s <= update.seconds < 0.05  # only what followed the last part
    # every part was in before the update began (queued while the server waited for another worker):
    # all that follows counts, here the sending of 8 parameters at 10 ms each
    _, update = ps.apply_by_parameter(SHARES, grads, arrivals(ps), lambda offset, size: time.sleep(0.01))
    assert update.seconds >= 0.08 and 0 < update.optimizer_s < update.seconds
