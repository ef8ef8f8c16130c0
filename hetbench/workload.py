"""The one workload every strategy trains: the PyTorch MNIST example CNN and its optimizer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _int32(value: int) -> int:
    """`value`'s low 32 bits as a signed int32: the hash runs in int32, which every device has."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _mix(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 (C. Wellons' integer hash), a bijection of int32; the masks make the shifts logical."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * _int32(0x7FEB352D)
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * _int32(0x846CA68B)
    return x ^ ((x >> 16) & 0xFFFF)


def dropout_keys(seed: int, step: int, indices: torch.Tensor) -> torch.Tensor:
    """Each sample's dropout key in global batch `step`: from (seed, step, the sample's index) alone."""
    run = _mix(_mix(torch.tensor(_int32(seed), dtype=torch.int32)) + _int32(step))
    return _mix(indices.to(torch.int32) ^ int(run))


class KeyedDropout(nn.Module):
    """Dropout whose masks come from each sample's key, not from the process's random stream.

    A sample drops the same units whichever worker computes it and however the global batch is
    split, so a synchronous step is exactly one single-device step on the union batch, dropout
    and all: runs on the same seed follow one trajectory unless their arithmetic differs.
    """

    def __init__(self, p: float, layer: int) -> None:
        super().__init__()
        self.p, self.layer = p, layer

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if keys is None:
            raise ValueError("a training step with dropout needs its samples' keys (workload.dropout_keys)")
        units = torch.arange(x[0].numel(), dtype=torch.int32, device=x.device) * _int32(0x9E3779B1)
        drawn = _mix(keys.to(x.device)[:, None] ^ (units + _int32(self.layer * 0x632BE5AB)))
        keep = (drawn & 0xFFFFFF) >= round(self.p * (1 << 24))  # 24 uniform bits against the rate
        return x * (keep.view_as(x).to(x.dtype) / (1 - self.p))


class Net(nn.Module):
    """pytorch/examples mnist/main.py's CNN: 1,199,882 parameters; its dropout keyed by sample."""

    def __init__(self, dropout: float = 0.25) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = KeyedDropout(dropout, layer=1)
        self.dropout2 = KeyedDropout(dropout, layer=2)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """`keys`: the samples' dropout keys (`dropout_keys`), needed to train with dropout."""
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2), keys)
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))), keys)
        return F.log_softmax(self.fc2(x), dim=1)


def build_model(dropout: float, seed: int) -> Net:
    """Same seed, same initial weights on every process: workers start from the server's model."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Net(dropout)


def build_optimizer(params, name: str, lr: float) -> torch.optim.Optimizer:
    optimizers = {
        "adadelta": lambda: torch.optim.Adadelta(params, lr=lr),  # the example's choice
        "sgd": lambda: torch.optim.SGD(params, lr=lr, momentum=0.9),
        "adam": lambda: torch.optim.Adam(params, lr=lr),
    }
    return optimizers[name]()


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean NLL over the batch: the gradient rule in gradients.py relies on the mean."""
    return F.nll_loss(output, target)


def forward_backward(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, keys: torch.Tensor | None = None
) -> torch.Tensor:
    """One worker's compute: forward (`keys`: the samples' dropout keys), mean loss, backward into
    the model's .grad buffers."""
    loss = loss_fn(model(images, keys), labels)
    loss.backward()
    return loss.detach()


@torch.inference_mode()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int = 1000) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(labels), batch):
        logits = model(images[start : start + batch])
        correct += (logits.argmax(1) == labels[start : start + batch]).sum().item()
    model.train()
    return correct / max(1, len(labels))
