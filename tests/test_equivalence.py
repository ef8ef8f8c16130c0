"""The update rule, strategy by strategy (every registered synchronous one): with dropout (keyed by
sample) and unequal batches (40 + 24), the first update equals one single-device step on the union batch.
On the session's shared cluster: the fast tier's proof that every strategy computes the same step."""

import pytest
import torch

from helpers import (
    UNEQUAL,
    check_first_update_is_the_union_batch_step,
    made,
    registered,
    small_config,
    weights_after,
)
from hetbench.strategies import registry
from hetbench.strategies.parameter_server import ParameterServerDriver


@pytest.mark.parametrize("name", registered(lambda cls: cls.distributed and cls.synchronous))
def test_first_update_equals_the_single_device_step_on_the_union_batch(tmp_path, name, shared_cluster):
    check_first_update_is_the_union_batch_step(tmp_path, name, shared_cluster)


@pytest.mark.parametrize("name", registered(lambda cls: cls.distributed and cls.synchronous))
def test_a_users_workload_takes_the_same_step_through_every_strategy(tmp_path, name, shared_cluster):
    # tests/tiny_workload.py: its own model, data and optimizer, imported by module:function everywhere
    check_first_update_is_the_union_batch_step(tmp_path, name, shared_cluster, "workload=tiny_workload:build")


@pytest.mark.parametrize("name", registered(lambda cls: cls.distributed and cls.synchronous))
def test_a_model_returning_logits_and_an_aux_loss_takes_the_same_step_through_every_strategy(
    tmp_path, name, shared_cluster
):
    check_first_update_is_the_union_batch_step(tmp_path, name, shared_cluster, "workload=tiny_workload:with_aux")


def test_a_model_returning_an_object_with_logits_takes_the_same_step_through_torch_ddp(tmp_path, shared_cluster):
    logits = "workload=tiny_workload:with_logits"  # Hugging Face's way: an object whose .logits are the scores
    check_first_update_is_the_union_batch_step(tmp_path, "torch-ddp", shared_cluster, logits)


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


GROUP_ROWS = {  # the rows that form a torch.distributed group, and their settings
    "torch-ddp": [],
    "torch-ddp-powersgd": ["torch-ddp.compression=powersgd", "torch-ddp.powersgd_start=6"],  # its hook, plain
    "ray-train": [],
}


@pytest.mark.parametrize(
    "row, collective",
    [
        pytest.param(
            row,
            collective,
            id=f"{row}-{collective}",
            # Ray Train's gloo group forms in the fast tier's first-update test; five steps of it are slow tier
            marks=pytest.mark.slow if (row, collective) == ("ray-train", "gloo") else (),
        )
        for row in GROUP_ROWS
        for collective in ("gloo", "tcp")
    ],
)
def test_five_steps_in_a_group_of_either_backend_equal_single_s(tmp_path, row, collective, shared_cluster):
    five = ["eval_every=1", "steps=5", "warmup_steps=0", "repeats=1", f"cluster.collective={collective}"]
    cfg = small_config(tmp_path, UNEQUAL, *five, *GROUP_ROWS[row], *shared_cluster.overrides)
    (single, _), (grouped, info) = (weights_after(name, cfg, 5) for name in ("single", row.split("-powersgd")[0]))
    assert [w["collective"] for w in info] == [collective] * 2
    assert torch.allclose(grouped, single, atol=1e-4, rtol=0), (grouped - single).abs().max()


def test_powersgd_compresses_alike_over_gloo_and_the_tcp_group(tmp_path, shared_cluster):
    # from step 2 the hook all-reduces low-rank factors in chained callbacks: the same math on either
    powersgd = ["torch-ddp.compression=powersgd", "torch-ddp.powersgd_rank=2", "torch-ddp.powersgd_start=2"]
    trained = []
    for collective in ("gloo", "tcp"):
        five = ["eval_every=1", "steps=5", "warmup_steps=0", "repeats=1", f"cluster.collective={collective}"]
        cfg = small_config(tmp_path, UNEQUAL, *five, *powersgd, *shared_cluster.overrides)
        trained.append(weights_after("torch-ddp", cfg, 5)[0])
    single = weights_after("single", cfg, 5)[0]
    assert (trained[0] - single).abs().max() > 1e-3  # it did compress
    assert torch.allclose(trained[0], trained[1], atol=1e-4, rtol=0), (trained[0] - trained[1]).abs().max()
