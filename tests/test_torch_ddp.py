"""torch-ddp: DDP's own gloo group between the ranks, with hetbench's gradient rule in its comm hook."""

import statistics

import torch

from helpers import UNEQUAL, cnn, made, small_config
from hetbench.gradients import powersgd_fraction
from hetbench.runner import run
from hetbench.strategies import registry


def weights_after(cfg, name: str, steps: list[int], before_step=None) -> list[torch.Tensor]:
    """Strategy `name`'s weights after each of `steps`, from a fresh start; `before_step(strategy, step)`
    runs before every step."""
    strategy, weights = made(registry.load(name), cfg), []
    try:
        strategy.start()
        strategy.reset(cfg.run.seed)
        for step in range(max(steps) + 1):
            if before_step:
                before_step(strategy, step)
            strategy.step(step)
            if step in steps:
                weights.append(strategy.weights())
        return weights
    finally:
        strategy.close()


def test_a_resplit_keeps_every_step_the_single_device_step_on_the_union_batch(tmp_path, shared_cluster):
    # the hook weights by the batches the ranks hold now, so a new split changes no update
    cfg = small_config(tmp_path, UNEQUAL, "dropout=0", "optimizer=sgd", "lr=0.05", *shared_cluster.overrides)

    def resplit(strategy, step):
        if step == 2:
            strategy._set_split([16, 48])
            strategy.push_split()

    (ddp,) = weights_after(cfg, "torch-ddp", [3], resplit)
    (single,) = weights_after(cfg, "single", [3])
    # four steps summed in another order drift ~1.6e-5 with or without the re-split (the weights move ~1e-2)
    assert torch.allclose(ddp, single, atol=1e-4, rtol=0), (ddp - single).abs().max()


def test_a_slowed_rank_is_slowed_in_its_compute_and_the_fast_rank_waits_outside_its_own(tmp_path, shared_cluster):
    workers = "workers=[{name: fast, batch: 32}, {name: slow, batch: 32, slowdown: 4.0}]"
    strategy = made(registry.load("torch-ddp"), small_config(tmp_path, workers, *shared_cluster.overrides))
    try:
        strategy.start()
        strategy.reset(0)
        timings = [strategy.step(step) for step in range(6)][1:]
        # each rank on the interface toward rank 0's node address (both nodes share this machine's)
        assert [w["gloo_interface"] for w in strategy.worker_info()] == [shared_cluster.interface] * 2
    finally:
        strategy.close()
    fast, slow = (statistics.median(t.compute_s[name] for t in timings) for name in ("fast", "slow"))
    assert slow > 2 * fast  # the emulated wait lands in the slow rank's compute, bucket by bucket
    assert all(t.wait_s > 0 and t.total_s >= t.compute_s["slow"] for t in timings)


def test_powersgd_steps_as_the_rule_until_it_starts_then_records_the_share_it_sends(tmp_path, shared_cluster):
    powersgd = ["torch-ddp.compression=powersgd", "torch-ddp.powersgd_rank=1", "torch-ddp.powersgd_start=3"]
    # dropout on: its masks follow the samples, so the plain steps still match single's
    sgd = [UNEQUAL, "optimizer=sgd", "lr=0.05", "strategies=[single, torch-ddp]", "floor.enabled=false"]
    cfg = small_config(tmp_path, *sgd, *powersgd, "steps=6", "warmup_steps=0", "repeats=1", *shared_cluster.overrides)
    ddp, single = (weights_after(cfg, name, [2, 5]) for name in ("torch-ddp", "single"))
    # steps 0-2 are PowerSGD's plain all-reduces (it starts at 3), weighted as ever; from step 3 on rank-1 factors
    assert torch.allclose(ddp[0], single[0], atol=1e-4, rtol=0)
    assert (ddp[1] - single[1]).abs().max() > 1e-3
    (row,) = [r for r in run(cfg).records if r.strategy == "torch-ddp"]
    fraction = powersgd_fraction(cnn().build_model(0), 1)
    assert 0.005 < fraction < 0.02 and row.floor_transfers == fraction  # ~100x less than the model
    model_bytes = cnn().parameters * 4
    assert [w.wire_bytes_per_step for w in row.workers] == [fraction * model_bytes] * 2
    assert "PowerSGD at rank 1" in row.table_note and "from step 3" in row.table_note
    assert row.config.of("torch-ddp").compression == "powersgd"
