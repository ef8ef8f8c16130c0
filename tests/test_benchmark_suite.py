"""The pytest-benchmark suite, short mode, for real: its JSON carries the figures and `compare` reads it."""

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

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


@pytest.mark.parametrize("script", ["baseline_overhead.py", "collectives.py", "workloads.py"])
def test_each_kept_benchmark_script_imports_and_answers_help(script):
    """No test runs them in full (they measure): this keeps an edit elsewhere from breaking them unseen."""
    repo = Path(__file__).resolve().parents[1]
    shown = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage:")


def test_the_overhead_check_counts_each_loops_kernels_and_syncs_per_step(monkeypatch):
    # for this test only: benchmarks/workloads.py would shadow the checkout's workloads/ package after it
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import baseline_overhead as overhead

    from hetbench.config import load_config
    from hetbench.devices import resolve_device
    from hetbench.workload import load_workload

    cfg = load_config(None, ["workers=[{batch: 16, device: cpu}]", "download=false"])
    cnn = load_workload(cfg.run)
    images, labels = cnn.train_split().tensors(resolve_device("cpu"))
    images = cnn.prepare(images)
    counts = overhead.count_steps(lambda keyed: overhead.Loop(images, labels, 16, "cpu", cfg, keyed), cfg)
    (examples, example_syncs, example_ops), (keyed, _, keyed_ops), (single, syncs, single_ops) = (
        counts[name] for name in ("examples", "keyed", "single")
    )
    assert example_syncs == 0  # the example's loop never waits for its device inside a step
    assert "aten::bernoulli_" in example_ops and "aten::bernoulli_" not in keyed_ops  # nn.Dropout's draw
    assert keyed_ops["aten::bitwise_xor"] > 0 and keyed > examples  # the keyed hash costs kernels
    assert single >= keyed and syncs == 1  # its stopwatch read at the step's end
    assert single_ops["aten::convolution_backward"] == example_ops["aten::convolution_backward"] == 2


def test_the_overhead_check_fails_on_one_kernel_planted_past_singles_budget(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import baseline_overhead as overhead

    from hetbench.strategies.single import OneDevice

    for setting in ("use_ray_defaults", "configure_threads", "keep_freed_memory"):  # this process's, kept
        monkeypatch.setattr(overhead, setting, lambda *args: None)
    check = ["--device", "cpu", "--batch", "8", "--counts-only"]
    assert overhead.main(check) == 0  # CI's check, as it runs
    counted = re.search(r"keyed (\d+), single (\d+)", capsys.readouterr().out)
    room = overhead.SINGLE_BEYOND_KEYED - (int(counted[2]) - int(counted[1]))  # kernels single may add
    step = OneDevice.train_step

    def planted(kernels):
        ones = torch.ones(1)  # made here: only the adds below run in the step

        def train_step(self, n):
            for _ in range(kernels):
                ones.add_(1)
            return step(self, n)

        return train_step

    monkeypatch.setattr(OneDevice, "train_step", planted(room))
    assert overhead.main(check) == 0 and "ABOVE" not in capsys.readouterr().out  # up to the budget
    monkeypatch.setattr(OneDevice, "train_step", planted(room + 1))
    assert overhead.main(check) == 1  # one past it
    said = capsys.readouterr().out
    assert f"ABOVE: single runs {overhead.SINGLE_BEYOND_KEYED + 1} kernels beyond the keyed loop (5 allowed)" in said


def test_the_overhead_checks_budgets_are_the_keyed_hash_singles_batch_and_one_sync(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from baseline_overhead import count_failures

    none = Counter()
    assert count_failures({"examples": (131, 0, none), "keyed": (141, 0, none), "single": (146, 1, none)}) == []
    assert count_failures({"examples": (131, 0, none), "keyed": (142, 0, none), "single": (146, 2, none)}) == [
        "the keyed loop runs 11 kernels beyond the example's (10 allowed)",
        "single syncs its device 2 times a step (1 allowed)",
    ]


@pytest.mark.slow
def test_the_overhead_check_fails_above_its_target(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    command = [sys.executable, str(repo / "benchmarks" / "baseline_overhead.py"), "--device", "cpu", "--batch", "8"]
    checked = subprocess.run(
        [*command, "--steps", "8", "--rounds", "1", "--target", "0.01"], capture_output=True, text=True, timeout=240
    )
    assert checked.returncode == 1, checked.stderr[-2000:]
    assert "ABOVE the target 0.01" in checked.stdout and "single" in checked.stdout


def test_the_workload_benchmark_prints_each_workloads_step_bytes_and_their_ratio():
    repo = Path(__file__).resolve().parents[1]
    command = [sys.executable, str(repo / "benchmarks" / "workloads.py"), "--device", "cpu", "--batch", "16"]
    run = [*command, "--steps", "2", "--rounds", "2", "--workload", "tiny_workload:build", "--workload", "mnist-cnn"]
    shown = subprocess.run([*run, "--precision", "fp32", "--precision", "bf16"], capture_output=True, text=True,
                           timeout=240, cwd=repo / "tests")  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    cells = [[cell.strip() for cell in line.split("|")[1:-1]] for line in shown.stdout.splitlines()[3:]]
    rows = {(row[0], row[1]): row[2:] for row in cells}
    assert set(rows) == {(name, p) for name in ("tiny-mlp", "mnist-cnn") for p in ("fp32", "bf16")}
    assert rows["mnist-cnn", "bf16"][:2] == rows["mnist-cnn", "fp32"][:2] == ["1,199,882", "4.80"]
    assert float(rows["tiny-mlp", "bf16"][4]) > 0  # MB per compute-second: measured
    bad = subprocess.run([*command, "--workload", "no_such:build"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("workloads: workload no_such:build: no module")
    assert len(bad.stderr.strip().splitlines()) == 1
