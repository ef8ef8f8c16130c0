"""Dask synchronous data parallelism: single.py's loop with (1) on Dask workers, (2)(3) on the client.

Each configured worker maps to one Dask worker, which holds a model replica and its data
between steps as a Dask actor (Replica, as in ray-ps). Actor calls go straight from the client
to the worker, without a scheduler round trip: a step sends each worker the new flat weights,
gets its flat gradient back, and the client applies the shared sample-weighted rule and the
optimizer (ParameterServer, in-process). Measured here, the scheduler path (scatter with
broadcast=True, submit, gather) cost about 3x the actors' overhead per step.
"""
from __future__ import annotations

import logging

import torch

from .addresses import check_reachable
from .base import StepTiming, Strategy, quiet_loggers, workers_per_host
from .clock import now
from .errors import RunFailed, UserError
from .gradients import batch_shares
from .roles import ParameterServer, Replica

STEP_TIMEOUT_S = 600  # no single step on any device takes this long: past it, something hangs


class DaskSync(Strategy):
    name = "dask-sync"
    floor_transfers = 2.0

    def start(self) -> None:
        from distributed import Client, LocalCluster

        quiet_loggers("distributed")
        workers, cluster = self.cfg["workers"], self.cfg["cluster"]
        self.batches = [w["batch"] for w in workers]
        self.shares = batch_shares(self.batches)
        self.local = None
        if cluster["dask_scheduler"]:
            check_reachable(cluster["dask_scheduler"], cluster["connect_timeout_s"])
            self.client = Client(cluster["dask_scheduler"], timeout=cluster["connect_timeout_s"])
        else:
            # One single-threaded worker process per configured worker, on loopback, no dashboard.
            self.local = LocalCluster(n_workers=len(workers), threads_per_worker=1, processes=True,
                                      host="127.0.0.1", dashboard_address=None, silence_logs=logging.ERROR)
            self.client = Client(self.local)
        self.addresses = self._place(workers)
        joined = bool(cluster["dask_scheduler"])
        self.replicas = self._results([self.client.submit(Replica, actor=True, workers=[a], pure=False)
                                       for a in self.addresses], "placing replicas")
        self.info = self._results([r.setup(self.cfg, rank, workers_per_host(self.cfg, w, joined))
                                   for rank, (r, w) in enumerate(zip(self.replicas, workers))], "setting up")
        self.server = ParameterServer()

    def _place(self, workers: list[dict]) -> list[str]:
        """A Dask worker address per configured worker: by resource label, else in order."""
        available = self.client.scheduler_info()["workers"]
        labelled = {label: addr for addr, w in available.items() for label in w.get("resources", {})}
        unlabelled = iter(sorted(available))
        addresses = []
        for w in workers:
            if w["node"] and self.cfg["cluster"]["dask_scheduler"]:
                if w["node"] not in labelled:
                    raise UserError(f"no Dask worker advertises placement label '{w['node']}' "
                                    f"(labels here: {', '.join(sorted(labelled)) or 'none'})")
                addresses.append(labelled[w["node"]])
            else:
                addresses.append(next(unlabelled, None) or sorted(available)[0])
        return addresses

    def reset(self, seed: int) -> None:
        self.weights_now = self.server.reset(self.cfg, seed)
        self._results([r.reset(seed) for r in self.replicas], "resetting")

    def step(self, step: int) -> StepTiming:
        start = now()
        # (2a) (1) every worker gets the new weights as one flat buffer and computes on its own
        # batch with its resident replica; its flat gradient comes straight back
        results = self._results([r.compute(self.weights_now, step) for r in self.replicas], f"step {step}")
        grads, compute = zip(*results)
        # (2b) (3) the sample-weighted rule and the optimizer step, here on the client
        self.weights_now, update_s = self.server.apply(self.shares, *grads)
        total = now() - start
        return StepTiming.synchronous({w["name"]: c for w, c in zip(self.info, compute)}, total, update_s)

    def weights(self) -> torch.Tensor:
        return torch.from_numpy(self.weights_now.copy())

    def worker_info(self) -> list[dict]:
        return [dict(i, dask_worker=a) for i, a in zip(self.info, self.addresses)]

    def close(self) -> None:
        self.replicas = []
        client = getattr(self, "client", None)
        if client is not None:
            client.close(timeout=10)
        if self.local is not None:
            self.local.close(timeout=10)

    def _results(self, futures: list, doing: str) -> list:
        """Results, or one sentence: bad input stays bad input, a lost worker is named."""
        try:
            return [f.result(timeout=STEP_TIMEOUT_S) for f in futures]
        except UserError:
            raise
        except Exception as e:  # KilledWorker, CommClosedError, a task's own exception
            gone = [w["name"] for w, a in zip(self.cfg["workers"], self.addresses)
                    if a not in self.client.scheduler_info()["workers"]]
            who = f"worker '{gone[0]}' was lost" if gone else f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            raise RunFailed(f"{self.name} failed while {doing}: {who}") from None
