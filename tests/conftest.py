"""Fixtures every test gets or may ask for. Shared helpers live in helpers.py (imported as `helpers`:
pytest puts this folder on sys.path, so bare `pytest` and `python -m pytest` both find it)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from helpers import SHARED_MNIST


def offline_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real MNIST test split where the machine has it; never the network (the download test serves its own)."""
    if SHARED_MNIST.is_dir():
        monkeypatch.setenv("HETBENCH_DATA_DIR", str(SHARED_MNIST))
    else:
        monkeypatch.delenv("HETBENCH_DATA_DIR", raising=False)


@pytest.fixture(autouse=True)
def _offline_data(monkeypatch):
    offline_data(monkeypatch)


@pytest.fixture(scope="module")
def _cluster_data():
    """The same data settings for the processes of a cluster a fixture starts: they outlive one test,
    and their workers read the data where they run."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        offline_data(monkeypatch)
        yield


@pytest.fixture(scope="module")
def two_nodes(_cluster_data):
    """A real two-node Ray cluster on this machine: a head, and a node advertising the `mac` label."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"desktop": 1}})
    mac = cluster.add_node(num_cpus=1, resources={"mac": 1})
    cluster.wait_for_nodes(timeout=60)
    yield cluster, mac
    import ray

    if ray.is_initialized():  # a test that failed before its strategy's close()
        ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def labelled_cluster(_cluster_data):
    """A real scheduler and two `dask worker` processes, one advertising the `mac` resource label."""
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_worker",
                cluster.scheduler_address,
                "--nthreads",
                "1",
                "--no-dashboard",
                "--host",
                "127.0.0.1",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for extra in (["--resources", "desktop=1"], ["--resources", "mac=1"])
    ]
    try:
        deadline = time.monotonic() + 60
        while len(cluster.scheduler.workers) < 2:
            assert time.monotonic() < deadline, "dask workers did not join"
            time.sleep(0.2)
        yield cluster
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        cluster.close(timeout=10)
