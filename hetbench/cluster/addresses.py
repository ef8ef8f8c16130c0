"""Cluster addresses: refuse one nothing answers at, fast and in one sentence."""

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
