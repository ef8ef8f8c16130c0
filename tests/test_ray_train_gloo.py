"""ray-train-gloo on real Ray Train and real gloo: the staged weighted all-reduce, equivalence, learning."""

import json
import multiprocessing as mp
import queue
from datetime import timedelta

import ray
import torch

from helpers import UNEQUAL, small_config
from hetbench.floor import free_port
from hetbench.gradients import FlatModel
from hetbench.runner import run
from hetbench.strategies.ray_train_gloo import RayTrainGloo, assign_ranks, staged_allreduce
from hetbench.workload import build_model


def _rank(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    flat = FlatModel(build_model(0.0, seed=0))  # stands in for an MPS rank: the same copy-in/copy-out path
    flat.grads.fill_(float(rank + 1))  # rank 0's gradient is all 1s, rank 1's all 2s
    staging = torch.zeros_like(flat.grads)
    staged_allreduce(flat, staging, share=[0.625, 0.375][rank])
    results.put(
        (
            rank,
            flat.grads.min().item(),
            flat.grads.max().item(),
            all(torch.equal(p.grad, flat.grads[: p.numel()].view_as(p)) for p in list(flat.model.parameters())[:1]),
        )
    )
    dist.destroy_process_group()


def test_staged_allreduce_applies_the_sample_weighted_rule_across_two_gloo_ranks():
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, results), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = sorted(results.get(timeout=120) for _ in procs)
    except queue.Empty:
        raise AssertionError("gloo ranks did not finish") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    expected = 0.625 * 1 + 0.375 * 2  # batches 40 and 24 of 64
    for _, low, high, views_intact in got:
        assert abs(low - expected) < 1e-6 and abs(high - expected) < 1e-6 and views_intact


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
