"""The one formula of a step's speed, and its inversions: each inverts the formula."""

import pytest

from hetbench.step_rate import (
    allreduce_that_pays,
    batch_that_pays,
    fewer_bytes_that_pay,
    in_float32,
    samples_per_s,
    smallest_sync_every,
)


def test_a_step_is_its_compute_then_its_transfers_then_its_own_overhead():
    assert samples_per_s(128, 0.05) == pytest.approx(2560.0)
    assert samples_per_s(128, 0.05, 2.0, 0.005, 0.002) == pytest.approx(128 / 0.062)
    assert in_float32(2.0, 2) == 1.0 and in_float32(1.0, 4) == 1.0  # a bfloat16 wire moves half the bytes


def test_at_the_batch_or_link_that_pays_two_machines_tie_the_best_one_alone():
    one, together, allreduce = 1000.0, 1600.0, 0.03  # samples/s alone, the sum of both, one all-reduce
    batch = batch_that_pays(allreduce, one, together)
    split = batch / together  # the batch's compute across both machines, each on its share
    assert samples_per_s(batch, split, 1.0, allreduce) == pytest.approx(one)
    assert allreduce_that_pays(batch, one, together) == pytest.approx(allreduce)
    assert samples_per_s(2 * batch, 2 * batch / together, 1.0, allreduce) > one  # a larger batch pays


def test_the_fewest_steps_between_exchanges_beat_the_best_alone():
    # each local step leaves 4 ms of the best alone's step; an exchange takes 10 ms
    every = smallest_sync_every(0.010, 0.004)
    assert every == 3 and 0.010 / every < 0.004 <= 0.010 / (every - 1)
    assert smallest_sync_every(0.008, 0.004) == 3  # 2 would only tie: it must beat it
    assert smallest_sync_every(0.001, 0.004) == 1


def test_fewer_bytes_only_shrink_the_part_that_moves_with_them():
    # a 50 ms all-reduce of which 10 ms is fixed, to fit under 30 ms: 40 ms of bytes to 20, half
    assert fewer_bytes_that_pay(0.050, 0.030, 0.010) == pytest.approx(2.0)
