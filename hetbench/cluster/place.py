"""`place()`: a strategy's processes, started through the launcher it names (cluster/placed.py's seam)."""

from __future__ import annotations

from hetbench.cluster.placed import Placed
from hetbench.config import ClusterConfig, WorkerConfig


def place(
    cluster: ClusterConfig,
    workers: tuple[WorkerConfig, ...],
    role: type,
    owner: str,
    job,
    via: str = "ray",
    coordinator: type | None = None,
    ranks: list[int] | None = None,
) -> Placed:
    """Processes for the configured workers (or those at `ranks`, a rank twice for two processes),
    running `role`, each on its labelled node, set up with `job`; `coordinator` on the driver's node.
    `via`: ray | dask."""
    if via == "dask":
        from hetbench.cluster.dask_placed import DaskPlaced as Launcher
    else:
        from hetbench.cluster.ray_placed import RayPlaced as Launcher
    placed = Launcher(cluster, workers, owner, ranks)
    try:
        placed.start(role, coordinator)
        placed.setup(job)
    except BaseException:
        placed.close()
        raise
    return placed
