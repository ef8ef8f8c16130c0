"""The seam every strategy trains through: the `workload` setting names a built-in (hetbench/workloads/)
or a user's `module:function` returning a `Workload`; `load_workload` gives every reader its model,
data, loss and optimizer, and the keyed dropout that keeps a synchronous step one single-device step."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau

from hetbench.clock import median
from hetbench.config import BUILT_IN_WORKLOADS, RunConfig
from hetbench.data import Split, check_same_data
from hetbench.devices import autocast, loss_scale_of
from hetbench.errors import UserError
from hetbench.gradients import count_parameters
from hetbench.metric import ACCURACY, LOSS, METRICS, Metric, Score, class_scores, correct, for_labels, mean_of, own
from hetbench.optimizer import RunSchedule, ScheduledOptimizer

Data = Split | tuple  # (inputs, labels): tensors or arrays, one row per sample; labels class indices or targets


@dataclass(frozen=True)
class Workload:
    """What a workload function returns: the model hetbench trains, its data, loss and optimizer."""

    model: Callable[[], nn.Module] | nn.Module
    """Makes a fresh model, run under the repeat's seed (every process starts from the same weights), or
    a model itself (every repeat starts from a copy of its weights). Its forward takes one batch of
    prepared inputs and returns what its loss takes, as it is: a tensor, a tuple (logits, aux), an
    object with .logits; accuracy reads class scores [N, classes] from the output, its first element
    or its .logits (else give it a `metric`)."""
    train: Data | torch.utils.data.Dataset | Callable[[], Data | torch.utils.data.Dataset]
    """The training set: (inputs, labels), a Dataset of (input, label) pairs, or a function without
    arguments making either, called once per process: every machine makes its own, and the driver
    refuses machines whose copies differ. Labels are class indices (one integer a sample), or any
    float32 targets, which make the test loss the run's metric (hetbench/metric.py)."""
    test: Data | torch.utils.data.Dataset | Callable[[], Data | torch.utils.data.Dataset]
    """The test set, as `train`: accuracy is argmax(scores) == label on it; for other targets, the
    loss's mean over it."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy
    """(scores, labels) -> the batch's mean loss: the workers' gradients are averaged by their batch
    shares, which is the union batch's gradient only for a mean."""
    optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None
    """params -> the optimizer; None: the run's `optimizer` and `lr` settings."""
    scheduler: Callable[[torch.optim.Optimizer], LRScheduler] | None = None
    """optimizer -> its learning-rate scheduler (any LRScheduler, LambdaLR's warm-up then cosine say),
    stepped once per global update wherever that update runs; None: the rate stays as made."""
    prepare: Callable[[torch.Tensor], torch.Tensor] | None = None
    """A batch as stored -> the model's input, on the worker's device (uint8 pixels -> float32, say:
    the stored set stays small on an 8 GB Mac); None: the batch as stored."""
    name: str = ""
    """What tables and verdicts call it; empty: its `module:function`."""
    metric: Callable[[Any, torch.Tensor], float | tuple[float, int]] | None = None
    """(the model's output for a test batch, its labels) -> the batch's figure (its mean over the
    batch), or (its sum, its count) for a figure that a mean of means would not give: the test set's
    figure is their sums over their counts. Rows are judged by it, to `target_metric`; None: accuracy
    where the labels are class indices, else the test loss."""
    metric_name: str = ""
    """What tables and sentences call that metric (top-5 accuracy, perplexity); empty: its function's name."""
    higher_is_better: bool = True
    """Whether that metric improves upward (accuracy, F1) or downward (perplexity)."""


# ---- keyed dropout -----------------------------------------------------------------------------


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


