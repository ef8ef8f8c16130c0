"""Joining Ray: a private local instance, or an explicit cluster address. Never Ray's auto-detection."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time

from hetbench.cluster.addresses import check_reachable
from hetbench.config import ClusterConfig, WorkerConfig
from hetbench.cores import usable_cores
from hetbench.errors import UserError

RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage-stats prompt or network call
    "RAY_DEDUP_LOGS": "0",  # worker output is off the terminal anyway (log_to_driver=False)
    "RAY_TRAIN_V2_ENABLED": "1",  # 2.60's default, pinned: ray-train is written for V2
}

# Ray reads these once, when a process first starts or joins a cluster, so every way in sets them
# first, unless the user chose otherwise: the CLI, connect(), the test suites.
RAY_PROCESS_DEFAULTS = {
    # a `ray start` head turns token auth on by default: every hetbench process, and every cluster it
    # starts, uses token mode (the token itself is read when joining, so it can come later)
    "RAY_AUTH_MODE": "token",
    # nodes match at Python's minor release (3.11), not its patch: a Mac's Homebrew 3.11.y joins a
    # desktop image's 3.11.x (one bytecode and pickle format per minor release); worker.py checks the
    # minor release itself, with Ray, torch and hetbench's code
    "RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL": "minor",
    # Ray refuses to start a node that joins another, and gives a driver only loopback, on macOS (and
    # Windows) without it: a Mac's `hetbench worker`, and local-multinode on a Mac (gpu-check.sh mps)
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
}


def use_ray_defaults() -> None:
    for key, value in RAY_PROCESS_DEFAULTS.items():
        os.environ.setdefault(key, value)


@functools.cache
def process_token() -> str:
    """One Ray token for every cluster this process starts (private or local-multinode): Ray keeps
    the token a process first used for the process's life, so a second cluster with a token of its
    own (the benchmark suite's next link; a local-multinode run after a private one in one test
    process) refused the driver. The environment's, if it has one; else a fresh one."""
    return os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32)


class KeptRay:
    """The one Ray connection a run keeps, with the worker processes its rows hand on (ray_hosts.py).
    A test session keeps one across tests too: its clusters start once, not per test."""

    def __init__(self) -> None:
        self.connection: RayConnection | None = None
        self.address: str | None = None

    def connect(self, cluster: ClusterConfig, labels: set[str]) -> RayConnection:
        """The kept connection, opened now if there is none, if it serves another address, if its Ray
        was shut down meanwhile, or if its private Ray lacks a label; a joined cluster's labels are
        waited for."""
        address, kept = cluster.ray_address, self.connection
        usable = kept is not None and not kept.closed and kept.ray.is_initialized() and self.address == address
        if usable and not address and not labels <= kept.labels:
            usable = False  # a private Ray has the labels it was started with
        if not usable:
            self.close()
            self.connection, self.address = RayConnection(cluster, labels), address
            self.connection.kept = True
        elif address:
            self.connection.wait_for_labels(labels, cluster.wait_for_workers_s)
        return self.connection

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
        self.connection = None


_kept: KeptRay | None = None  # inside ray_kept_for_the_run


@contextlib.contextmanager
def ray_kept_for_the_run(keeper: KeptRay | None = None):
    """Within: the first Ray connection opened serves every later strategy, reference row and repeat
    of the run, so Ray's startup is paid once; each user still stops the actors it started.
    Nested in another keep, the outer one serves. `keeper`: one that outlives the block (a test
    session's): left open at its end, for the next block."""
    global _kept
    if _kept is not None:
        yield
        return
    _kept = keeper or KeptRay()
    try:
        yield
    finally:
        kept, _kept = _kept, None
        if keeper is None:
            kept.close()


def connect(
    cluster: ClusterConfig, workers: tuple[WorkerConfig, ...] = (), labels: set[str] | None = None
) -> RayConnection:
    """A Ray connection with a node for each of `labels` (default: each of `workers`' labels);
    `release()` it when done. Inside a run, the run's (see KeptRay.connect); outside one, a fresh one."""
    if labels is None:
        labels = {w.node for w in workers if w.node}
    if _kept is None:
        return RayConnection(cluster, labels)
    return _kept.connect(cluster, labels)


