"""What each workload asks of the link: its step time on one device, its bytes, their ratio.

    python benchmarks/workloads.py [--workload mnist-cnn --workload shapes-resnet ...] [--batch 256]
                                   [--steps 12] [--rounds 3] [--device auto] [--threads 0]
                                   [--precision fp32 --precision bf16 ...]

Each workload trains on single's own worker (OneDevice: keyed dropout, the run's or the workload's
own optimizer, batches prepared from the stored copy on the device), in alternating rounds (ABBA:
neither always first on a machine that heats). Each round times --steps steps after two untimed
ones, each step by single's own stopwatch (marked on the device's queue, read after one sync).
Printed per workload: the median ms a step and a sample, with the rounds' CV; the float32 bytes
every synchronous step moves; MB per compute-second, their ratio; and the link rate at which one
all-reduce of those bytes takes as long as the step's compute (a ring of two moves each byte once
each way; the floor's fixed cost comes on top). A workload whose ratio is lower needs a slower link
to be worth splitting. Each --precision times every workload again in it (the same rounds, alternated).
"""

from __future__ import annotations

import argparse
import sys

from tabulate import tabulate

from hetbench.clock import cv, median
from hetbench.config import load_config
from hetbench.devices import resolve_device
from hetbench.errors import UserError
from hetbench.results.records import environment
from hetbench.strategies.single import OneDevice
from hetbench.workloads import BUILT_IN

WARMUP = 2  # untimed steps of each round


def steps_timer(spec: str, batch: int, steps: int, device: str, threads: int, precision: str = "fp32"):
    """The workload `spec` and a function timing `steps` steps of it (seconds a step) in `precision` on
    single's own worker (OneDevice), set up once: the step every `single` row times."""
    worker = f"workers=[{{batch: {batch}, device: {device}}}]"
    cfg = load_config(None, [f"workload={spec}", worker, f"threads={threads}", f"precision={precision}"])
    worker = OneDevice()
    worker.setup(cfg.job(), 0, 1)
    worker.reset(cfg.run.seed)
    done = 0

    def timed() -> float:
        nonlocal done
        seconds = [worker.train_step(done + n) for n in range(WARMUP + steps)]
        done += WARMUP + steps
        return sum(seconds[WARMUP:]) / steps

    return worker.workload, timed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", action="append", help=f"a workload (repeatable; default: {', '.join(BUILT_IN)})")
    ap.add_argument("--batch", type=int, default=256, help="samples per step (256, as hetero-links)")
    ap.add_argument("--steps", type=int, default=12, help="timed steps per round (12)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    ap.add_argument("--device", default="auto", help="auto, cpu, mps, cuda[:N] (auto)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads, 0: this host's usable cores (0)")
    ap.add_argument("--precision", action="append", help="fp32, tf32, bf16, fp16 (repeatable; default: fp32)")
    args = ap.parse_args()
    if args.steps < 1 or args.rounds < 1 or args.batch < 1:
        print("workloads: --steps, --rounds and --batch must be positive", file=sys.stderr)
        return 2
    try:
        device = resolve_device(args.device)
        specs = [(spec, p) for spec in args.workload or BUILT_IN for p in args.precision or ["fp32"]]
        timers = {key: steps_timer(key[0], args.batch, args.steps, args.device, args.threads, key[1]) for key in specs}
    except UserError as e:
        print(f"workloads: {e}", file=sys.stderr)
        return 2
    seconds: dict[tuple, list[float]] = {key: [] for key in timers}
    for r in range(args.rounds):
        for key in list(timers) if r % 2 == 0 else list(timers)[::-1]:
            seconds[key].append(timers[key][1]())
    rows = []
    for key, (workload, _) in timers.items():
        step, size = median(seconds[key]), workload.facts().model_bytes
        rows.append(
            [
                workload.name,
                key[1],
                f"{workload.parameters:,}",
                f"{size / 1e6:.2f}",
                f"{step * 1000:.0f} ± {cv(seconds[key]):.0%}",
                f"{step * 1000 / args.batch:.2f}",
                f"{size / 1e6 / step:.1f}",
                f"{size * 8 / step / 1e6:,.0f}",
            ]
        )
    env = environment()
    print(
        f"{device} on {env['host']} ({env['usable_cores']} usable cores, torch {env['versions']['torch']}), "
        f"batch {args.batch}, median of {args.rounds} rounds of {args.steps} steps:"
    )
    headers = ["workload", "precision", "parameters", "MB a step", "ms a step ± CV", "ms a sample", "MB per compute-s",
               "link Mbit/s = compute"]  # fmt: skip
    print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
