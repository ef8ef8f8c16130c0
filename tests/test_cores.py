"""A process's cores are those it may run on (a container's cpuset, taskset), not the machine's count."""

import os
import subprocess
import sys

import pytest

from helpers import CAN_PIN

CHECK = """
import torch
from hetbench.cluster.nodes import ray_node_argv
from hetbench.cores import usable_cores
from hetbench.devices import configure_threads
configure_threads(0)
print(usable_cores(), torch.get_num_threads(), [a for a in ray_node_argv("mac") if a.startswith("--num-cpus")][0])
"""


@pytest.mark.skipif(not CAN_PIN, reason="needs taskset and a machine of more than one core")
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


def test_pinned_nodes_share_out_the_cores_in_order_the_first_taking_what_is_left(monkeypatch):
    from hetbench.cores import core_shares

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 0, 3, 1, 2})
    assert core_shares(2) == [[0, 1, 2], [3, 5]]
    assert core_shares(5) == [[0], [1], [2], [3], [5]]


def test_more_nodes_than_cores_or_no_affinity_to_pin_with_is_one_sentence(monkeypatch):
    from hetbench.cores import core_shares
    from hetbench.errors import UserError

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(UserError, match="3 nodes need a core each, and this process may use 2"):
        core_shares(3)
    monkeypatch.delattr(os, "sched_getaffinity")
    with pytest.raises(UserError, match="needs Linux's CPU affinity"):
        core_shares(2)


def test_workers_on_pinned_nodes_split_their_own_nodes_cores_not_the_boxs():
    from hetbench.cluster.placed import workers_per_host
    from hetbench.config import load_config

    workers = "workers=[{name: d0, node: desktop}, {name: d1, node: desktop}, {name: m, node: mac}]"
    for pin, expected in (("false", [3, 3, 3]), ("true", [2, 2, 1])):
        cfg = load_config(None, [workers, "cluster.mode=local-multinode", f"cluster.pin_nodes={pin}"])
        assert [workers_per_host(cfg.cluster, cfg.workers, w, True) for w in cfg.workers] == expected
