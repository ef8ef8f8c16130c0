"""What the launchers say when a call does not come back: a worker that is gone is lost, a worker the
scheduler still has is busy (not lost), each in one sentence naming the worker. The seam is
Placed.results, with the launcher's futures and liveness standing in for a cluster."""

from __future__ import annotations

import pytest

from helpers import UNEQUAL, small_config
from hetbench.cluster.dask_placed import DaskPlaced, Part
from hetbench.errors import RunFailed


class Silent:
    """A Dask future that never resolves: each wait ends in TimeoutError, as Dask's does."""

    def result(self, timeout=None):
        raise TimeoutError


def dask_placed(tmp_path, alive: bool) -> DaskPlaced:
    cfg = small_config(tmp_path, UNEQUAL, "cluster.step_timeout_s=0.3")
    placed = DaskPlaced(cfg.cluster, cfg.workers, "dask-sync")
    placed.addresses = ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]
    placed.alive = lambda address: alive
    return placed


def test_a_dask_worker_that_is_still_connected_is_busy_not_lost(tmp_path):
    placed = dask_placed(tmp_path, alive=True)
    with pytest.raises(RunFailed) as failure:
        placed.results([Part(Silent(), placed.addresses[1])], "stepping")
    assert str(failure.value) == (
        "dask-sync failed while stepping: worker 'small' did not answer within 0.3 s, though it is still "
        "connected (busy or stuck, not lost: a slower machine may need a larger cluster.step_timeout_s)"
    )


def test_a_dask_worker_the_scheduler_dropped_is_lost(tmp_path):
    placed = dask_placed(tmp_path, alive=False)
    with pytest.raises(RunFailed, match="^dask-sync failed while stepping: worker 'small' was lost$"):
        placed.results([Part(Silent(), placed.addresses[1])], "stepping")


def test_a_ray_worker_that_died_is_named(tmp_path, monkeypatch):
    import ray

    from hetbench.cluster import ray_placed

    def died(handles, timeout=None):
        raise ray.exceptions.RayActorError()

    monkeypatch.setattr(ray_placed.ray, "get", died)
    cfg = small_config(tmp_path, UNEQUAL)
    placed = ray_placed.RayPlaced(cfg.cluster, cfg.workers, "torch-ddp")
    placed._dead_ranks = lambda: [1]
    with pytest.raises(RunFailed, match="^torch-ddp: worker 'small' died while stepping$"):
        placed.results(["handle"], "stepping")


class Pool:
    """A run's host pool, recording which hosts were kept and which killed."""

    def __init__(self) -> None:
        self.kept, self.killed = [], []

    def give_back(self, hosts):
        self.kept += [host for _, host in hosts]

    def discard(self, hosts):
        self.killed += [host for _, host in hosts]


class KeptRay:
    """A run's Ray that outlives the row, with its pool."""

    kept = True

    def __init__(self) -> None:
        self.hosts = Pool()

    def release(self) -> None:
        pass


def ray_placed_with_two_hosts(tmp_path, monkeypatch, answer):
    from hetbench.cluster import ray_placed

    monkeypatch.setattr(ray_placed.ray, "get", answer)
    cfg = small_config(tmp_path, UNEQUAL)
    placed = ray_placed.RayPlaced(cfg.cluster, cfg.workers, "torch-ddp")
    placed.connection, placed.actors = KeptRay(), ["host 0", "host 1"]
    return placed


def test_the_processes_of_a_row_that_failed_are_killed_not_kept_for_the_next(tmp_path, monkeypatch):
    import ray

    def address_in_use(handles, timeout=None):  # rank 0's group failed to form; rank 1 may still wait in it
        raise ray.exceptions.RayTaskError("join", "", RuntimeError("EADDRINUSE"))

    placed = ray_placed_with_two_hosts(tmp_path, monkeypatch, address_in_use)
    pool = placed.connection.hosts
    with pytest.raises(RunFailed, match="^torch-ddp failed while forming the gloo group: EADDRINUSE$"):
        placed.results(["handle"], "forming the gloo group")
    placed.close()
    assert pool.killed == ["host 0", "host 1"] and pool.kept == []


def test_the_processes_of_a_row_that_finished_serve_the_next(tmp_path, monkeypatch):
    placed = ray_placed_with_two_hosts(tmp_path, monkeypatch, lambda handles, timeout=None: [1, 2])
    pool = placed.connection.hosts
    assert placed.results(["handle"], "stepping") == [1, 2]
    placed.close()
    assert pool.kept == ["host 0", "host 1"] and pool.killed == []


def test_a_ray_batch_that_fails_names_each_calls_reason(tmp_path, monkeypatch):
    """Two ranks of a group that never forms: the one that broke it (it cannot reach the rendezvous)
    is not the first to fail, so the sentence names both reasons, the first raised first."""
    import ray

    from hetbench.cluster import ray_placed

    failures = {
        "rank0": ray.exceptions.RayTaskError("f", "", RuntimeError("the group did not form within 120 s")),
        "rank1": ray.exceptions.RayTaskError("f", "", RuntimeError("The client socket has timed out\ndetail")),
    }

    def get(handles, timeout=None):
        for handle in handles if isinstance(handles, list) else [handles]:
            raise failures[handle]

    monkeypatch.setattr(ray_placed.ray, "get", get)
    monkeypatch.setattr(ray_placed.ray, "wait", lambda handles, num_returns, timeout: (handles, []))
    cfg = small_config(tmp_path, UNEQUAL)
    placed = ray_placed.RayPlaced(cfg.cluster, cfg.workers, "gloo-floor")
    with pytest.raises(RunFailed) as failure:
        placed.results(["rank0", "rank1"], "measuring the all-reduce")
    assert str(failure.value) == (
        "gloo-floor failed while measuring the all-reduce: the group did not form within 120 s; "
        "The client socket has timed out"
    )
