"""ray-ps on real Ray: placement, each node's transport with the update exact, a dying server, joining."""

import logging
import os
import signal
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest
import ray
import torch

from helpers import LABELLED, TINY, hetbench, made, placed_workers, run_killing_a_worker, sets, small_config
from hetbench.cluster.nodes import DIRECT_PORT
from hetbench.errors import UserError
from hetbench.strategies import ray_ps
from hetbench.strategies.single import Single


@pytest.mark.slow
def test_a_dead_server_fails_its_row_clearly_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    # a lost worker is survived (test_faults.py); the server holds the only master weights
    message, records, _ = run_killing_a_worker(
        tmp_path,
        monkeypatch,
        capsys,
        ray_ps.RayParameterServer,
        lambda strategy: ray.kill(strategy.placed.coordinator),
        "ray-ps",
        then="dask-sync",
    )
    assert message == "ray-ps: the parameter server died while step 3"
    assert [(r["strategy"], r["status"]) for r in records] == [
        ("single", "ok"),
        ("ray-ps", "failed"),
        ("dask-sync", "ok"),
    ]
    table = (tmp_path / "results" / "killed.md").read_text()
    assert "| single" in table and "| dask-sync" in table
    assert not ray.is_initialized()


def test_worker_labelled_for_the_second_node_runs_there(tmp_path, shared_cluster):
    cfg = small_config(tmp_path, *shared_cluster.overrides, LABELLED)
    placed = placed_workers(ray_ps.RayParameterServer, cfg, "node_id")
    assert placed == {"m": shared_cluster.node_ids["mac"], "d": shared_cluster.node_ids["desktop"]}


@pytest.mark.parametrize(
    "transport, blocked, mac_gets, stream",
    [
        ("direct", False, "direct tcp", False),
        ("direct", False, "direct tcp", True),  # m's gradient goes up in parts, during its backward
        ("direct", True, "object store", True),  # the server's port is taken: the object store serves
        ("object-store", False, "object store", False),
    ],
)
def test_the_servers_node_shares_memory_the_other_its_transport_and_the_update_stays_exact(
    tmp_path, shared_cluster, transport, blocked, mac_gets, stream
):
    options = (f"ray-ps.transport={transport}", f"ray-ps.stream={str(stream).lower()}")
    cfg = small_config(tmp_path, *shared_cluster.overrides, LABELLED, "dropout=0", *options)
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
    strategy = made(strategy_cls, cfg)
    try:
        strategy.start()
        transports = {w["name"]: w.get("transport") for w in strategy.worker_info()}
        assert not list(Path("/dev/shm").glob("hetbench-*"))  # unlinked once mapped: nothing can be left
        strategy.reset(cfg.run.seed)
        for step in range(steps):
            strategy.step(step, step + 1 if step + 1 < steps else None)
        return strategy.weights(), transports
    finally:
        strategy.close()


@pytest.mark.parametrize("killed, stream", [("m", False), ("d", False), ("m", True)])
def test_a_worker_killed_while_steps_run_ahead_over_a_direct_channel_is_survived_without_waiting(
    tmp_path, shared_cluster, killed, stream
):
    # m waits on its channel for the weights, the server for m's gradient on it: the mac's death must
    # end the server's wait, the desk's must end m's (the server's given-up mark), neither at a timeout
    cfg = small_config(
        tmp_path, *shared_cluster.overrides, LABELLED, "dropout=0", f"ray-ps.stream={str(stream).lower()}"
    )
    strategy = made(ray_ps.RayParameterServer, cfg)
    try:
        strategy.start()
        assert [i["transport"] for i in strategy.info] == ["shared memory", "direct tcp"]
        strategy.reset(0)
        strategy.step(0, 1)
        os.kill(next(i["pid"] for i in strategy.info if i["name"] == killed), signal.SIGKILL)  # in step 1
        started = time.monotonic()
        timings = [strategy.step(1, 2), strategy.step(2, 3), strategy.step(3, None)]
        assert time.monotonic() - started < 60  # no wait ran into its limit (600 s)
        assert [w["name"] for w in strategy.lost] == [killed]
        assert list(timings[-1].compute_s) == [{"m": "d", "d": "m"}[killed]]
        assert torch.isfinite(strategy.weights()).all()
    finally:
        strategy.close()


def test_a_joined_run_waits_for_missing_nodes_then_names_them_or_runs_without(tmp_path, shared_nodes, caplog):
    caplog.set_level(logging.INFO, logger="hetbench")
    from hetbench.cluster.joined import wait_for_workers

    cfg = small_config(
        tmp_path,
        f"cluster.ray_address={shared_nodes.ray_address}",
        "cluster.wait_for_workers_s=3",
        "batch_size=48",
        "workers=[{name: d, node: desktop}, {name: i, node: ipad}]",
    )
    started = time.monotonic()
    with pytest.raises(UserError, match=r"'ipad' \(Ray node\) did not join within 3 s: start deploy/mac/worker.sh"):
        wait_for_workers(cfg.cluster, cfg.workers)
    assert 3 <= time.monotonic() - started < 30 and not ray.is_initialized()
    assert "waiting for 'ipad' (Ray node) to join" in caplog.text

    def exited():  # what LocalMultinode.check_alive raises once a node it started has died
        raise UserError("local-multinode: 'ray start' exited with 1 while starting")

    started = time.monotonic()  # a node that died is said at once, not waited for
    with pytest.raises(UserError, match="exited with 1 while starting"):
        wait_for_workers(replace(cfg.cluster, wait_for_workers_s=60), cfg.workers, exited)
    assert time.monotonic() - started < 30
    cfg = replace(cfg, cluster=replace(cfg.cluster, allow_missing=True))
    kept = wait_for_workers(cfg.cluster, cfg.workers)
    assert [(w.name, w.batch) for w in kept] == [("d", 48)]  # the global batch is kept
    assert len(cfg.workers) == 2  # the configured run is left as it was


@pytest.mark.slow
@pytest.mark.parametrize("old_state", [None, "a-stale-token-from-another-install\n"])
def test_local_mode_works_on_a_fresh_home_and_over_an_old_ray_token(tmp_path, old_state):
    home = tmp_path / "home"
    if old_state is not None:
        (home / ".ray").mkdir(parents=True)
        (home / ".ray" / "auth_token").write_text(old_state)
    settings = sets("strategies=[ray-ps]", "eval_samples=300", "test_samples=300")
    args = ["-c", "benchmarks/configs/quick.yaml", *TINY, *settings, "--results-dir", str(tmp_path / "r")]
    result = hetbench("run", *args, env={"HOME": str(home)}, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| ray-ps" in result.stdout and "ok" in result.stdout.split("| ray-ps", 1)[1]
