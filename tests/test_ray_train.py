"""ray-train on real Ray Train and real gloo: which rank plays which configured worker, and where."""

import pytest

from helpers import made, small_config
from hetbench.config import WorkerConfig
from hetbench.strategies.ray_train import RayTrain, assign_ranks


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
