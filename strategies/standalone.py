"""Each worker measured alone, in the same run: the speeds `balance: auto` splits by, and the
reference of scaling efficiency (measured throughput / the sum of the workers' standalone ones).

Every worker trains alone, one after the other, on the whole global batch, on its own node and
device, with the threads it gets in the run (on one box the emulated machines share the cores).
"""
from __future__ import annotations

from .base import workers_per_host
from .ray_cluster import RayConnection, placement

WARMUP_STEPS = 3


def measure_standalone(cfg: dict) -> dict[str, float]:
    """Worker name -> samples/s training alone."""
    import ray

    from .ray_ps import RemoteWorker, results

    workers = cfg["workers"]
    cluster = RayConnection(cfg, {w["node"] for w in workers if w["node"]})
    try:
        joined = bool(cfg["cluster"]["ray_address"])
        speeds = {}
        for rank, spec in enumerate(workers):
            actor = RemoteWorker.options(**placement(spec)).remote()
            threads_share = workers_per_host(cfg, spec, joined)
            results([actor.setup.remote(cfg, rank, threads_share)], "setting up", "standalone", [actor], [spec])
            speeds[spec["name"]] = results([actor.alone.remote(cfg["standalone_steps"], WARMUP_STEPS)],
                                           f"timing {spec['name']} alone", "standalone", [actor], [spec])[0]
            ray.kill(actor)
        return speeds
    finally:
        cluster.close()
