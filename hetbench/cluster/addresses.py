"""Cluster addresses: refuse one nothing answers at, fast and in one sentence; this machine's address
and interface on its route to another."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from hetbench.errors import UserError


def check_reachable(address: str, timeout_s: float) -> None:
    """Fail fast, in one sentence, on an address nothing listens at (ray.init would retry for minutes)."""
    parsed = urlsplit(address if "://" in address else f"tcp://{address}")
    host, port = parsed.hostname, parsed.port
    if not host or not port:
        raise UserError(f"cluster address '{address}' must look like host:port or scheme://host:port")
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        raise UserError(f"cannot reach {address} within {timeout_s:g} s: {e.strerror or e}") from None


def route_address(peer: str) -> str:
    """This machine's address on its route to `peer` (the head; a gloo group's rank 0): where its
    nodes listen, and nowhere else."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((peer, 9))  # UDP: no packet is sent, the kernel only picks the route
        return probe.getsockname()[0]


def interface_of(address: str) -> str | None:
    """The network interface holding `address`: gloo's (it would otherwise take the address the host
    name resolves to, which a Mac or a Linux /etc/hosts may point elsewhere, e.g. 127.0.1.1)."""
    import psutil  # Ray's own dependency

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    return None
