"""The update rule, strategy by strategy (every registered synchronous one): with dropout (keyed by
sample) and unequal batches (40 + 24), the first update equals one single-device step on the union batch.
On the session's shared cluster: the fast tier's proof that every strategy computes the same step."""

import pytest
import torch

from helpers import UNEQUAL, check_first_update_is_the_union_batch_step, made, registered, small_config
from hetbench.strategies import registry
from hetbench.strategies.parameter_server import ParameterServerDriver


@pytest.mark.parametrize("name", registered(lambda cls: cls.distributed and cls.synchronous))
def test_first_update_equals_the_single_device_step_on_the_union_batch(tmp_path, name, shared_cluster):
    check_first_update_is_the_union_batch_step(tmp_path, name, shared_cluster)


@pytest.mark.parametrize("name", registered(lambda cls: issubclass(cls, ParameterServerDriver) and cls.synchronous))
def test_steps_started_ahead_train_exactly_as_steps_started_in_turn(tmp_path, name, shared_cluster):
    strategy = made(registry.load(name), small_config(tmp_path, UNEQUAL, "dropout=0", *shared_cluster.overrides))
    try:
        strategy.start()
        trained = []
        for ahead in (True, False):
            strategy.reset(0)
            initial = strategy.weights()
            timings = [strategy.step(step, step + 1 if ahead and step < 3 else None) for step in range(4)]
            trained.append(strategy.weights())
            # a step queued ahead is timed from when the runner saw the previous one end, so one step can
            # read a little under its compute (that end seen late); the steps still add up to the run
            assert all(t.total_s > 0 and min(t.compute_s.values()) > 0 for t in timings)
            assert sum(t.total_s for t in timings) >= sum(max(t.compute_s.values()) for t in timings)
    finally:
        strategy.close()
    assert not torch.equal(trained[0], initial)  # it did train
    assert torch.equal(trained[0], trained[1])
