"""Batch norm, trained as DDP trains it: each worker normalizes over its own share of the batch (the
row is not exact, and says why), and the running statistics follow one rule in every row: recomputed
from the weights at each check over the same training samples, so they depend on the weights alone."""

import pytest
import torch

from helpers import UNEQUAL, made, registered, small_config
from hetbench.config import RunConfig
from hetbench.gradients import FlatModel
from hetbench.results.record import Settings
from hetbench.results.records import trained
from hetbench.strategies import registry
from hetbench.training import Evaluator
from hetbench.workload import load_workload

NORMED = "workload=tiny_workload:batch_norm"
FEW = ["eval_every=1", "steps=3", "warmup_steps=0", "repeats=1", "ray-localsgd.sync_every=1"]


def statistics(evaluate: Evaluator) -> torch.Tensor:
    norm = evaluate.flat.model[2]
    return torch.cat([norm.running_mean, norm.running_var])


def test_the_workload_says_it_is_not_exact_and_the_record_says_the_rule():
    loaded = load_workload(RunConfig(workload="tiny_workload:batch_norm"))
    loaded.preflight(RunConfig())  # its statistics change in a step, by the rule: not refused
    assert not loaded.exact and "batch norm (2) normalizes over each worker's share of the batch" in loaded.inexact
    facts = loaded.facts()
    assert facts.batch_norm_layers == 1

    class Row:  # what trained() reads of a record
        workload = facts
        config = Settings()

    assert "its 1 batch norm layers' statistics recomputed at each check" in trained([Row()])


def test_the_statistics_an_evaluation_uses_depend_on_the_weights_alone(tmp_path):
    cfg = small_config(tmp_path, NORMED)
    evaluate = Evaluator(load_workload(cfg.run), cfg.run)
    weights = evaluate.flat.params.clone() + 0.01
    first = evaluate(weights)
    kept = statistics(evaluate).clone()
    evaluate.flat.model[2].running_mean.fill_(5.0)  # whatever a worker's training left in them
    assert evaluate(weights) == first and torch.equal(statistics(evaluate), kept)
    assert not torch.equal(kept[:32], torch.zeros(32))  # recomputed: not the fresh layer's zeros
    evaluate(weights * 2)
    assert not torch.equal(statistics(evaluate), kept)


@pytest.mark.parametrize("name", registered(lambda cls: True))
def test_a_model_with_batch_norm_trains_through_every_strategy(tmp_path, name, shared_cluster):
    cfg = small_config(tmp_path, UNEQUAL, NORMED, *FEW, *shared_cluster.overrides)
    workload = load_workload(cfg.run)
    evaluate = Evaluator(workload, cfg.run)
    initial = FlatModel(workload.build_model(cfg.run.seed)).params  # every row starts from it
    strategy = made(registry.load(name), cfg)
    try:
        strategy.start()
        strategy.reset(cfg.run.seed)
        for step in range(3):
            strategy.step(step)
        weights = strategy.weights()
    finally:
        strategy.close()
    assert torch.isfinite(weights).all() and not torch.equal(weights, initial)
    before, after = evaluate(initial), evaluate(weights)
    assert after > before, (before, after)  # accuracy on 600 test samples rose in 3 steps


def test_a_resume_evaluates_with_the_statistics_of_an_uninterrupted_run(tmp_path):
    cfg = small_config(tmp_path, UNEQUAL, NORMED, *FEW)
    evaluate = Evaluator(load_workload(cfg.run), cfg.run)
    strategy = made(registry.load("single"), cfg)
    try:
        strategy.start()
        strategy.reset(cfg.run.seed)
        strategy.step(0)
        kept = strategy.state()
        for step in (1, 2):
            strategy.step(step)
        evaluate(strategy.weights())
        uninterrupted = statistics(evaluate).clone()
        strategy.reset(cfg.run.seed)
        strategy.load_state(kept)
        for step in (1, 2):
            strategy.step(step)
        evaluate(strategy.weights())
    finally:
        strategy.close()
    assert torch.equal(statistics(evaluate), uninterrupted)
