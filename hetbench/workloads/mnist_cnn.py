"""The first workload: the PyTorch MNIST example's CNN (mnist/main.py), its dropout keyed by sample."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hetbench.config import RunConfig
from hetbench.data import cached_mnist, normalized
from hetbench.workload import KeyedDropout, Workload


class Net(nn.Module):
    """pytorch/examples mnist/main.py's CNN: 1,199,882 parameters, 98% of them in fc1."""

    def __init__(self, dropout: float = 0.25) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = KeyedDropout(dropout, layer=1)
        self.dropout2 = KeyedDropout(dropout, layer=2)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        return F.log_softmax(self.fc2(x), dim=1)


def prepare(images: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 28, 28] as stored -> the CNN's [N, 1, 28, 28] input (data.normalized)."""
    return normalized(images.unsqueeze(1))


def build(run: RunConfig, announce: bool = True) -> Workload:
    return Workload(
        model=lambda: Net(run.dropout),
        train=lambda: cached_mnist(run, announce)[0],
        test=lambda: cached_mnist(run, announce)[1],
        loss=F.nll_loss,  # the net ends in log_softmax, as the example's does
        prepare=prepare,
        name="mnist-cnn",
    )
