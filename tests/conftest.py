"""Fixtures every test gets or may ask for, and the two tiers. Shared helpers live in helpers.py
(imported as `helpers`: pytest puts this folder on sys.path, so bare `pytest` and `python -m
pytest` both find it).

Tiers (dask/distributed's convention): `pytest -q` runs the fast tier; tests marked
`@pytest.mark.slow` (whole runs, their own clusters, faults, subprocess runs) need `--runslow`.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass, field

import pytest

from helpers import REPO, SHARED_MNIST, CliResult
from hetbench.cluster.ray_connection import use_ray_defaults
from hetbench.errors import INTERRUPTED, interrupt

use_ray_defaults()  # as the CLI does, before any test's Ray reads them
# tests/tiny_workload.py is a user's workload module: the processes the session's cluster starts
# import it as every machine must (hetbench exports a run's own module folder, but this cluster
# starts before any run)
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run the slow tier (@pytest.mark.slow)")


def pytest_configure(config):
    # SIGTERM (CI's `timeout`, a kill) ends the session as Ctrl-C does: through every fixture's
    # teardown and helpers.stop_child
    signal.signal(signal.SIGTERM, interrupt)


def pytest_runtest_logfinish(nodeid, location):
    # the KeyboardInterrupt can land where Python swallows it (a gc callback, a __del__): stop anyway
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt("SIGTERM")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow tier: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def offline_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real MNIST test split where the machine has it; never the network (the download test serves its own)."""
    if SHARED_MNIST.is_dir():
        monkeypatch.setenv("HETBENCH_DATA_DIR", str(SHARED_MNIST))
    else:
        monkeypatch.delenv("HETBENCH_DATA_DIR", raising=False)


@pytest.fixture(autouse=True)
def _offline_data(monkeypatch):
    offline_data(monkeypatch)


@pytest.fixture
def cli(capsys, monkeypatch):
    """`hetbench ARGS...` run in this process from the checkout, as a user types it: its exit code,
    stdout and stderr. The SIGTERM handler and unraisable hook main() installs, and its logging, are put back.
    (Three subprocess smokes in test_cli.py prove the console script itself.)"""
    from hetbench.cli import main

    monkeypatch.chdir(REPO)

    def call(*args: str) -> CliResult:
        sigterm, hook = signal.getsignal(signal.SIGTERM), sys.unraisablehook
        ours = logging.getLogger("hetbench")  # main() sends its lines to stderr: caplog sees them again after
        kept = ours.handlers[:], ours.level, ours.propagate
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse: --help, a usage error
            code = e.code
        finally:
            signal.signal(signal.SIGTERM, sigterm)
            sys.unraisablehook = hook
            ours.handlers[:], ours.propagate = kept[0], kept[2]
            ours.setLevel(kept[1])
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return call


@pytest.fixture(scope="session")
def _session_data():
    """The same data settings for the processes of a cluster a fixture starts: they outlive one test,
    and their workers read the data where they run."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        offline_data(monkeypatch)
        yield


@dataclass
class SharedCluster:
    """The session's cluster as a test joins it."""

    overrides: list[str]  # config settings that join it: cluster.ray_address, cluster.dask_scheduler
    ray_address: str
    dask_scheduler: str
    keeper: object  # the session's KeptRay: its connection and idle worker processes
    node_ids: dict[str, str] = field(default_factory=dict)  # placement label -> Ray node id
    node_ip: str = ""  # the address both nodes advertise (Ray's pick: this machine's, not loopback)

    @property
    def interface(self) -> str | None:
        """The network interface holding the nodes' address: where their gloo ranks must join."""
        from hetbench.cluster.addresses import interface_of

        return interface_of(self.node_ip)

    def dask_worker(self, label: str) -> str:
        """The address of the Dask worker carrying `label`."""
        from distributed import Client

        from hetbench.cluster.nodes import dask_workers

        with Client(self.dask_scheduler, timeout=30) as client:
            return next(a for a, w in dask_workers(client).items() if label in w.get("resources", {}))


@pytest.fixture(scope="session")
def _shared_cluster(_session_data):
    """One real two-node cluster for the whole session, started by hetbench's own local-multinode:
    a Ray head labelled `desktop` and a Ray node labelled `mac`, a Dask scheduler and one
    single-threaded Dask worker on each label; and a KeptRay, so the Ray worker processes (torch
    imported, data loaded) serve test after test as they serve row after row in a run."""
    import ray

    from hetbench.cluster.multinode import cluster_for_run
    from hetbench.cluster.ray_connection import KeptRay, ray_kept_for_the_run
    from hetbench.config import load_config

    cfg = load_config(
        None,
        ["workers=[{name: desk, node: desktop}, {name: mac, node: mac}]", "cluster.mode=local-multinode"],
    )
    keeper = KeptRay()
    with cluster_for_run(cfg.cluster, cfg.workers, cfg.link) as (joined, _, _):
        address, scheduler = joined.ray_address, joined.dask_scheduler
        joins = [f"cluster.ray_address={address}", f"cluster.dask_scheduler={scheduler}"]
        shared = SharedCluster(joins, address, scheduler, keeper)
        try:
            with ray_kept_for_the_run(keeper):
                keeper.connect(joined, {"desktop", "mac"})
                labelled = [(label, node["NodeID"]) for node in ray.nodes() for label in node["Resources"]]
                shared.node_ids = {label: node for label, node in labelled if label in ("desktop", "mac")}
                shared.node_ip = next(n["NodeManagerAddress"] for n in ray.nodes() if "desktop" in n["Resources"])
            yield shared
        finally:
            keeper.close()


@pytest.fixture
def shared_nodes(_shared_cluster):
    """The session's cluster without its kept Ray: for tests of what joining and leaving do (what
    they shut down, the kept Ray opens again for the next test)."""
    return _shared_cluster


@pytest.fixture
def shared_cluster(_shared_cluster):
    """The session's cluster (see _shared_cluster), its kept Ray serving this test."""
    from hetbench.cluster.ray_connection import ray_kept_for_the_run

    with ray_kept_for_the_run(_shared_cluster.keeper):
        yield _shared_cluster
