"""`hetbench worker --head HOST`: make this machine (the Mac) a node of the desktop's cluster.

Trains a forward and backward pass on the device it joins with (MPS unless MAC_DEVICE says cpu),
checks that Python (to the minor release), Ray, torch and hetbench's own code match the head's
(asked through the Dask scheduler, which runs on the head), then runs a Ray node advertising the
label and a Dask worker carrying it, both listening only on this machine's address on its route
to the head, on the fixed ports of nodes.py (warning when the head cannot reach the ephemeral
ports gloo needs). A Ray node the head dropped (the Mac slept) joins
again; Ctrl-C, SIGTERM, or the Dask worker ending stops both, by PID, with their process trees.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from hetbench.cluster.addresses import check_reachable, interface_of, route_address
from hetbench.cluster.admission import (
    check_both_directions,
    check_group,
    check_machine,
    check_token,
    check_versions,
    gloo_warning,
    head_versions,
    memory_warning,
    versions,
)
from hetbench.cluster.nodes import DASK_NODE_ENV, DASK_WORKER_PORT, dask_worker_argv, fixed_port_args, ray_node_argv
from hetbench.cluster.processes import machine_memory_mb, peak_rss_mb, stop_trees
from hetbench.device_check import require
from hetbench.devices import NODE_DEVICE_ENV
from hetbench.errors import UserError

log = logging.getLogger(__name__)

REJOINS = 5  # times the Ray node is started again after the head dropped it (a Mac that slept)
TOKEN_VARIABLES = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # the Ray node's only
JOIN_ON_CPU = "to join on its CPU instead, set MAC_DEVICE=cpu here and in the desktop's .env"


def node_commands(head: str, ray_port: int, dask_port: int, label: str, name: str) -> list[tuple[list[str], str]]:
    """The Ray node and the Dask worker, listening on this machine's route to the head, fixed ports."""
    here = route_address(head)
    ray = ray_node_argv(label, f"--address={head}:{ray_port}", f"--node-ip-address={here}", *fixed_port_args())
    dask = dask_worker_argv(f"tcp://{head}:{dask_port}", name, label, host=here, port=DASK_WORKER_PORT)
    return [(ray, "ray"), (dask, "dask")]


def on_workload_path(folder: str) -> None:
    """`folder` first on the Python path of the processes this node starts: they import the user's
    workload module from it, as the desktop's do from theirs (the driver compares the two copies)."""
    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise UserError(f"--workload-path {folder}: no such folder on this machine")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(path), *paths])


def node_environments(head: str, device: str = "mps") -> dict[str, dict]:
    """The Ray node's and the Dask worker's environments: gloo on the interface toward the head, the
    device this machine was checked on (its workers train there: devices.node_device); the Ray
    token's variables for the Ray node only (Dask has no authentication: whoever reaches its worker
    could read its environment)."""
    env = {**os.environ, **DASK_NODE_ENV, NODE_DEVICE_ENV: device, "RAY_USAGE_STATS_ENABLED": "0"}
    interface = interface_of(route_address(head))
    if interface:
        env["GLOO_SOCKET_IFNAME"] = interface
    return {"ray": env, "dask": {k: v for k, v in env.items() if k not in TOKEN_VARIABLES}}


def run_worker(
    head: str,
    label: str,
    name: str,
    ray_port: int,
    dask_port: int,
    timeout_s: float,
    device: str = "mps",
    workload_path: str | None = None,
) -> int:
    scheduler, ray_address = f"tcp://{head}:{dask_port}", f"{head}:{ray_port}"
    check_machine()
    if workload_path:
        on_workload_path(workload_path)
    for line in require(device, fix=JOIN_ON_CPU):  # as the desktop's gate does on cuda, before anything joins
        say(line)
    if warning := memory_warning(machine_memory_mb(), peak_rss_mb()):  # the check's process: one that trained
        say(f"warning: {warning}")
    try:
        for address in (ray_address, scheduler):
            check_reachable(address, timeout_s)
    except UserError as e:  # nothing answers yet to ask whether the head is a Windows desktop
        raise UserError(
            f"{e}; a Windows desktop must let it through its Hyper-V firewall too "
            "(docs/deployment.md: Desktop on Windows)"
        ) from None
    check_versions(versions(), head_versions(scheduler, timeout_s))
    check_token()
    envs = node_environments(head, device)
    logs = tempfile.mkdtemp(prefix="hetbench-worker-")
    procs: dict[str, subprocess.Popen] = {}
    keep_logs = True  # logs are kept to read after a failure

    def start(argv: list[str], what: str) -> None:
        with open(os.path.join(logs, f"{what}.log"), "ab") as log:
            procs[what] = subprocess.Popen(
                argv,
                env=envs[what],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    try:
        commands = dict((what, argv) for argv, what in node_commands(head, ray_port, dask_port, label, name))
        for what, argv in commands.items():
            start(argv, what)
        check_both_directions(head, route_address(head), scheduler, timeout_s)
        if warning := gloo_warning(route_address(head), scheduler, timeout_s):
            say(f"warning: {warning}")
        say(f"a group with the head formed on {check_group(head, scheduler, timeout_s)}")
        say(
            f"joined {head} as '{label}' (Ray node + Dask worker '{name}'); Ctrl-C leaves nothing running. Logs: {logs}"
        )
        rejoins = 0
        try:
            while True:
                time.sleep(0.5)
                if procs["dask"].poll() is not None:
                    break
                if procs["ray"].poll() is not None:
                    if rejoins == REJOINS:
                        break
                    # the head drops a node that stopped answering (a Mac asleep): join again, as new
                    rejoins += 1
                    stop_trees([procs["ray"]])
                    say(f"the Ray node ended (exit {procs['ray'].returncode}; asleep?): joining {head} again")
                    start(commands["ray"], "ray")
        except KeyboardInterrupt:  # the normal way out: nothing to read afterwards
            keep_logs = False
            raise
        ended = next(p for p in procs.values() if p.poll() is not None)
        raise UserError(
            f"'{' '.join(ended.args[:3])} ...' ended with exit code {ended.returncode} "
            f"(logs: {logs}); stopped this worker"
        )
    finally:
        stop_trees(list(procs.values()))
        if not keep_logs:
            shutil.rmtree(logs, ignore_errors=True)


def say(line: str) -> None:
    log.info("hetbench worker: %s", line)