class RayConnection:
    """`ray.init` for one strategy, or a run (`kept`); `close()` shuts down exactly what it started
    and restores the env."""

    kept = False  # the run's: release() leaves it up for the next user
    closed = False

    def __init__(self, cluster: ClusterConfig, labels: set[str]) -> None:
        use_ray_defaults()  # before Ray reads them, in a process that came in through none of the others
        import ray

        from hetbench.cluster.ray_hosts import HostPool

        self.ray, self.labels = ray, labels
        self.temp_dir: str | None = None  # a private cluster's session files, where this starts one
        self.hosts = HostPool()  # the worker processes rows hand on to each other (kept connections)
        self.saved_env = {k: os.environ.get(k) for k in (*RAY_ENV, "RAY_ADDRESS")}
        os.environ.update(RAY_ENV)
        quiet = {
            "include_dashboard": False,
            "logging_level": logging.ERROR,
            "log_to_driver": False,
            "configure_logging": True,
        }
        if ray.is_initialized():
            ray.shutdown()
        self.sigterm = signal.getsignal(signal.SIGTERM)
        try:
            if cluster.ray_address:
                check_reachable(cluster.ray_address, cluster.connect_timeout_s)
                ray.init(address=cluster.ray_address, **quiet)
            else:
                self._start_private(labels, quiet)
        except UserError:
            self.close()
            raise
        except (ConnectionError, RuntimeError) as e:
            self.close()
            raise UserError(f"could not connect to Ray: {str(e).splitlines()[0]}") from None
        self._keep_sigterm()
        self.wait_for_labels(labels, cluster.wait_for_workers_s if cluster.ray_address else 0.0)

    def _keep_sigterm(self) -> None:
        """Ray's init and shutdown replace the process's SIGTERM handling (shutdown leaves the default,
        which kills at once); hetbench's own unwinds through every close(), so it is put back."""
        if threading.current_thread() is threading.main_thread() and self.sigterm is not None:
            signal.signal(signal.SIGTERM, self.sigterm)

    def wait_for_labels(self, labels: set[str], timeout_s: float) -> None:
        """Nodes may still be joining (a Mac waking up, a local node starting): wait, bounded, then name the missing."""
        deadline = time.monotonic() + timeout_s
        while True:
            have = self.ray.cluster_resources()
            missing = sorted(label for label in labels if label not in have)
            if not missing:
                return
            if time.monotonic() >= deadline:
                present = sorted(
                    k
                    for k in have
                    if not k.startswith("node:") and k not in ("CPU", "GPU", "memory", "object_store_memory")
                )
                self.close()
                raise UserError(
                    f"no Ray node advertises placement label '{missing[0]}' "
                    f"(labels in this cluster: {', '.join(present) or 'none'})"
                )
            time.sleep(0.5)

    def _start_private(self, labels: set[str], quiet: dict) -> None:
        # A fresh instance of our own (address="local", no RAY_ADDRESS): never some other Ray on
        # this machine. Auth settings are left as this process had them when it imported Ray
        # (Ray reads them once, then): changing RAY_AUTH_MODE now would split driver and GCS.
        os.environ.pop("RAY_ADDRESS", None)
        if os.environ.get("RAY_AUTH_MODE") == "token":
            os.environ["RAY_AUTH_TOKEN"] = process_token()  # not ~/.ray's: see process_token
        self.temp_dir = tempfile.mkdtemp(prefix="hbray-")
        self.ray.init(
            address="local",
            num_cpus=usable_cores(),
            resources={label: 1000.0 for label in labels},
            _temp_dir=self.temp_dir,
            **quiet,
        )

    def release(self) -> None:
        """Done with it: closed unless the run keeps it."""
        if not self.kept:
            self.close()

    def close(self) -> None:
        self.closed = True
        if self.ray.is_initialized():
            self.hosts.close()
            self.ray.shutdown()
        self._keep_sigterm()
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        for key, value in self.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def on_driver_node() -> dict:
    """Actor options that keep a coordinating actor (parameter server, collector) on the driver's own
    node: losing another machine must not take it along (measured: an unpinned server landed on the
    `mac` node, and a killed `mac` ended the run)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def placement(worker: dict) -> dict:
    """Actor options that pin a worker to the node advertising its label (anywhere if it has none)."""
    return {"num_cpus": 0, "resources": {worker.node: 0.001} if worker.node else {}}
