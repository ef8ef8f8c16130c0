"""Where math runs. Strategies never branch on device type; they call these."""

from __future__ import annotations

import contextlib
import ctypes
import os

import torch

from hetbench.cores import usable_cores
from hetbench.errors import UserError

AUTO = "auto"
NODE_DEVICE_ENV = "HETBENCH_NODE_DEVICE"  # the device a joined machine was checked on (cluster/worker.py)


def mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps and mps.is_available())


def available_devices() -> list[str]:
    """Every device this process can use, fastest kind first."""
    found = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if mps_available():
        found.append("mps")
    return found + ["cpu"]


def resolve_device(spec: str = AUTO) -> torch.device:
    """`auto` = cuda > mps > cpu; an explicit device must exist here. Call it where the math runs."""
    spec = (spec or AUTO).strip().lower()
    if spec == AUTO:
        return torch.device(available_devices()[0])
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise UserError(f"unknown device '{spec}': use auto, cpu, mps, cuda or cuda:N") from None
    if device.type == "cuda":
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise UserError(
                f"device '{spec}' is not available here (this machine has: {', '.join(available_devices())})"
            )
        return torch.device("cuda", index)
    if device.type == "mps" and not mps_available():
        raise UserError(f"device '{spec}' is not available here (this machine has: {', '.join(available_devices())})")
    if device.type not in ("cpu", "mps"):
        raise UserError(f"unknown device '{spec}': use auto, cpu, mps, cuda or cuda:N")
    return device


def node_device(name: str, configured: str) -> torch.device:
    """Where configured worker `name` trains on this node: as configured, unless the node joined with
    a device of its own (`hetbench worker --device`, MAC_DEVICE), which `auto` takes and another GPU
    kind contradicts: the machine's owner checked that one, and said so."""
    joined = os.environ.get(NODE_DEVICE_ENV, "").strip().lower()
    configured = (configured or AUTO).strip().lower()
    if joined and configured == AUTO:
        return resolve_device(joined)
    kind = configured.partition(":")[0]
    if joined and kind not in ("cpu", joined.partition(":")[0]):
        raise UserError(
            f"worker '{name}' is configured for {configured}, but its machine joined the cluster to train on "
            f"{joined} (MAC_DEVICE={joined}): set the same MAC_DEVICE in the desktop's .env and on the Mac"
        )
    return resolve_device(configured)


def device_memory_mb(device: torch.device) -> float | None:
    """What the device's allocator holds for this process, MiB: MPS's driver-allocated memory (taken
    from the machine's unified memory), CUDA's reserved; None on a CPU."""
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**20
    if device.type == "cuda":
        return torch.cuda.memory_reserved(device) / 2**20
    return None


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels so a clock read after it measures finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def gloo_takes(device: torch.device) -> bool:
    """Whether gloo's collectives take this device's tensors as they are (CPU and CUDA; not MPS)."""
    return device.type in ("cpu", "cuda")


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}  # mixed precisions: the dtype autocast computes in


def autocast(device: torch.device, precision: str):
    """The forward and the loss in `precision`'s dtype on `device` (torch.autocast: matmuls and
    convolutions in it, reductions and the loss in float32); fp32 and tf32: as they are."""
    if precision not in AUTOCAST:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST[precision])


def loss_scale_of(precision: str, loss_scale: float) -> float:
    """What the loss is multiplied by before backward: `loss_scale` in fp16 (whose small gradients
    would underflow), else 1 (bf16 has float32's range)."""
    return loss_scale if precision == "fp16" else 1.0


def precision_problem(device: torch.device, precision: str) -> str | None:
    """Why `device` cannot train in `precision`, as the end of a sentence; None where it can."""
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return f"{describe(device)} has no bfloat16 (Ampere, compute 8.0, and newer have it): use precision fp16"
    if precision == "bf16" and device.type == "mps" and not torch.backends.mps.is_macos_or_newer(14, 0):
        return "MPS has bfloat16 from macOS 14: update macOS, or use precision fp16"
    return None


def check_precision(device: torch.device, precision: str, who: str) -> None:
    """One sentence, before `who` (a worker, this machine) trains a step, where its device cannot run
    the run's precision."""
    why = precision_problem(device, precision)
    if why:
        raise UserError(f"{who} cannot train in {precision} on {device}: {why}")


def set_precision(precision: str) -> dict:
    """float32 math as `precision` says (run.precision), in this process, before its first kernel:
    fp32 turns TF32 off in cuDNN's convolutions and cuBLAS's matmuls (cuDNN's is on by default on
    Ampere and later, and two ranks' partial batches then round differently from one batch), tf32
    turns both on; bf16 and fp16 (autocast) keep what stays float32 at fp32's. What a worker's
    record keeps: the setting and cuDNN's autotuner's."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return {"precision": precision, "cudnn_benchmark": torch.backends.cudnn.benchmark}


def configure_threads(threads: int, processes_sharing_host: int = 1) -> None:
    """Set torch's intra-op threads: `threads`, or for 0 this host's usable cores split among its training processes."""
    torch.set_num_threads(threads or max(1, usable_cores() // processes_sharing_host))


def keep_freed_memory() -> None:
    """Let glibc keep freed heap memory for reuse instead of returning it to the OS at once.

    Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, which also pins large
    allocations to mmap: every step's activations are then mapped and page-faulted afresh, which
    slows the same forward+backward in a Dask worker (docs/design.md).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): nothing to undo
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's largest; allocations below it reuse the heap
    libc.mallopt(m_trim_threshold, 256 * 2**20)  # return memory only past this much free at the top
