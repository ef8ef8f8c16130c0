"""`cluster.mode: local-multinode`: unequal machines on one box.

A Ray head plus one `ray start --address` node per further placement label, each advertising
its label as a custom resource, and one Dask worker per configured worker carrying its
worker's label as a Dask resource. Placement then works as on real machines. With
`link.rate`, every non-head node (its Ray node and its Dask workers) lives in its own network
namespace behind a shaped veth pair (netns.py). With `cluster.pin_nodes`, each node's processes
(and the driver, with the head's) run on a share of the cores of their own, as separate machines
do; else the emulated machines share every core. Everything is started as our own child
processes and stopped by PID, never by name.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace

from hetbench.cluster.collective import REPORTED_OS_ENV
from hetbench.cluster.netns import Link, check_can_emulate, open_links
from hetbench.cluster.nodes import DASK_HTTP_LOCAL, DASK_NODE_ENV, dask_worker_argv, dask_workers, ray_node_argv
from hetbench.cluster.processes import kill_trees, stop_trees
from hetbench.cluster.ray_connection import RAY_ENV, process_token
from hetbench.config import ClusterConfig, LinkConfig, WorkerConfig
from hetbench.cores import core_shares
from hetbench.errors import UserError

log = logging.getLogger(__name__)
HOST_IP = "127.0.0.1"
# A Mac's processes, as far as a Linux process can be one to the group it joins: macOS has only
# gloo's uv transport, which Linux torch lacks, so any gloo group fails at once there as a real
# Mac's does against a Linux desktop (pytorch/gloo#383); and it reports macOS, so `auto` chooses
# as on the real pair (cluster/collective.py). An arm64 Mac has none of the desktop's x86 vector
# kernels, whose float results differ in their last bits (torch.randn, numpy's float32 sin/exp):
# without them, data a workload draws with float math differs from the desktop's as on the real
# pair, and the driver refuses it (data.check_same_data).
MAC_STAND_IN = {
    "GLOO_DEVICE_TRANSPORT": "UV",
    REPORTED_OS_ENV: "Darwin",
    "ATEN_CPU_CAPABILITY": "default",
    "NPY_DISABLE_CPU_FEATURES": "X86_V3,X86_V4,AVX512_ICL,AVX512_SPR",
}
# What Ray does on macOS unless told otherwise: no node may join another (ray_constants.ENABLE_RAY_CLUSTER)
MACOS_DEFAULTS = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
HEALTH_CHECKS = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "3000",
    "RAY_health_check_failure_threshold": "3",
}


def placement_labels(workers: tuple[WorkerConfig, ...]) -> list[str]:
    """Placement labels in worker order; the first is the head node's (config.validate made sure of one)."""
    return list(dict.fromkeys(w.node for w in workers if w.node))


