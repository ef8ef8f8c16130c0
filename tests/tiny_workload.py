"""A user's workload, as docs/workloads.md shows one: `--set workload=tiny_workload:build`.

Four classes of 16 random features (seeded: every process makes the same set), a two-layer MLP with
keyed dropout, its own optimizer (`scheduled`: and a learning-rate schedule). The fast tier's
equivalence test trains it through every synchronous strategy; `plain` is the same net with torch's
own dropout, which hetbench marks inexact.
"""

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from hetbench.workload import KeyedDropout, Workload


def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = torch.randn(n, 16, generator=torch.Generator().manual_seed(seed))
    labels = (inputs[:, :4].sum(1) > 0).long() + 2 * (inputs[:, 4:8].sum(1) > 0).long()
    return inputs, labels


def build(dropout: nn.Module | None = None) -> Workload:
    return Workload(
        model=lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), dropout or KeyedDropout(0.25), nn.Linear(32, 4)),
        train=lambda: data(2_000, 0),
        test=lambda: data(600, 1),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        name="tiny-mlp",
    )


def warmup_then_halving(update: int) -> float:
    """The rate's factor at each update: a 3-update warm-up, then halved every 2 updates."""
    return min(1.0, (update + 1) / 3) * 0.5 ** max(0, (update - 2) // 2)


def scheduled() -> Workload:  # a LambdaLR, stepped once per global update wherever the update runs
    return replace(
        build(), scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_halving)
    )


def not_a_scheduler() -> Workload:  # a scheduler factory returning something else
    return replace(build(), scheduler=lambda optimizer: optimizer)


def plain() -> Workload:
    return build(nn.Dropout(0.25))


def batch_norm() -> Workload:  # trained as DDP trains it: each worker normalizes over its own share
    return build(nn.BatchNorm1d(32))


def wide_prepare() -> Workload:  # its stored batch made float64, which MPS lacks
    return replace(build(), prepare=lambda batch: batch.double())


def frozen() -> Workload:  # its first layer fixed, as a fine-tuned model's backbone is
    def model() -> nn.Module:
        net = build().model()
        net[0].requires_grad_(False)
        return net

    return replace(build(), model=model)


def as_dict(seed: int) -> dict:  # the plainest form: a module itself, a Dataset, the seed passed in
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), KeyedDropout(0.25), nn.Linear(32, 4))
    return {"model": net, "train": TensorDataset(*data(2_000, 0)), "test": data(600, 1)}


def summed_loss() -> Workload:  # a loss that adds the batch up: the weighted average of shares breaks
    return replace(build(), loss=lambda scores, labels: F.cross_entropy(scores, labels, reduction="sum"))


class Counting(nn.Module):
    """A layer whose buffer a training step changes, as batch norm's running mean does."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen += len(x)
        return x


def counting() -> Workload:
    return build(Counting())


def no_test() -> dict:
    return {"model": build().model(), "train": data(100, 0)}


def regression() -> Workload:  # float targets: judged by the test loss (set target_loss), not accuracy
    def targets(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, _ = data(n, seed)
        return inputs, torch.stack([inputs[:, :4].sum(1), inputs[:, 4:8].mean(1)], 1)

    return replace(
        build(),
        model=lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), KeyedDropout(0.1), nn.Linear(32, 2)),
        train=lambda: targets(2_000, 0),
        test=lambda: targets(600, 1),
        loss=F.mse_loss,
        name="tiny-regression",
    )


def top2(outputs: torch.Tensor, labels: torch.Tensor) -> float:
    """The batch's share of samples whose label is among their two highest scores."""
    return (outputs.topk(2, dim=1).indices == labels[:, None]).any(1).float().mean().item()


def top2_accuracy() -> Workload:  # judged by a metric of its own (set target_metric)
    return replace(build(), metric=top2, metric_name="top-2 accuracy")


def metric_of_a_tensor() -> Workload:  # a metric that returns each sample's figure, not the batch's
    return replace(build(), metric=lambda outputs, labels: outputs.argmax(1) == labels, metric_name="per-sample")


class WithAux(nn.Module):
    """The tiny MLP returning (logits, aux), as many models do: the loss takes both."""

    def __init__(self) -> None:
        super().__init__()
        self.net = build().model()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(x)
        return logits, logits.pow(2).mean()


def with_aux() -> Workload:  # accuracy reads the tuple's first element
    return replace(build(), model=WithAux, loss=lambda out, labels: F.cross_entropy(out[0], labels) + 0.01 * out[1])


class Scores:
    """What a Hugging Face model returns, in small: an object whose .logits hold the class scores."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class WithLogits(WithAux):
    def forward(self, x: torch.Tensor) -> Scores:
        return Scores(self.net(x))


def with_logits() -> Workload:  # accuracy reads .logits
    return replace(build(), model=WithLogits, loss=lambda out, labels: F.cross_entropy(out.logits, labels))


def with_no_scores() -> Workload:  # an output accuracy cannot read: it needs a metric
    return replace(build(), model=lambda: nn.Sequential(build().model(), nn.Flatten(0)), loss=lambda out, y: out.mean())
