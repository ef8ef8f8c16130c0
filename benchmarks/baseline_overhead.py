"""Is hetbench's `single` strategy a plain PyTorch loop? Both, same batch and device, in one run.

    python benchmarks/baseline_overhead.py [--batch 64] [--steps 40] [--rounds 7] [--device auto]

Rounds alternate plain / hetbench (ABBA) so machine drift hits both alike; prints median step
time and spread of each and their ratio (the target is within 3%).
"""

from __future__ import annotations

import argparse

import torch

from hetbench.clock import cv, median, now
from hetbench.config import load_config
from hetbench.data import cached_mnist
from hetbench.devices import resolve_device
from hetbench.results.records import environment
from hetbench.strategies.base import step_indices
from hetbench.strategies.single import Single
from hetbench.workload import build_model, build_optimizer, loss_fn


def plain_loop(images, labels, batch, steps, device, cfg):
    """pytorch/examples mnist/main.py's inner loop, nothing else."""
    model = build_model(cfg.run.dropout, cfg.run.seed).to(device)
    optimizer = build_optimizer(model.parameters(), cfg.run.optimizer, cfg.run.lr)
    model.train()
    times = []
    for step in range(steps):
        index = torch.from_numpy(step_indices(len(labels), batch, cfg.run.seed, step)).to(device)
        start = now(device)
        data, target = images[index], labels[index]
        optimizer.zero_grad()
        loss_fn(model(data), target).backward()
        optimizer.step()
        times.append(now(device) - start)
    return times


def hetbench_single(cfg, steps):
    """hetbench's baseline: the same loop in a process placed on the worker's node (its startup untimed)."""
    strategy = Single(cfg)
    try:
        strategy.start()
        strategy.reset(cfg.run.seed)
        return [strategy.step(step).total_s for step in range(steps)]
    finally:
        strategy.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--batch", type=int, default=64, help="samples per step")
    ap.add_argument("--steps", type=int, default=40, help="steps per round (the first 5 are warm-up)")
    ap.add_argument("--rounds", type=int, default=7, help="alternating plain/hetbench rounds")
    ap.add_argument("--device", default="auto", help="auto, cpu, mps, cuda[:N]")
    args = ap.parse_args()
    cfg = load_config(None, [f"workers=[{{batch: {args.batch}, device: {args.device}}}]"])
    device = resolve_device(args.device)
    images, labels = cached_mnist(cfg.run)[0].tensors(device)
    plain, ours = [], []
    for r in range(args.rounds):  # ABBA order: neither loop always runs first
        pair = [
            lambda: plain.append(median(plain_loop(images, labels, args.batch, args.steps, device, cfg)[5:])),
            lambda: ours.append(median(hetbench_single(cfg, args.steps)[5:])),
        ]
        for measure in pair if r % 2 == 0 else pair[::-1]:
            measure()
    env = environment()
    print(
        f"device {device}, batch {args.batch}, {args.rounds} rounds x {args.steps - 5} timed steps; "
        f"torch {env['versions']['torch']}, {env['cpu_count']} CPUs, commit {env['git_commit']}"
    )
    print(f"{'loop':<18}{'median step ms':>16}{'CV':>8}{'samples/s':>12}")
    for name, values in (("plain PyTorch", plain), ("hetbench single", ours)):
        m = median(values)
        print(f"{name:<18}{m * 1000:>16.2f}{cv(values):>8.1%}{args.batch / m:>12.1f}")
    print(f"hetbench single / plain step time: {median(ours) / median(plain):.3f} (target <= 1.03)")


if __name__ == "__main__":
    main()