class LocalMultinode:
    """Start with `start()`, stop with `stop()` (idempotent, on every exit path)."""

    def __init__(
        self,
        workers: tuple[WorkerConfig, ...],
        link: LinkConfig,
        timeout_s: float,
        pin: bool = False,
        macos: tuple[str, ...] = (),
        macos_workload_path: str | None = None,
    ) -> None:
        self.workers, self.rate, self.timeout_s = workers, link.rate, timeout_s  # timeout_s: for each node to come up
        self.labels = placement_labels(workers)
        self.macos = set(macos)  # labels whose processes stand in for a Mac's (MAC_STAND_IN)
        self.macos_path = macos_workload_path  # where they import a user's workload from, before the driver's
        # label -> the cores its processes may run on (pinned), else every node takes them all
        self.cores: dict[str, list[int]] = dict(zip(self.labels, core_shares(len(self.labels)))) if pin else {}
        if pin and not shutil.which("taskset"):
            raise UserError("cluster.pin_nodes starts each node under `taskset`, which is not installed (util-linux)")
        self.procs: list[subprocess.Popen] = []
        self.node_procs: dict[str, list[subprocess.Popen]] = {}  # label -> its Ray node and Dask workers
        self.node_args: dict[str, list[str]] = {}  # label -> its `ray start` arguments
        self.cut: set[str] = set()  # labels whose link a fault cut
        self.links: dict[str, Link] = {}
        self.head_ip: str | None = None  # once started: where the head's Ray node and the scheduler listen
        self.ray_address: str | None = None
        self.dask_scheduler: str | None = None
        self.temp_dir = tempfile.mkdtemp(prefix="hbmn-")
        # Token auth on, with this process's own token; the driver joins with it too.
        self.env = {
            **os.environ,
            **RAY_ENV,
            **DASK_NODE_ENV,
            "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token"),
            "RAY_AUTH_TOKEN": process_token(),
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("RAY_ADDRESS", None)
        # A node cut off (a fault, a lost link) is declared dead within about 10 s, not Ray's ~30-60 s.
        for key, value in HEALTH_CHECKS.items():
            self.env.setdefault(key, value)

    def start(self) -> dict:
        """Bring the nodes up; returns the cluster addresses strategies join."""
        try:
            if self.rate:
                check_can_emulate()
                self.links = open_links(self.labels[1:], self.rate)
            self.head_ip = head_ip = next(iter(self.links.values())).host_ip if self.links else HOST_IP
            # Ray's GCS and Dask's scheduler each bind a port the kernel picks and write down where
            # they listen: no window between choosing a free port and binding it for another to take
            self._ray_node(
                self.labels[0],
                [
                    "--head",
                    "--port=0",
                    f"--node-ip-address={head_ip}",
                    f"--temp-dir={self.temp_dir}",
                    "--include-dashboard=false",
                    "--disable-usage-stats",
                ],
            )
            self.ray_address = self._wait_written(self._ray_address, "the Ray head")
            for label in self.labels[1:]:
                self._ray_node(
                    label,
                    [
                        f"--address={self.ray_address}",
                        f"--node-ip-address={self.links[label].ns_ip if label in self.links else head_ip}",
                    ],
                )
            scheduler_file = os.path.join(self.temp_dir, "dask-scheduler.json")
            self._spawn(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_scheduler",
                    "--host",
                    head_ip,
                    "--port",
                    "0",
                    "--scheduler-file",
                    scheduler_file,
                    "--no-dashboard",
                    *DASK_HTTP_LOCAL,
                ],
                "dask-scheduler",
            )
            self.dask_scheduler = self._wait_written(lambda: _scheduler_address(scheduler_file), "the Dask scheduler")
            for w in self.workers:
                self._dask_worker(w)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return {
            "ray_address": self.ray_address,
            "dask_scheduler": self.dask_scheduler,
            "token": self.env["RAY_AUTH_TOKEN"],
        }

    def _prefix(self, label: str | None) -> list[str]:
        return self.links[label].prefix() if label in self.links else []

    def _env(self, label: str | None) -> dict:
        """The cluster's environment; behind a link, gloo told which interface is its end of it; on a
        stand-in Mac, gloo that fails as a Mac's does against Linux, and macOS reported."""
        if label in self.macos:  # macOS's defaults under what this cluster sets, its stand-in's over it
            env = {**MACOS_DEFAULTS, **self.env, **MAC_STAND_IN}
            if self.macos_path:  # its own copy of the user's workload first, as worker.sh --workload-path
                paths = [self.macos_path, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
                env["PYTHONPATH"] = os.pathsep.join(paths)
        else:
            env = self.env
        if label in self.links:
            return {**env, **self.links[label].gloo_env(inside=True)}
        if self.links and label == self.labels[0]:  # the head: the host end (one link per gloo peer)
            return {**env, **next(iter(self.links.values())).gloo_env(inside=False)}
        return env

    def _pinned(self, label: str | None) -> list[str]:
        """`taskset` onto the node's cores (the scheduler's: the head's), where nodes are pinned; what
        it starts (Ray's workers, a Dask worker's training) inherits them."""
        cores = self.cores.get(label or self.labels[0])
        return ["taskset", "--cpu-list", ",".join(map(str, cores))] if cores else []

    def _spawn(self, argv: list[str], what: str, label: str | None = None) -> None:
        log_file = open(os.path.join(self.temp_dir, f"{what}.log"), "ab")
        self.procs.append(
            subprocess.Popen(
                [*self._pinned(label), *argv],
                env=self._env(label),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        log_file.close()
        if label is not None:
            self.node_procs.setdefault(label, []).append(self.procs[-1])
        log.debug("started %s (pid %d): %s", what, self.procs[-1].pid, " ".join(argv))

    def _ray_node(self, label: str, args: list[str]) -> None:
        # unpinned, every node takes all cores: on one box the emulated machines share them, as the workers' threads do
        self.node_args[label] = args
        argv = ray_node_argv(label, *args, num_cpus=len(self.cores[label]) if self.cores else None)
        self._spawn([*self._prefix(label), *argv], f"ray-{label}", label)

    def _dask_worker(self, worker: WorkerConfig) -> None:
        label = worker.node
        host = self.links[label].ns_ip if label in self.links else self.head_ip
        self._spawn(
            [*self._prefix(label), *dask_worker_argv(self.dask_scheduler, worker.name, label, host)],
            f"dask-{worker.name}",
            label,
        )

    def kill_node(self, label: str) -> None:
        """Fault injection: the node's Ray node (raylet, its workers) and Dask workers die at once."""
        procs = self.node_procs.pop(label, [])
        kill_trees(procs)
        if label in self.links:  # and what outlived its parent there (a raylet Ray ended: its agents)
            self.links[label].end_processes()
        self.procs = [p for p in self.procs if p not in procs]

    def cut_link(self, label: str) -> None:
        """Fault injection: the node's link goes down; its processes run on, cut off."""
        self.links[label].cut()
        self.cut.add(label)

    def revive(self, label: str) -> None:
        """Start a killed or cut-off node again (same label, same link), for the scenarios after the
        fault: Ray has declared it dead, so its cut-off processes are ended first."""
        if label in self.cut:
            self.links[label].restore()
            self.cut.discard(label)
            self.kill_node(label)
            # the scheduler must drop the cut-off workers before new ones may take their names
            gone = {w.name for w in self.workers if w.node == label}
            self._wait_dask(lambda names: sorted(gone & names), "did not leave")
        if label in self.node_procs:
            return
        self._ray_node(label, self.node_args[label])
        for w in self.workers:
            if w.node == label:
                self._dask_worker(w)
        self._wait_ready()

    def _ray_address(self) -> str | None:
        """The head's GCS address, which `ray start` writes into its temp dir once the head is up."""
        from ray._private.utils import read_ray_address

        return read_ray_address(self.temp_dir)

    def _wait_written(self, read, what: str) -> str:
        """The address `read()` finds once `what` has written it, within timeout_s."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            self.check_alive()
            address = read()
            if address:
                return address
            if time.monotonic() > deadline:
                raise UserError(
                    f"local-multinode: {what} did not say where it listens within "
                    f"{self.timeout_s:g} s (logs: {self.temp_dir})"
                )
            time.sleep(0.2)

    def _wait_ready(self) -> None:
        """Every Dask worker joined (Ray nodes are waited for by whoever joins: RayConnection), or who is missing."""
        expected = {w.name for w in self.workers}
        self._wait_dask(lambda names: sorted(expected - names), "did not join")

    def _wait_dask(self, offending, what: str) -> None:
        """Poll the scheduler's worker names until `offending(names)` is empty, within connect_timeout_s."""
        from distributed import Client

        timeout = self.timeout_s
        deadline = time.monotonic() + timeout
        with Client(self.dask_scheduler, timeout=timeout) as client:
            while True:
                self.check_alive()
                left = offending({w["name"] for w in dask_workers(client).values()})
                if not left:
                    return
                if time.monotonic() > deadline:
                    raise UserError(
                        f"local-multinode: Dask worker '{left[0]}' {what} within {timeout:g} s (logs: {self.temp_dir})"
                    )
                time.sleep(0.3)

    def check_alive(self) -> None:
        """Raises in a sentence once a process this cluster started has exited (while it starts)."""
        for proc in self.procs:
            if proc.poll() is not None:
                raise UserError(
                    f"local-multinode: '{' '.join(proc.args[:4])} ...' exited with {proc.returncode} "
                    f"while starting (logs: {self.temp_dir})"
                )

    def stop(self) -> None:
        stop_trees(list(reversed(self.procs)))
        self.procs = []
        for link in self.links.values():
            link.close()
        self.links = {}
        if self.temp_dir and not log.isEnabledFor(logging.INFO):
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


@contextmanager
def cluster_for_run(cluster_cfg: ClusterConfig, workers: tuple[WorkerConfig, ...], link: LinkConfig):
    """(the cluster section strategies run with, cluster startup seconds, the LocalMultinode or None).

    A local-multinode cluster lives exactly as long as the `with` block, and its token only in
    this process's environment meanwhile."""
    if cluster_cfg.mode != "local-multinode":
        yield cluster_cfg, None, None
        return
    cluster = LocalMultinode(
        workers,
        link,
        cluster_cfg.connect_timeout_s,
        cluster_cfg.pin_nodes,
        cluster_cfg.macos_nodes,
        cluster_cfg.macos_workload_path,
    )
    saved_token = os.environ.get("RAY_AUTH_TOKEN")
    own_cores = os.sched_getaffinity(0) if cluster.cores else None
    try:
        started = time.perf_counter()
        addresses = cluster.start()
        startup_s = time.perf_counter() - started
        os.environ["RAY_AUTH_TOKEN"] = addresses["token"]
        if own_cores:  # the driver, and the threads it starts from here on (Ray's), where the desktop's node runs
            os.sched_setaffinity(0, cluster.cores[cluster.labels[0]])
        yield (
            replace(
                cluster_cfg,
                ray_address=addresses["ray_address"],
                dask_scheduler=addresses["dask_scheduler"],
                wait_for_workers_s=cluster_cfg.connect_timeout_s,  # nodes still registering
            ),
            startup_s,
            cluster,
        )
    finally:
        cluster.stop()
        if own_cores:
            os.sched_setaffinity(0, own_cores)
        if saved_token is None:
            os.environ.pop("RAY_AUTH_TOKEN", None)
        else:
            os.environ["RAY_AUTH_TOKEN"] = saved_token


def _scheduler_address(path: str) -> str | None:
    """The address in a Dask scheduler file, once the scheduler has written it whole."""
    try:
        with open(path) as f:
            return json.load(f).get("address")
    except (FileNotFoundError, json.JSONDecodeError):  # not yet, or half written
        return None
