"""Before a run on a joined cluster: refuse an address nothing answers at, before anything starts;
then wait for every placement label to have its Ray node and its Dask worker (the Mac may still be
starting), saying who is missing; bounded by `cluster.wait_for_workers_s`, then a clear failure,
or without them if `cluster.allow_missing`."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from hetbench.balance import split_batch
from hetbench.cluster.addresses import check_reachable
from hetbench.cluster.nodes import dask_workers
from hetbench.cluster.ray_connection import connect
from hetbench.config import ClusterConfig, WorkerConfig
from hetbench.errors import UserError

log = logging.getLogger(__name__)

REPORT_EVERY_S = 10.0


def _dask_labels(client) -> set[str]:
    return {label for w in dask_workers(client).values() for label in w.get("resources", {})}


def _dask_client(cluster: ClusterConfig):
    from distributed import Client

    return Client(cluster.dask_scheduler, timeout=cluster.connect_timeout_s)


def missing_labels(wanted: set[str], ray_conn, dask_client) -> dict[str, list[str]]:
    """label -> the systems (Ray node, Dask worker) that do not have it yet."""
    have = {}
    if ray_conn is not None:
        have["Ray node"] = set(ray_conn.ray.cluster_resources())
    if dask_client is not None:
        have["Dask worker"] = _dask_labels(dask_client)
    return {
        label: [system for system, labels in have.items() if label not in labels]
        for label in sorted(wanted)
        if any(label not in labels for labels in have.values())
    }


def wait_for_workers(
    cluster: ClusterConfig, workers: tuple[WorkerConfig, ...], check_alive: Callable[[], None] | None = None
) -> tuple[WorkerConfig, ...]:
    """The workers to run: unchanged once every label is there, or without the missing ones.

    `check_alive` raises once a node this run started itself has exited (LocalMultinode's): a node
    that failed to start is said at once, not waited for until the timeout."""
    for address in (cluster.ray_address, cluster.dask_scheduler):
        if address:
            check_reachable(address, cluster.connect_timeout_s)
    wanted = {w.node for w in workers if w.node}
    if not wanted or not (cluster.ray_address or cluster.dask_scheduler):
        return workers
    with contextlib.ExitStack() as stack:
        # inside a run, the run's connection: its rows join once
        ray_conn = connect(cluster, labels=set()) if cluster.ray_address else None
        if ray_conn is not None:
            stack.callback(ray_conn.release)
        dask_client = stack.enter_context(_dask_client(cluster)) if cluster.dask_scheduler else None
        deadline, next_report = time.monotonic() + cluster.wait_for_workers_s, 0.0
        while True:
            if check_alive is not None:
                check_alive()
            missing = missing_labels(wanted, ray_conn, dask_client)
            if not missing:
                return workers
            who = "; ".join(f"'{label}' ({', '.join(systems)})" for label, systems in missing.items())
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if time.monotonic() >= next_report:
                log.info("waiting for %s to join: %.0f s left", who, left)
                next_report = time.monotonic() + REPORT_EVERY_S
            time.sleep(1.0)
    if not cluster.allow_missing:
        raise UserError(
            f"{who} did not join within {cluster.wait_for_workers_s:g} s: start "
            "deploy/mac/worker.sh on that machine, or set cluster.allow_missing to run without it"
        )
    kept = [w for w in workers if w.node not in missing]
    if not kept:
        raise UserError(f"no worker's node joined within {cluster.wait_for_workers_s:g} s: {who}")
    log.info("running without %s (cluster.allow_missing)", who)
    # the global batch stays as configured, split as the kept workers' batches were
    batches = split_batch(sum(w.batch for w in workers), [w.batch for w in kept])
    return tuple(replace(w, batch=b) for w, b in zip(kept, batches))
