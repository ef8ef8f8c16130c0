"""The pytest-benchmark suite, short mode, for real: its JSON carries the figures and `compare` reads it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_child


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_suite_writes_json_with_figures_that_pytest_benchmark_compare_reads(tmp_path):
    out = tmp_path / "bench.json"
    run = run_child(
        [
            sys.executable,
            "-m",
            "pytest",
            "benchmarks",
            "-q",
            "-p",
            "no:cacheprovider",
            "--bench-mode",
            "short",
            f"--benchmark-json={out}",
        ],
        timeout=560,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["machine_info"]["hetbench"]["versions"]["torch"]
    by_id = {(b["extra_info"]["strategy"], b["extra_info"]["balance"]): b["extra_info"] for b in data["benchmarks"]}
    assert set(by_id) == {
        ("gloo-floor", None),
        ("single", None),
        ("ray-ps", "equal"),
        ("ray-ps", "auto"),
        ("dask-sync", "equal"),
        ("dask-sync", "auto"),
    }
    assert by_id[("gloo-floor", None)]["allreduce_ms"] > 0 and by_id[("gloo-floor", None)]["ps_roundtrip_ms"] > 0
    for (name, _), info in by_id.items():
        if name != "gloo-floor":
            assert info["samples_per_s"] > 0 and set(info["step_ms"]) == {
                "compute_s",
                "comm_s",
                "wait_s",
                "sync_overhead_s",
            }
    assert by_id[("ray-ps", "equal")]["split"] == [32, 32]
    auto = by_id[("ray-ps", "auto")]["split"]
    assert sum(auto) == 64 and auto[0] > auto[1]  # w1 is emulated 3x slower
    assert by_id[("ray-ps", "auto")]["emulated"] == {"w1": "slowed 3x"}
    compare = subprocess.run(
        [str(Path(sys.executable).parent / "pytest-benchmark"), "compare", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert compare.returncode == 0 and "test_step" in compare.stdout, compare.stderr[-2000:]


@pytest.mark.parametrize("script", ["baseline_overhead.py", "collectives.py"])
def test_each_kept_benchmark_script_imports_and_answers_help(script):
    """No test runs them in full (they measure): this keeps an edit elsewhere from breaking them unseen."""
    repo = Path(__file__).resolve().parents[1]
    shown = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage:")
