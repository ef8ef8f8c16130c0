"""`hetbench worker --head HOST`: make this machine (the Mac) a node of the desktop's cluster.

Checks that Python, Ray and torch match the head's (asked through the Dask scheduler, which
runs on the head), then runs a Ray node advertising the label and a Dask worker carrying it,
until Ctrl-C, SIGTERM, or one of them ends; then stops both, by PID, with their process trees.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata

from hetbench.cluster.addresses import check_reachable
from hetbench.cluster.nodes import DASK_NODE_ENV, dask_worker_argv, ray_node_argv
from hetbench.cluster.processes import stop_trees
from hetbench.errors import UserError

MATCHED = ("ray", "torch", "hetbench")  # with Python's version: what must equal the head's


def versions() -> dict:
    """This machine's Python version (Ray refuses a node whose patch release differs) and the packages
    whose versions must match across nodes."""

    def version(package):
        try:
            return metadata.version(package).split("+")[0]  # torch 2.13.0+cpu and 2.13.0 are one release
        except metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), **{p: version(p) for p in MATCHED}}


def head_versions(scheduler: str, timeout_s: float) -> dict:
    from distributed import Client

    with Client(scheduler, timeout=timeout_s) as client:
        return client.run_on_scheduler(versions)


def check_versions(mine: dict, head: dict) -> None:
    wrong = [f"{k} {mine[k]} here but {head[k]} on the head" for k in ("python", *MATCHED) if mine[k] != head[k]]
    if wrong:
        raise UserError(
            f"version mismatch: {'; '.join(wrong)}; install the pinned versions "
            "(deploy/mac/worker.sh does, from deploy/constraints.txt)"
        )


def run_worker(head: str, label: str, name: str, ray_port: int, dask_port: int, timeout_s: float) -> int:
    scheduler, ray_address = f"tcp://{head}:{dask_port}", f"{head}:{ray_port}"
    for address in (ray_address, scheduler):
        check_reachable(address, timeout_s)
    check_versions(versions(), head_versions(scheduler, timeout_s))
    if os.environ.get("RAY_AUTH_MODE", "token") == "token" and not os.environ.get("RAY_AUTH_TOKEN"):
        raise UserError(
            "RAY_AUTH_TOKEN is not set: copy the head's token from its .env "
            "(export RAY_AUTH_TOKEN=...) so this node can join"
        )
    env = {**os.environ, **DASK_NODE_ENV, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    logs = tempfile.mkdtemp(prefix="hetbench-worker-")
    procs, keep_logs = [], True  # logs are kept to read after a failure
    try:
        for argv, what in (
            (ray_node_argv(label, f"--address={ray_address}"), "ray"),
            (dask_worker_argv(scheduler, name, label), "dask"),
        ):
            with open(os.path.join(logs, f"{what}.log"), "ab") as log:
                procs.append(
                    subprocess.Popen(
                        argv,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        print(
            f"hetbench worker: joined {head} as '{label}' (Ray node + Dask worker '{name}'); "
            f"Ctrl-C leaves nothing running. Logs: {logs}",
            file=sys.stderr,
            flush=True,
        )
        try:
            while all(p.poll() is None for p in procs):
                time.sleep(0.5)
        except KeyboardInterrupt:  # the normal way out: nothing to read afterwards
            keep_logs = False
            raise
        ended = next(p for p in procs if p.poll() is not None)
        raise UserError(
            f"'{' '.join(ended.args[:3])} ...' ended with exit code {ended.returncode} "
            f"(logs: {logs}); stopped this worker"
        )
    finally:
        stop_trees(procs)
        if not keep_logs:
            shutil.rmtree(logs, ignore_errors=True)
