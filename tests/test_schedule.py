"""A workload's learning-rate schedule steps once per global update wherever that update runs: after
k steps every synchronous row's rate and weights are single's, local SGD's replicas step theirs each
local step, an async server each applied gradient; a checkpoint carries the schedule's place."""

import pytest
import torch

from helpers import UNEQUAL, made, registered, small_config
from hetbench.optimizer import ScheduledOptimizer
from hetbench.strategies import registry
from tiny_workload import warmup_then_halving

SCHEDULED = "workload=tiny_workload:scheduled"
BASE_LR = 0.1  # tiny_workload's SGD
STEPS = 5
# the steps ray-train's ranks run on their own, as the test steps them
FIVE = ["dropout=0", "eval_every=1", f"steps={STEPS}", "warmup_steps=0", "repeats=1"]


def rates_and_weights(name: str, cfg, keep: bool = False, halfway: dict | None = None):
    """The learning rate after each of STEPS steps, and the weights after them; `keep`: and the state
    after step 2; `halfway`: such a state to resume from (the steps then continue after it)."""
    strategy = made(registry.load(name), cfg)
    try:
        strategy.start()
        strategy.reset(cfg.run.seed)
        first = 0
        if halfway is not None:
            strategy.load_state(halfway["state"])
            first = halfway["step"]
        rates, kept = [], None
        for step in range(first, STEPS):
            strategy.step(step)
            rates.append(strategy.learning_rate())
            if keep and step + 1 == 2:
                kept = {"step": 2, "state": strategy.state()}
        return rates, strategy.weights(), kept
    finally:
        strategy.close()


def schedule(updates: int) -> float:
    return BASE_LR * warmup_then_halving(updates)


@pytest.mark.parametrize("name", registered(lambda cls: cls.distributed))
def test_the_schedule_steps_once_per_update_wherever_the_update_runs(tmp_path, name, shared_cluster):
    cfg = small_config(tmp_path, UNEQUAL, *FIVE, SCHEDULED, *shared_cluster.overrides)
    single_rates, single_weights, _ = rates_and_weights("single", cfg)
    assert single_rates == pytest.approx([schedule(k) for k in range(1, STEPS + 1)])
    rates, weights, _ = rates_and_weights(name, cfg)
    cls = registry.load(name)
    if cls.synchronous:  # one update a step: single's rates, and single's weights
        assert rates == pytest.approx(single_rates)
        assert torch.allclose(weights, single_weights, atol=1e-5, rtol=0), (weights - single_weights).abs().max()
    elif name == "ray-localsgd":  # each replica's inner optimizer steps every step, alike
        assert rates == pytest.approx(single_rates)
    else:  # async: once per applied gradient, a worker's share of a batch: at least one a step, and as
        # many as its workers deliver (a fast one's small share may come twice in a step)
        reachable = {round(schedule(n), 12) for n in range(1, 100 * STEPS)}
        assert all(round(r, 12) in reachable for r in rates), rates
        assert rates[-1] <= schedule(STEPS)  # no fewer updates than steps: at least as far along


def test_a_checkpoint_resumes_the_schedule_where_it_was(tmp_path):
    cfg = small_config(tmp_path, UNEQUAL, *FIVE, SCHEDULED)
    rates, weights, kept = rates_and_weights("single", cfg, keep=True)
    resumed_rates, resumed_weights, _ = rates_and_weights("single", cfg, halfway=kept)
    assert kept["state"]["optimizer"]["scheduler"]["last_epoch"] == 2
    assert resumed_rates == rates[2:] and torch.equal(resumed_weights, weights)


def test_the_scheduled_optimizer_steps_its_schedule_with_each_update_and_keeps_both_states():
    param = torch.nn.Parameter(torch.ones(3))
    sgd = torch.optim.SGD([param], lr=1.0)
    stepped = ScheduledOptimizer(sgd, torch.optim.lr_scheduler.StepLR(sgd, step_size=2, gamma=0.1))
    rates = []
    for _ in range(4):
        param.grad = torch.ones(3)
        stepped.step()
        rates.append(stepped.lr)
    assert rates == pytest.approx([1.0, 0.1, 0.1, 0.01])
    again = torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=1.0)
    restored = ScheduledOptimizer(again, torch.optim.lr_scheduler.StepLR(again, step_size=2, gamma=0.1))
    restored.load_state_dict(stepped.state_dict())
    assert restored.lr == pytest.approx(0.01) and restored.scheduler.last_epoch == 4
    assert ScheduledOptimizer(torch.optim.SGD([param], lr=0.5)).state_dict()["scheduler"] is None


@pytest.mark.parametrize(
    "decay, factors",
    [("cosine", [0.5, 1.0, 1.0, 0.75, 0.25, 0.0]), ("linear", [0.5, 1.0, 1.0, 2 / 3, 1 / 3, 0.0])],
)
def test_the_configs_schedule_warms_up_then_decays_by_the_same_seam(decay, factors):
    """lr_warmup_steps and lr_decay: a LambdaLR over a repeat's steps, where the workload brings none."""
    from hetbench.config import RunConfig
    from hetbench.workload import load_workload

    loaded = load_workload(RunConfig(workload="tiny_workload:build"))
    run = RunConfig(lr_warmup_steps=2, lr_decay=decay, warmup_steps=1, steps=4)  # 5 updates in a repeat
    optimizer = loaded.build_optimizer(loaded.build_model(0).parameters(), run)
    rates = [optimizer.lr]
    for _ in range(5):
        optimizer.step()  # no gradients: the rate moves all the same
        rates.append(optimizer.lr)
    assert rates == pytest.approx([BASE_LR * f for f in factors])
    assert str(optimizer.scheduler.lr_lambdas[0]) == f"2 updates' warm-up then {decay} decay to 0 at update 5"


def test_a_workload_with_its_own_scheduler_and_a_configs_schedule_is_one_sentence(cli):
    from helpers import assert_one_line_error

    scheduled = ["--set", "workload=tiny_workload:scheduled", "--set", "lr_decay=cosine"]
    refused = cli("run", "-c", "benchmarks/configs/quick.yaml", *scheduled)
    assert_one_line_error(refused, "it brings its own scheduler (LambdaLR), and the config sets lr_warmup_steps")
