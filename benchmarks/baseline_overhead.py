"""Is hetbench's `single` strategy a plain PyTorch loop? Both, same batch and device, in one run.

    python benchmarks/baseline_overhead.py [--batch 64] [--steps 40] [--rounds 7] [--device auto]

The reference is pytorch/examples mnist/main.py's inner loop as it runs there: asynchronous, the
device synchronized once around the whole window (on a GPU, kernels queue ahead of the Python
loop). Beside it the same loop read step by step (a sync each step), and hetbench's `single`,
whose per-step figures need one clock (one sync) around each step, in its own placed process.
Rounds alternate the loops (ABBA) so machine drift hits all alike; prints each loop's median step
time and spread, and `single`'s ratio to the asynchronous loop (the target is within 3%).
"""

from __future__ import annotations

import argparse

from hetbench.clock import cv, median, now
from hetbench.cluster.ray_connection import use_ray_defaults
from hetbench.config import load_config
from hetbench.data import cached_mnist
from hetbench.devices import configure_threads, keep_freed_memory, resolve_device
from hetbench.results.records import environment
from hetbench.strategies.base import BatchOrder
from hetbench.strategies.single import Single
from hetbench.workload import build_model, build_optimizer, dropout_keys, loss_fn

WARMUP = 5  # steps of each round left untimed


def plain_loop(images, labels, batch, steps, device, cfg, each_step: bool) -> float:
    """pytorch/examples' inner loop on device-resident data; its median step seconds (`each_step`),
    or the timed window's seconds per step with one sync at either end."""
    model = build_model(cfg.run.dropout, cfg.run.seed).to(device)
    optimizer = build_optimizer(model.parameters(), cfg.run.optimizer, cfg.run.lr)
    order = BatchOrder(len(labels), batch, cfg.run.seed, device)
    model.train()
    times = []
    for step in range(steps):
        if step == WARMUP:
            window = now(device)
        start = now(device) if each_step else 0.0
        index = order(step)
        optimizer.zero_grad()
        loss_fn(model(images[index], dropout_keys(cfg.run.seed, step, index)), labels[index]).backward()
        optimizer.step()
        if each_step:
            times.append(now(device) - start)
    return median(times[WARMUP:]) if each_step else (now(device) - window) / (steps - WARMUP)


def hetbench_single(cfg, steps) -> float:
    """hetbench's baseline in a process placed on the worker's node (its startup untimed): median step seconds."""
    strategy = Single(cfg.job())
    try:
        strategy.start()
        strategy.reset(cfg.run.seed)
        return median([strategy.step(step).total_s for step in range(steps)][WARMUP:])
    finally:
        strategy.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--batch", type=int, default=64, help="samples per step")
    ap.add_argument("--steps", type=int, default=40, help=f"steps per round (the first {WARMUP} are warm-up)")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds of the loops")
    ap.add_argument("--device", default="auto", help="auto, cpu, mps, cuda[:N]")
    args = ap.parse_args()
    use_ray_defaults()  # as the CLI does: token auth, this Ray's own addresses
    # the plain loops run here, set up as `single`'s placed process is: its threads, its malloc settings
    configure_threads(0)
    keep_freed_memory()
    cfg = load_config(None, [f"workers=[{{batch: {args.batch}, device: {args.device}}}]"])
    device = resolve_device(args.device)
    images, labels = cached_mnist(cfg.run)[0].tensors(device)
    loops = {
        "plain, async": lambda: plain_loop(images, labels, args.batch, args.steps, device, cfg, each_step=False),
        "plain, sync/step": lambda: plain_loop(images, labels, args.batch, args.steps, device, cfg, each_step=True),
        "hetbench single": lambda: hetbench_single(cfg, args.steps),
    }
    measured: dict[str, list[float]] = {name: [] for name in loops}
    for r in range(args.rounds):  # ABBA order: no loop always runs first
        for name in list(loops) if r % 2 == 0 else list(loops)[::-1]:
            measured[name].append(loops[name]())
    env = environment()
    print(
        f"device {device}, batch {args.batch}, {args.rounds} rounds x {args.steps - WARMUP} timed steps; "
        f"torch {env['versions']['torch']}, {env['cpu_count']} CPUs, commit {env['git_commit']}"
    )
    print(f"{'loop':<18}{'median step ms':>16}{'CV':>8}{'samples/s':>12}")
    for name, values in measured.items():
        m = median(values)
        print(f"{name:<18}{m * 1000:>16.3f}{cv(values):>8.1%}{args.batch / m:>12.1f}")
    ratio = median(measured["hetbench single"]) / median(measured["plain, async"])
    print(f"hetbench single / plain async step time: {ratio:.3f} (target <= 1.03)")


if __name__ == "__main__":
    main()
