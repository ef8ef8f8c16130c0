"""The device gate (`hetbench devices --require DEVICE`, compose's gpu-check): a device passes only
when the model trains on it. Resolving `cuda` is not enough: torch 2.13's wheel is built for CUDA 13,
which needs an NVIDIA driver 580 or newer and a Turing (compute capability 7.5) or newer GPU, and an
old driver shows up only as "no CUDA device". Each refusal is one sentence with its fix."""

from __future__ import annotations

import platform
import shutil
import subprocess

import torch

from hetbench.config import RunConfig
from hetbench.devices import (
    AUTOCAST,
    check_precision,
    describe,
    mps_available,
    precision_problem,
    resolve_device,
    synchronize,
)
from hetbench.errors import UserError
from hetbench.workload import dropout_keys, load_workload

MIN_DRIVER = 580  # CUDA 13's minimum Linux driver branch
MIN_CAPABILITY = (7, 5)  # CUDA 13 dropped Maxwell, Pascal and Volta


def nvidia_smi(index: int = 0) -> dict | None:
    """GPU `index`'s name, driver and compute capability as the driver reports them; None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.splitlines()
    if index >= len(lines):
        return None
    name, driver, capability = (part.strip() for part in lines[index].split(","))
    return {"name": name, "driver": driver, "capability": capability}


def check_driver(gpu: dict | None) -> None:
    """Refuse, with the fix, an NVIDIA driver or GPU that torch's CUDA build cannot use."""
    if gpu is None:
        return
    major = int(gpu["driver"].split(".")[0])
    if major < MIN_DRIVER:
        raise UserError(
            f"the NVIDIA driver here is {gpu['driver']} and torch {torch.__version__}'s CUDA "
            f"{torch.version.cuda or 13} needs {MIN_DRIVER} or newer: install a {MIN_DRIVER}+ driver on the host "
            "(e.g. apt install nvidia-driver-580), reboot, and start again"
        )
    capability = tuple(int(x) for x in gpu["capability"].split("."))
    if capability < MIN_CAPABILITY:
        raise UserError(
            f"{gpu['name']} is compute capability {gpu['capability']} and torch {torch.__version__}'s CUDA build "
            f"needs {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} (Turing) or newer: run the desk on its CPU "
            "(DESK_DEVICE=cpu with compose.cpu.yaml)"
        )


def require(spec: str, read_gpu=nvidia_smi, fix: str | None = None, precision: str = "fp32") -> list[str]:
    """The gate: `spec` resolved, the driver and GPU checked where it is CUDA, why MPS is missing where
    it is MPS, `precision` checked there, one forward and backward pass of the model run there in it.
    What it found, as lines to print (the first names the precisions it has); one sentence if it refuses,
    ending in `fix` where given (the Mac's: join on its CPU)."""
    spec = spec.strip().lower()
    cuda, gpu = spec.startswith("cuda"), None
    if spec == "mps" and not mps_available():
        raise UserError(f"MPS is not available here: {why_no_mps()}" + (f"; {fix}" if fix else ""))
    if cuda:
        gpu = read_gpu(int(spec.partition(":")[2] or 0))
        if torch.version.cuda is None:
            raise UserError(
                f"this torch ({torch.__version__}) is a CPU build and cannot use '{spec}': "
                "install torch's CUDA build (the image's default TORCH_INDEX_URL)"
            )
        check_driver(gpu)
        if torch.cuda.device_count() == 0:
            raise UserError(
                f"no CUDA device is visible here and '{spec}' was asked for: on the desktop, install the NVIDIA "
                "container toolkit and run `nvidia-ctk runtime configure --runtime=docker`, then restart Docker"
            )
    device = resolve_device(spec)
    try:
        check_precision(device, precision, "this machine")
        trained(device, precision)
    except UserError as e:
        raise UserError(f"{e}; {fix}" if fix else str(e)) from None
    has = ", ".join(p for p in ("fp32", "tf32", *AUTOCAST) if precision_problem(device, p) is None)
    found = [
        f"{spec}: {describe(device)} trains the model in {precision} (one forward and backward pass; it has {has})"
    ]
    if cuda:
        major, minor = torch.cuda.get_device_capability(device)
        driver = gpu["driver"] if gpu else "unknown (no nvidia-smi)"
        found.append(f"torch {torch.__version__}, CUDA {torch.version.cuda}, driver {driver}, compute {major}.{minor}")
    return found


def why_no_mps() -> str:
    if platform.system() != "Darwin":
        return f"this is {platform.system()}, and MPS is Apple's (macOS 14 or newer on Apple Silicon)"
    if not torch.backends.mps.is_built():
        return "this torch was built without it (deploy/install.sh installs torch's macOS arm64 wheel)"
    return "macOS gives torch no Metal device (MPS needs macOS 14 or newer on Apple Silicon, not in a VM)"


def trained(device: torch.device, precision: str = "fp32") -> None:
    """One forward and backward pass of the model on `device` in `precision`, on a small random batch;
    a finite gradient."""
    try:
        workload = load_workload(RunConfig())  # the built-in CNN: a model only, no data loaded
        model = workload.build_model(0).to(device)
        images, labels = torch.randn(8, 1, 28, 28, device=device), torch.randint(0, 10, (8,), device=device)
        keys = dropout_keys(0, 0, torch.arange(8, device=device))
        workload.forward_backward(model, images, labels, keys, precision)
        synchronize(device)
        finite = all(torch.isfinite(p.grad).all().item() for p in model.parameters())
    except RuntimeError as e:  # a kernel the device cannot run ("no kernel image", out of memory, ...)
        raise UserError(f"the model does not train on {device}: {str(e).strip().splitlines()[0]}") from None
    if not finite:
        raise UserError(f"the model's gradient on {device} is not finite: the device computes wrongly")
