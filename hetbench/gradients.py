"""How gradients and weights travel: one flat float32 buffer each, and the one synchronous update rule."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import nn


class FlatModel:
    """Re-homes a model's parameters and gradients as views of two contiguous buffers.

    `params` and `grads` are then whole-model tensors: sending, averaging or loading
    weights is one memcpy, with no per-parameter objects or Python loops on the hot path.
    """

    def __init__(self, model: nn.Module, params_in: torch.Tensor | None = None) -> None:
        """`params_in`: a buffer (on the model's device) to keep the weights in, e.g. shared memory."""
        self.model = model
        params = [p for p in model.parameters() if p.requires_grad]
        device = params[0].device
        self.params = torch.cat([p.detach().reshape(-1) for p in params]).to(device)
        if params_in is not None:
            self.params = params_in.copy_(self.params)
        self.grads = torch.zeros_like(self.params)
        self.spans: list[tuple[nn.Parameter, int, int]] = []  # each parameter, its offset and size in the buffers
        offset = 0
        for p in params:
            n = p.numel()
            p.data = self.params[offset : offset + n].view_as(p)
            p.grad = self.grads[offset : offset + n].view_as(p)
            self.spans.append((p, offset, n))
            offset += n

    def optimizer_params(self) -> list[nn.Parameter]:
        """What the optimizer steps: the model's trainable parameters as the model has them, views of
        the flat buffers. Shaped as written, an optimizer that reads a tensor whole (Adafactor's
        factored rows and columns, a layer-wise trust ratio) steps as it would in the user's loop,
        in as many kernels. (1 MB chunks of the buffer measured no faster here: 2.21-2.29 against
        2.30-2.34 ms for Adadelta's step with cold caches, one thread; 1.33-1.43 against 1.32-1.38, two.)"""
        return [p for p, _, _ in self.spans]

    def zero_grad(self) -> None:
        # In place: autograd then accumulates into our views (optimizer.zero_grad would drop them).
        self.grads.zero_()

    def load_params(self, flat: torch.Tensor) -> None:
        self.params.copy_(flat, non_blocking=copies_ahead_safely(flat, self.params))


def copies_ahead_safely(source: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether copying `source` into `target` may return before the copy is done: only from pinned
    memory to CUDA, where torch keeps the pinned block until the copy has read it. From pageable
    memory CUDA copies synchronously anyway; on MPS a non-blocking copy can read a temporary source
    after it was freed (a bf16 wire's float32 conversion, an array from ray.get: pytorch/pytorch#189690)."""
    return target.device.type == "cuda" and source.device.type == "cpu" and source.is_pinned()


def weighted_sum(
    grads: Sequence[torch.Tensor], weights: Sequence[float], out: torch.Tensor | None = None
) -> torch.Tensor:
    """sum(w_i * g_i) in one output buffer, no temporaries beyond it.

    With w = batch_shares(b) this is the synchronous update rule: each worker's gradient is
    d(mean loss over its b_i samples), and weighting by b_i / sum(b) gives d(mean loss over the
    union batch), i.e. one single-device step on b1+...+bn samples.
    """
    wrong = [g.numel() for g in grads if out is not None and g.numel() != out.numel()]
    if wrong:  # torch would resize `out` to fit: the model's gradients would silently come apart from it
        raise ValueError(f"a gradient of {wrong[0]:,} values, where the model has {out.numel():,}")
    combined = torch.mul(grads[0], weights[0], out=out)
    for grad, w in zip(grads[1:], weights[1:]):
        combined.add_(grad, alpha=w)
    return combined


def batch_shares(samples: Sequence[int]) -> list[float]:
    """b_i / B per worker: the weights of the rule (and what an all-reduce SUM pre-scales by)."""
    total = float(sum(samples))
    return [n / total for n in samples]


WIRE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def weighted_allreduce(grads: torch.Tensor, share: float, wire_dtype: str, staging: torch.Tensor | None = None):
    """The rule as one collective over the process group: grads x my share b_i/B (in place, in
    float32, where they are), staged on CPU in the wire dtype (gloo takes no MPS tensors), SUM.

    Returns a future of the sample-weighted mean on grads' device and dtype. `staging`: a CPU
    buffer in the wire dtype to reuse, else one is made per call.
    """
    import torch.distributed as dist

    grads.mul_(share)
    staged = staging.copy_(grads) if staging is not None else grads.to("cpu", WIRE_DTYPES[wire_dtype])
    reduced = dist.all_reduce(staged, async_op=True).get_future()
    return reduced.then(lambda done: done.value()[0].to(grads.device, grads.dtype))


def weighted_powersgd(bucket, share: float, state, staging: torch.Tensor | None = None):
    """The rule through torch's own PowerSGD hook (low-rank factors, its error feedback): the bucket
    x my share x the world size, since the hook averages, so its mean is the sample-weighted mean.

    `staging`: a float32 CPU buffer of the bucket's size where gloo cannot take the bucket's tensors
    (MPS): the hook then runs on a CPU copy. Returns a future of the result on the bucket's device.
    """
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    grads = bucket.buffer()
    grads.mul_(share * dist.get_world_size())
    if staging is None:
        return powerSGD_hook(state, bucket)
    return powerSGD_hook(state, StagedBucket(bucket, staging)).then(lambda done: done.value().to(grads.device))


class StagedBucket:
    """A DDP bucket as torch's hooks read it (buffer, per-parameter views, index, is_last), over a
    CPU copy of its buffer."""

    def __init__(self, bucket, staging: torch.Tensor) -> None:
        self.bucket, self.staged = bucket, staging.copy_(bucket.buffer())
        self.views, offset = [], 0
        for grad in bucket.gradients():  # the bucket's buffer is its gradients end to end, in order
            self.views.append(self.staged[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def buffer(self) -> torch.Tensor:
        return self.staged

    def gradients(self) -> list[torch.Tensor]:
        return self.views

    def index(self) -> int:
        return self.bucket.index()

    def is_last(self) -> bool:
        return self.bucket.is_last()

    def parameters(self) -> list[torch.Tensor]:
        return self.bucket.parameters()


def powersgd_fraction(model: nn.Module, rank: int, min_compression_rate: float = 2) -> float:
    """The share of the model's elements PowerSGD's hook sends per step: an n x m gradient (a
    parameter's first dimension by the rest) goes as rank-k factors, (n + m) k elements, where that
    is `min_compression_rate` times smaller, else whole (the hook's own rule)."""
    sent = total = 0
    for p in model.parameters():
        n = p.shape[0]
        m = p.numel() // n
        k = min(n, m, rank)
        compressed = (n + m) * k
        sent += compressed if compressed * min_compression_rate < n * m else n * m
        total += n * m
    return sent / total


def to_wire(flat: torch.Tensor, wire_dtype: str):
    """A flat buffer as it leaves for another process by value: a CPU numpy array in `wire_dtype`
    (float32: the buffer itself, no copy). numpy has no bfloat16: its bits travel as int16."""
    return wire_array(flat.detach().to("cpu", WIRE_DTYPES[wire_dtype]))


def wire_array(wire: torch.Tensor):
    """A CPU tensor in a wire dtype as the numpy array that travels (its memory, no copy)."""
    return (wire.view(torch.int16) if wire.dtype == torch.bfloat16 else wire).numpy()


def from_wire(array) -> torch.Tensor:
    """to_wire's array back as float32 (zero-copy when it travelled as float32): masters stay float32."""
    wire = from_buffer(array)
    return (wire.view(torch.bfloat16) if wire.dtype == torch.int16 else wire).to(torch.float32)


def from_buffer(array) -> torch.Tensor:
    """A tensor over a (read-only, zero-copy) numpy buffer from an object store; callers only read it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def count_parameters(model: nn.Module) -> int:
    """The trainable parameters: what FlatModel's buffers hold and every strategy moves (a frozen
    layer is built alike from the seed on every process and never sent)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
