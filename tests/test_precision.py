"""Mixed precision: the forward and the loss under autocast on every worker's device, alike in every
row; fp16's loss scale divided out where the update runs, and a step whose gradient overflows skipped
there, so single, a parameter server and every DDP rank skip the same steps."""

import pytest
import torch

from helpers import UNEQUAL, made, small_config, weights_after
from hetbench.gradients import FlatModel
from hetbench.strategies import registry
from hetbench.workload import load_workload

FIVE = ["eval_every=1", "steps=5", "warmup_steps=0", "repeats=1"]


def loss_on_test_images(cfg, weights: torch.Tensor) -> float:
    """The model's mean loss on 256 test images at `weights`, in float32."""
    workload = load_workload(cfg.run)
    flat = FlatModel(workload.build_model(0).eval())
    flat.load_params(weights)
    inputs, labels = workload.test_split().tensors("cpu")
    with torch.no_grad():
        return float(workload.loss(flat.model(workload.prepare(inputs[:256])), labels[:256]))


def test_bf16_trains_through_single_and_torch_ddp_near_fp32(tmp_path, shared_cluster):
    def config(precision: str):
        return small_config(tmp_path, UNEQUAL, *FIVE, f"precision={precision}", *shared_cluster.overrides)

    fp32, bf16 = config("fp32"), config("bf16")
    single32 = weights_after("single", fp32, 5)[0]
    single16, info = weights_after("single", bf16, 5)
    ddp16 = weights_after("torch-ddp", bf16, 5)[0]
    assert info[0]["precision"] == "bf16"
    assert not torch.equal(single16, single32)  # autocast ran: its matmuls rounded to bfloat16
    assert (single16 - single32).abs().max() < 0.05  # five steps on the same batches: close to fp32's
    # each rank's shares round in bfloat16 as the whole batch does, up to the sums over the batch
    assert (ddp16 - single16).abs().max() < 0.02, (ddp16 - single16).abs().max()
    start = loss_on_test_images(fp32, FlatModel(load_workload(fp32.run).build_model(fp32.run.seed)).params)
    losses = [loss_on_test_images(fp32, w) for w in (single32, single16, ddp16)]
    assert all(loss < start for loss in losses), (start, losses)  # each trained
    assert all(abs(loss - losses[0]) < 0.05 * losses[0] for loss in losses), losses


@pytest.mark.parametrize("name", ["single", "ray-ps", "torch-ddp"])
def test_an_fp16_step_that_overflows_is_skipped_alike_with_its_schedule(tmp_path, name, shared_cluster):
    """A loss scale of 1e30 overflows float16 in every backward: no row takes a step, and the schedule
    stays where it was (ray-ps streams no parameter in fp16: the check needs the whole gradient)."""
    overflow = ["precision=fp16", "loss_scale=1.0e+30", "workload=tiny_workload:scheduled", "dropout=0"]
    cfg = small_config(tmp_path, UNEQUAL, *FIVE, *overflow, *shared_cluster.overrides)
    strategy = made(registry.load(name), cfg)
    try:
        strategy.start()
        strategy.reset(cfg.run.seed)
        initial, rate = strategy.weights(), strategy.learning_rate()
        for step in range(3):
            strategy.step(step)
        assert torch.equal(strategy.weights(), initial)
        assert strategy.learning_rate() == rate
    finally:
        strategy.close()


def test_fp16_with_a_loss_scale_that_fits_trains_as_fp32_does(tmp_path, shared_cluster):
    def config(*precision: str):
        return small_config(tmp_path, UNEQUAL, *FIVE, *precision, *shared_cluster.overrides)

    single32 = weights_after("single", config(), 5)[0]
    single16 = weights_after("single", config("precision=fp16", "loss_scale=1024"), 5)[0]
    assert not torch.equal(single16, single32) and (single16 - single32).abs().max() < 0.05
