"""Faults: a worker killed mid-run (for real) and the run going on with the survivors."""

import json
import os
import signal
import time

import pytest
import torch

from helpers import check_a_killed_worker_is_survived, made, registered, small_config
from hetbench.errors import UserError
from hetbench.runner import run
from hetbench.scenarios import faults_for, skipped_features
from hetbench.strategies import registry
from hetbench.strategies.parameter_server import ParameterServerDriver

TWO = "workers=[{name: big, batch: 40}, {name: small, batch: 24}]"
KILL_SMALL = "faults=[{at_step: 4, kill: worker, target: small}]"


def faulted_run(tmp_path, strategy: str, *extra: str) -> tuple[dict, dict]:
    """single, then `strategy` losing worker 'small' at step 4 of its first repeat (dropout 0)."""
    cfg = small_config(
        tmp_path,
        f"strategies=[single, {strategy}]",
        TWO,
        KILL_SMALL,
        "dropout=0",
        "steps=8",
        "warmup_steps=1",
        "eval_every=3",
        "floor.enabled=false",
        *extra,
    )
    single, faulted = json.loads(run(cfg).path.read_text())
    return single, faulted


@pytest.mark.slow
@pytest.mark.parametrize("name", registered(lambda cls: cls.synchronous and cls.survives_worker_loss))
def test_a_killed_worker_is_survived_on_the_single_device_trajectory(tmp_path, name):
    check_a_killed_worker_is_survived(tmp_path, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", registered(lambda cls: not cls.synchronous and cls.survives_worker_loss))
def test_a_strategy_without_a_barrier_goes_on_without_a_killed_worker(tmp_path, name):
    _, faulted = faulted_run(tmp_path, name, "repeats=1", "steps=30")
    assert faulted["status"] == "ok"
    assert faulted["events"][0]["injected"] == "kill worker small" and faulted["events"][0]["step"] == 4
    lost = next(e for e in faulted["events"] if "lost" in e)
    assert lost["lost"] == "small" and lost["split"] == {"big": 64}
    assert faulted["final_accuracy"] > 0.3  # still learning on the survivor (chance is 0.1)


def test_a_strategy_that_cannot_survive_gets_no_fault_and_says_so(tmp_path):
    from hetbench.strategies.base import Strategy
    from hetbench.strategies.single import Single

    class Fragile(Strategy):  # only the class attributes matter here
        name = "fragile"

    cfg = small_config(tmp_path, TWO, KILL_SMALL)
    assert faults_for(Fragile, cfg) == []
    assert skipped_features(Fragile, cfg) == {
        "faults_skipped": "fragile does not survive a lost worker yet: faults not injected"
    }
    assert faults_for(Single, cfg) == [] and skipped_features(Single, cfg) == {}  # the baseline has no workers to lose


@pytest.mark.parametrize(
    "faults,message",
    [
        ("[{at_step: 4, kill: worker, target: nobody}]", "no worker is named 'nobody'"),
        ("[{at_step: 99, kill: worker, target: small}]", "must be a step of a repeat, 0 to 7"),
        ("[{at_step: 1, kill: planet, target: small}]", "must be one of worker"),
        ("[{at_step: 1, target: small}]", "must be a mapping with keys at_step, kill, target"),
        ("[{at_step: 1, kill: worker, target: small}, {at_step: 2, kill: worker, target: big}]", "kill every worker"),
    ],
)
def test_bad_faults_are_one_sentence(tmp_path, faults, message):
    with pytest.raises(UserError, match=message):
        small_config(tmp_path, TWO, f"faults={faults}", "steps=5", "warmup_steps=3")


@pytest.mark.slow
@pytest.mark.parametrize("name", registered(lambda cls: issubclass(cls, ParameterServerDriver) and cls.synchronous))
def test_a_worker_killed_while_steps_run_ahead_in_shared_memory_is_survived_without_waiting(tmp_path, name):
    # its gradient counter never moves: the server's wait and the survivor's wait for the weights must end
    strategy = made(registry.load(name), small_config(tmp_path, TWO, "dropout=0"))
    try:
        strategy.start()
        assert [i["transport"] for i in strategy.info] == ["shared memory"] * 2 and strategy.host is not None
        strategy.reset(0)
        strategy.step(0, 1)
        os.kill(strategy.info[1]["pid"], signal.SIGKILL)  # while it computes step 1, queued ahead
        started = time.monotonic()
        timings = [strategy.step(1, 2), strategy.step(2, 3), strategy.step(3, None)]
        assert time.monotonic() - started < 60  # no wait ran into its limit
        assert [w["name"] for w in strategy.lost] == ["small"] and strategy.batches == [64]
        assert list(timings[-1].compute_s) == ["big"] and all(t.total_s > 0 for t in timings)
        assert torch.isfinite(strategy.weights()).all()
    finally:
        strategy.close()
    assert not any(name.startswith("hetbench-") for name in os.listdir("/dev/shm"))
