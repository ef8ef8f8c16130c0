"""Each worker measured alone, in the same run: the speeds `balance: auto` splits by, and the
reference of scaling efficiency (measured throughput / the sum of the workers' standalone ones).

Every worker trains alone, one after the other (twice, A B .. B A), on the whole global batch, on
its own node and device, with the threads it gets in the run (on one box the emulated machines
share the cores). `hetbench run` times them at its start (auto's split) and again at its end: a
shared machine drifts over a run, and the reference should drift with the rows it judges.
"""
from __future__ import annotations

from hetbench.strategies.base import workers_per_host
from hetbench.clock import median
from hetbench.cluster.ray_connection import RayConnection, placement

WARMUP_STEPS = 3


def measure_standalone(cfg: dict) -> dict[str, list[float]]:
    """Worker name -> its samples/s training alone, one figure per timing (two each)."""
    import ray

    from hetbench.strategies.ray_ps import RemoteWorker, results

    workers = cfg["workers"]
    cluster = RayConnection(cfg, {w["node"] for w in workers if w["node"]})
    try:
        joined = bool(cfg["cluster"]["ray_address"])
        actors = [RemoteWorker.options(**placement(spec)).remote() for spec in workers]
        results([a.setup.remote(cfg, rank, workers_per_host(cfg, spec, joined))
                 for rank, (a, spec) in enumerate(zip(actors, workers))], "setting up", "standalone", actors, workers)
        # one at a time, in the order A B .. B A, so drift on a shared machine hits every worker alike
        order = list(range(len(workers))) + list(reversed(range(len(workers))))
        timed: dict[str, list[float]] = {w["name"]: [] for w in workers}
        for rank in order:
            spec = workers[rank]
            timed[spec["name"]] += results([actors[rank].alone.remote(cfg["standalone_steps"], WARMUP_STEPS)],
                                           f"timing {spec['name']} alone", "standalone", actors, workers)
        for actor in actors:
            ray.kill(actor)
        return timed
    finally:
        cluster.close()


def speeds(*timings: dict[str, list[float]]) -> dict[str, float]:
    """Worker name -> samples/s alone: the median of all its timings."""
    return {name: median([rate for timed in timings for rate in timed[name]]) for name in timings[0]}
