"""How far float arithmetic alone parts a split run from the whole batch's, step by step.

    python benchmarks/split_trajectory.py [-c CONFIG] [--splits 196+60 195+61] [--steps 24]

In this one process, the config's model trains from its seed on the same global batches three or
more ways: one device stepping each whole batch, and each `--splits` split's workers computing
their slices (dropout keyed by sample, as every strategy computes them), combined by the update
rule. Nothing differs but the order of the arithmetic, so what parts the curves is rounding. Prints
each split's largest weight difference from the whole batch's, and every way's test accuracy.
"""

from __future__ import annotations

import argparse

import torch
from script_cluster import run_script

from hetbench.config import load_config
from hetbench.data import cached_mnist
from hetbench.gradients import FlatModel, batch_shares, weighted_sum
from hetbench.strategies.base import BatchOrder, worker_slice
from hetbench.training import Evaluator
from hetbench.workload import build_model, build_optimizer, dropout_keys, forward_backward


def trained(run, images, labels, batches: list[int], steps: int) -> list[torch.Tensor]:
    """The weights after each of `steps` synchronous steps of workers with `batches` samples each."""
    order = BatchOrder(len(labels), run.batch_size, run.seed)
    workers = [FlatModel(build_model(run.dropout, run.seed)) for _ in batches]
    server = FlatModel(build_model(run.dropout, run.seed))
    optimizer = build_optimizer(server.optimizer_params(), run.optimizer, run.lr)
    weights = []
    for step in range(steps):
        gradients = []
        for rank, worker in enumerate(workers):
            worker.load_params(server.params)
            index = worker_slice(order(step), batches, rank)
            worker.zero_grad()
            forward_backward(worker.model, images[index], labels[index], dropout_keys(run.seed, step, index))
            gradients.append(worker.grads.clone())
        server.grads.copy_(weighted_sum(gradients, batch_shares(batches)))
        optimizer.step()
        weights.append(server.params.clone())
    return weights


def split(text: str) -> list[int]:
    try:
        batches = [int(b) for b in text.split("+")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a split is '+'-joined sample counts, e.g. 196+60, not {text!r}") from None
    if min(batches) < 1:
        raise argparse.ArgumentTypeError(f"every worker of a split needs a sample, not {text!r}")
    return batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("-c", "--config", default="benchmarks/configs/hetero-local.yaml", help="its model, data and seed")
    ap.add_argument("--splits", nargs="+", type=split, default=[[196, 60], [195, 61]], help="each worker's samples")
    ap.add_argument("--steps", type=int, default=24, help="synchronous steps each way")
    ap.add_argument("--every", type=int, default=4, help="print every N steps")
    args = ap.parse_args()
    run = load_config(args.config).run
    train, test = cached_mnist(run, announce=False)
    images, labels = train.tensors("cpu")
    evaluate = Evaluator(test, run)
    ways = {"whole": [run.batch_size]} | {"+".join(map(str, batches)): batches for batches in args.splits}
    if any(sum(batches) != run.batch_size for batches in ways.values()):
        ap.error(f"each split must add up to the config's global batch, {run.batch_size}")
    curves = {name: trained(run, images, labels, batches, args.steps) for name, batches in ways.items()}
    splits = [name for name in ways if name != "whole"]
    print("step  whole acc  " + "  ".join(f"{name:>8} acc  max |w - whole|" for name in splits))
    for step in range(args.every - 1, args.steps, args.every):
        cells = [
            f"{evaluate(curves[name][step]):8.1%}  {apart(curves[name][step], curves['whole'][step]):15.1e}"
            for name in splits
        ]
        print(f"{step + 1:4d}  {evaluate(curves['whole'][step]):9.1%}  " + "  ".join(cells))


def apart(weights: torch.Tensor, whole: torch.Tensor) -> float:
    return (weights - whole).abs().max().item()


if __name__ == "__main__":
    run_script(main)
