"""Load: eight workers (one of them emulated 2x slower) on this 2-core machine, for every strategy."""

import json

import pytest

from helpers import small_config
from hetbench.runner import run

EIGHT = "workers=[" + ", ".join(["{}"] * 7 + ["{slowdown: 2.0}"]) + "]"
WORKER_PEAK_MB = 2048  # a worker holds torch, the 1.2M-parameter model and the 5,000-image sample


LOADED = ["ray-ps", "ray-ps-async", "dask-sync", "ray-train"]


@pytest.fixture(scope="module")
def eight_worker_records(tmp_path_factory, _session_data) -> dict[str, dict]:
    """One run of every loaded strategy with eight workers, as a user's run would (one cluster and
    one set of worker processes for all rows): strategy -> its record."""
    cfg = small_config(
        tmp_path_factory.mktemp("load"),
        f"strategies=[{', '.join(LOADED)}]",
        EIGHT,
        "batch_size=64",
        "steps=4",
        "warmup_steps=1",
        "repeats=1",
        "eval_every=5",
        "floor.enabled=false",
    )
    return {r["strategy"]: r for r in json.loads(run(cfg).path.read_text())}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", LOADED)
def test_eight_workers_complete_with_coherent_records_and_bounded_memory(eight_worker_records, strategy):
    record = eight_worker_records[strategy]
    assert record["status"] == "ok", record.get("reason")
    workers = record["workers"]
    assert sorted(w["name"] for w in workers) == [f"w{i}" for i in range(8)]
    assert record["split"] == [8] * 8 and sum(w["batch"] for w in workers) == 64
    assert [w["slowdown"] for w in sorted(workers, key=lambda w: w["name"])] == [1.0] * 7 + [2.0]
    assert all(0 < w["peak_rss_mb"] < WORKER_PEAK_MB for w in workers), [w["peak_rss_mb"] for w in workers]
    assert 0 < record["driver_peak_rss_mb"] < 4 * WORKER_PEAK_MB
    assert record["samples_per_s"] > 0 and len(record["accuracy_curve"]) == 1


def test_peak_memory_is_the_process_own_not_its_parents():
    # Dask's local workers are forked and exec'd from the driver: ru_maxrss would report the
    # driver's peak for them. Here the parent holds 300 MiB more than any child needs.
    import subprocess
    import sys

    from hetbench.cluster.processes import peak_rss_mb

    held = bytearray(300 * 2**20)
    held[::4096] = b"x" * len(held[::4096])  # touch every page: resident
    child = subprocess.run(
        [sys.executable, "-c", "from hetbench.cluster.processes import peak_rss_mb; print(peak_rss_mb())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert peak_rss_mb() >= 300
    assert float(child.stdout) < 200, child.stdout
