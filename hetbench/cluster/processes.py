"""Starting and stopping the processes hetbench owns: by PID, with their whole trees, within bounded time."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path


def machine_memory_mb() -> float | None:
    """This machine's memory, MiB (an 8 GB Mac's unified memory: the CPU's and MPS's alike); None
    where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError):
        return None


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB.

    Linux: VmHWM, this address space's own peak; ru_maxrss would report the parent's peak in a
    process forked and exec'd from a big one (Dask's local worker processes, from the driver).
    macOS: ru_maxrss, in bytes there."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(kib) / 2**10


def children_and_sessions() -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Parent PID -> child PIDs, and session ID -> member PIDs, from /proc (Linux: where local clusters run)."""
    tree: dict[int, list[int]] = {}
    sessions: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
        except OSError:  # the process ended while we looked
            continue
        pid = int(stat.parent.name)
        tree.setdefault(int(fields[1]), []).append(pid)
        sessions.setdefault(int(fields[3]), []).append(pid)
    return tree, sessions


def descendants(pid: int) -> list[int]:
    """`pid`, every process below it, and, where `pid` leads a session (started with
    start_new_session), every member of that session. Ray's workers leave the process group, so the
    tree it is; and a process whose parent ended first (a raylet that exited by itself, or was killed
    before it was listed, leaves its booting agents) is reparented to init, out of the tree, but
    stays in the session."""
    tree, sessions = children_and_sessions()
    found, todo = [], [pid, *sessions.get(pid, [])]
    while todo:
        p = todo.pop()
        if p not in found:
            found.append(p)
            todo.extend(tree.get(p, []))
    return found


def alive(pid: int) -> bool:
    return _state(pid) not in "ZX"  # a zombie has exited; only its parent's wait is missing


def _state(pid: int) -> str:
    """The process's state letter from /proc (R, S, T, Z, ...); X where it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def frozen_trees(procs: list[subprocess.Popen], timeout_s: float = 5.0) -> list[int]:
    """SIGSTOP each process and its descendants until the listing holds still, and return it.

    A tree listed and then signalled loses what it forks in between (a booting raylet starting its
    agents): the child outlives its killed parent, reparented to init, where no listing finds it.
    A stopped process forks nothing, so once every listed process is stopped, the tree is whole."""
    pids: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        new = [p for proc in procs for p in descendants(proc.pid) if p not in pids]
        if not new or time.monotonic() > deadline:  # past it, what is listed is signalled unstopped
            return pids + new
        _signal(new, signal.SIGSTOP)
        pids += new
        while any(_state(p) not in "TtZX" for p in new) and time.monotonic() < deadline:
            time.sleep(0.01)


def stop_trees(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM each process and its descendants, SIGKILL what is left after `grace_s`, reap."""
    pids = frozen_trees(procs)
    _signal(pids, signal.SIGTERM)
    _signal(pids, signal.SIGCONT)  # the SIGTERM is handled as each wakes
    deadline = time.monotonic() + grace_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        for proc in procs:
            proc.poll()
        time.sleep(0.1)
    # what they started while shutting down (a raylet restarts an agent it saw end before its own
    # SIGTERM ends it): its parent gone, found by its session, stopped and killed with the rest
    pids += [p for p in frozen_trees(procs) if p not in pids]
    _signal([p for p in pids if alive(p)], signal.SIGKILL)
    _reap(procs, pids, grace_s)


def kill_trees(procs: list[subprocess.Popen], reap_s: float = 10.0) -> None:
    """SIGKILL each process and its descendants at once (a machine vanishing, not a shutdown), reap."""
    pids = frozen_trees(procs)
    _signal(pids, signal.SIGKILL)
    _reap(procs, pids, reap_s)


def kill_pids(pids: list[int], reap_s: float = 10.0) -> None:
    """SIGKILL processes that need not be our children (orphans init holds), and wait until they are gone."""
    _signal(pids, signal.SIGKILL)
    _reap([], pids, reap_s)


def in_namespace(netns_path: str) -> list[int]:
    """The processes inside the network namespace mounted at `netns_path` (/run/netns/NAME),
    whatever their parent: none where it does not exist."""
    try:
        inode = os.stat(netns_path).st_ino
    except OSError:
        return []
    found = []
    for link in Path("/proc").glob("[0-9]*/ns/net"):
        try:
            if os.stat(link).st_ino == inode:
                found.append(int(link.parent.parent.name))
        except OSError:  # the process ended while we looked
            continue
    return found


def _reap(procs: list[subprocess.Popen], pids: list[int], timeout_s: float) -> None:
    """Wait for our children, and until every descendant signalled is gone: a killed process tears
    its memory down before it ends, and one that is not our child is not waited for by `wait`."""
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
