"""Stopping a process tree while it forks: nothing it forked outlives it (a booting raylet starting its
agents as its node is killed), nor what a process that ended first left to init (the agents of a
raylet that exited by itself)."""

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import live_processes
from hetbench.cluster.processes import kill_trees, stop_trees

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees are read from /proc")


def sleepers(seconds: str) -> list[int]:
    """PIDs of live `sleep <seconds>` processes, whoever their parent (not the shell that forks them)."""
    return [pid for pid, argv, _ in live_processes() if argv[:2] == [b"sleep", seconds.encode()]]


def kill_all(leader: subprocess.Popen, seconds: str) -> None:
    """Whatever a failed test left: the leader and its sleepers."""
    for pid in [leader.pid, *sleepers(seconds)]:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    leader.wait(timeout=10)


@pytest.mark.parametrize("stop", [kill_trees, stop_trees], ids=["kill", "stop"])
def test_a_tree_that_keeps_forking_leaves_no_orphan(stop):
    seconds = str(random.randint(900_000, 999_999))  # names this test's sleepers alone
    forker = subprocess.Popen(["sh", "-c", f"while :; do sleep {seconds} & sleep 0.002; done"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(sleepers(seconds)) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sleepers(seconds), "the tree forked nothing"
        stop([forker])
        assert forker.poll() is not None
        assert sleepers(seconds) == []
    finally:
        kill_all(forker, seconds)


@pytest.mark.parametrize("stop", [kill_trees, stop_trees], ids=["kill", "stop"])
def test_what_a_dead_parent_left_to_init_is_stopped_with_the_session(stop):
    seconds = str(random.randint(900_000, 999_999))
    # the middle shell starts a sleeper and exits: the sleeper's parent is init now, not the leader
    leader = subprocess.Popen(["sh", "-c", f"sh -c 'sleep {seconds} &'; exec sleep 300"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not sleepers(seconds) and time.monotonic() < deadline:
            time.sleep(0.05)
        (orphan,) = sleepers(seconds)
        children = Path(f"/proc/{leader.pid}/task/{leader.pid}/children").read_text().split()
        assert str(orphan) not in children
        stop([leader])
        assert leader.poll() is not None and sleepers(seconds) == []
    finally:
        kill_all(leader, seconds)


def test_what_a_process_starts_as_it_is_stopped_is_stopped_too():
    seconds = str(random.randint(900_000, 999_999))
    # on SIGTERM the leader starts a sleeper and exits, as a raylet restarts an agent while shutting down
    script = f"trap 'sleep {seconds} & exit 0' TERM; while :; do sleep 0.05; done"
    leader = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        time.sleep(0.3)  # the trap is set
        stop_trees([leader])
        assert leader.poll() is not None and sleepers(seconds) == []
    finally:
        kill_all(leader, seconds)
