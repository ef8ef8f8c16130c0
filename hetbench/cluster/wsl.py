"""The desktop on Windows: WSL2 in mirrored networking mode, or one sentence naming the step missed.

The supported route (docs/deployment.md, "Desktop on Windows"): Windows 11 22H2 or later, WSL2 with
`networkingMode=mirrored`, inbound connections allowed through the Hyper-V firewall, Docker Engine
inside the WSL2 distribution running the same compose.yaml. In WSL2's default NAT mode the
distribution has an address of its own behind Windows, and the Mac can reach none of its ports.

Inside a container `wslinfo` is absent, but the kernel is the WSL2 VM's, and so is the network
(`network_mode: host`): in NAT mode the desktop's LAN address (HEAD_HOST) is Windows', not one of
this machine's. That is the check where `wslinfo --networking-mode` cannot answer.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from hetbench.cluster.nodes import (
    COLLECTIVE_PORTS,
    DASK_WORKER_PORT,
    DIRECT_PORT,
    HEAD_DASK_PORT,
    HEAD_RAY_PORT,
    LINUX_EPHEMERAL_PORTS,
    RAY_NODE_PORTS,
)
from hetbench.errors import UserError

OSRELEASE = Path("/proc/sys/kernel/osrelease")  # the kernel's release: a container sees its host's
# WSL's VM creator id in the Hyper-V firewall (Microsoft's documentation, WSL networking)
WSL_VM_CREATOR_ID = "{40E0AC32-46A5-438A-A0B2-2B479E8F2E90}"
# What the Mac connects to on the desktop (docs/deployment.md: Ports): Ray's GCS and node, ray-ps's server, Dask's
# scheduler and worker, Ray's worker processes, the TCP group's ranks, gloo's (and a group's
# rendezvous') ephemeral ports
_RAY = RAY_NODE_PORTS
DESKTOP_PORTS = ",".join(
    [
        f"{HEAD_RAY_PORT}-{DIRECT_PORT}",
        "{}-{}".format(*COLLECTIVE_PORTS),
        f"{HEAD_DASK_PORT}",
        f"{DASK_WORKER_PORT}",
        f"{_RAY['min-worker-port']}-{_RAY['max-worker-port']}",
        "{}-{}".format(*LINUX_EPHEMERAL_PORTS),
    ]
)
HYPERV_RULE = (
    "New-NetFirewallHyperVRule -Name hetbench -DisplayName hetbench -Direction Inbound"
    f' -VMCreatorId "{WSL_VM_CREATOR_ID}" -Protocol TCP -LocalPorts {DESKTOP_PORTS}'
)
MIRRORED = (
    "in Windows, put `networkingMode=mirrored` under [wsl2] in %UserProfile%\\.wslconfig, run `wsl --shutdown` "
    "in PowerShell and start again (docs/deployment.md: Desktop on Windows)"
)


def wsl_version(osrelease: str) -> int:
    """2 for a WSL2 kernel ("5.15.153.1-microsoft-standard-WSL2"), 1 for WSL 1's ("4.4.0-19041-Microsoft"),
    0 for any other."""
    release = osrelease.lower()
    if "microsoft" not in release:
        return 0
    return 2 if "wsl2" in release or "microsoft-standard" in release else 1


def networking_mode() -> str | None:
    """`wslinfo --networking-mode` (nat, mirrored, virtioproxy) where WSL provides it (a WSL shell,
    not a container); None elsewhere."""
    try:
        done = subprocess.run(["wslinfo", "--networking-mode"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip().lower() or None


def check_desktop(head: str | None, osrelease: str, mode: str | None, addresses: set[str]) -> None:
    """Refuse, in one sentence, a desktop the Mac cannot reach: WSL 1, WSL2 in NAT mode, or a HEAD_HOST
    that is none of this machine's addresses (on WSL2 in NAT mode it is Windows' address)."""
    version = wsl_version(osrelease)
    if version == 1:
        raise UserError(
            "this desktop runs WSL 1, which runs no Docker Engine or Ray node: "
            "convert the distribution with `wsl --set-version <distribution> 2` "
            "(docs/deployment.md: Desktop on Windows)"
        )
    if version == 2 and mode == "nat":
        raise UserError(f"WSL2 is in NAT networking mode, which hides every port from the Mac: {MIRRORED}")
    if head is None or resolved(head) in addresses:
        return
    mine = ", ".join(sorted(a for a in addresses if not a.startswith("127.")))
    if version == 2:
        raise UserError(
            f"HEAD_HOST {head} is not an address of this WSL2 machine ({mine}): WSL2 is in NAT networking mode, "
            f"which hides every port from the Mac; {MIRRORED}"
        )
    raise UserError(f"HEAD_HOST {head} is not an address of this machine ({mine}): set it in .env to one of them")


def resolved(head: str) -> str:
    try:
        return socket.gethostbyname(head)
    except OSError:
        raise UserError(f"HEAD_HOST {head} does not resolve: set it in .env to this desktop's LAN address") from None


def local_addresses() -> set[str]:
    """This machine's IPv4 addresses (HEAD_HOST is one: Ray and Dask are given it)."""
    import psutil  # Ray's own dependency

    return {a.address for addresses in psutil.net_if_addrs().values() for a in addresses if a.family == socket.AF_INET}


def check_this_desktop(head: str | None) -> None:
    """check_desktop for this machine: its kernel, WSL's networking mode where asked, its addresses."""
    check_desktop(head, OSRELEASE.read_text(), networking_mode(), local_addresses())


def is_wsl2() -> bool:
    """Whether this machine is a WSL2 desktop (asked of the head by a joining Mac, for its messages)."""
    try:
        return wsl_version(OSRELEASE.read_text()) == 2 or "WSL_DISTRO_NAME" in os.environ
    except OSError:  # not Linux
        return False
