"""A model as image models are written: torchvision's ResNet design (BasicBlock, BatchNorm2d after
each convolution), small, on hetbench's ten-shapes images: `--set workload=workloads.resnet_bn:build`.

Its batch norm trains as DDP trains it (each worker normalizes over its own share), so its rows are
not exact; the statistics it is evaluated with are recomputed from the weights (docs/workloads.md).
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from hetbench.optimizer import RunSchedule
from hetbench.workloads.shapes_resnet import prepare, shapes

STEPS = 60  # the schedule's length: a config running longer holds the floor of the cosine


class BasicBlock(nn.Module):
    """torchvision's: 3x3 convolution, batch norm, ReLU, 3x3 convolution, batch norm, plus the shortcut."""

    def __init__(self, into: int, out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(into, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or into != out:
            self.downsample = nn.Sequential(nn.Conv2d(into, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """A 3x3 stem for 32x32 images, stages of 16, 32 and 64 channels, pooled, one linear layer."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def build(seed: int) -> dict:
    return {
        "model": ResNet,
        "train": lambda: shapes("train"),  # uint8 images: prepare makes them float on the device
        "test": lambda: shapes("test"),
        "prepare": prepare,
        "optimizer": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        "scheduler": lambda optimizer: LambdaLR(optimizer, RunSchedule(5, "cosine", STEPS)),  # warm-up, cosine
        "name": "resnet-bn",
    }
