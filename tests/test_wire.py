"""wire_dtype: what crosses between machines by value, in float32, bfloat16 or float16; masters stay float32."""

import json

import pytest
import torch

from helpers import UNEQUAL, cnn, first_update, small_config
from hetbench.gradients import from_wire, to_wire
from hetbench.runner import run
from hetbench.strategies import registry


def test_float32_travels_as_itself_and_narrower_wires_round_once():
    flat = torch.randn(1000)
    same = to_wire(flat, "float32")
    assert same.ctypes.data == flat.data_ptr() and torch.equal(from_wire(same), flat)  # no copy either way
    for dtype, bits in (("bfloat16", 8), ("float16", 11)):
        wire = to_wire(flat, dtype)
        back = from_wire(wire)
        assert wire.nbytes == 2000 and back.dtype == torch.float32
        assert torch.equal(back, flat.to(getattr(torch, dtype)).float())
        # half a unit in the last place: relative above the smallest normal, absolute below it
        # (randn draws a float16 subnormal, |x| < 6.1e-5, in about one run of twenty)
        scale = flat.abs().clamp(min=torch.finfo(getattr(torch, dtype)).tiny)
        assert ((back - flat).abs() <= scale * 2.0**-bits).all()


@pytest.mark.parametrize("name", [pytest.param("ray-train", marks=pytest.mark.slow), "ray-localsgd", "torch-ddp"])
def test_a_bfloat16_wire_moves_the_first_step_by_its_rounding_only(tmp_path, name, shared_cluster):
    sgd = [
        "dropout=0",
        UNEQUAL,
        *shared_cluster.overrides,
        "optimizer=sgd",
        "lr=0.05",
        "ray-localsgd.sync_every=1",
        "ray-localsgd.outer_lr=1.0",
    ]
    sgd += ["ray-localsgd.outer_momentum=0.0", "eval_every=1", "steps=1", "warmup_steps=0", "repeats=1"]
    expected = first_update(registry.load("single"), small_config(tmp_path, *sgd))
    got = first_update(registry.load(name), small_config(tmp_path, *sgd, "wire_dtype=bfloat16"))
    difference = (got - expected).abs().max()
    assert 0 < difference < 1e-3, difference  # narrowed for real, yet the same step


def test_records_say_what_each_worker_moves_a_step(tmp_path, shared_cluster):
    cfg = small_config(
        tmp_path,
        *shared_cluster.overrides,
        "strategies=[single, ray-localsgd]",
        UNEQUAL,
        "wire_dtype=bfloat16",
        "ray-localsgd.sync_every=2",
        "steps=4",
        "warmup_steps=0",
        "repeats=1",
        "eval_every=4",
        "floor.enabled=false",
    )
    _, local_sgd = json.loads(run(cfg).path.read_text())
    # an exchange every 2 steps: the delta up and the weights down, 2 bytes a parameter
    assert [w["wire_bytes_per_step"] for w in local_sgd["workers"]] == [cnn().parameters * 2] * 2
    assert local_sgd["floor_transfers"] == 0.5  # in float32 all-reduces of the model: 2 transfers / 2 steps / 2
    assert local_sgd["step"]["exchange_every"] == 2  # its step figures are a round's mean
