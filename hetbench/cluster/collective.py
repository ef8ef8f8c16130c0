"""A torch.distributed group between machines: its backend chosen by the operating systems in it, and
every rank on its interface toward rank 0.

The backend: gloo where every rank runs the same operating system and trains on a device gloo takes;
else hetbench's TCP group (transport/tcp_group.py), since stock gloo cannot join a Linux rank to a
macOS one (pytorch/gloo#383) and takes no MPS tensors (pytorch/pytorch#160732). `cluster.collective`
forces either; gloo across operating systems is refused in one sentence. The choice is made as the
group forms, from what each rank publishes in the rendezvous store, so every rank makes the same one
and a row that forms its group inside a framework (Ray Train's TorchConfig) chooses the same way.

The interface: without GLOO_SOCKET_IFNAME, gloo advertises the address the host name resolves to:
127.0.1.1 on Debian and Ubuntu (/etc/hosts), which a container with `network_mode: host` copies. The
rank whose address compares greater dials the other (gloo/transport/tcp/device.cc,
Device::isInitiator), so a Mac at 192.168.x.x would dial the desktop's loopback and the group would
never form (ray-project/ray#37461). The TCP group listens on the same address toward rank 0.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from datetime import timedelta

from hetbench.cluster.addresses import interface_of, route_address
from hetbench.cluster.nodes import COLLECTIVE_PORTS

BACKEND = "hetbench"  # what init_process_group is given: gloo or the TCP group, chosen as the group forms
COLLECTIVES = ("auto", "gloo", "tcp")
# A Mac stand-in (a Linux process) reports this operating system (local-multinode's cluster.macos_nodes,
# the compose smoke's Mac): `auto` then chooses as it will on the real pair.
REPORTED_OS_ENV = "HETBENCH_REPORTED_OS"
FACTS_KEY = "hetbench-collective/facts/"

# Whoever started this process chose (hetbench worker, an emulated link's node, the user): it stands.
CHOSEN = os.environ.get("GLOO_SOCKET_IFNAME")


def operating_system() -> str:
    """This process's operating system as the group sees it: Linux, Darwin (macOS), Windows."""
    return os.environ.get(REPORTED_OS_ENV) or platform.system()


@dataclass(frozen=True)
class GroupPlan:
    """What this process brings to the next group it forms (`prepare`)."""

    collective: str = "auto"  # cluster.collective
    host: str = "127.0.0.1"  # where the TCP group listens: this machine's address toward rank 0
    ports: tuple[int, int] | None = None  # the TCP group's port range (a joined cluster's); None: any
    connect_timeout_s: float = 30.0  # bound on forming the group
    gloo_device: bool = True  # this rank trains on a device gloo takes (not MPS)


plan = GroupPlan()
formed: str | None = None  # the backend this process's latest group formed on: gloo or tcp


def use_interface_toward(master: str) -> str | None:
    """Set GLOO_SOCKET_IFNAME, before this process joins a group, to the interface it reaches
    `master` through (its own address's, on rank 0); the interface, or None where none is found."""
    interface = CHOSEN or interface_of(route_address(master))
    if interface:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
    return interface


def prepare(
    master: str, collective: str, joined: bool, connect_timeout_s: float, device: str | None = None
) -> str | None:
    """Make this process ready to form a group whose rank 0 is at `master`: the backend registered,
    gloo's interface chosen, the TCP group's address and ports. `joined`: a cluster someone started,
    whose firewalls open COLLECTIVE_PORTS. `device`: the type this rank trains on (None: MPS unless
    this machine has none). The interface toward `master`."""
    import torch
    import torch.distributed as dist

    global plan
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda", "mps"])
    interface = use_interface_toward(master)
    if device is None:
        mps = getattr(torch.backends, "mps", None)
        device = "mps" if mps and mps.is_available() else "cpu"
    plan = GroupPlan(
        collective=collective,
        host=route_address(master),
        ports=COLLECTIVE_PORTS if joined else None,
        connect_timeout_s=connect_timeout_s,
        gloo_device=device != "mps",
    )
    return interface


def choose(collective: str, systems: list[str], gloo_devices: list[bool]) -> str:
    """The backend for a group whose ranks run `systems` and train on devices gloo takes or not."""
    if collective == "tcp":
        return "tcp"
    mixed = sorted(set(systems))
    if collective == "gloo":
        if len(mixed) > 1:
            raise RuntimeError(
                f"cluster.collective: gloo cannot form a group between {' and '.join(mixed)} (gloo's transports "
                "differ by platform, pytorch/gloo#383): use auto or tcp"
            )
        return "gloo"
    return "gloo" if len(mixed) == 1 and all(gloo_devices) else "tcp"


def _create(options, _backend_options):
    """torch.distributed's creator for BACKEND: every rank publishes its operating system and device
    kind, reads everyone's, and all form the same backend."""
    from torch.distributed import ProcessGroupGloo

    from hetbench.transport.tcp_group import TcpProcessGroup, form

    global formed
    store, rank, size, timeout = options.store, options.group_rank, options.group_size, options.timeout
    store.set(f"{FACTS_KEY}{rank}", f"{operating_system()} {int(plan.gloo_device)}")
    keys = [f"{FACTS_KEY}{r}" for r in range(size)]
    try:
        store.wait(keys, timedelta(seconds=plan.connect_timeout_s))
    except RuntimeError:
        raise RuntimeError(
            f"the group did not form within {plan.connect_timeout_s:g} s: not every rank joined the rendezvous"
        ) from None
    facts = [store.get(key).decode().split() for key in keys]
    backend = choose(plan.collective, [system for system, _ in facts], [ok == "1" for _, ok in facts])
    if backend == "gloo":
        group = ProcessGroupGloo(store, rank, size, timeout)
    else:
        peers = form(store, rank, size, plan.host, plan.ports, plan.connect_timeout_s)
        group = TcpProcessGroup(rank, size, peers, timeout.total_seconds())
    formed = backend
    return group


def rendezvous(master: str, world: int, timeout_s: float):
    """Rank 0's store for a group of `world`, listening at `master` on a port the kernel picks as it
    binds: no window between choosing a free port and listening on it for another socket to take
    (a CI run once lost a row and the rank-0 process to EADDRINUSE that way). Its `port` is the
    other ranks' to join; rank 0 joins with the store itself."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    return dist.TCPStore(master, 0, world, is_master=True, timeout=timeout, wait_for_workers=False)


@dataclass(frozen=True)
class Joined:
    """How this process joined its group: records keep both (the first things to check when a group
    never forms)."""

    interface: str | None  # gloo's interface toward rank 0
    collective: str  # the backend the group formed on: gloo or tcp


def join_group(
    master: str,
    port: int,
    rank: int,
    world: int,
    timeout_s: float,
    store=None,
    *,
    collective: str = "auto",
    joined: bool = False,
    connect_timeout_s: float = 30.0,
    device: str | None = None,
) -> Joined:
    """This process as `rank` of a group of `world` whose rank 0 listens at master:port (rank 0
    passes its `rendezvous` store), on the backend `collective` chooses (`prepare`)."""
    import torch.distributed as dist

    interface = prepare(master, collective, joined, connect_timeout_s, device)
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(master, port, world, is_master=False, timeout=timeout)
    dist.init_process_group(BACKEND, store=store, rank=rank, world_size=world, timeout=timeout)
    return Joined(interface, formed)
