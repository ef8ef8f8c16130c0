"""ray-train-gloo on real Ray Train and real gloo: equivalence, learning, placement."""

import json

import ray

from helpers import UNEQUAL, small_config
from hetbench.runner import run
from hetbench.strategies.ray_train_gloo import RayTrainGloo, assign_ranks


def test_learns_and_records_every_rank(tmp_path):
    cfg = small_config(
        tmp_path,
        "strategies=[ray-train-gloo]",
        UNEQUAL,
        "steps=120",
        "warmup_steps=2",
        "repeats=2",
        "eval_every=40",
        "floor.enabled=false",
    )
    (record,) = json.loads(run(cfg).path.read_text())
    assert record["status"] == "ok" and record["final_accuracy"] > 0.5  # chance is 0.1
    assert {w["name"]: w["batch"] for w in record["workers"]} == {"big": 40, "small": 24}
    assert sorted(w["rank"] for w in record["workers"]) == [0, 1]
    assert all(w["compute_s"] > 0 for w in record["workers"]) and record["step"]["comm_s"] > 0
    assert len(record["repeat_samples_per_s"]) == 2 and record["startup_s"] > 0
    assert not ray.is_initialized()


def test_ranks_play_the_worker_labelled_for_their_node(tmp_path, two_nodes):
    cluster, mac = two_nodes
    cfg = small_config(
        tmp_path,
        f"cluster.ray_address={cluster.address}",
        "steps=1",
        "warmup_steps=0",
        "repeats=1",
        "workers=[{name: m, node: mac, batch: 8}, {name: d, node: desktop, batch: 16}]",
    )
    strategy = RayTrainGloo(cfg)
    try:
        strategy.start()
        placed = {w["name"]: (w["node_id"], w["batch"]) for w in strategy.worker_info()}
    finally:
        strategy.close()
    assert placed["m"] == (mac.node_id, 8)
    assert placed["d"][0] != mac.node_id and placed["d"][1] == 16


def test_rank_assignment_follows_node_labels_then_order():
    workers = [{"node": "mac"}, {"node": None}, {"node": "desktop"}]
    assert assign_ranks(workers, [{"desktop", "CPU"}, {"mac"}, {"CPU"}]) == [2, 0, 1]
    assert assign_ranks(workers, [{"mac", "desktop"}] * 3) == [0, 2, 1]  # one node with every label
    assert assign_ranks([{"node": None}, {"node": None}], [set(), set()]) == [0, 1]
