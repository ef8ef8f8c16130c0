"""The race's cluster, opened once for a command (`hetbench run`, `hetbench plan`): its nodes (a
local-multinode cluster, or one someone started), the workers joined, Ray and the run's processes
started; and the floors measured on it."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from hetbench.clock import now
from hetbench.cluster.joined import wait_for_workers
from hetbench.cluster.multinode import cluster_for_run
from hetbench.cluster.place import place
from hetbench.cluster.ray_connection import connect, ray_kept_for_the_run
from hetbench.config import Config, WorkerConfig
from hetbench.errors import RunFailed
from hetbench.floor import FLOORS, measure_floor
from hetbench.results.record import FloorRecord, from_json
from hetbench.results.records import redacted
from hetbench.scenarios import planned, wants_standalone
from hetbench.strategies import registry
from hetbench.strategies.parameter_server import ParameterServer
from hetbench.strategies.replica import Replica

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Race:
    """The cluster a command runs on, as opened."""

    cfg: Config  # the config with the joined cluster's addresses and the workers as they joined
    cluster: object | None  # the local-multinode cluster it started (faults kill and revive its nodes); None: joined
    cluster_startup_s: float | None  # that cluster's start; None where it joined one
    ray_startup_s: float | None  # Ray's and the run's processes' start (open_ray); None where no row uses Ray
    rows: int = 0  # the rows of the run, as the progress line counts them


@contextmanager
def opened(cfg: Config) -> Iterator[Race]:
    """The race's cluster for the command's length: started (or joined), its workers waited for,
    Ray and the run's processes started (open_ray); stopped on every way out."""
    with (
        cluster_for_run(cfg.cluster, cfg.workers, cfg.link) as (joined, cluster_startup_s, cluster),
        ray_kept_for_the_run(),
    ):
        if cluster_startup_s is not None:
            log.info("local-multinode cluster up in %.1f s", cluster_startup_s)
        workers = ramps_started(wait_for_workers(joined, cfg.workers, cluster and cluster.check_alive))
        on = replace(cfg, cluster=joined, workers=workers)
        yield Race(on, cluster, cluster_startup_s, open_ray(on), len(planned(on)))


def open_ray(cfg: Config) -> float | None:
    """Ray started (or joined) once, before any row, for the whole run (ray_kept_for_the_run), with a
    process per worker and one for a coordinator, torch imported and data loaded, that the rows hand
    on to each other (cluster/ray_hosts.py): no row's startup pays for either. Its seconds; None
    where no row uses Ray."""
    if not (cfg.floor.enabled or wants_standalone(cfg) or any(via(n) == "ray" for n in cfg.run.strategies)):
        return None
    started = now()
    connect(cfg.cluster, cfg.workers)
    job = cfg.job()  # no strategy's own: the processes serve every row
    place(cfg.cluster, cfg.workers, Replica, "starting the run's processes", job, coordinator=ParameterServer).close()
    return now() - started


def via(name: str) -> str | None:
    """The launcher a strategy's processes go through; None where it is unavailable (its row says why)."""
    try:
        return registry.load(name).via
    except ImportError:
        return None


def ramps_started(workers: tuple[WorkerConfig, ...]) -> tuple[WorkerConfig, ...]:
    """Each growing emulated slowdown with no start of its own starts now, the run's start: every
    process of the run, and every row's record, reads the same clock for it."""
    started = time.time()
    return tuple(
        replace(w, ramp_start=started) if w.slowdown_to is not None and w.ramp_start is None else w for w in workers
    )


def run_floors(cfg: Config, env: dict, parameters: int) -> list[FloorRecord]:
    """The gloo-floor's and the ps-floor's records, from one measurement: both failed where the floor's
    processes failed, the ps-floor alone where it could not connect (measure_floor says so)."""
    base = {"config": redacted(cfg.as_dict()), "env": env}
    try:
        figures = measure_floor(cfg.floor, cfg.cluster, cfg.workers, cfg.link, parameters)
    except RunFailed as e:
        figures = [{"status": "failed", "reason": str(e)}] * len(FLOORS)
    # floor.py's figures read as a record reads (record.from_json: the floors' JSON names)
    return [from_json({"strategy": name, **base, "status": "ok", **f}) for name, f in zip(FLOORS, figures)]
