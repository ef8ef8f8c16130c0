"""The contract every strategy implements, and what one global step reports."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import torch

from hetbench.balance import resplit_event, speed_split, split_batch
from hetbench.cluster.placed import Placed
from hetbench.config import Job
from hetbench.errors import RunFailed
from hetbench.floor import FLOOR_NAME
from hetbench.gradients import batch_shares
from hetbench.step_timing import StepTiming
from hetbench.workload import dropout_keys

log = logging.getLogger(__name__)


class Strategy(ABC):
    """How gradients move. A strategy never branches on device type (see devices.py)."""

    name: ClassVar[str]
    distributed: ClassVar[bool] = True
    # Every step is one update from every live worker's gradient (a barrier): the update rule then
    # makes it one single-device step on the union batch.
    synchronous: ClassVar[bool] = True
    # Link time one synchronous step needs, in gloo-floor all-reduces of the model: an all-reduce
    # is 1; a parameter server moves the gradient up, then the weights down, one after the other: 2.
    # None: no prediction (no link crossed, or no barrier per step).
    floor_transfers: ClassVar[float | None] = None
    # The floor its sync overhead is judged against (floor.py): an all-reduce's, or for a parameter
    # server, a round trip of the model up and back down.
    floor_name: ClassVar[str] = FLOOR_NAME
    # Whether its transfers go out while backward still runs, so the link hides behind the rest of it
    # (plan.overlapped_s): "buckets" (DDP's, each all-reduced once full), "parameters" (each gradient
    # up as backward has it, each weight down once stepped), or "" (all of it after backward).
    overlap: str = ""
    # Asynchronous: how many weights versions a worker may start ahead of the slowest still computing
    # (plan.async_rate); None: no bound, or synchronous.
    max_staleness: int | None = None
    # Steps between exchanges over the link: above 1, most steps move nothing, so per-step costs are
    # read as a round's mean (the median step would show no exchange at all).
    exchange_every: int = 1
    # Goes on without a worker that dies (a fault, a machine lost): implements kill_worker and
    # keeps info/batches/shares per live worker, calling lose_worker for each lost one.
    survives_worker_loss: ClassVar[bool] = False
    # Can hand out and take back its model + optimizer (state/load_state): checkpoints, --resume.
    resumable: ClassVar[bool] = False
    # Can take a new batch split between steps (rebalance_every): implements push_split, or
    # overrides rebalance where its workers re-split themselves.
    rebalances: ClassVar[bool] = False
    # The launcher its processes go through (cluster/placed.py): ray | dask.
    via: ClassVar[str] = "ray"
    # What else it runs on the workers' machines while they compute, busy enough to take a core's
    # share: the plan times the workers only, and names it where they share one box's cores
    # (plan.sharing_note). "" where that is only Ray's own processes.
    beside_workers: ClassVar[str] = ""

    # This strategy's own settings: a frozen dataclass of config.setting() fields (a default and a
    # one-line doc each). They live under the strategy's name in a config (e.g. `ray-ps-async:
    # {max_staleness: 1}`); config.py checks them, its Job carries them, and `settings` has them typed.
    options: ClassVar[type | None] = None
    # A sentence for the tables' legend, shown where this strategy has a row.
    table_note: ClassVar[str] = ""

    @classmethod  # noqa: B027 (optional: most strategies take what config.py checks)
    def check_options(cls, options) -> None:
        """Refuse, with UserError, resolved `options` that config.py's type checks let through."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.settings = self.options(**job.options) if self.options else None  # typed once, here
        self.wire_dtype = job.run.wire_dtype  # what its transfers travel in (torch-ddp's PowerSGD: float32)
        self.events: list[dict] = []  # what was lost, when, and the split that went on
        self.lost: list[dict] = []  # worker_info of the lost workers, with lost_at_step
        self.info: list[dict] = []  # per live worker, in rank order: what worker_info reports
        self.batches: list[int] = []  # per live worker: its samples per step
        self.shares: list[float] = []  # per live worker: batch / global batch, the rule's weights
        self.placed: Placed | None = None  # its workers' processes (cluster/place.py), once started
        # Set by the training loop after each check: whether the next checks come every fine_eval_every
        # steps (training.Schedule.near). Ranks that run the Schedule themselves must be told.
        self.near_target = False

    @abstractmethod
    def start(self) -> None:
        """Bring up processes, actors, groups and data; the runner times this as startup."""

    @abstractmethod
    def reset(self, seed: int) -> None:
        """Fresh model (same init on every worker) and optimizer for one repeat."""

    @abstractmethod
    def step(self, step: int, then: int | None = None) -> StepTiming:
        """One synchronous global step over every worker's slice of global batch `step`.

        `then`: the step the runner calls next with nothing in between (no evaluation, checkpoint or
        fault), or None. A strategy may start it early; it then times it from this step's end.
        """

    @abstractmethod
    def weights(self) -> torch.Tensor:
        """The current model as one flat float32 CPU tensor, for evaluation."""

    def learning_rate(self) -> float | None:
        """The learning rate its next update takes (where a workload's schedule moves it, the curve
        records it at each check); None where no one optimizer takes the updates."""
        return None

    @abstractmethod
    def worker_info(self) -> list[dict]:
        """Per worker: name, device (as resolved where it runs), node, batch."""

    def state(self) -> dict:
        """The master model and optimizer as CPU tensors (train_state.py)."""
        raise NotImplementedError(f"{self.name} keeps no checkpoints")

    def load_state(self, state: dict) -> None:
        """Continue from a state() taken earlier (after reset)."""
        raise NotImplementedError(f"{self.name} keeps no checkpoints")

    def kill_worker(self, name: str) -> None:
        """Fault injection: really end worker `name`'s process; the next step finds it lost."""
        raise NotImplementedError(f"{self.name} does not survive a lost worker")

    def lose_worker(self, rank: int, step: int) -> None:
        """Drop a lost worker; the survivors take its samples so the global batch stays as configured.

        The survivors' batches keep their ratios (so an auto/proportional split stays speed-proportional);
        the gradient rule weights by the new batches, so a step still equals one on the union batch.
        """
        lost = self.info.pop(rank)
        del self.batches[rank]
        if not self.batches:
            raise RunFailed(f"{self.name}: every worker was lost (the last, '{lost['name']}', at step {step})")
        split = self._set_split(split_batch(self.job.run.batch_size, self.batches))
        self.lost.append({**lost, "lost_at_step": step})
        self.events.append({"step": step, "lost": lost["name"], "node": lost["node"], "split": split})
        going_on = ", ".join(f"{n}x{b}" for n, b in split.items())
        log.info("%s: worker '%s' lost at step %d; going on with %s", self.name, lost["name"], step, going_on)

    def rebalance(self, step: int, timings: list[StepTiming]) -> None:
        """Re-split the global batch by the speeds in `timings` (speed_split), and hand it on."""
        computes = [[t.compute_s[info["name"]] for t in timings if t.compute_s.get(info["name"])] for info in self.info]
        batches = speed_split(self.job.run.batch_size, self.batches, computes)
        if batches is not None:
            self.events.append(resplit_event(self.job.run.warmup_steps, step, self._set_split(batches)))
            self.push_split()

    def push_split(self) -> None:
        """Hand every live worker self.batches and its rank among them (its slice follows them)."""
        raise NotImplementedError(f"{self.name} cannot re-split between steps")

    def _set_split(self, batches: list[int]) -> dict[str, int]:
        """The driver's side of a new split: batches, the rule's shares, the workers' info; the split by name."""
        self.batches, self.shares = batches, batch_shares(batches)
        for info, batch in zip(self.info, batches):
            info["batch"] = batch
        return {info["name"]: info["batch"] for info in self.info}

    def record_extras(self, earlier: dict) -> dict:
        """Strategy-specific figures for the record (e.g. async staleness), over this start's repeats
        and `earlier`, what the row's earlier starts recorded (its record's extras, as JSON reads
        them: a row starts anew for each repeat). Its `events` go to the record's own field."""
        return {}

    def close(self) -> None:  # noqa: B027 (optional: a strategy that starts nothing has nothing to stop)
        """Stop everything start() started; called on every exit path."""


