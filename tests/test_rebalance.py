"""rebalance_every: the global batch re-split between steps by the speeds measured in the run."""

import json

import pytest

from helpers import small_config
from hetbench.balance import resplit_event
from hetbench.runner import run
from hetbench.step_timing import StepTiming
from hetbench.strategies.base import Strategy
from hetbench.training import Schedule


class Splittable(Strategy):
    """Only the driver's side of a split: what Strategy.rebalance decides and hands on."""

    name = "splittable"
    rebalances = True
    start = reset = step = weights = worker_info = lambda *a: None

    def __init__(self, job, batches):
        super().__init__(job)
        self.info = [{"name": n, "batch": b} for n, b in zip("ab", batches)]
        self.batches, self.pushed = list(batches), []

    def push_split(self):
        self.pushed.append(list(self.batches))


def timings(*computes):
    return [StepTiming({"a": a, "b": b}, comm_s=0.0, wait_s=0.0, total_s=max(a, b)) for a, b in computes]


def test_a_worker_3x_slower_gets_a_quarter_of_the_batch_and_the_rule_follows(tmp_path):
    strategy = Splittable(small_config(tmp_path, "batch_size=64").job(), [32, 32])
    strategy.rebalance(7, timings((0.10, 0.30), (0.11, 0.29), (0.10, 0.31)))
    assert strategy.batches == [48, 16] and strategy.pushed == [[48, 16]]
    assert strategy.shares == [0.75, 0.25]
    assert [i["batch"] for i in strategy.info] == [48, 16]
    assert strategy.events == [{"step": 7, "rebalanced": {"a": 48, "b": 16}}]


def test_a_fresh_group_s_slow_first_steps_do_not_move_the_split(tmp_path):
    """A Ray Train group's warm-up on hetero-local (ms a step, its first steps slowed by the group's own
    start): split by each worker's fastest step, not by the median that the start's steps move."""
    strategy = Splittable(small_config(tmp_path, "batch_size=256").job(), [192, 64])
    desk, mac = [979, 553, 449, 291, 292], [986, 623, 398, 334, 330]
    strategy.rebalance(4, timings(*((a / 1e3, b / 1e3) for a, b in zip(desk, mac))))
    assert strategy.batches == [198, 58]  # the median's would be 186/70; the steps after trained best at 194/62


def test_speeds_that_barely_differ_leave_the_split_alone(tmp_path):
    strategy = Splittable(small_config(tmp_path, "batch_size=64").job(), [32, 32])
    strategy.rebalance(3, timings((0.100, 0.102), (0.101, 0.100)))
    strategy.rebalance(5, timings((0.1, 0.0)))  # b finished no batch in the window (async): no speed for it
    assert strategy.batches == [32, 32] and strategy.pushed == [] and strategy.events == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dask-sync", "ray-ps", "ray-train"])
def test_samples_move_from_the_slowed_worker_as_it_trains(tmp_path, name, shared_cluster):
    cfg = small_config(
        tmp_path,
        *shared_cluster.overrides,
        "name=resplit",
        f"strategies=[{name}]",
        "batch_size=64",
        "workers=[{name: fast}, {name: slow, slowdown: 3.0}]",
        "rebalance_every=4",
        "steps=12",
        "warmup_steps=2",
        "repeats=1",
        "eval_every=14",
        "floor.enabled=false",
    )
    (record,) = json.loads(run(cfg).path.read_text())
    assert record["status"] == "ok"
    splits = [e["rebalanced"] for e in record["events"] if "rebalanced" in e]
    assert splits and all(sum(s.values()) == 64 for s in splits)
    assert splits[-1]["slow"] < splits[-1]["fast"]  # equal at first; the slowed worker ends with less
    assert {w["name"]: w["batch"] for w in record["workers"]} == splits[-1]
    assert f"equal, re-split {len(splits)}x" in (tmp_path / "results" / "resplit.md").read_text()


def test_auto_re_splits_once_at_the_end_of_warm_up_and_rebalance_every_as_asked(tmp_path):
    auto = small_config(tmp_path, "balance=[auto]", "standalone_steps=2", "warmup_steps=3", "rebalance_every=0")
    assert [step for step in range(10) if Schedule.of(auto.run).resplits(step, step + 1)] == [2]
    equal = small_config(tmp_path, "balance=[equal]", "warmup_steps=3", "rebalance_every=0")
    assert not any(Schedule.of(equal.run).resplits(step, step + 1) for step in range(10))
    every = small_config(tmp_path, "balance=[equal]", "warmup_steps=3", "rebalance_every=4")
    assert [Schedule.of(every.run).resplits(step, n) for step, n in ((3, 3), (3, 4), (9, 5))] == [False, True, True]
    assert resplit_event(auto.run.warmup_steps, 2, {"a": 1}) == {"step": 2, "rebalanced": {"a": 1}, "in_warmup": True}
    assert resplit_event(auto.run.warmup_steps, 3, {"a": 1}) == {"step": 3, "rebalanced": {"a": 1}}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ray-ps", "ray-train"])
def test_auto_corrects_a_split_from_speeds_alone_by_the_warm_up_steps(tmp_path, name, shared_cluster):
    cfg = small_config(
        tmp_path,
        *shared_cluster.overrides,
        "name=auto",
        f"strategies=[{name}]",
        "batch_size=64",
        "balance=[auto]",
        "standalone_steps=2",  # auto's; the run is given the speeds below, not timing them
        "workers=[{name: fast}, {name: slow, slowdown: 3.0}]",
        "steps=4",
        "warmup_steps=3",
        "repeats=1",
        "eval_every=14",
        "floor.enabled=false",
    )
    # speeds "measured alone" that the run contradicts: auto starts from 32/32
    (record,) = json.loads(run(cfg, standalone={"fast": 100.0, "slow": 100.0}).path.read_text())
    assert record["status"] == "ok" and record["split"] == [32, 32]
    (event,) = [e for e in record["events"] if "rebalanced" in e]
    assert event["step"] == 2 and event["in_warmup"] and sum(event["rebalanced"].values()) == 64
    assert "step_s" not in event  # a re-split costs no lost step (a loss or restart event has one)
    assert event["rebalanced"]["slow"] < event["rebalanced"]["fast"]
    assert {w["name"]: w["batch"] for w in record["workers"]} == event["rebalanced"]
    (row,) = [
        line for line in (tmp_path / "results" / "auto.md").read_text().splitlines() if line.startswith(f"| {name} ")
    ]
    assert "| auto " in row and "re-split" not in row  # auto's own re-split is not a rebalance_every one
