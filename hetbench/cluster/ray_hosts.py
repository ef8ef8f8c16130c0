"""A run's Ray worker processes, kept from row to row.

A fresh Ray actor is a fresh Python process that imports torch and loads the data: 4.4-6.4 s of a
row's startup here (docs/design.md: Ray strategies), paid again by every row. Within a run (the connection is
`kept`) each row's role runs instead in a `Host` an earlier row started on the same node, as Dask's
actors run in its kept worker processes: a fresh role object each row, a fresh model each repeat.
"""

from __future__ import annotations

import gc

import ray

RETIRE_S = 10.0  # a host that has not let go of its row within this is killed, not kept


class Host:
    """One kept process: runs one row's role object at a time."""

    role = None

    def become(self, role: type) -> None:
        self.role = role()

    def invoke(self, method: str, *args, **kwargs):
        return getattr(self.role, method)(*args, **kwargs)

    def retire(self) -> None:
        """The row's role lets go of what it holds (channels, process groups), then is forgotten."""
        role, self.role = self.role, None
        if hasattr(role, "retire"):
            role.retire()
        del role
        gc.collect()


class HostPool:
    """Idle hosts by where they run (a node label, or the driver's node); the run's connection owns it."""

    def __init__(self) -> None:
        self.idle: dict[str, list] = {}

    def take(self, where: str, options: dict):
        """An idle host placed `where`, else a new one placed by `options`."""
        free = self.idle.get(where)
        return free.pop() if free else ray.remote(Host).options(**options).remote()

    def give_back(self, hosts: list[tuple[str, object]]) -> None:
        """(where, host) pairs whose row is over: kept if they retire cleanly and in time, else killed."""
        retired = [host.retire.remote() for _, host in hosts]
        ready, _ = ray.wait(retired, num_returns=len(retired), timeout=RETIRE_S) if retired else ([], [])
        for (where, host), done in zip(hosts, retired):
            if done in ready and _returned(done):
                self.idle.setdefault(where, []).append(host)
            else:
                self.discard([(where, host)])

    def discard(self, hosts: list[tuple[str, object]]) -> None:
        """(where, host) pairs whose row failed: killed, whatever they still hold or run."""
        for _, host in hosts:
            ray.kill(host, no_restart=True)

    def close(self) -> None:
        self.discard([(where, host) for where, hosts in self.idle.items() for host in hosts])
        self.idle.clear()


def _returned(handle) -> bool:
    try:
        ray.get(handle, timeout=0)
        return True
    except Exception:  # a host whose role failed to let go is not kept: that is the answer
        return False
