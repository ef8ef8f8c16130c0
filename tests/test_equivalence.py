"""The update rule, strategy by strategy: with dropout 0 and unequal batches (40 + 24), the first
synchronous update of every distributed strategy equals one single-device step on the union batch."""
import pytest
import ray
import torch

from hetbench.strategies.dask_sync import DaskSync
from hetbench.strategies.ray_ps import RayParameterServer
from hetbench.strategies.ray_train_gloo import RayTrainGloo
from hetbench.strategies.single import Single
from tests.conftest import small_config

UNEQUAL = "workers=[{name: big, batch: 40}, {name: small, batch: 24}]"


def first_update(strategy_cls, cfg) -> torch.Tensor:
    strategy = strategy_cls(cfg)
    try:
        strategy.start()
        strategy.reset(cfg["seed"])
        strategy.step(0)
        return strategy.weights()
    finally:
        strategy.close()


@pytest.mark.parametrize("strategy_cls", [RayParameterServer, RayTrainGloo, DaskSync])
def test_first_update_equals_the_single_device_step_on_the_union_batch(tmp_path, strategy_cls):
    cfg = small_config(tmp_path, "dropout=0", UNEQUAL, "eval_every=1", "steps=1", "warmup_steps=0", "repeats=1")
    expected = first_update(Single, cfg)
    got = first_update(strategy_cls, cfg)
    assert not ray.is_initialized()  # close() shut any private Ray instance down
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()


@pytest.mark.parametrize("strategy_cls", [RayParameterServer, DaskSync])
def test_steps_started_ahead_train_exactly_as_steps_started_in_turn(tmp_path, strategy_cls):
    strategy = strategy_cls(small_config(tmp_path, UNEQUAL, "dropout=0"))
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
