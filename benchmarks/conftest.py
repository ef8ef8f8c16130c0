"""The pytest-benchmark suite's plumbing: modes, where the JSON goes, machine info, shared clusters.

    pytest benchmarks                      # short mode (CI): 2 workers, loopback, a few steps
    pytest benchmarks --bench-mode full    # every strategy x balance x link x worker count

The JSON lands in results/raw/benchmark-<time>.json unless --benchmark-json says otherwise;
`pytest-benchmark compare results/raw/benchmark-*.json` compares runs.
"""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hetbench.cluster.ray_connection import use_ray_defaults
from hetbench.errors import INTERRUPTED, interrupt

use_ray_defaults()  # as the CLI does, before any benchmark's Ray reads them

REPO = Path(__file__).resolve().parents[1]


def pytest_addoption(parser):
    parser.addoption(
        "--bench-mode",
        choices=("short", "full"),
        default="short",
        help="short: the CI-sized scenario set; full: every strategy, link and worker count",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # SIGTERM (a kill, the test that runs this suite giving up) unwinds as Ctrl-C does, through the
    # shared clusters' teardown; by default it ends the process at once, and they outlive it
    signal.signal(signal.SIGTERM, interrupt)
    if config.getoption("benchmark_json", None) is None and not config.getoption("benchmark_disable", False):
        raw = REPO / "results" / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        config.option.benchmark_json = raw / f"benchmark-{time.strftime('%Y%m%d-%H%M%S')}.json"


def pytest_runtest_logfinish(nodeid, location):
    # the KeyboardInterrupt can land where Python swallows it (a gc callback, a __del__): stop anyway
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt("SIGTERM")


def pytest_benchmark_update_machine_info(config, machine_info):
    from hetbench.results.records import environment

    machine_info["hetbench"] = environment()


@pytest.fixture(scope="session")
def clusters():
    """The local-multinode cluster for (link, worker count): one at a time (tests are ordered by
    that key), the previous one stopped when the key changes, the last at the session's end."""
    from hetbench.cluster.multinode import cluster_for_run

    current: dict = {}
    with contextlib.ExitStack() as stack:

        def get(cfg, key: tuple):
            if current.get("key") != key:
                if "stack" in current:
                    current.pop("stack").close()
                inner = stack.enter_context(contextlib.ExitStack())
                joined, startup_s, cluster = inner.enter_context(cluster_for_run(cfg.cluster, cfg.workers, cfg.link))
                current.update(key=key, stack=inner, value=(replace(cfg, cluster=joined), startup_s, cluster))
            return current["value"]

        yield get
