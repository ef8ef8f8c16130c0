"""The second workload: a small ResNet on 32x32 colour images of ten shapes that hetbench draws itself.

Where the MNIST CNN is nearly all one fully connected layer (1.2 M parameters for little compute),
this net's weights are convolutions applied at every pixel: about 4 times the CNN's compute a sample
for a quarter of its bytes, so the link costs a far smaller share of each step. Its data is made
here from a fixed seed (nothing downloaded; every machine draws the same images), and its norms are
GroupNorm: batch norm's would depend on how a step's batch is split between machines (a row with
batch norm runs, but not exact: docs/workloads.md).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetbench.config import RunConfig
from hetbench.data import Split
from hetbench.workload import KeyedDropout, Workload

SIZE = 32  # pixels a side
SHAPES = ("disk", "ring", "square", "frame", "diamond", "plus", "cross", "h-stripes", "v-stripes", "triangle")
TRAIN, TEST = 20_000, 2_000  # images in each split (61 MB and 6 MB as stored, uint8)
DATA_SEED = 20261203  # the images are the same whatever the run's seed: a fixed dataset


def draw(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` images, uint8 [n, 3, 32, 32], and their shape labels: each shape at a random place and size,
    in a random bright colour on a random dark background, with pixel noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(SHAPES), n)
    images = np.empty((n, 3, SIZE, SIZE), dtype=np.uint8)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    for start in range(0, n, 2000):  # in chunks: float32 masks of 2,000 images at a time
        k = min(2000, n - start)
        r = rng.uniform(6, 11, (k, 1, 1)).astype(np.float32)
        cy, cx = (rng.uniform(11, SIZE - 11, (2, k, 1, 1))).astype(np.float32)
        dy, dx = yy - cy, xx - cx
        box, dist = np.maximum(abs(dx), abs(dy)), np.hypot(dx, dy)
        masks = [
            dist <= r,
            (dist <= r) & (dist >= r - 2.5),
            box <= r,
            (box <= r) & (box >= r - 2.5),
            abs(dx) + abs(dy) <= r,
            ((abs(dx) <= 1.6) | (abs(dy) <= 1.6)) & (box <= r),
            (abs(abs(dx) - abs(dy)) <= 1.6) & (box <= r),
            (box <= r) & ((np.floor(yy / 3) % 2) == 0),
            (box <= r) & ((np.floor(xx / 3) % 2) == 0),
            (dy <= r) & (dy >= -r) & (abs(dx) <= (dy + r) / 2),
        ]
        mask = np.choose(labels[start : start + k, None, None], masks)[:, None]  # [k, 1, 32, 32]
        ink = rng.uniform(150, 255, (k, 3, 1, 1))
        ground = rng.uniform(0, 90, (k, 3, 1, 1))
        noise = rng.normal(0, 12, (k, 3, SIZE, SIZE))
        images[start : start + k] = np.clip(np.where(mask, ink, ground) + noise, 0, 255).astype(np.uint8)
    return images, labels.astype(np.int64)


def shapes(split: str) -> Split:
    n, seed = (TRAIN, DATA_SEED) if split == "train" else (TEST, DATA_SEED + 1)
    return Split(*draw(n, seed), f"shapes:{split} (drawn by hetbench, seed {seed})")


class Block(nn.Module):
    """ResNet's basic block: two 3x3 convolutions and the shortcut, GroupNorm after each convolution."""

    def __init__(self, into: int, out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(into, out, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(8, out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(8, out)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(into, out, 1, stride, bias=False), nn.GroupNorm(8, out))
            if stride != 1 or into != out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(y)) + self.shortcut(x))


class ShapesResNet(nn.Module):
    """A stem and three residual stages (32, 64, 128 channels at 32, 16 and 8 pixels), pooled, then one
    keyed dropout and a linear classifier: 308,650 parameters."""

    def __init__(self, dropout: float = 0.25) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.GroupNorm(8, 32), nn.ReLU())
        self.stages = nn.Sequential(Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2))
        self.dropout = KeyedDropout(dropout)
        self.fc = nn.Linear(128, len(SHAPES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(self.dropout(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))


def prepare(images: torch.Tensor) -> torch.Tensor:
    """uint8 pixels as stored -> float32 around zero."""
    return images.float().div_(255).sub_(0.5).div_(0.25)


def build(run: RunConfig, announce: bool = True) -> Workload:
    return Workload(
        model=lambda: ShapesResNet(run.dropout),
        train=lambda: shapes("train"),
        test=lambda: shapes("test"),
        prepare=prepare,
        name="shapes-resnet",
    )
