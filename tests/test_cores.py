"""A process's cores are those it may run on (a container's cpuset, taskset), not the machine's count."""

import os
import shutil
import subprocess
import sys

import pytest

PINNED = shutil.which("taskset") and hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1
CHECK = """
import torch
from hetbench.cluster.nodes import ray_node_argv
from hetbench.cores import usable_cores
from hetbench.devices import configure_threads
configure_threads(0)
print(usable_cores(), torch.get_num_threads(), [a for a in ray_node_argv("mac") if a.startswith("--num-cpus")][0])
"""


@pytest.mark.skipif(not PINNED, reason="needs taskset and a machine of more than one core")
def test_a_process_held_to_one_core_trains_on_one_thread_and_offers_ray_one_cpu():
    first = sorted(os.sched_getaffinity(0))[0]
    out = subprocess.run(
        ["taskset", "-c", str(first), sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1", "--num-cpus=1"]
    # unpinned, the same process has every core it may run on
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[0] == str(len(os.sched_getaffinity(0)))
