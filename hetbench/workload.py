"""The one workload every strategy trains: the PyTorch MNIST example CNN and its optimizer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    """pytorch/examples mnist/main.py's CNN: 1,199,882 parameters."""

    def __init__(self, dropout: float = 0.25) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
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


def forward_backward(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One worker's compute: forward, mean loss, backward into the model's .grad buffers."""
    loss = loss_fn(model(images), labels)
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
