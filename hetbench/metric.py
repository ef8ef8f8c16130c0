"""What a trained model is judged by on its workload's test set, and which way is better: the
workload's own metric where it brings one (Workload.metric), else accuracy where the labels are
class indices, else the workload's own loss, its mean over the test set (lower is better). Each is
a sum over the test batches and a count (Score); the run's target, the verdict's tolerance and every
table, plot and sentence that names the figure go through the workload's Metric."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

EVAL_BATCH = 64  # the driver's evaluation batch: a batch's activations stay in the CPU's caches. At
# 1,000 a check took 2.2x as long for the CNN (0.80 s against 0.36 s for 2,000 images on this host's 2
# cores) and 2.5x for the ResNet, a quarter of local.yaml's run; the scores are the same to the bit


@dataclass(frozen=True)
class Metric:
    name: str  # "accuracy" | "loss" | a workload's own metric's name: what a record keeps (WorkloadFacts.metric)
    label: str  # as sentences and plots name it
    column: str  # as tables head it
    higher_is_better: bool
    target_key: str  # the run setting it is trained to (time to target)
    tolerance_key: str  # the run setting of how much worse than the best machine alone a row may end

    def measure(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, score: Score) -> float:
        """The model's figure on these test samples, in eval mode, EVAL_BATCH at a time: the sums
        `score` gives each batch over their counts (LoadedWorkload.score)."""
        return _measured(model, inputs, labels, score)

    def reached(self, value: float, target: float) -> bool:
        return value >= target if self.higher_is_better else value <= target

    def near(self, value: float, target: float, within: float) -> bool:
        """Within reach of the target: `within` below it (accuracy), or within that fraction above it (loss)."""
        return value >= target - within if self.higher_is_better else value <= target * (1 + within)

    def shortfall(self, mine: float, base: float) -> float:
        """How much worse `mine` ends than `base`, 0 where as good: in accuracy points (0.021: 2.1
        points), or as a fraction of base's loss (0.05: 5% higher)."""
        if self.higher_is_better:
            return max(0.0, base - mine)
        if mine <= base:
            return 0.0
        return (mine - base) / base if base > 0 else float("inf")

    def worse(self, shortfall: float) -> str:
        """A shortfall in words."""
        if self.name == "accuracy":
            return f"{shortfall * 100:.1f} points less accurate"
        if self.higher_is_better:
            return f"{shortfall:.3g} lower in {self.label}"
        return f"{shortfall:.0%} higher in {self.label}"

    def format(self, value: float) -> str:
        return f"{value:.1%}" if self.name == "accuracy" else f"{value:.4g}"

    def at(self, target: float) -> str:
        """A target in a sentence: '95% test accuracy', 'test loss 0.05', 'top-2 accuracy 0.9'."""
        return f"{target:.0%} test accuracy" if self.name == "accuracy" else self.short(target)

    def short(self, target: float) -> str:
        """The same in few words: '95%', 'test loss 0.05'."""
        return f"{target:.0%}" if self.name == "accuracy" else f"{self.label} {target:.3g}"

    def target(self, settings) -> float | None:
        """The target in a run's settings (RunConfig, or a record's Settings)."""
        return getattr(settings, self.target_key, None)

    def tolerance(self, settings) -> float | None:
        return getattr(settings, self.tolerance_key, None)


ACCURACY = Metric("accuracy", "test accuracy", "test acc", True, "target_accuracy", "accuracy_tolerance")
LOSS = Metric("loss", "test loss", "test loss", False, "target_loss", "loss_tolerance")
METRICS = {m.name: m for m in (ACCURACY, LOSS)}

Score = Callable[[torch.Tensor, torch.Tensor], tuple[float, int]]  # (outputs, labels) -> (sum, count)


def own(name: str, higher_is_better: bool) -> Metric:
    """A workload's own metric (Workload.metric), named as the workload names it."""
    return Metric(name, name, name, higher_is_better, "target_metric", "metric_tolerance")


def named(name: str, higher_is_better: bool = True) -> Metric:
    """The Metric a record names: accuracy, the test loss, or a workload's own."""
    return METRICS.get(name) or own(name, higher_is_better)


def for_labels(labels) -> Metric:
    """Accuracy for class indices (one integer a sample), the test loss for any other target."""
    integer = not labels.dtype.is_floating_point if isinstance(labels, torch.Tensor) else labels.dtype.kind in "iu"
    return ACCURACY if integer and labels.ndim == 1 else LOSS


def class_scores(outputs) -> torch.Tensor | None:
    """Where a model's output holds its class scores, as accuracy reads them: the output itself, the
    first element of a tuple, or `.logits` (Hugging Face's outputs); None: nowhere accuracy looks."""
    if isinstance(outputs, tuple | list) and outputs:
        outputs = outputs[0]
    if not isinstance(outputs, torch.Tensor):
        outputs = getattr(outputs, "logits", None)
    return outputs if isinstance(outputs, torch.Tensor) else None


def correct(outputs, labels: torch.Tensor) -> tuple[float, int]:
    """ACCURACY's score: the batch's samples whose highest class score is their label."""
    return float((class_scores(outputs).argmax(1) == labels).sum()), len(labels)


def mean_of(loss: Callable) -> Score:
    """LOSS's score, or a workload metric's that gives one number a batch: the batch's mean weighed
    by its samples (preflight checks the mean is one)."""

    def score(outputs: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
        figure = loss(outputs, labels)
        if isinstance(figure, tuple):  # a metric that cannot be averaged so: (sum, count)
            return float(figure[0]), int(figure[1])
        return float(figure) * len(labels), len(labels)

    return score


@torch.inference_mode()
def _measured(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, score: Score) -> float:
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(labels), EVAL_BATCH):
        summed, n = score(model(inputs[start : start + EVAL_BATCH]), labels[start : start + EVAL_BATCH])
        total, count = total + summed, count + n
    model.train()
    return total / max(1, count)
