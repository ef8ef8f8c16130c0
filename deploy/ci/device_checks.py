"""gpu-check.sh's checks that need Python: each runs on DEVICE (cuda, or cpu in CI) and prints one
`ok:` line per finding, or raises.

    python deploy/ci/device_checks.py {wire,allreduce,ddp} DEVICE
"""

from __future__ import annotations

import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.multiprocessing as mp

from hetbench.cluster.ray_connection import use_ray_defaults
from hetbench.config import RunConfig, load_config
from hetbench.devices import resolve_device, synchronize
from hetbench.gradients import WIRE_DTYPES, FlatModel, from_wire, to_wire, weighted_allreduce
from hetbench.strategies import registry
from hetbench.workload import load_workload

SHARES = [0.625, 0.375]  # batches 40 and 24 of 64
STRICT_FP32 = "import torch\ntorch.backends.cudnn.allow_tf32 = False\ntorch.backends.cuda.matmul.allow_tf32 = False\n"
TOLERANCE = {"float32": 0.0, "bfloat16": 2**-8, "float16": 2**-11}  # relative rounding of each wire dtype


def wire(device: torch.device) -> None:
    """The model's flat weights on `device`, to the wire and back, in every wire dtype; loaded into a model there."""
    cnn = load_workload(RunConfig())
    flat = FlatModel(cnn.build_model(0).to(device))
    sent = flat.params.cpu()
    for name, dtype in WIRE_DTYPES.items():
        back = from_wire(to_wire(flat.params, name))
        normal = sent.abs() >= torch.finfo(dtype).tiny  # below it float16 keeps only an absolute precision
        error = ((back - sent).abs()[normal] / sent.abs()[normal]).max().item()
        assert error <= TOLERANCE[name], f"{name}: relative error {error:.2e} beyond {TOLERANCE[name]:.2e}"
        assert torch.allclose(back, sent, rtol=TOLERANCE[name], atol=torch.finfo(dtype).tiny), name
        target = FlatModel(cnn.build_model(1).to(device))
        target.load_params(back.to(device))
        synchronize(device)
        assert torch.equal(target.params.cpu(), back), f"{name}: the weights loaded on {device} differ"
        print(f"ok: wire {name}: {device} -> wire -> {device}, relative error {error:.1e}")


def _rank(rank: int, device: str, dtype: str, out: str) -> None:
    import torch.distributed as dist

    init = f"file://{out}/store"  # the ranks meet at a file: no free port to find and lose
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        grads = torch.full((1000,), float(rank + 1), device=device)
        reduced = weighted_allreduce(grads, SHARES[rank], dtype).wait()
        torch.save(reduced.cpu(), f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def allreduce(device: torch.device) -> None:
    """gloo's weighted all-reduce of a `device` tensor between two processes, in every wire dtype."""
    expected = SHARES[0] * 1.0 + SHARES[1] * 2.0
    for dtype in WIRE_DTYPES:
        with tempfile.TemporaryDirectory() as out:
            mp.start_processes(_rank, args=(str(device), dtype, out), nprocs=2, start_method="spawn")
            for rank in range(2):
                got = torch.load(f"{out}/{rank}.pt")
                assert torch.allclose(got, torch.full_like(got, expected), rtol=TOLERANCE[dtype] * 2), (dtype, got[:3])
        print(f"ok: gloo all-reduce of {device} tensors, {dtype} wire: {expected} on both ranks")


def ddp(device: torch.device) -> None:
    """torch-ddp with two `device` workers (40 + 24 samples) against `single` on 64, after 5 steps."""
    use_ray_defaults()
    with tempfile.TemporaryDirectory() as results:
        if device.type == "cuda":
            strict_fp32(results)
        workers = f"workers=[{{name: a, batch: 40, device: {device}}}, {{name: b, batch: 24, device: {device}}}]"
        cfg = load_config(None, [workers, "dropout=0", "download=false", f"results_dir={results}"], registry.declared())
        made = {name: registry.load(name) for name in (registry.BASELINE, "torch-ddp")}
        weights = {name: five_steps(cls(cfg.job(name))) for name, cls in made.items()}
    gap = (weights["torch-ddp"] - weights[registry.BASELINE]).abs().max().item()
    assert gap < 1e-4, f"torch-ddp's weights differ from single's by {gap:.2e} after 5 steps"
    print(f"ok: torch-ddp on two {device} workers = single on {device} after 5 steps (largest gap {gap:.1e})")


def strict_fp32(folder: str) -> None:
    """TF32 off here and in every process started from here (the Ray workers, through sitecustomize).
    cuDNN convolves in TF32 by default on Ampere and later, which alone moves two ranks' weights
    past the check's tolerance from one batch's (docs/performance.md, "On a GPU")."""
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(STRICT_FP32)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))
    exec(STRICT_FP32)  # and here, where single runs


def five_steps(strategy) -> torch.Tensor:
    try:
        strategy.start()
        strategy.reset(0)
        for step in range(5):
            strategy.step(step)
        return strategy.weights()
    finally:
        strategy.close()


if __name__ == "__main__":
    check, spec = sys.argv[1], sys.argv[2]
    os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "0")
    {"wire": wire, "allreduce": allreduce, "ddp": ddp}[check](resolve_device(spec))