class BatchOrder:
    """The sample indices of global batch `step`, and their dropout keys: epochs of seeded
    permutations, read in order.

    Every process computes the same indices from (seed, step) alone, so no indices travel. Each
    epoch's permutation is drawn once, on the CPU so that every device agrees, and kept on `device`
    with each position's key (workload.dropout_keys of its step and index): a step only slices
    them (no per-step permutation of the whole set, no per-step hashing)."""

    def __init__(self, n: int, global_batch: int, seed: int, device: torch.device | str = "cpu") -> None:
        self.n, self.global_batch, self.seed, self.device = n, global_batch, seed, device
        self.epochs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # epoch -> (its order, their keys)

    def epoch(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        if epoch not in self.epochs:
            self.epochs = {e: kept for e, kept in self.epochs.items() if e == epoch - 1}  # a batch spans two at most
            seed = int(np.random.SeedSequence([self.seed, epoch]).generate_state(1)[0])
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(seed)).to(self.device)
            # each position's step, counted on the CPU as the order is drawn (int64 division there)
            steps = ((torch.arange(self.n) + epoch * self.n) // self.global_batch).to(self.device)
            self.epochs[epoch] = order, dropout_keys(self.seed, steps, order)
        return self.epochs[epoch]

    def __call__(self, step: int) -> torch.Tensor:
        return self._sliced(step, 0)

    def keys(self, step: int) -> torch.Tensor:
        """The dropout keys of global batch `step`'s samples, in the order __call__ gives them."""
        return self._sliced(step, 1)

    def _sliced(self, step: int, which: int) -> torch.Tensor:
        start, end = step * self.global_batch, (step + 1) * self.global_batch
        parts = []
        for epoch in range(start // self.n, (end - 1) // self.n + 1):
            lo, hi = max(start - epoch * self.n, 0), min(end - epoch * self.n, self.n)
            parts.append(self.epoch(epoch)[which][lo:hi])
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def worker_slice(indices: torch.Tensor, batches: list[int], rank: int) -> torch.Tensor:
    """Worker `rank`'s part of a global batch: contiguous, in worker order."""
    offset = sum(batches[:rank])
    return indices[offset : offset + batches[rank]]
