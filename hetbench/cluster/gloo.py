"""A gloo group between machines: every rank on the interface toward rank 0, not its host name's.

Without GLOO_SOCKET_IFNAME, gloo advertises the address the host name resolves to: 127.0.1.1 on
Debian and Ubuntu (/etc/hosts), which a container with `network_mode: host` copies. The rank whose
address compares greater dials the other (gloo/transport/tcp/device.cc, Device::isInitiator), so a Mac
at 192.168.x.x would dial the desktop's loopback and the group would never form (ray-project/ray#37461).
"""

from __future__ import annotations

import os
from datetime import timedelta

from hetbench.cluster.addresses import interface_of, route_address

# Whoever started this process chose (hetbench worker, an emulated link's node, the user): it stands.
CHOSEN = os.environ.get("GLOO_SOCKET_IFNAME")


def use_interface_toward(master: str) -> str | None:
    """Set GLOO_SOCKET_IFNAME, before this process joins a group, to the interface it reaches
    `master` through (its own address's, on rank 0); the interface, or None where none is found."""
    interface = CHOSEN or interface_of(route_address(master))
    if interface:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
    return interface


def rendezvous(master: str, world: int, timeout_s: float):
    """Rank 0's store for a group of `world`, listening at `master` on a port the kernel picks as it
    binds: no window between choosing a free port and listening on it for another socket to take
    (a CI run once lost a row and the rank-0 process to EADDRINUSE that way). Its `port` is the
    other ranks' to join; rank 0 joins with the store itself."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    return dist.TCPStore(master, 0, world, is_master=True, timeout=timeout, wait_for_workers=False)


def join_group(master: str, port: int, rank: int, world: int, timeout_s: float, store=None) -> str | None:
    """This process as `rank` of a gloo group of `world` whose rank 0 listens at master:port (rank 0
    passes its `rendezvous` store); the interface it joined on (records keep it: the first thing to
    check when a group never forms)."""
    import torch.distributed as dist

    interface = use_interface_toward(master)
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(master, port, world, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    return interface
