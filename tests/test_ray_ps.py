"""ray-ps / ray-ps-async on real Ray: the update rule, learning, placement, a dying worker, bad addresses."""

import json
import socket
import time
from pathlib import Path

import pytest
import ray
import torch

from helpers import (
    LABELLED,
    UNEQUAL,
    assert_one_line_error,
    hetbench,
    placed_workers,
    run_killing_a_worker,
    small_config,
)
from hetbench.cluster.nodes import DIRECT_PORT
from hetbench.errors import UserError
from hetbench.runner import run
from hetbench.strategies import ray_ps
from hetbench.strategies.single import Single


def test_async_learns_and_records_bounded_staleness(tmp_path):
    cfg = small_config(
        tmp_path,
        "strategies=[ray-ps-async]",
        UNEQUAL,
        "steps=120",
        "warmup_steps=2",
        "repeats=1",
        "eval_every=40",
        "floor.enabled=false",
        "ray-ps-async.max_staleness=1",
    )
    (record,) = json.loads(run(cfg).path.read_text())
    assert record["status"] == "ok" and record["final_accuracy"] > 0.5  # chance is 0.1
    staleness = record["staleness"]
    assert sum(staleness["histogram"].values()) > 120 and staleness["max"] <= 2
    assert {w["name"]: w["device"] for w in record["workers"]} == {"big": "cpu", "small": "cpu"}


def test_a_dead_server_ends_the_run_clearly_and_keeps_earlier_records(tmp_path, monkeypatch):
    # a lost worker is survived (test_faults.py); the server holds the only master weights
    message, records = run_killing_a_worker(
        tmp_path,
        monkeypatch,
        ray_ps.RayParameterServer,
        lambda strategy: ray.kill(strategy.placed.coordinator),
        "ray-ps",
    )
    assert message == "ray-ps: the parameter server died while step 3"
    assert [(r["strategy"], r["status"]) for r in records] == [("single", "ok"), ("ray-ps", "failed")]
    assert "| single" in (tmp_path / "results" / "killed.md").read_text()
    assert not ray.is_initialized()


def test_worker_labelled_for_the_second_node_runs_there(tmp_path, two_nodes):
    cluster, mac = two_nodes
    placed = placed_workers(
        ray_ps.RayParameterServer, small_config(tmp_path, f"cluster.ray_address={cluster.address}", LABELLED), "node_id"
    )
    assert placed["m"] == mac.node_id
    assert placed["d"] != mac.node_id


@pytest.mark.parametrize(
    "transport, blocked, mac_gets",
    [
        ("direct", False, "direct tcp"),
        ("direct", True, "object store"),  # the server's port is taken: the object store serves
        ("object-store", False, "object store"),
    ],
)
def test_the_servers_node_shares_memory_the_other_its_transport_and_the_update_stays_exact(
    tmp_path, two_nodes, transport, blocked, mac_gets
):
    cluster, _ = two_nodes
    cfg = small_config(
        tmp_path, f"cluster.ray_address={cluster.address}", LABELLED, "dropout=0", f"ray-ps.transport={transport}"
    )
    blocker = socket.create_server(("", DIRECT_PORT)) if blocked else None
    try:
        mixed, transports = trained(ray_ps.RayParameterServer, cfg)
    finally:
        if blocker:
            blocker.close()
    # the driver (and so the server) is on the head node, beside `d`; `m` is on the second node
    assert transports == {"d": "shared memory", "m": mac_gets}
    assert torch.allclose(mixed, trained(Single, cfg)[0], atol=1e-5, rtol=0)


def trained(strategy_cls, cfg, steps: int = 3) -> tuple[torch.Tensor, dict]:
    """The weights after `steps` steps, each queued before the last one ended, and each worker's transport."""
    strategy = strategy_cls(cfg)
    try:
        strategy.start()
        transports = {w["name"]: w.get("transport") for w in strategy.worker_info()}
        assert not list(Path("/dev/shm").glob("hetbench-*"))  # unlinked once mapped: nothing can be left
        strategy.reset(cfg["seed"])
        for step in range(steps):
            strategy.step(step, step + 1 if step + 1 < steps else None)
        return strategy.weights(), transports
    finally:
        strategy.close()


def test_a_joined_run_waits_for_missing_nodes_then_names_them_or_runs_without(tmp_path, two_nodes, capsys):
    from hetbench.cluster.joined import wait_for_workers

    cluster, _ = two_nodes
    cfg = small_config(
        tmp_path,
        f"cluster.ray_address={cluster.address}",
        "cluster.wait_for_workers_s=3",
        "batch_size=48",
        "workers=[{name: d, node: desktop}, {name: i, node: ipad}]",
    )
    started = time.monotonic()
    with pytest.raises(UserError, match=r"'ipad' \(Ray node\) did not join within 3 s: start deploy/mac/worker.sh"):
        wait_for_workers(cfg)
    assert 3 <= time.monotonic() - started < 30 and not ray.is_initialized()
    assert "waiting for 'ipad' (Ray node) to join" in capsys.readouterr().err
    cfg["cluster"]["allow_missing"] = True
    kept = wait_for_workers(cfg)
    assert [(w["name"], w["batch"]) for w in kept["workers"]] == [("d", 48)]  # the global batch is kept
    assert len(cfg["workers"]) == 2  # the configured run is left as it was


def test_unreachable_ray_address_is_exit_2_within_bounded_time(tmp_path):
    started = time.monotonic()
    result = hetbench(
        "run",
        "-c",
        "benchmarks/configs/quick.yaml",
        "--set",
        "strategies=[ray-ps]",
        "--set",
        "cluster.ray_address=127.0.0.1:9",
        "--set",
        "cluster.connect_timeout_s=3",
        "--set",
        "download=false",
        "--results-dir",
        str(tmp_path),
        timeout=120,
    )
    assert_one_line_error(result, "cannot reach 127.0.0.1:9 within 3 s")
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("old_state", [None, "a-stale-token-from-another-install\n"])
def test_local_mode_works_on_a_fresh_home_and_over_an_old_ray_token(tmp_path, old_state):
    home = tmp_path / "home"
    if old_state is not None:
        (home / ".ray").mkdir(parents=True)
        (home / ".ray" / "auth_token").write_text(old_state)
    result = hetbench(
        "run",
        "-c",
        "benchmarks/configs/quick.yaml",
        "--set",
        "strategies=[ray-ps]",
        "--set",
        "steps=2",
        "--set",
        "warmup_steps=0",
        "--set",
        "repeats=1",
        "--set",
        "floor.enabled=false",
        "--set",
        "download=false",
        "--results-dir",
        str(tmp_path / "r"),
        env={"HOME": str(home)},
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| ray-ps" in result.stdout and "ok" in result.stdout.split("| ray-ps", 1)[1]
