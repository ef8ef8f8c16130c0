"""ray-localsgd: replicas that exchange every sync_every steps, and nothing in between."""

import torch

from helpers import UNEQUAL, made, small_config
from hetbench.strategies import registry


def trained(name: str, cfg: dict, steps: int) -> list[torch.Tensor]:
    """The weights `name` reports at the start, then after each of its first `steps` steps."""
    strategy = made(registry.load(name), cfg)
    try:
        strategy.start()
        strategy.reset(cfg.run.seed)
        weights = [strategy.weights()]
        for step in range(steps):
            strategy.step(step)
            weights.append(strategy.weights())
        return weights
    finally:
        strategy.close()


def test_an_exchange_every_step_with_plain_averaging_is_the_single_device_trajectory(tmp_path, shared_cluster):
    # SGD's update is linear in the gradient (momentum too), so averaging replicas that each took
    # one step from the same weights is one step on the union batch, step after step
    cfg = small_config(
        tmp_path,
        UNEQUAL,
        "dropout=0",
        "optimizer=sgd",
        "lr=0.05",
        "ray-localsgd.sync_every=1",
        "ray-localsgd.outer_lr=1.0",
        "ray-localsgd.outer_momentum=0.0",
        *shared_cluster.overrides,
    )
    for got, expected in zip(trained("ray-localsgd", cfg, 3), trained("single", cfg, 3), strict=True):
        assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()


def test_the_server_weights_change_only_at_each_rounds_last_step(tmp_path, shared_cluster):
    cfg = small_config(tmp_path, UNEQUAL, "ray-localsgd.sync_every=3", *shared_cluster.overrides)
    before, *after = trained("ray-localsgd", cfg, 6)
    changed = [not torch.equal(a, b) for a, b in zip([before, *after], after)]
    assert changed == [False, False, True, False, False, True]
