"""An 8 GB Mac: each worker records its machine's memory and its device's, and a machine whose memory
is under what the run's processes on it will hold is warned at join, in one line."""

import pytest

from hetbench.cluster import admission
from hetbench.cluster.processes import machine_memory_mb, peak_rss_mb
from hetbench.config import load_config

GB = 1024  # MiB


def test_a_worker_records_its_machines_memory_and_none_for_a_cpus_device_memory():
    from hetbench.strategies.single import OneDevice

    info = OneDevice().setup(load_config(None, ["workers=[{batch: 8, device: cpu}]", "download=false"]).job(), 0, 1)
    assert info["ram_mb"] == machine_memory_mb() and info["ram_mb"] > GB
    assert info["device_memory_mb"] is None  # a CPU's is the process's own, in its peak RSS


def test_an_8_gb_mac_whose_training_processes_would_not_fit_is_warned_in_one_line():
    held_each = 2.5 * GB  # a training process as big as an MPS one can get with a big batch
    warning = admission.memory_warning(8 * GB, held_each)
    assert warning is not None and "\n" not in warning
    each = (held_each + admission.TRAINING_SET_MB) / GB
    expected = admission.TRAINING_PROCESSES * each + admission.RAY_NODE_MB / GB
    assert warning.startswith(
        f"this machine has 8.0 GB of memory and the run's processes on it will hold about {expected:.1f} GB"
    )
    assert f"{admission.TRAINING_PROCESSES} training processes of ~{each:.1f} GB each" in warning


@pytest.mark.parametrize("ram_gb", [8, 16])
def test_a_machine_that_holds_them_is_not_warned(ram_gb):
    assert admission.memory_warning(ram_gb * GB, peak_rss_mb()) is None  # this test process: torch and a model
    assert admission.memory_warning(None, 100 * GB) is None  # a system that does not say: nothing to compare
