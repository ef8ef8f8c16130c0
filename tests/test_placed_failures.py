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
