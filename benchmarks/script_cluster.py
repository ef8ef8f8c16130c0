"""What the stand-alone benchmark scripts share: a run config's cluster up and Ray connected around
their measurement, and bad input said in one sentence, as the CLI says it."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import replace

from hetbench.errors import UserError

# hetero-local's auto split, as its runs settle it (the runner's standalone timings are not in a script)
HETERO_LOCAL_SPLIT = ["balance=[equal]", "workers.0.batch=192", "workers.1.batch=64"]


@contextmanager
def cluster_of(cfg):
    """Within: `cfg` as its strategies run, its cluster started where the config asks it (a local
    multinode one behind its emulated link) and Ray connected; everything stopped on the way out.
    Call `use_ray_defaults()` before this module's first use (Ray reads them as it is imported)."""
    from hetbench.cluster.joined import wait_for_workers
    from hetbench.cluster.multinode import cluster_for_run
    from hetbench.cluster.ray_connection import connect, ray_kept_for_the_run

    with (
        cluster_for_run(cfg.cluster, cfg.workers, cfg.link) as (joined, _, _cluster),
        ray_kept_for_the_run(),
    ):
        cfg = replace(cfg, cluster=joined, workers=wait_for_workers(joined, cfg.workers))
        connection = connect(cfg.cluster, cfg.workers)
        try:
            yield cfg
        finally:
            connection.release()


def run_script(main) -> None:
    """`main()`, with bad input (UserError) one sentence on stderr and exit code 2."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
