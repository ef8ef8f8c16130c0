"""A workload of your own, in the shape hetbench loads: `--set workload=workloads.example:build`.

Copy it to workloads/NAME.py and change the model and data; docs/workloads.md says what each field
must be. Its data is drawn as integers: every CPU draws those alike, while torch.randn's floats
differ in their last bits between a desktop's x86 kernels and a Mac's arm64 ones, and the driver
refuses a Mac whose copy differs.
"""

import torch
from torch import nn

from hetbench.workload import KeyedDropout, Workload


def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` samples of 16 features in quarters from -2 to 2, four classes by the signs of two sums."""
    inputs = torch.randint(-8, 9, (n, 16), generator=torch.Generator().manual_seed(seed)).float() / 4
    labels = (inputs[:, :4].sum(1) > 0).long() + 2 * (inputs[:, 4:8].sum(1) > 0).long()
    return inputs, labels


def build() -> Workload:
    return Workload(
        model=lambda: nn.Sequential(nn.Linear(16, 64), nn.ReLU(), KeyedDropout(0.2), nn.Linear(64, 4)),
        train=lambda: data(20_000, 0),  # or a hetbench.data.Split, or arrays: made once on every machine
        test=lambda: data(2_000, 1),
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-3),  # optional: else `optimizer`, `lr`
        name="example-mlp",
    )
