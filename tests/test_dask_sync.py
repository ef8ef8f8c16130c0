"""dask-sync on real Dask: placement by resource label, every worker lost, which workers share memory."""

import os
import signal

import pytest
import torch

from helpers import LABELLED, UNEQUAL, made, placed_workers, run_killing_a_worker, small_config
from hetbench.errors import UserError
from hetbench.strategies import dask_sync
from hetbench.transport.host_memory import HostBuffers


@pytest.mark.slow
def test_losing_every_worker_fails_its_row_clearly_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    def kill_every_worker(strategy):  # one lost worker is survived (test_faults.py)
        pids = strategy.placed.client.run(os.getpid, workers=strategy.placed.addresses)
        for address in strategy.placed.addresses:
            os.kill(pids[address], signal.SIGKILL)

    message, records, printed = run_killing_a_worker(
        tmp_path, monkeypatch, capsys, dask_sync.DaskSync, kill_every_worker, "dask-sync", then="torch-ddp"
    )
    assert message == "dask-sync: every worker was lost (the last, 'big', at step 3)"
    # one failed row is one failed row: the run went on with the next
    assert [(r["strategy"], r["status"]) for r in records] == [
        ("single", "ok"),
        ("dask-sync", "failed"),
        ("torch-ddp", "ok"),
    ]
    assert records[1]["reason"] == message
    # and the table it prints holds them all, the failed row with its reason
    assert "| torch-ddp" in printed and f"failed: {message}" in printed


def test_workers_go_to_the_dask_worker_with_their_label(tmp_path, shared_cluster):
    address = shared_cluster.dask_scheduler
    placed = placed_workers(
        dask_sync.DaskSync, small_config(tmp_path, f"cluster.dask_scheduler={address}", LABELLED), "dask_worker"
    )
    assert placed == {label[0]: shared_cluster.dask_worker(label) for label in ("mac", "desktop")}

    for workers, message in [
        ("[{node: laptop}]", r"no Dask worker advertises placement label 'laptop' \(labels here: desktop, mac\)"),
        # one replica per Dask worker: a second `mac` worker has none to go to
        ("[{node: mac}, {node: mac}]", "1 Dask worker.s. advertise placement label 'mac' for 2 configured workers"),
    ]:
        cfg = small_config(tmp_path, f"cluster.dask_scheduler={address}", f"workers={workers}")
        strategy = made(dask_sync.DaskSync, cfg)
        try:
            with pytest.raises(UserError, match=message):
                strategy.start()
        finally:
            strategy.close()


def test_a_worker_sent_its_weights_is_called_ahead_once_they_exist(tmp_path, shared_cluster, monkeypatch):
    # no shared memory: each call carries the weights, which exist once the update here is done
    monkeypatch.setattr(HostBuffers, "create", classmethod(lambda cls, *args: None))
    strategy = made(dask_sync.DaskSync, small_config(tmp_path, UNEQUAL, "dropout=0", *shared_cluster.overrides))
    try:
        strategy.start()
        assert [i["transport"] for i in strategy.info] == ["tcp", "tcp"]
        trained = []
        for ahead in (True, False):
            strategy.reset(0)
            strategy.step(0, 1 if ahead else None)
            queued = strategy.ahead and (strategy.ahead[0], sorted(strategy.ahead[2]))
            assert queued == ((1, [0, 1]) if ahead else None)
            strategy.step(1, None)
            trained.append(strategy.weights())
    finally:
        strategy.close()
    assert torch.equal(trained[0], trained[1])  # the call queued ahead computed on the updated weights


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
