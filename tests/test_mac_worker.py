"""deploy/mac/worker.sh on a Mac torch 2.13 has no wheel for: refused in one sentence, before any install.

`uname`, `sw_vers` and the Python are stand-ins on PATH: the script's own checks run as on a Mac."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers import REPO

WORKER = REPO / "deploy" / "mac" / "worker.sh"


def fake_mac(tmp_path, macos: str, arch: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "uname": 'case "$1" in -s) echo Darwin ;; -m) echo arm64 ;; *) echo Darwin ;; esac',
        "sw_vers": f'[ "$1" = -productVersion ] && echo {macos}',
        "python3.11": f"echo {arch}",  # asked for platform.machine() only
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    venv = tmp_path / "venv"  # a made-up venv whose hetbench says how it was called: nothing is installed
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "hetbench").write_text('#!/bin/sh\necho "hetbench $*"\n')
    (venv / "bin" / "hetbench").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VENV")}
    return {**env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "VENV": str(venv), "HOME": str(tmp_path)}


def worker(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(WORKER), "desk.local"], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    "macos, arch, refusal",
    [
        ("13.6.1", "arm64", "torch 2.13 needs macOS 14 or newer and this Mac runs 13.6.1: update macOS first"),
        ("14.5", "x86_64", "is an x86_64 Python (Rosetta or an Intel Mac) and torch 2.13 for macOS is arm64 only"),
    ],
)
def test_a_mac_torch_has_no_wheel_for_is_refused_before_install(tmp_path, macos, arch, refusal):
    env = fake_mac(tmp_path, macos, arch)
    (tmp_path / "venv" / "bin" / "hetbench").unlink()  # would be installed if the checks let it through
    done = worker(env)
    assert done.returncode == 2
    assert refusal in done.stderr and done.stderr.count("\n") == 1  # one sentence
    assert not (tmp_path / "venv" / "bin" / "hetbench").exists()


def test_a_supported_mac_goes_on_to_the_worker(tmp_path):
    done = worker(fake_mac(tmp_path, "15.1", "arm64"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "hetbench worker --head desk.local"
