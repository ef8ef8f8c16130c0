"""The commands that make a machine a node of a hetbench cluster: one home for the Ray node and
the Dask worker invocations, used by local-multinode, by `hetbench worker` (the Mac) and documented
for compose.yaml. A node advertises its placement label as a Ray custom resource and node label,
and its Dask worker carries the same label as a Dask resource.
"""

from __future__ import annotations

import json
import os
import sys

from hetbench.cores import usable_cores

LABEL_KEY = "hetbench-node"  # the Ray node label that names a node's placement label

# The environment of every Dask scheduler and worker a hetbench node starts (compose.yaml sets the
# same): idle, Dask's defaults take cores training needs (docs/design.md). Neither is used: we run
# no dashboard, and a blocked loop is still reported.
DASK_NODE_ENV = {
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",  # samples the task's thread every 10 ms (takes the GIL)
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",  # event-loop health check, every 20 ms by default
}


HEAD_RAY_PORT, HEAD_DASK_PORT = 6379, 8786  # the head's GCS and Dask scheduler (compose.yaml's defaults)
# The ports a node of a joined cluster (the desktop's head, the Mac) listens on besides the head's
# GCS and Dask scheduler: fixed, so a firewall can open exactly these, on both machines
# (compose.yaml's head and dask-worker name the same; docs/deployment.md: Ports). Ray picks them at random otherwise.
RAY_NODE_PORTS = {
    "node-manager-port": 6380,  # the raylet: the GCS and the other nodes' raylets call it
    "object-manager-port": 6381,  # objects (weights, gradients) pulled from this node
    "runtime-env-agent-port": 6382,
    "dashboard-agent-grpc-port": 6383,
    "dashboard-agent-listen-port": 6384,
    "metrics-export-port": 6385,
    "min-worker-port": 10002,  # each worker process (an actor) serves the driver's calls on one of these
    "max-worker-port": 10101,
}
# Dask's HTTP server (health, metrics) starts even with --no-dashboard, on every interface unless
# told otherwise (found by the smoke's `ss -tlnp`): keep it on loopback, off the LAN
DASK_HTTP_LOCAL = ["--dashboard-address", "127.0.0.1:0"]
DASK_WORKER_PORT = 8788  # the Dask worker (no nanny): the scheduler and the client call it
DIRECT_PORT = 6386  # ray-ps's server on the head: the other node's workers' own connections to it
# hetbench's TCP process group (transport/tcp_group.py: torch-ddp, the Ray Train row and the
# all-reduce floor between operating systems): in a joined cluster each rank listens on the first
# free one of these, on its address toward rank 0 (ten: a machine's ranks of one row, and a floor's)
COLLECTIVE_PORTS = (6390, 6399)


def direct_port(joined: bool) -> int:
    """Where a parameter server's direct channels listen: in a joined cluster the port its firewall
    opens (docs/deployment.md: Ports), else any free one."""
    return DIRECT_PORT if joined else 0


# gloo (ray-train, the gloo-floor row) cannot be given ports (pytorch/gloo#54): its rendezvous
# and its pairs listen on any ephemeral port, which the other machine must reach. macOS's range:
MAC_EPHEMERAL_PORTS = (49152, 65535)
LINUX_EPHEMERAL_PORTS = (32768, 60999)  # the desktop's (net.ipv4.ip_local_port_range)


def fixed_port_args() -> list[str]:
    return [f"--{name}={port}" for name, port in RAY_NODE_PORTS.items()]


def ray_node_argv(label: str, *args: str, num_cpus: int | None = None) -> list[str]:
    """`ray start --block` for a node labelled `label` (add --head or --address=... in args)."""
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    return [
        ray,
        "start",
        "--block",
        f"--num-cpus={num_cpus or usable_cores()}",
        f"--resources={json.dumps({label: 1000})}",
        f"--labels={json.dumps({LABEL_KEY: label})}",
        *args,
    ]


def dask_worker_argv(
    scheduler: str, name: str, label: str | None, host: str | None = None, port: int | None = None
) -> list[str]:
    """One single-threaded Dask worker process (no nanny: its PID is the worker) named `name`,
    listening on `host` (never every interface: Dask has no authentication) and `port` (else any)."""
    return [
        sys.executable,
        "-m",
        "distributed.cli.dask_worker",
        scheduler,
        "--nthreads",
        "1",
        "--no-nanny",
        "--name",
        name,
        "--no-dashboard",
        *DASK_HTTP_LOCAL,
        "--memory-limit",
        "0",
        *(["--host", host] if host else []),
        *(["--worker-port", str(port)] if port else []),
        *(["--resources", f"{label}=1"] if label else []),
    ]


def dask_workers(client) -> dict[str, dict]:
    """The scheduler's workers by address, asked now. Not client.scheduler_info(): the client's own
    periodic refresh rewrites the cache that returns with no workers in it, so live workers can
    look gone (they did, 8 of them setting up in CI)."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]
