"""What a trained model is judged by on its workload's test set, and which way is better: accuracy
where the labels are class indices, else the workload's own loss, its mean over the test set (lower
is better). The run's target, the verdict's tolerance and every table, plot and sentence that names
the figure go through the workload's Metric."""

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
    name: str  # "accuracy" | "loss": what a record keeps (WorkloadFacts.metric)
    label: str  # as sentences and plots name it
    column: str  # as tables head it
    higher_is_better: bool
    target_key: str  # the run setting it is trained to (time to target)
    tolerance_key: str  # the run setting of how much worse than the best machine alone a row may end

    def measure(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, loss: Callable) -> float:
        """The model's figure on these test samples, in eval mode, EVAL_BATCH at a time."""
        return _measured(model, inputs, labels, loss if self.name == "loss" else None)

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
        if self.higher_is_better:
            return f"{shortfall * 100:.1f} points less accurate"
        return f"{shortfall:.0%} higher in test loss"

    def format(self, value: float) -> str:
        return f"{value:.1%}" if self.higher_is_better else f"{value:.4g}"

    def at(self, target: float) -> str:
        """A target in a sentence: '95% test accuracy', 'test loss 0.05'."""
        return f"{target:.0%} test accuracy" if self.higher_is_better else self.short(target)

    def short(self, target: float) -> str:
        """The same in few words: '95%', 'test loss 0.05'."""
        return f"{target:.0%}" if self.higher_is_better else f"test loss {target:.3g}"

    def target(self, settings) -> float | None:
        """The target in a run's settings (RunConfig, or a record's Settings)."""
        return getattr(settings, self.target_key, None)

    def tolerance(self, settings) -> float | None:
        return getattr(settings, self.tolerance_key, None)


ACCURACY = Metric("accuracy", "test accuracy", "test acc", True, "target_accuracy", "accuracy_tolerance")
LOSS = Metric("loss", "test loss", "test loss", False, "target_loss", "loss_tolerance")
METRICS = {m.name: m for m in (ACCURACY, LOSS)}


def for_labels(labels) -> Metric:
    """Accuracy for class indices (one integer a sample), the test loss for any other target."""
    integer = not labels.dtype.is_floating_point if isinstance(labels, torch.Tensor) else labels.dtype.kind in "iu"
    return ACCURACY if integer and labels.ndim == 1 else LOSS


@torch.inference_mode()
def _measured(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, loss: Callable | None) -> float:
    model.eval()
    total = 0.0
    for start in range(0, len(labels), EVAL_BATCH):
        scores, truth = model(inputs[start : start + EVAL_BATCH]), labels[start : start + EVAL_BATCH]
        if loss is None:
            total += (scores.argmax(1) == truth).sum().item()
        else:  # a batch's mean (preflight checks it is one), weighed by the batch's share
            total += float(loss(scores, truth)) * len(truth)
    model.train()
    return total / max(1, len(labels))
