"""dask-sync on real Dask: the update rule, learning, placement by resource label, a lost worker, bad addresses."""

import json
import os
import signal
import time

import pytest

from helpers import (
    LABELLED,
    UNEQUAL,
    assert_one_line_error,
    hetbench,
    placed_workers,
    run_killing_a_worker,
    small_config,
)
from hetbench.errors import UserError
from hetbench.runner import run
from hetbench.strategies import dask_sync


def test_learns_with_worker_resident_replicas(tmp_path):
    cfg = small_config(
        tmp_path,
        "strategies=[dask-sync]",
        UNEQUAL,
        "steps=120",
        "warmup_steps=2",
        "repeats=1",
        "eval_every=40",
        "floor.enabled=false",
    )
    (record,) = json.loads(run(cfg).path.read_text())
    assert record["status"] == "ok" and record["final_accuracy"] > 0.5  # chance is 0.1
    assert [w["device"] for w in record["workers"]] == ["cpu", "cpu"]
    assert len({w["dask_worker"] for w in record["workers"]}) == 2  # one Dask worker each
    assert [w["transport"] for w in record["workers"]] == ["shared memory"] * 2  # a LocalCluster is on this host
    assert record["step"]["comm_s"] > 0 and record["startup_s"] > 0


def test_losing_every_worker_ends_the_run_clearly_and_keeps_earlier_records(tmp_path, monkeypatch):
    def kill_every_worker(strategy):  # one lost worker is survived (test_faults.py)
        pids = strategy.placed.client.run(os.getpid, workers=strategy.placed.addresses)
        for address in strategy.placed.addresses:
            os.kill(pids[address], signal.SIGKILL)

    message, records = run_killing_a_worker(tmp_path, monkeypatch, dask_sync.DaskSync, kill_every_worker, "dask-sync")
    assert message == "dask-sync: every worker was lost (the last, 'big', at step 3)"
    assert [(r["strategy"], r["status"]) for r in records] == [("single", "ok"), ("dask-sync", "failed")]


def test_workers_go_to_the_dask_worker_with_their_label(tmp_path, labelled_cluster):
    address = labelled_cluster.scheduler_address
    mac = next(a for a, w in labelled_cluster.scheduler.workers.items() if "mac" in w.resources)
    placed = placed_workers(
        dask_sync.DaskSync, small_config(tmp_path, f"cluster.dask_scheduler={address}", LABELLED), "dask_worker"
    )
    assert placed["m"] == mac and placed["d"] != mac

    for workers, message in [
        ("[{node: laptop}]", r"no Dask worker advertises placement label 'laptop' \(labels here: desktop, mac\)"),
        # one replica per Dask worker: a second `mac` worker has none to go to
        ("[{node: mac}, {node: mac}]", "1 Dask worker.s. advertise placement label 'mac' for 2 configured workers"),
    ]:
        strategy = dask_sync.DaskSync(small_config(tmp_path, f"cluster.dask_scheduler={address}", f"workers={workers}"))
        try:
            with pytest.raises(UserError, match=message):
                strategy.start()
        finally:
            strategy.close()


def test_unreachable_scheduler_is_exit_2_within_bounded_time(tmp_path):
    started = time.monotonic()
    result = hetbench(
        "run",
        "-c",
        "benchmarks/configs/quick.yaml",
        "--set",
        "strategies=[dask-sync]",
        "--set",
        "cluster.dask_scheduler=tcp://127.0.0.1:9",
        "--set",
        "cluster.connect_timeout_s=3",
        "--set",
        "download=false",
        "--results-dir",
        str(tmp_path),
        timeout=120,
    )
    assert_one_line_error(result, "cannot reach tcp://127.0.0.1:9 within 3 s")
    assert time.monotonic() - started < 60


def test_only_a_worker_at_an_address_of_this_host_shares_its_memory():
    from hetbench.cluster.dask_placed import _bindable

    assert _bindable("tcp://127.0.0.1:40000")
    assert not _bindable("tcp://192.0.2.1:40000")  # TEST-NET-1: never an address here
    assert not _bindable("tcp://mac.local:40000")


def test_live_workers_are_asked_of_the_scheduler_not_the_clients_cache():
    import logging

    from distributed import Client, LocalCluster

    from hetbench.cluster.nodes import dask_workers

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None, silence_logs=logging.CRITICAL
        ) as cluster,
        Client(cluster) as client,
    ):
        client.sync(client._update_scheduler_info)  # what the client's periodic refresh does, every 2 s
        assert client._scheduler_identity["workers"] == {}  # the cache scheduler_info() would hand back
        assert len(dask_workers(client)) == 2