def dropout_keys(seed: int, step: int | torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Each sample's dropout key in global batch `step` (or, a tensor, each sample's own step): from
    (seed, step, the sample's index) alone, on the indices' device (no host read)."""
    seeded = _mix(torch.tensor(_int32(seed), dtype=torch.int32, device=indices.device))
    steps = torch.as_tensor(step, device=indices.device).to(torch.int32)
    return _mix(indices.to(torch.int32) ^ _mix(seeded + steps))


# any odd multiplier mixes alike (tests/test_workload.py): which one only moves a seeded run's trajectory
GOLDEN, LAYER, MIX = _int32(0x9E3779B1), _int32(0x632BE5AB), _int32(0x2C1B3C6D)


class KeyedDropout(nn.Module):
    """Dropout whose masks come from each sample's key, not from the process's random stream.

    A sample drops the same units whichever worker computes it and however the global batch is
    split, so a synchronous step is exactly one single-device step on the union batch, dropout
    and all: runs on the same seed follow one trajectory unless their arithmetic differs. The keys
    are set for one forward by `keyed`; `layer` (numbered in model order by `build_model` when not
    given) keeps two layers' masks apart.

    A step's draw is six kernels where nn.Dropout's is three: a unit's own hash is made once per
    shape and device, a sample's key once per epoch (BatchOrder.keys), and what is left a step is
    one xor of the two and one multiply, whose high bits depend on every bit of both; the keep rate,
    and independence across samples, units, layers and steps, are tested (tests/test_workload.py).
    """

    def __init__(self, p: float, layer: int | None = None) -> None:
        super().__init__()
        self.p, self.layer = p, layer
        self.keys: torch.Tensor | None = None
        self.units: dict[tuple, torch.Tensor] = {}  # (units a sample, device) -> each unit's hash

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if self.keys is None:
            raise ValueError("a training step with dropout needs its samples' keys (workload.keyed)")
        if self.p >= 1:
            return x * 0.0  # every unit dropped, as nn.Dropout's p=1 does
        drawn = (self.keys.to(x.device)[:, None] ^ self.hashed_units(x)) * MIX
        keep = drawn >= round(self.p * (1 << 32)) - (1 << 31)  # a signed int32 at or above: 1 - p of them
        return x * keep.to(x.dtype).mul_(1 / (1 - self.p)).view_as(x)

    def hashed_units(self, x: torch.Tensor) -> torch.Tensor:
        """Each unit of a sample of `x`, hashed with this layer's number: made once per shape and device."""
        shape = (x[0].numel(), x.device)
        if shape not in self.units:
            numbered = torch.arange(shape[0], dtype=torch.int32, device=x.device) * GOLDEN
            self.units[shape] = _mix(numbered + _int32((self.layer or 0) * LAYER))
        return self.units[shape]


@contextlib.contextmanager
def keyed(model: nn.Module, keys: torch.Tensor | None):
    """The model's KeyedDropout layers draw from `keys` (one per sample) for the forward inside."""
    layers = [m for m in model.modules() if isinstance(m, KeyedDropout)]
    for layer in layers:
        layer.keys = keys
    try:
        yield
    finally:
        for layer in layers:
            layer.keys = None


def keyed_dropout(model: nn.Module) -> nn.Module:
    """`model` with each nn.Dropout swapped for a KeyedDropout of its rate (in place; returned): the
    one change that makes a model with dropout train exactly alike on every split of the batch.
    Channel dropout (Dropout2d, ...) is left: it draws whole channels, which keyed dropout does not."""
    for name, child in model.named_children():
        if type(child) is nn.Dropout:
            setattr(model, name, KeyedDropout(child.p))
        else:
            keyed_dropout(child)
    return model


def build_optimizer(params, name: str, lr: float) -> torch.optim.Optimizer:
    optimizers = {
        "adadelta": lambda: torch.optim.Adadelta(params, lr=lr),  # the PyTorch MNIST example's choice
        "sgd": lambda: torch.optim.SGD(params, lr=lr, momentum=0.9),
        "adam": lambda: torch.optim.Adam(params, lr=lr),
    }
    return optimizers[name]()


# ---- the loaded workload -----------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadFacts:
    """What a record keeps of the workload a row trained (records.py's `workload`)."""

    name: str  # as tables call it
    spec: str  # the `workload` setting: a built-in's name or a `module:function`
    parameters: int  # the model's parameters (its float32 flat buffer's bytes are 4x)
    code: str  # digest of the workload's source: the driver refuses workers whose code differs
    exact: bool  # whether a synchronous step is exactly one single-device step on the union batch
    inexact: str | None = None  # why not, where it is not
    optimizer: str | None = None  # its own optimizer's class; None: the run's `optimizer` and `lr` settings
    scheduler: str | None = None  # its learning-rate scheduler's class, stepped once per global update; None: none
    input_shape: list[int] | None = None  # one sample as the model takes it (after `prepare`)
    keyed_layers: int = 0  # its KeyedDropout layers (keyed_dropout's swaps among them)
    batch_norm_layers: int = 0  # their statistics are recomputed at each check (recompute_batch_norm)
    metric: str = "accuracy"  # what rows are judged by (metric.named): accuracy, the test loss, or its own
    higher_is_better: bool = True  # its own metric's way (accuracy's and the loss's are known)

    @property
    def model_bytes(self) -> int:
        """Its model as float32: what one exchange of all its weights or gradients moves."""
        return self.parameters * 4


class LoadedWorkload:
    """One process's workload: what every strategy, the floor, the evaluator and the records read."""

    def __init__(self, spec: str, workload: Workload, sources: list[Path]) -> None:
        self.spec, self.workload = spec, workload
        self.name = workload.name or spec
        self.loss = workload.loss
        self._splits: dict[str, Split] = {}
        model = self.build_model(0)  # refuses what hetbench cannot train alike before any cluster starts
        self.parameters = count_parameters(model)  # as many as the flat buffer every strategy moves
        self.inexact = _why_inexact(model)
        self.batch_norm_layers = len(batch_norms(model))
        self.keyed_layers = sum(isinstance(m, KeyedDropout) for m in model.modules())
        self.files = {path.name: hashlib.sha256(path.read_bytes()).hexdigest()[:12] for path in sorted(set(sources))}
        self.code = hashlib.sha256(repr(sorted(self.files.items())).encode()).hexdigest()[:12]
        own = workload.optimizer  # its class, for the records: learned once, on a throwaway parameter
        self.optimizer_name = type(own([nn.Parameter(torch.zeros(1))])).__name__ if own else None
        self.scheduler_name = self._scheduler_name()

    @property
    def exact(self) -> bool:
        return self.inexact is None

    def facts(self) -> WorkloadFacts:
        name, spec = self.name, self.spec
        shape = list(self.prepare(self.test_split().tensors("cpu")[0][:1]).shape[1:])
        optimizer, keyed = self.optimizer_name, self.keyed_layers
        facts = (self.parameters, self.code, self.exact, self.inexact, optimizer, self.scheduler_name, shape, keyed)
        metric = self.metric
        return WorkloadFacts(name, spec, *facts, self.batch_norm_layers, metric.name, metric.higher_is_better)

    @property
    def metric(self) -> Metric:
        """Its own metric where it brings one, else accuracy where the labels are class indices, else
        the test loss (preflight: both splits alike)."""
        if self.workload.metric is not None:
            name = self.workload.metric_name or getattr(self.workload.metric, "__name__", "metric")
            return own(name, self.workload.higher_is_better)
        return for_labels(self.train_split().labels)

    @property
    def score(self) -> Score:
        """A test batch's (sum, count) of the metric, as a function chosen once: Metric.measure adds
        them up over the test set."""
        if self.workload.metric is not None:
            return mean_of(self.workload.metric)
        return correct if self.metric.name == "accuracy" else mean_of(self.loss)

    def fingerprint(self) -> dict:
        """What a worker reports of the workload it trains (check_same_workload compares them)."""
        return {"spec": self.spec, "code": self.code, "files": self.files}

    def build_model(self, seed: int) -> nn.Module:
        """Same seed, same initial weights on every process: workers start from the server's model."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = self.workload.model()
        if not isinstance(model, nn.Module):
            raise UserError(
                f"workload {self.spec}: its model() returned a {type(model).__name__}, not a torch nn.Module"
            )
        wide = [name for name, p in model.named_parameters() if p.dtype == torch.float64]
        if wide:
            raise UserError(f"workload {self.spec}: its model has float64 parameters ({wide[0]}); MPS has no float64")
        for layer, dropout in enumerate((m for m in model.modules() if isinstance(m, KeyedDropout)), 1):
            if dropout.layer is None:
                dropout.layer = layer
        return model

    def preflight(self, run: RunConfig) -> None:
        """A few training samples through the model on this CPU, once before any row: refuses in one
        sentence what would make every row wrong rather than fail (the driver calls it)."""
        train, test = self.train_split(), self.test_split()
        for what, mine, theirs in (("inputs", train.inputs, test.inputs), ("labels", train.labels, test.labels)):
            if mine.shape[1:] != theirs.shape[1:] or mine.dtype != theirs.dtype:
                raise UserError(
                    f"workload {self.spec}: its training {what} are {list(mine.shape[1:])} {mine.dtype} a sample but "
                    f"its test {what} {list(theirs.shape[1:])} {theirs.dtype}"
                )
        if self.workload.scheduler is not None and (run.lr_warmup_steps or run.lr_decay != "none"):
            raise UserError(
                f"workload {self.spec}: it brings its own scheduler ({self.scheduler_name}), and the config sets "
                "lr_warmup_steps or lr_decay too: keep one schedule"
            )
        metric = self.metric
        if metric is LOSS and not metric.target(run):  # target_loss has no default: no loss suits every model
            raise UserError(
                f"workload {self.spec}: its labels are not class indices, so rows are judged by their test loss: "
                f"set {metric.target_key}, the test loss to train to (e.g. --set {metric.target_key}=0.1)"
            )
        if self.workload.metric is not None and metric.name in METRICS:
            raise UserError(f"workload {self.spec}: its metric's name '{metric.name}' is hetbench's own: name it apart")
        if self.workload.metric is not None and not metric.target(run):  # no figure suits every metric
            raise UserError(
                f"workload {self.spec}: rows are judged by its metric, {metric.name}: set {metric.target_key}, "
                f"the {metric.name} to train to (e.g. --set {metric.target_key}=0.9)"
            )
        n = min(len(train.labels), 8)
        if n < 2:
            raise UserError(f"workload {self.spec}: its training set has {n} samples; a step splits at least 2")
        stored, labels = train.tensors("cpu")
        inputs, labels = self.prepare(stored[:n]), labels[:n]
        model = self.build_model(0).train()
        norms = {id(m) for m in batch_norms(model)}  # their statistics follow recompute_batch_norm's rule
        statistics = {
            f"{name}.{b}".lstrip(".")
            for name, m in model.named_modules()
            if id(m) in norms
            for b, _ in m.named_buffers(recurse=False)
        }
        buffers = {
            name: b.clone() for name, b in model.named_buffers() if b.is_floating_point() and name not in statistics
        }
        try:
            with keyed(model, dropout_keys(0, 0, torch.arange(n))):
                outputs = model(inputs)
            scores = class_scores(outputs)
            classes = scores.shape[1] if scores is not None and scores.dim() == 2 else None
            if metric is ACCURACY and (classes is None or int(labels.max()) >= classes):
                raise UserError(
                    f"workload {self.spec}: its model returns {_described(outputs)} for a batch of {n}, and accuracy "
                    f"reads class scores [{n}, classes] for labels up to {int(labels.max())} (the output, its first "
                    "element or its .logits): give the workload a metric of its own"
                )
            loss = self.loss(outputs, labels)
            if loss.dim() != 0:
                raise UserError(
                    f"workload {self.spec}: its loss returns {list(loss.shape)}, not one number for the batch "
                    "(its mean: reduction='mean')"
                )
            loss.backward()
            changed = [
                name for name, b in model.named_buffers() if name in buffers and not torch.equal(b, buffers[name])
            ]
            if changed:
                raise UserError(
                    f"workload {self.spec}: its model's buffers ({', '.join(changed)}) change in a training step, and "
                    "hetbench moves and checkpoints parameters only: each machine's copy would drift apart"
                )
            model.eval()  # the mean, checked where dropout plays no part: the whole batch against a 1:2 split
            with torch.no_grad():
                cut = n // 3
                parts = [self.loss(model(x), y) for x, y in ((inputs, labels), (inputs[:cut], labels[:cut]))]
                parts.append(self.loss(model(inputs[cut:]), labels[cut:]))
                scored = self.workload.metric and self.workload.metric(model(inputs), labels)
        except UserError:
            raise
        except Exception as e:  # the model or the loss cannot run on its own data
            raise UserError(
                f"workload {self.spec}: a training step on {n} samples failed: {type(e).__name__}: {e}"
            ) from e
        whole, first, rest = (float(p) for p in parts)
        weighted = (cut * first + (n - cut) * rest) / n
        if abs(whole - weighted) > 1e-4 * max(1.0, abs(whole)):
            raise UserError(
                f"workload {self.spec}: its loss is not a mean over the batch ({whole:.4g} for {n} samples, but "
                f"{first:.4g} and {rest:.4g} for {cut} and {n - cut} of them), and the machines' gradients are "
                "weighted by their share of the batch: use reduction='mean'"
            )
        if self.workload.metric is not None and not _a_figure(scored):
            raise UserError(
                f"workload {self.spec}: its metric returns {_described(scored)} for a test batch, not one number "
                "(its mean over the batch) or (sum, count)"
            )

    def gradients_ready(self, run: RunConfig, batch: int = 32, steps: int = 4) -> tuple[tuple[float, int], ...]:
        """When each trainable parameter's gradient is ready in a training step on this CPU, as a
        fraction of the step (forward, backward, the optimizer's step), with its float32 bytes; in the
        order they are ready: what DDP's buckets and a streaming parameter server send while backward
        still runs (plan.overlapped_s). The median of `steps` steps after one to warm up."""
        model = self.build_model(run.seed).train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = self.build_optimizer(params, run)
        stored, labels = self.train_split().tensors("cpu")
        n = min(batch, len(labels))
        inputs, labels, keys = self.prepare(stored[:n]), labels[:n], dropout_keys(run.seed, 0, torch.arange(n))
        ready: list[list[float]] = [[] for _ in params]
        for step in range(steps + 1):
            at = [0.0] * len(params)
            hooks = [
                p.register_post_accumulate_grad_hook(lambda _, i=i, at=at: at.__setitem__(i, time.perf_counter()))
                for i, p in enumerate(params)
            ]
            optimizer.zero_grad(set_to_none=True)
            started = time.perf_counter()
            self.forward_backward(model, inputs, labels, keys, run.precision, run.loss_scale)
            optimizer.step()
            span = time.perf_counter() - started
            for hook in hooks:
                hook.remove()
            if step:  # the first warms up; a parameter the loss does not reach is sent with the last
                for i, t in enumerate(at):
                    ready[i].append((t - started) / span if t else 1.0)
        return tuple(sorted((median(f), p.numel() * 4) for f, p in zip(ready, params)))

    def build_optimizer(self, params, run: RunConfig) -> ScheduledOptimizer:
        """The optimizer of one process's update (the workload's own, else the run's), with its schedule."""
        params = list(params)
        if self.workload.optimizer is not None:
            optimizer = self.workload.optimizer(params)
        else:
            optimizer = build_optimizer(params, run.optimizer, run.lr)
        if self.workload.scheduler is not None:
            scheduler = self.workload.scheduler(optimizer)
        elif run.lr_warmup_steps or run.lr_decay != "none":
            schedule = RunSchedule.of(run.lr_warmup_steps, run.lr_decay, run.warmup_steps, run.steps)
            scheduler = LambdaLR(optimizer, schedule)
        else:
            scheduler = None
        return ScheduledOptimizer(optimizer, scheduler, loss_scale_of(run.precision, run.loss_scale))

    def _scheduler_name(self) -> str | None:
        """Its scheduler's class, for the records, made once on a throwaway optimizer; refused in one
        sentence where it is not a scheduler that steps once per update."""
        if self.workload.scheduler is None:
            return None
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
        try:
            scheduler = self.workload.scheduler(optimizer)
        except Exception as e:
            raise UserError(f"workload {self.spec}: its scheduler raised {type(e).__name__}: {e}") from e
        if isinstance(scheduler, ReduceLROnPlateau):
            raise UserError(
                f"workload {self.spec}: its scheduler is a ReduceLROnPlateau, which steps by a metric; hetbench "
                "steps a scheduler once per update: give an LRScheduler such as LambdaLR or CosineAnnealingLR"
            )
        if not isinstance(scheduler, LRScheduler):
            raise UserError(
                f"workload {self.spec}: its scheduler returned a {type(scheduler).__name__}, not a torch LRScheduler "
                "(scheduler: lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, ...))"
            )
        return type(scheduler).__name__

    def prepare(self, batch: torch.Tensor) -> torch.Tensor:
        if self.workload.prepare is None:
            return batch
        prepared = self.workload.prepare(batch)
        if prepared.dtype == torch.float64:  # the driver's evaluator prepares first: refused before a row
            raise UserError(
                f"workload {self.spec}: its prepare() returns float64, which MPS does not have: make it float32"
            )
        return prepared

    def forward_backward(
        self,
        model: nn.Module,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        keys: torch.Tensor | None = None,
        precision: str = "fp32",
        loss_scale: float = 1.0,
    ) -> torch.Tensor:
        """One worker's compute on a prepared batch: forward (`keys`: the samples' dropout keys) and the
        mean loss, under autocast in a mixed `precision`; backward of the loss times fp16's
        `loss_scale` into the model's .grad buffers (the optimizer divides it out: ScheduledOptimizer)."""
        with keyed(model, keys), autocast(inputs.device, precision):
            loss = self.loss(model(inputs), labels)
        scale = loss_scale_of(precision, loss_scale)
        (loss * scale if scale != 1.0 else loss).backward()
        return loss.detach()

    def train_split(self) -> Split:
        return self._split("train")

    def test_split(self) -> Split:
        return self._split("test")

    def _split(self, which: str) -> Split:
        if which not in self._splits:
            made = getattr(self.workload, which)
            self._splits[which] = as_split(made() if callable(made) else made, f"{self.spec}:{which}", self.spec)
        return self._splits[which]


def as_split(data: Data, source: str, spec: str) -> Split:
    """A workload's (inputs, labels) as the Split every worker stores (arrays on the CPU)."""
    if isinstance(data, Split):
        return data
    if isinstance(data, torch.utils.data.Dataset):
        data = _gathered(data, spec)
    if not (isinstance(data, tuple | list) and len(data) == 2):
        raise UserError(
            f"workload {spec}: its data must be (inputs, labels) or a torch Dataset of (input, label), "
            f"got a {type(data).__name__}"
        )
    inputs, labels = (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in data)
    for what, array in (("inputs", inputs), ("labels", labels)):
        if array.dtype == np.float64:
            raise UserError(f"workload {spec}: its {what} are float64, which MPS does not have: make them float32")
    integer, floating = np.issubdtype(labels.dtype, np.integer), np.issubdtype(labels.dtype, np.floating)
    if len(inputs) != len(labels) or labels.ndim == 0 or not (integer or floating):
        raise UserError(
            f"workload {spec}: its data needs one label (a class index) or target per input ({len(inputs)} inputs, "
            f"labels {labels.shape} {labels.dtype})"
        )
    return Split(
        np.ascontiguousarray(inputs), labels.astype(np.int64) if integer else np.ascontiguousarray(labels), source
    )


def _gathered(dataset: torch.utils.data.Dataset, spec: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A map-style Dataset of (input, label) pairs read once into two tensors: every worker keeps its
    whole split on its device and draws its slice of each batch from it (no loader per step)."""
    try:
        batches = list(torch.utils.data.DataLoader(dataset, batch_size=1024, shuffle=False))
    except (TypeError, NotImplementedError) as e:  # no __len__/__getitem__, or items collate cannot stack
        raise UserError(f"workload {spec}: its Dataset cannot be read as (input, label) pairs: {e}") from e
    if not batches or not all(isinstance(b, list | tuple) and len(b) == 2 for b in batches):
        raise UserError(f"workload {spec}: its Dataset must hold (input, label) pairs")
    return torch.cat([b[0] for b in batches]), torch.cat([torch.as_tensor(b[1]) for b in batches])


def _a_figure(scored) -> bool:
    """One number (a 0-d tensor too), or a (sum, count) pair of them."""
    parts = scored if isinstance(scored, tuple) and len(scored) == 2 else (scored,)
    return all(
        isinstance(p, int | float) and not isinstance(p, bool) or isinstance(p, torch.Tensor) and p.numel() == 1
        for p in parts
    )


def _described(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {', '.join(_described(v) for v in value)}"
    return f"a {type(value).__name__}"


def _why_inexact(model: nn.Module) -> str | None:
    drawn = [name for name, m in model.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]
    norms = [name for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    why = []
    if drawn:
        why.append(
            f"its dropout ({', '.join(drawn)}) draws from each process's own random stream, so a synchronous step "
            "is not one single-device step on the union batch (hetbench.workload.keyed_dropout(model) swaps "
            "nn.Dropout for dropout keyed by sample)"
        )
    if norms:
        why.append(
            f"its batch norm ({', '.join(norms)}) normalizes over each worker's share of the batch, as DDP does, "
            "not over the union batch"
        )
    return "; ".join(why) or None


def batch_norms(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def recompute_batch_norm(model: nn.Module, inputs: torch.Tensor, batch: int) -> None:
    """Batch norm's running statistics made afresh from the model's weights: its mean and variance over
    `inputs` (prepared training samples, the same every time), `batch` at a time, as an equal average
    of those batches; the rest of the model in eval mode. What every row is evaluated with, so they
    depend on the weights alone, not on how the run split its batches (docs/workloads.md)."""
    norms = batch_norms(model)
    momenta = [m.momentum for m in norms]
    model.eval()
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average: every batch counts alike
        m.train()
    try:
        with torch.no_grad():
            for start in range(0, len(inputs), batch):
                model(inputs[start : start + batch])
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        model.eval()


# ---- finding it --------------------------------------------------------------------------------

_loaded: dict[tuple, LoadedWorkload] = {}


def load_workload(run: RunConfig, announce: bool = True) -> LoadedWorkload:
    """The run's workload, once per process for the same settings. A built-in's data follows the run's
    data settings; workers pass announce=False (the driver has said where the data came from)."""
    data = (run.dataset, run.data_dir, os.environ.get("HETBENCH_DATA_DIR"), run.download)
    key = (run.workload, run.seed, run.dropout, *data)
    if key not in _loaded:
        _loaded[key] = _load(run, announce)
    return _loaded[key]


def built_in_module(name: str) -> str:
    """A built-in workload's module (config.BUILT_IN_WORKLOADS names them): hetbench/workloads/, its
    name with _ for -. Named, not imported here: those modules build on this one."""
    return f"hetbench.workloads.{name.replace('-', '_')}"


def _load(run: RunConfig, announce: bool) -> LoadedWorkload:
    spec = run.workload
    if spec in BUILT_IN_WORKLOADS:
        module = importlib.import_module(built_in_module(spec))
        return LoadedWorkload(spec, module.build(run, announce), [Path(module.__file__)])
    if run.dataset != "mnist":
        raise UserError(f"dataset: {run.dataset} is MNIST's; workload {spec} brings its own data")
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name.isidentifier():
        raise UserError(
            f"workload {spec!r} is neither a built-in ({', '.join(BUILT_IN_WORKLOADS)}) nor a module:function, "
            "e.g. mypkg.mymodel:build"
        )
    module = _import(spec, module_name)
    function = getattr(module, function_name, None)
    if not callable(function):
        raise UserError(f"workload {spec}: module {module_name} ({module.__file__}) has no function {function_name}")
    made = _called(function, spec, run.seed)
    loaded = LoadedWorkload(spec, as_workload(made, spec), _sources(module, made))
    _export_path(module)
    return loaded


def _called(function, spec: str, seed: int):
    """`function()`, or `function(seed)` where it takes a `seed` or one required argument, under the
    run's seed: a model made inside it has the same weights in every process."""
    name = function.__name__
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        parameters = {}
    required = [
        p
        for p in parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if "seed" in parameters:
        args, kwargs = (), {"seed": seed}
    elif len(required) == 1:
        args, kwargs = (seed,), {}
    elif required:
        raise UserError(f"workload {spec}: {name}() takes {len(required)} arguments; hetbench passes none, or the seed")
    else:
        args, kwargs = (), {}
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return function(*args, **kwargs)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"workload {spec}: {name}() raised {type(e).__name__}: {e}") from e


FIELDS = ("model", "train", "test", "loss", "optimizer", "scheduler", "prepare", "name")  # Workload's, as a dict's keys


def as_workload(made, spec: str) -> Workload:
    """A workload function's return value as a Workload: a Workload, or a dict of its fields. `model`
    may be a module itself (every repeat starts from a copy of its weights) or a function making one."""
    if isinstance(made, dict):
        unknown = sorted(set(made) - set(FIELDS))
        if unknown:
            raise UserError(
                f"workload {spec}: unknown keys {unknown} in what it returned; it takes {', '.join(FIELDS)}"
            )
        missing = [key for key in ("model", "train", "test") if made.get(key) is None]
        if missing:
            raise UserError(
                f"workload {spec}: what it returned has no {' or '.join(missing)}: it needs a model, train and test"
            )
        made = Workload(**made)
    if not isinstance(made, Workload):
        raise UserError(
            f"workload {spec}: it returned a {type(made).__name__}, not a hetbench Workload or a dict with a model, "
            "train and test data"
        )
    if isinstance(made.model, nn.Module):
        module = made.model
        return replace(made, model=lambda: copy.deepcopy(module))
    return made


def _import(spec: str, module_name: str):
    if "" not in sys.path and os.getcwd() not in sys.path:  # as `python -m` does: the folder you run from
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise UserError(
                f"workload {spec}: no module {module_name} on this machine's Python path "
                "(run from the folder that holds it, or add that folder to PYTHONPATH)"
            ) from e
        raise UserError(f"workload {spec}: importing {module_name} failed: {e}") from e
    except Exception as e:
        raise UserError(f"workload {spec}: importing {module_name} failed: {type(e).__name__}: {e}") from e


def _sources(module, made) -> list[Path]:
    """The files whose code the workload runs: the function's module and its model class's, where
    they are the user's (torch's and hetbench's own are covered by the package's code hash)."""
    files = [Path(inspect.getfile(module))]
    model = made.get("model") if isinstance(made, dict) else getattr(made, "model", None)
    model = type(model) if isinstance(model, nn.Module) else model
    with contextlib.suppress(TypeError):
        model_module = sys.modules.get(getattr(model, "__module__", "") or "")
        if model_module is not None and not model_module.__name__.startswith(("torch", "hetbench")):
            files.append(Path(inspect.getfile(model_module)))
    return files


def _export_path(module) -> None:
    """The folder the user's module was imported from, on PYTHONPATH for every process this driver starts
    (local nodes, Dask workers; Ray's workers get the driver's folder themselves). A joined machine
    (the Mac) imports its own copy, which the driver compares."""
    root = Path(inspect.getfile(module)).resolve().parent
    for _ in range(module.__name__.count(".")):
        root = root.parent
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(root) not in paths and not str(root).startswith(sys.prefix):
        os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *paths])


def check_same_workload(workers: list[dict]) -> None:
    """Every worker imports the workload on its own machine and loads its own data: all must run the
    same workload code on the same data, or a step is no longer one step. One sentence if not."""
    reported = [w for w in workers if "workload" in w]
    other = next((w for w in reported if w["workload"] != reported[0]["workload"]), None)
    if other is not None:
        first, second = reported[0], other
        mine, theirs = first["workload"].get("files", {}), second["workload"].get("files", {})
        differ = sorted(name for name in {**mine, **theirs} if mine.get(name) != theirs.get(name))
        files = f": {', '.join(differ)} differs" if differ else ""
        raise UserError(
            f"the workers would train different code{files}: {first['name']} runs workload "
            f"{first['workload']['spec']} (code {first['workload']['code']}), but {second['name']} runs "
            f"{second['workload']['spec']} (code {second['workload']['code']}); give every machine the same copy "
            "of the workload's module"
        )
    check_same_data(workers)
