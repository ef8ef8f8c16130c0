"""Is hetbench's `single` as fast as pytorch/examples' own loop? Three loops, one process state, ABBA rounds.

    python benchmarks/baseline_overhead.py [--batch 64] [--steps 100] [--rounds 7] [--device auto]
                                           [--target 1.03] [--report-only] [--counts-only]

- examples: pytorch/examples mnist/main.py's train loop as that example writes it: its Net with
  nn.Dropout, optimizer.zero_grad(), backward, step, on device-resident batches in a seeded order;
  the device synchronized once around the timed window (kernels queue ahead of the Python loop).
- keyed: the same loop with hetbench's Net (dropout keyed by sample) and BatchOrder: what keying costs.
- single: hetbench's baseline strategy, its placed process started once and kept for every round
  (so Ray is up for all three loops), reset each round; its steps as the rows read them.

First one warm step of each is counted in this process: kernels (torch.profiler's leaf aten ops
that compute, the kernels a GPU launches) and device syncs (hetbench.devices.synchronize). Exits 1
when the keyed loop runs more than 10 kernels beyond the example's, `single` more than 5 beyond the
keyed loop, or `single` syncs more than once a step: counts, the same on every run, so always
judged (--counts-only stops there: CI's check on CPU).

The timed figure is the median over rounds of each round's single / examples (the two ran next to
each other, so what drifts over a run, a shared box's load or a fanless machine's clock, cancels).
Exits 1 when it is above --target, or when those ratios' CV is 5% or more (the figure cannot tell
then: more --steps); --report-only prints the figure without judging it (gpu-check's CPU mode in
CI, where a shared 2-core runner's noise is not a GPU's overhead).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

from hetbench import clock
from hetbench.clock import cv, median, now
from hetbench.cluster.ray_connection import use_ray_defaults
from hetbench.config import load_config
from hetbench.devices import configure_threads, keep_freed_memory, resolve_device
from hetbench.results.records import environment
from hetbench.strategies.base import BatchOrder
from hetbench.strategies.single import OneDevice, Single
from hetbench.workload import keyed, load_workload

WARMUP = 5  # steps of each round left untimed
KEYED_BEYOND_EXAMPLES = 10  # kernels a step the keyed loop may run beyond the example's (its hash)
SINGLE_BEYOND_KEYED = 5  # kernels a step single may run beyond the keyed loop (its uint8 batch made float)
SINGLE_SYNCS = 1  # device syncs a step: its stopwatch read at the step's end
RESOLVED_CV = 0.05  # the round ratios' spread under which their median is a figure
# aten ops that only describe memory (views, shapes, allocation): no kernel runs for them
NO_KERNEL = {
    "aten::view", "aten::_unsafe_view", "aten::as_strided", "aten::t", "aten::transpose", "aten::reshape",
    "aten::_reshape_alias", "aten::expand", "aten::permute", "aten::squeeze", "aten::unsqueeze", "aten::slice",
    "aten::select", "aten::detach", "aten::alias", "aten::empty", "aten::empty_strided", "aten::empty_like",
    "aten::resize_", "aten::flatten", "aten::lift_fresh", "aten::result_type", "aten::to", "aten::_to_copy",
    "aten::numpy_T", "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::narrow",
    "aten::as_strided_", "aten::resolve_conj", "aten::resolve_neg", "aten::contiguous", "aten::view_as",
}  # fmt: skip


class ExamplesNet(nn.Module):
    """pytorch/examples mnist/main.py's Net, with its nn.Dropout layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = self.dropout2(F.relu(self.fc1(torch.flatten(self.dropout1(x), 1))))
        return F.log_softmax(self.fc2(x), dim=1)


