"""ray-train on real Ray Train and real gloo: which rank plays which configured worker, and where."""

import pytest

from helpers import made, small_config
from hetbench.config import WorkerConfig
from hetbench.strategies.ray_train import RayTrain, assign_ranks
from hetbench.strategies.ray_train_collector import Collector


@pytest.mark.slow
def test_ranks_play_the_worker_labelled_for_their_node(tmp_path, shared_cluster):
    cfg = small_config(
        tmp_path,
        *shared_cluster.overrides,
        "steps=1",
        "warmup_steps=0",
        "repeats=1",
        "workers=[{name: m, node: mac, batch: 8}, {name: d, node: desktop, batch: 16}]",
    )
    strategy = made(RayTrain, cfg)
    try:
        strategy.start()
        placed = {w["name"]: (w["node_id"], w["batch"]) for w in strategy.worker_info()}
        interfaces = [w["gloo_interface"] for w in strategy.worker_info()]
    finally:
        strategy.close()
    assert placed == {"m": (shared_cluster.node_ids["mac"], 8), "d": (shared_cluster.node_ids["desktop"], 16)}
    assert interfaces == [shared_cluster.interface] * 2  # toward rank 0's node address, set before Ray Train's init


def test_rank_assignment_follows_node_labels_then_order():
    workers = (WorkerConfig(node="mac"), WorkerConfig(node=None), WorkerConfig(node="desktop"))
    assert assign_ranks(workers, [{"desktop", "CPU"}, {"mac"}, {"CPU"}]) == [2, 0, 1]
    assert assign_ranks(workers, [{"mac", "desktop"}] * 3) == [0, 2, 1]  # one node with every label
    assert assign_ranks((WorkerConfig(), WorkerConfig()), [set(), set()]) == [0, 1]


def started(world: int = 2) -> Collector:
    """A collector whose driver waits in repeat 0 and whose group began at step 0."""
    collector = Collector(world)
    assert collector.wait((0, 0), 0) is None  # the driver names its repeat
    for rank in range(world):
        assert collector.begin(rank, 0)[:2] == (0, 0)
    return collector


def test_a_restart_reruns_a_step_that_a_lost_rank_never_recorded():
    # rank 0 finished step 5 and kept its state (next step 6); rank 1 died before it recorded step 5
    collector = started()
    for step in range(5):
        for rank in (0, 1):
            collector.record((0, step), rank, {"total_s": 1.0})
    collector.save_state(0, 3, "after 2")
    collector.record((0, 5), 0, {"total_s": 1.0}, weights="rank 0's step 5")
    collector.save_state(0, 6, "after 5")
    assert collector.wait((0, 5), 0) is None
    # the restarted group begins where every rank had finished: step 5 is trained and timed again
    assert collector.begin(0, 0) == (0, 3, "after 2", False) and collector.begin(1, 0)[:3] == (0, 3, "after 2")
    for step in (3, 4):
        for rank in (0, 1):
            collector.record((0, step), rank, {"total_s": 2.0})
    collector.record((0, 5), 1, {"total_s": 2.0})
    assert collector.wait((0, 5), 0) is None  # not rank 0's timing from the lost group
    collector.record((0, 5), 0, {"total_s": 2.0}, weights="restarted step 5")
    timings, weights, starts, resumed_from = collector.wait((0, 5), 0)
    assert timings == {0: {"total_s": 2.0}, 1: {"total_s": 2.0}} and weights == "restarted step 5"
    assert (starts, resumed_from) == (2, 3)


def test_a_state_counts_once_every_rank_recorded_its_step_in_either_order():
    collector = started()
    collector.record((0, 2), 1, {"total_s": 1.0})
    collector.save_state(0, 3, "after 2")  # rank 0 keeps it before its own record arrives
    collector.record((0, 2), 0, {"total_s": 1.0})
    assert collector.begin(0, 0)[:3] == (0, 3, "after 2")
    collector.record((0, 5), 0, {"total_s": 1.0})
    collector.record((0, 5), 1, {"total_s": 1.0})
    collector.save_state(0, 6, "after 5")  # both recorded first
    assert collector.begin(0, 0)[:3] == (0, 6, "after 5")


def test_the_driver_checkpoints_the_state_of_its_own_step_though_the_ranks_ran_ahead():
    collector = started()
    for step in range(7):
        for rank in (0, 1):
            collector.record((0, step), rank, {"total_s": 1.0})
        if step in (2, 5):
            collector.save_state(0, step + 1, f"after {step}")
    for step in range(3):  # the driver is behind: it checkpoints after step 2
        assert collector.wait((0, step), 0) is not None
    assert collector.state_at(0, 3, 0) == "after 2" and collector.state_at(0, 6, 0) == "after 5"
    for step in range(3, 6):
        collector.wait((0, step), 0)
    for step in (7, 8):
        for rank in (0, 1):
            collector.record((0, step), rank, {"total_s": 1.0})
    collector.save_state(0, 9, "after 8")  # a state the driver has passed is let go once a newer is kept
    assert collector.state_at(0, 3, 0) is None and collector.state_at(0, 6, 0) == "after 5"
    assert collector.begin(0, 0)[:3] == (0, 9, "after 8")
    # a resumed run's group begins where the driver's checkpoint was, checking as finely as it did
    resumed = Collector(2)
    resumed.resume_from(0, 6, "read back", near_target=True)
    resumed.wait((0, 6), 0)
    assert resumed.begin(0, 0) == (0, 6, "read back", True)
