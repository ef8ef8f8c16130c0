"""Each worker measured alone, in the same run: the speeds `balance: auto` splits by, and the
reference of scaling efficiency (measured throughput / the sum of the workers' standalone ones).

Every worker trains alone, one after the other (twice, A B .. B A), on the whole global batch, on
its own node and device (placed as every strategy's workers are: cluster/placed.py), with the
threads it gets in the run (on one box the emulated machines
share the cores). `hetbench run` times them at its start (auto's split) and again at its end: a
shared machine drifts over a run, and the reference should drift with the rows it judges.
"""

from __future__ import annotations

from hetbench.clock import median
from hetbench.cluster.place import place
from hetbench.config import Config
from hetbench.strategies.roles import Replica

WARMUP_STEPS = 3


def measure_standalone(cfg: Config) -> dict[str, list[float]]:
    """Worker name -> its samples/s training alone, one figure per timing (two each)."""
    workers = place(cfg, Replica, "standalone")
    try:
        # one at a time, in the order A B .. B A, so drift on a shared machine hits every worker alike
        order = list(range(len(cfg.workers))) + list(reversed(range(len(cfg.workers))))
        timed: dict[str, list[float]] = {w.name: [] for w in cfg.workers}
        for rank in order:
            name = cfg.workers[rank].name
            timed[name] += workers.results(
                [workers.call(rank, "alone", cfg.run.standalone_steps, WARMUP_STEPS)], f"timing {name} alone"
            )
        return timed
    finally:
        workers.close()


def speeds(*timings: dict[str, list[float]]) -> dict[str, float]:
    """Worker name -> samples/s alone: the median of all its timings."""
    return {name: median([rate for timed in timings for rate in timed[name]]) for name in timings[0]}