class Loop:
    """One of the plain loops, built afresh each round; `step(n)` trains global batch n."""

    def __init__(self, images, labels, batch: int, device, cfg, keyed: bool) -> None:
        torch.manual_seed(cfg.run.seed)
        self.cnn = load_workload(cfg.run)  # the built-in mnist-cnn
        self.model = (self.cnn.build_model(cfg.run.seed) if keyed else ExamplesNet()).to(device)
        self.optimizer = self.cnn.build_optimizer(self.model.parameters(), cfg.run)
        self.images, self.labels, self.batch, self.keyed = images, labels, batch, keyed
        self.order = BatchOrder(len(labels), batch, cfg.run.seed, device)
        self.model.train()

    def step(self, n: int) -> None:
        index = self.order(n)
        self.optimizer.zero_grad()
        images = self.images[index]
        with keyed(self.model, self.order.keys(n) if self.keyed else None):
            output = self.model(images)
        self.cnn.loss(output, self.labels[index]).backward()
        self.optimizer.step()


def time_loop(make_loop, steps: int, device) -> float:
    """Seconds per timed step: one sync at either end of the window, as the example's loop runs."""
    loop = make_loop()
    for n in range(steps):
        if n == WARMUP:
            window = now(device)
        loop.step(n)
    return (now(device) - window) / (steps - WARMUP)


def time_single(strategy: Single, seed: int, steps: int) -> float:
    """Seconds per timed step of the kept `single`, by its own per-step clock (what its row reads)."""
    strategy.reset(seed)
    seconds = [strategy.step(n).total_s for n in range(steps)]
    return sum(seconds[WARMUP:]) / (steps - WARMUP)


def counted(step) -> tuple[int, int, Counter]:
    """One call of `step` under the profiler: its kernels, its device syncs, the kernels by name."""
    syncs = []
    real = clock.synchronize
    with mock.patch.object(clock, "synchronize", side_effect=lambda d: syncs.append(d) or real(d)):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
    kernels = [e.name for e in prof.events() if _computes(e) and not any(map(_launches, e.cpu_children))]
    return len(kernels), len(syncs), Counter(kernels)


def _computes(event) -> bool:
    return event.name.startswith("aten::") and event.name not in NO_KERNEL


def _launches(event) -> bool:
    """Whether a kernel runs at or under this op: the innermost computing op is the kernel."""
    return _computes(event) or any(map(_launches, event.cpu_children))


def count_steps(make_loop, cfg) -> dict[str, tuple[int, int, Counter]]:
    """A warm step of each loop counted; single's own worker (OneDevice) runs here for it."""
    loops = {"examples": make_loop(False), "keyed": make_loop(True)}
    for loop in loops.values():
        loop.step(0)
    worker = OneDevice()
    worker.setup(cfg.job(), 0, 1)
    worker.reset(cfg.run.seed)
    worker.train_step(0)
    return {
        "examples": counted(lambda: loops["examples"].step(1)),
        "keyed": counted(lambda: loops["keyed"].step(1)),
        "single": counted(lambda: worker.train_step(1)),
    }


