"""Link emulation: a network namespace per emulated remote machine, joined to this host by a shaped veth pair.

`tc tbf` caps the rate both ways. This kernel has no netem, so there is no delay or loss
emulation: a link here is a bandwidth limit on top of loopback-like latency. Traffic only ever
goes to the two addresses of each pair, which this module creates and removes.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess

from hetbench.cluster.processes import in_namespace, kill_pids
from hetbench.errors import UserError

log = logging.getLogger(__name__)

SUBNET = "10.231"  # link i: host side 10.231.i.1, namespace side 10.231.i.2 (/30)


def check_can_emulate() -> None:
    if os.geteuid() != 0:
        raise UserError(
            "link emulation (link.rate) needs root for network namespaces and tc; run as root or set link.rate to null"
        )
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise UserError(f"link emulation needs the '{missing[0]}' command (iproute2), which is not installed")


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise UserError(f"link emulation: '{' '.join(argv)}' failed: {done.stderr.strip() or done.returncode}")


def open_links(labels: list[str], rate: str) -> dict[str, Link]:
    """One Link per label, on subnets no interface here holds. A run killed outright (SIGKILL, a
    machine restart) cannot remove its namespaces; a later run that reused their addresses would
    route its packets into the dead namespace (it did, in CI), so those leftovers go first."""
    remove_leftovers()
    addresses = _output("ip", "-o", "-4", "addr")
    held = {int(index) for index in re.findall(rf"inet {re.escape(SUBNET)}\.(\d+)\.", addresses)}
    free = [index for index in range(256) if index not in held]
    if len(free) < len(labels):
        raise UserError(f"link emulation: no free {SUBNET}.x.0/30 subnet is left for {len(labels)} link(s)")
    links: dict[str, Link] = {}
    try:
        for label, index in zip(labels, free):
            links[label] = Link(index, rate, str(os.getpid()))
    except BaseException:
        for link in links.values():
            link.close()
        raise
    return links


def remove_leftovers() -> None:
    """Delete the namespaces of runs that are gone: hb<pid>n<i> whose process no longer exists."""
    for line in _output("ip", "netns", "list").splitlines():
        name = line.split(" ")[0]
        owner = re.fullmatch(r"hb(\d+)n(\d+)", name)
        if owner and not os.path.exists(f"/proc/{owner[1]}"):
            log.info("notice: removing link namespace %s, left by a run that is gone", name)
            _remove(name, f"hb{owner[1]}h{owner[2]}")


def _output(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout


class Link:
    """One shaped veth pair: `host_ip` here, `ns_ip` inside namespace `name`; `close()` removes both."""

    def __init__(self, index: int, rate: str, tag: str) -> None:
        self.name = f"hb{tag}n{index}"
        self.host_dev, self.ns_dev = f"hb{tag}h{index}", f"hb{tag}p{index}"
        ns_dev = self.ns_dev
        self.host_ip, self.ns_ip = f"{SUBNET}.{index}.1", f"{SUBNET}.{index}.2"
        self.rate = rate
        self.created = False
        try:
            _run("ip", "netns", "add", self.name)
            self.created = True
            _run("ip", "link", "add", self.host_dev, "type", "veth", "peer", "name", ns_dev)
            _run("ip", "link", "set", ns_dev, "netns", self.name)
            _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_dev)
            _run("ip", "link", "set", self.host_dev, "up")
            inside = ("ip", "netns", "exec", self.name)
            _run(*inside, "ip", "addr", "add", f"{self.ns_ip}/30", "dev", ns_dev)
            _run(*inside, "ip", "link", "set", ns_dev, "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
            # the same cap each way: host -> namespace on the host end, namespace -> host inside
            shape = ("root", "tbf", "rate", rate, "burst", "64kb", "latency", "50ms")
            _run("tc", "qdisc", "add", "dev", self.host_dev, *shape)
            _run(*inside, "tc", "qdisc", "add", "dev", ns_dev, *shape)
        except BaseException:
            self.close()
            raise

    def prefix(self) -> list[str]:
        """The command prefix that runs a process inside this namespace."""
        return ["ip", "netns", "exec", self.name]

    def gloo_env(self, inside: bool) -> dict:
        """gloo picks its interface from the host name, which resolves outside the namespace:
        name the link's own end instead, on each side."""
        return {"GLOO_SOCKET_IFNAME": self.ns_dev if inside else self.host_dev}

    def cut(self) -> None:
        """Fault injection: the link goes down (host end), as a dropped Wi-Fi would; nothing passes."""
        _run("ip", "link", "set", self.host_dev, "down")

    def restore(self) -> None:
        _run("ip", "link", "set", self.host_dev, "up")

    def processes(self) -> list[int]:
        """The processes inside this namespace, whoever holds them now: a Ray node's agents outlive
        their raylet when Ray ends a node it declared dead, and init inherits them."""
        return in_namespace(f"/run/netns/{self.name}")

    def end_processes(self) -> None:
        kill_pids(self.processes())

    def close(self) -> None:
        if self.created:
            self.end_processes()  # nothing is left running where no link leads any more
            _remove(self.name, self.host_dev)
            self.created = False


def _remove(namespace: str, host_dev: str) -> None:
    """The veth pair first: a deleted namespace takes its pair with it, but only later, in the
    kernel's own time, and meanwhile the host end still holds its address."""
    subprocess.run(["ip", "link", "del", host_dev], capture_output=True, timeout=30)
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
