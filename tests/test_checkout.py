"""The README's two commands, in that order, in a copy of the checkout: a run, then the tests. The
run writes under results/, which git ignores; the shipped set in results/reference/ and every
tracked file stay as committed, and the committed-record tests still pass."""

import shutil
import subprocess
import sys

import pytest

from helpers import REPO, TINY, hetbench, sets


def git(*args: str, cwd) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


@pytest.mark.slow  # 20 s alone: a run and a pytest in their own processes
def test_a_run_in_the_checkout_changes_no_tracked_file_and_the_tests_still_pass(tmp_path):
    copy = tmp_path / "checkout"
    for path in git("ls-files", "-z", cwd=REPO).split("\0"):  # the tracked files, as this tree has them
        if path and (REPO / path).is_file():
            (copy / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, copy / path)
    git("init", "-q", cwd=copy)
    git("add", "-A", cwd=copy)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "as cloned", cwd=copy)

    # the README's main job, small; "name=local" is the name of a shipped table, which it must not touch
    ran = hetbench(
        "run", "-c", "benchmarks/configs/quick.yaml", *TINY, *sets("strategies=[single]", "name=local"), cwd=copy
    )
    assert ran.returncode == 0, ran.stderr
    assert (copy / "results" / "local.md").is_file() and list((copy / "results" / "raw").glob("*-local-0.json"))

    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_record.py"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout
    assert git("status", "--porcelain", cwd=copy) == ""  # nothing tracked changed, nothing new to commit