def count_failures(counts: dict[str, tuple[int, int, Counter]]) -> list[str]:
    """What the counted step does beyond its budget, a sentence each; none: within every one."""
    (examples, _, _), (keyed, _, _), (single, syncs, _) = (counts[n] for n in ("examples", "keyed", "single"))
    failures = []
    if keyed - examples > KEYED_BEYOND_EXAMPLES:
        failures.append(
            f"the keyed loop runs {keyed - examples} kernels beyond the example's ({KEYED_BEYOND_EXAMPLES} allowed)"
        )
    if single - keyed > SINGLE_BEYOND_KEYED:
        failures.append(f"single runs {single - keyed} kernels beyond the keyed loop ({SINGLE_BEYOND_KEYED} allowed)")
    if syncs > SINGLE_SYNCS:
        failures.append(f"single syncs its device {syncs} times a step ({SINGLE_SYNCS} allowed)")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64, help="samples per step (default 64)")
    ap.add_argument("--steps", type=int, default=100, help=f"steps per round, the first {WARMUP} warm-up (100)")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds of the loops (7)")
    ap.add_argument("--device", default="auto", help="auto, cpu, mps, cuda[:N] (auto)")
    ap.add_argument("--target", type=float, default=1.03, help="single / examples at most this (1.03)")
    ap.add_argument("--report-only", action="store_true", help="print the timed figure without judging it")
    ap.add_argument("--counts-only", action="store_true", help="count kernels and syncs, judge them, time nothing")
    args = ap.parse_args(argv)
    if args.steps <= WARMUP or args.rounds < 1 or args.batch < 1:
        print(f"baseline_overhead: --steps must exceed {WARMUP}, --rounds and --batch be positive", file=sys.stderr)
        return 2
    use_ray_defaults()  # as the CLI does: token auth, this Ray's own addresses
    # the plain loops run here, set up as `single`'s placed process is: its threads, its malloc settings
    configure_threads(0)
    keep_freed_memory()
    cfg = load_config(None, [f"workers=[{{batch: {args.batch}, device: {args.device}}}]"])
    device = resolve_device(args.device)
    cnn = load_workload(cfg.run)
    images, labels = cnn.train_split().tensors(device)
    images = cnn.prepare(images)  # the plain loops' batches come normalized, as the example's DataLoader gives them

    def make_loop(keyed: bool) -> Loop:
        return Loop(images, labels, args.batch, device, cfg, keyed)

    counts = count_steps(make_loop, cfg)
    each = ", ".join(f"{name} {kernels}" for name, (kernels, _, _) in counts.items())
    print(f"kernels a step (device {device}, batch {args.batch}): {each}")
    extra = counts["single"][2] - counts["examples"][2]
    print(
        "kernels single runs beyond the examples loop: " + (", ".join(f"{k} x{n}" for k, n in extra.items()) or "none")
    )
    too_many = count_failures(counts)
    for failure in too_many:
        print(f"ABOVE: {failure}")
    if args.counts_only:
        return 1 if too_many else 0
    single = Single(cfg.job())
    try:
        single.start()  # once: its process and Ray stay up through every round of every loop
        loops = {
            "examples": lambda: time_loop(lambda: make_loop(False), args.steps, device),
            "keyed": lambda: time_loop(lambda: make_loop(True), args.steps, device),
            "single": lambda: time_single(single, cfg.run.seed, args.steps),
        }
        measured: dict[str, list[float]] = {name: [] for name in loops}
        for r in range(args.rounds):  # ABBA order: no loop always runs first
            for name in list(loops) if r % 2 == 0 else list(loops)[::-1]:
                measured[name].append(loops[name]())
    finally:
        single.close()
    env = environment()
    print(
        f"device {device}, batch {args.batch}, {args.rounds} rounds x {args.steps - WARMUP} timed steps; "
        f"torch {env['versions']['torch']}, {env['cpu_count']} CPUs, commit {env['git_commit']}"
    )
    print(f"{'loop':<10}{'step ms':>10}{'CV':>8}{'samples/s':>12}{'kernels':>9}{'syncs':>7}")
    for name, values in measured.items():
        m = median(values)
        kernels, syncs, _ = counts[name]
        print(f"{name:<10}{m * 1000:>10.3f}{cv(values):>8.1%}{args.batch / m:>12.1f}{kernels:>9}{syncs:>7}")
    ratios = {name: [a / b for a, b in zip(measured[name], measured["examples"])] for name in ("single", "keyed")}
    ratio, spread = median(ratios["single"]), cv(ratios["single"])
    verdict = "within" if ratio <= args.target else "ABOVE"
    print(
        f"single / examples step time: {ratio:.3f} (median of {args.rounds} rounds, CV {spread:.1%}), {verdict} "
        f"the target {args.target}; keyed / examples: {median(ratios['keyed']):.3f}"
    )
    if spread >= RESOLVED_CV:
        print(f"unresolved: the round ratios' CV is {RESOLVED_CV:.0%} or more; run more --steps")
    failed = ratio > args.target or spread >= RESOLVED_CV
    return 1 if too_many or (failed and not args.report_only) else 0


if __name__ == "__main__":
    sys.exit(main())
