"""Shared fixtures. Tests use the real MNIST test set beside the checkout when present, and pass without it."""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from hetbench.config import load_config

REPO = Path(__file__).resolve().parents[1]
# The real MNIST test set: where HETBENCH_DATA_DIR points, else beside the checkout (CI's layout).
SHARED_MNIST = Path(os.environ.get("HETBENCH_DATA_DIR") or REPO.parent / "shared" / "data" / "mnist")


@pytest.fixture(autouse=True)
def _offline_data(monkeypatch):
    """Real MNIST test split where the machine has it; never the network (the download test serves its own)."""
    if SHARED_MNIST.is_dir():
        monkeypatch.setenv("HETBENCH_DATA_DIR", str(SHARED_MNIST))
    else:
        monkeypatch.delenv("HETBENCH_DATA_DIR", raising=False)


@pytest.fixture(scope="module")
def two_nodes():
    """A real two-node Ray cluster on this machine: a head, and a node advertising the `mac` label."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"desktop": 1}})
    mac = cluster.add_node(num_cpus=1, resources={"mac": 1})
    cluster.wait_for_nodes(timeout=60)
    yield cluster, mac
    import ray

    if ray.is_initialized():  # a test that failed before its strategy's close()
        ray.shutdown()
    cluster.shutdown()


def placed_workers(strategy_cls, cfg: dict, where: str) -> dict:
    """Worker name -> `where` (node_id, dask_worker) as the strategy placed it; the strategy is closed."""
    strategy = strategy_cls(cfg)
    try:
        strategy.start()
        return {w["name"]: w[where] for w in strategy.worker_info()}
    finally:
        strategy.close()


LABELLED = "workers=[{name: d, node: desktop, batch: 16}, {name: m, node: mac, batch: 8}]"


def small_config(tmp_path: Path, *overrides: str) -> dict:
    """A resolved config that downloads nothing and writes under tmp_path."""
    return load_config(None, ["download=false", "test_samples=2000", "eval_samples=500",
                              f"results_dir={tmp_path / 'results'}", *overrides])


def write_idx(path: Path, array: np.ndarray, magic: int | None = None, gz: bool = False) -> Path:
    """An IDX file as published: big-endian magic, dimensions, then unsigned bytes."""
    magic = magic if magic is not None else (2051 if array.ndim == 3 else 2049)
    raw = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def fake_split(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def run_killing_a_worker(tmp_path: Path, monkeypatch, strategy_cls, kill, name: str):
    """Run `single` then `name`, whose step 3 starts by `kill(strategy)`; returns the failure and the
    records the run kept."""
    import json

    from hetbench.errors import RunFailed
    from hetbench.runner import run

    step = strategy_cls.step

    def step_then_kill(self, n, then=None):
        if n == 3:
            kill(self)
        return step(self, n, then)

    monkeypatch.setattr(strategy_cls, "step", step_then_kill)
    cfg = small_config(tmp_path, "name=killed", f"strategies=[single, {name}]",
                       "workers=[{name: big, batch: 40}, {name: small, batch: 24}]", "steps=6", "repeats=1",
                       "floor.enabled=false")
    with pytest.raises(RunFailed) as failure:
        run(cfg)
    records = json.loads(next((tmp_path / "results" / "raw").glob("*-killed-*.json")).read_text())
    return str(failure.value), records
