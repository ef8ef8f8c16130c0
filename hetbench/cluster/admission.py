"""What a machine must pass to join a head: the same Python minor release, Ray, torch and hetbench
code; an arm64 Python on a Mac; a readable Ray token; and every node port reachable both ways.
Each failure is one sentence naming what to change."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from importlib import metadata
from pathlib import Path

from hetbench.cluster.nodes import DASK_WORKER_PORT, RAY_NODE_PORTS
from hetbench.cluster.wsl import HYPERV_RULE, is_wsl2
from hetbench.errors import UserError
from hetbench.identity import code_hash

MATCHED = ("ray", "torch")  # with Python's version and hetbench's code: what must equal the head's


def versions() -> dict:
    """This machine's Python minor release, the packages whose versions must match across nodes,
    and the hash of hetbench's own code (a stale image against a newer checkout has the same
    version string but not the same code)."""

    def version(package):
        try:
            return metadata.version(package).split("+")[0]  # torch 2.13.0+cpu and 2.13.0 are one release
        except metadata.PackageNotFoundError:
            return None

    python = ".".join(platform.python_version_tuple()[:2])  # the minor release (hetbench/__init__.py)
    return {"python": python, **{p: version(p) for p in MATCHED}, "hetbench code": code_hash()}


def head_versions(scheduler: str, timeout_s: float) -> dict:
    from distributed import Client

    with Client(scheduler, timeout=timeout_s) as client:
        return client.run_on_scheduler(versions)


def check_versions(mine: dict, head: dict) -> None:
    wrong = [f"{k} {mine[k]} here but {head.get(k)} on the head" for k in mine if mine[k] != head.get(k)]
    if wrong:
        raise UserError(
            f"version mismatch: {'; '.join(wrong)}; check out the head's commit and install the pinned "
            "versions (deploy/mac/worker.sh does, from deploy/constraints.txt), or rebuild the head's image"
        )


# The ports each side of a join must reach on the other besides the head's GCS and scheduler, by name
LISTENED = {
    RAY_NODE_PORTS["node-manager-port"]: "Ray node manager",
    RAY_NODE_PORTS["object-manager-port"]: "Ray object manager",
    DASK_WORKER_PORT: "Dask worker",
}


def unreachable(host: str, ports: list[int], timeout_s: float) -> list[int]:
    """The ports of `host` a TCP connection from here does not reach within `timeout_s` each."""
    blocked = []
    for port in ports:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError:
            blocked.append(port)
    return blocked


def check_both_directions(head: str, here: str, scheduler: str, timeout_s: float) -> None:
    """This machine reaches the head's node ports, and the head reaches this one's (asked of the head
    through its Dask scheduler, once this node's processes listen): a blocked port, named, in one sentence."""
    blocked = unreachable(head, list(LISTENED), timeout_s)
    if blocked:
        who = f"this machine cannot reach the head at {head}"
        raise UserError(blocked_message(who, blocked, "the desktop's", head_is_wsl2(scheduler, timeout_s)))
    deadline = time.monotonic() + timeout_s
    while unreachable(here, list(LISTENED), 1.0):  # our own processes still starting
        if time.monotonic() > deadline:
            raise UserError(f"this node's Ray node and Dask worker did not listen on {here} within {timeout_s:g} s")
        time.sleep(0.5)
    from distributed import Client

    with Client(scheduler, timeout=timeout_s) as client:
        blocked = client.run_on_scheduler(unreachable, here, list(LISTENED), timeout_s)
    if blocked:
        raise UserError(blocked_message(f"the head cannot reach this machine at {here}", blocked, "this machine's"))


# What a joined machine's node holds while a run trains (an 8 GB Mac's memory is the CPU's and MPS's):
TRAINING_PROCESSES = 3  # at once: the run's kept Ray process for the worker, the Dask worker, a ray-train row's rank
TRAINING_SET_MB = 2 * 47  # MNIST's 60,000 training images as uint8: a process's cached array and its device copy
# a joined node's raylet 30, dashboard agent 120, runtime-env agent 80 and log monitor 78 MB (RSS on
# Linux, a local-multinode ray-ps row, 2 Dec 2026)
RAY_NODE_MB = 310


def memory_warning(ram_mb: float | None, checked_mb: float) -> str | None:
    """Whether this machine's memory is under what the run's processes on it will hold: each training
    process as much as this one after its device check (torch, the model, a forward and backward
    pass: `checked_mb`) plus its training set, TRAINING_PROCESSES of them, and Ray's node. A warning:
    the run still trains, slower, as the machine swaps."""
    each = checked_mb + TRAINING_SET_MB
    held = TRAINING_PROCESSES * each + RAY_NODE_MB
    if ram_mb is None or held <= ram_mb:
        return None
    return (
        f"this machine has {ram_mb / 1024:.1f} GB of memory and the run's processes on it will hold about "
        f"{held / 1024:.1f} GB ({TRAINING_PROCESSES} training processes of ~{each / 1024:.1f} GB each, this "
        f"check's peak and the training set, and Ray's node ~{RAY_NODE_MB / 1024:.1f} GB): it will swap, "
        "which slows its steps and skews the split; close other apps, or run it with more memory"
    )


def gloo_warning(here: str, scheduler: str, timeout_s: float) -> str | None:
    """Whether the head reaches a port of this machine's ephemeral range, as gloo's ranks must (it
    picks its ports at random): a warning, since the Ray and Dask strategies run without it."""
    from distributed import Client

    with socket.socket() as listening:
        listening.bind((here, 0))  # where gloo's listeners go: any port of the ephemeral range
        listening.listen()
        port = listening.getsockname()[1]
        with Client(scheduler, timeout=timeout_s) as client:
            # a LAN connects in milliseconds; a firewall that drops would hold the join for timeout_s
            if not client.run_on_scheduler(unreachable, here, [port], min(timeout_s, 5.0)):
                return None
    return (
        f"the head cannot reach this machine's ephemeral ports (tried {port}): gloo's strategies and the "
        "gloo-floor row will stall; let the head in on them, e.g. allow incoming connections for "
        f"{sys.executable} in the macOS firewall (docs/deployment.md: Ports)"
    )


def blocked_message(who: str, ports: list[int], firewall: str, wsl2_head: bool = False) -> str:
    """One sentence: who cannot reach which ports, and the firewall to open (a WSL2 desktop's has two)."""
    named = ", ".join(f"{port} ({LISTENED[port]})" for port in ports)
    message = f"{who} on port {named}: let it through {firewall} firewall (docs/deployment.md: Ports)"
    if wsl2_head:
        message += f"; the desktop is WSL2: open its Hyper-V firewall too (administrator PowerShell): {HYPERV_RULE}"
    return message


def head_is_wsl2(scheduler: str, timeout_s: float) -> bool:
    """Whether the head is a WSL2 desktop, asked of its Dask scheduler (which runs there)."""
    from distributed import Client

    with Client(scheduler, timeout=timeout_s) as client:
        return bool(client.run_on_scheduler(is_wsl2))


def check_token() -> None:
    if os.environ.get("RAY_AUTH_MODE", "token") != "token" or os.environ.get("RAY_AUTH_TOKEN"):
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if not path:
        raise UserError(
            "no Ray token: put the head's token (its .ray-token file) in ~/.config/hetbench/ray-token "
            "or point RAY_AUTH_TOKEN_PATH at it, so this node can join"
        )
    try:
        if not Path(path).expanduser().read_text().strip():
            raise UserError(f"the Ray token file {path} is empty: copy the head's .ray-token into it")
    except OSError as e:
        raise UserError(
            f"cannot read the Ray token file {path} ({e.strerror or e}): copy the desktop's .ray-token there"
        ) from None


def check_machine() -> None:
    """On a Mac, an x86-64 Python (under Rosetta) gets no MPS: the 'Mac' would train on its CPU."""
    if platform.system() == "Darwin" and platform.machine() != "arm64":
        raise UserError(
            f"this Python is {platform.machine()} (under Rosetta), which has no MPS: "
            "install an arm64 Python 3.11 (e.g. from python.org or Homebrew in /opt/homebrew)"
        )


def check_group(head: str, scheduler: str, timeout_s: float) -> str:
    """A two-rank group with the head, of the backend the rows will choose (cluster/collective.py):
    rank 0 in a process the head's Dask scheduler starts, rank 1 here, one all-reduce. The backend
    it formed on; what failed, in one sentence, before any row waits on it."""
    import torch
    import torch.distributed as dist
    from distributed import Client

    from hetbench.cluster.collective import join_group

    with Client(scheduler, timeout=timeout_s) as client:
        port = client.run_on_scheduler(start_group_rank_zero, head, timeout_s)
    if port is None:
        raise UserError(f"the head could not open a group's rendezvous at {head} within {timeout_s:g} s")
    try:
        joined = join_group(head, port, 1, 2, timeout_s, joined=True, connect_timeout_s=timeout_s)
        ones = torch.ones(4)
        dist.all_reduce(ones)
        if ones.tolist() != [2.0] * 4:
            raise RuntimeError(f"an all-reduce of ones gave {ones.tolist()}")
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"this machine and the head could not form a group (torch-ddp's, Ray Train's): {reason} "
            "(docs/deployment.md: Ports)"
        ) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return joined.collective


async def start_group_rank_zero(head: str, timeout_s: float) -> int | None:
    """On the head's scheduler: rank 0 of check_group's group in a process of its own (its event
    loop stays free); the rendezvous port it listens at, or None. The process ends by itself once
    the group is done or its waits run out."""
    import asyncio
    import subprocess

    code = f"from hetbench.cluster.admission import group_rank_zero; group_rank_zero({head!r}, {timeout_s!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline), timeout_s)
    except TimeoutError:
        proc.kill()
        return None
    return int(line) if line.strip().isdigit() else None


def group_rank_zero(head: str, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    from hetbench.cluster.collective import join_group, rendezvous

    store = rendezvous(head, 2, timeout_s)
    print(store.port, flush=True)
    join_group(head, store.port, 0, 2, timeout_s, store, joined=True, connect_timeout_s=timeout_s)
    try:
        dist.all_reduce(torch.ones(4))
    finally:
        dist.destroy_process_group()
