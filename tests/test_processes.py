"""Stopping a process tree while it forks: nothing it forked outlives it (a booting raylet starting its
agents as its node is killed)."""

import os
import random
import subprocess
import sys
import time

import pytest

from helpers import live_processes
from hetbench.cluster.processes import kill_trees, stop_trees

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees are read from /proc")


def sleepers(seconds: str) -> list[int]:
    """PIDs of live `sleep <seconds>` processes, whoever their parent (not the shell that forks them)."""
    return [pid for pid, argv, _ in live_processes() if argv[:2] == [b"sleep", seconds.encode()]]


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
        for pid in [forker.pid, *sleepers(seconds)]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        forker.wait(timeout=10)
