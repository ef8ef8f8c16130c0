"""Local SGD with DiLoCo-style outer steps: ray_ps.py's parameter server, exchanging every
`sync_every` steps instead of every step.

Differs from ray-ps in (1)-(3): each worker takes its slice of every global batch on its own
replica with its own optimizer (the inner one, kept across rounds), and nothing crosses the link
between exchanges. At a round's last step each worker sends how far its replica moved (start of
the round minus now); the server weights those deltas by samples, as ray-ps weights gradients,
and takes one outer step with them as the gradient: Nesterov SGD as in DiLoCo, or plain
averaging (outer_lr 1, outer_momentum 0). Every replica starts the next round from the result.

With an auto split each worker's batch is proportional to its speed, so its `sync_every` steps
take as long as anyone's: the slow machine is not waited for at the exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetbench.clock import now
from hetbench.config import Job, setting
from hetbench.errors import RunFailed, UserError, WorkersLost
from hetbench.gradients import from_wire
from hetbench.optimizer import ScheduledOptimizer
from hetbench.step_timing import StepTiming
from hetbench.strategies.ray_ps import RayParameterServer, RayPsOptions, RayReplica, RayServer
from hetbench.train_state import load_train_state, train_state

NAME = "ray-localsgd"


class LocalReplica(RayReplica):
    # from reset:
    optimizer: ScheduledOptimizer  # the inner one, stepping my replica (and the schedule) every step
    round_start: torch.Tensor  # my weights where the round began: my delta is taken from them
    delta: torch.Tensor  # where my delta is taken to
    taken: tuple[int, float] | None  # the last step my replica took, and its seconds

    def reset(self, seed: int) -> None:
        super().reset(seed)
        self.optimizer = self.workload.build_optimizer(self.flat.optimizer_params(), self.job.run)
        self.round_start = self.flat.params.detach().clone()
        self.delta = torch.empty_like(self.round_start)  # reused every round
        self.taken = None

    def inner(self, weights: list | None, step: int) -> float:
        """(1) my slice of global batch `step` on my own replica, then my optimizer's step; at a
        round's first step I start from the server's weights."""
        if self.taken and self.taken[0] == step:  # the step redone after a worker was lost: mine is in
            return self.taken[1]
        if weights is not None:
            self.flat.load_params(from_wire(self.weights_in(weights)))
            self.round_start.copy_(self.flat.params)
        self.local_step(step)
        self.work(self.optimizer.step)
        seconds = self.watch.read().work_s
        self.taken = (step, seconds)
        return seconds

    def state(self) -> dict:
        """My replica, my inner optimizer and where my round began: the server's state does not hold them."""
        return {**train_state(self.flat, self.optimizer), "round_start": self.round_start.to("cpu", copy=True)}

    def load_state(self, state: dict) -> None:
        load_train_state(self.flat, self.optimizer, state)
        self.round_start.copy_(state["round_start"])
        self.taken = None

    def compute(self, weights: list | None, step: int, ticket: int | None = None, after: int | None = None):
        """The round's last step, then (2a) my delta to the server, as ray-ps sends a gradient."""
        compute_s = self.inner(weights, step)
        delta = torch.sub(self.round_start, self.flat.params, out=self.delta)
        return [self.gradient_out(delta, ticket)], compute_s


@dataclass(frozen=True)
class LocalSGDOptions(RayPsOptions):
    sync_every: int = setting(8, "steps each worker takes on its own replica between exchanges (H)")
    outer_lr: float = setting(0.7, "the outer step's learning rate (DiLoCo's); 1 with momentum 0 = plain averaging")
    outer_momentum: float = setting(0.9, "the outer step's Nesterov momentum; 0 = none")


class OuterServer(RayServer):
    optimizer: ScheduledOptimizer  # from reset: the outer one (SGD), unscheduled: the inner ones follow the schedule

    def reset(self, job: Job, seed: int) -> list:
        weights = super().reset(job, seed)
        # (3) the outer optimizer, stepping with the weighted deltas as its gradient
        outer = LocalSGDOptions(**job.options)
        self.optimizer = ScheduledOptimizer(
            torch.optim.SGD(
                self.flat.optimizer_params(),
                lr=outer.outer_lr,
                momentum=outer.outer_momentum,
                nesterov=outer.outer_momentum > 0,
            )
        )
        return weights


class RayLocalSGD(RayParameterServer):
    name = NAME
    replica, server = LocalReplica, OuterServer
    options = LocalSGDOptions
    table_note = (
        "ray-localsgd: workers exchange every sync_every steps, not every step, so its accuracy is its "
        "own (not the single-device trajectory's) and its link time is shared by those steps."
    )
    synchronous = False  # an update is not one step on the union batch (except sync_every 1, plain SGD)
    uses_host_memory = False  # replicas drift apart between exchanges: each keeps its own weights
    resumable = True  # the server's state with every replica's and the place in the round

    def __init__(self, job: Job) -> None:
        super().__init__(job)
        self.every = self.exchange_every = self.settings.sync_every
        self.floor_transfers = 2.0 / self.every  # ray-ps's two transfers, once a round
        self.in_round = 0  # steps taken in this round
        self.new_round = True  # the next step starts a round: the replicas are given the server's weights

    @classmethod
    def check_options(cls, options: LocalSGDOptions) -> None:
        super().check_options(options)
        if options.sync_every < 1:  # config.py has checked it is an int, and not negative
            raise UserError(f"config key '{NAME}.sync_every' must be a whole number of steps >= 1")

    def reset(self, seed: int) -> None:
        super().reset(seed)
        self.in_round, self.new_round = 0, True

    def learning_rate(self) -> float:
        """The replicas' inner rate (the schedule's, alike on every replica): the outer step's is a setting."""
        return self.placed.results([self.placed.call(0, "learning_rate")], "reading the learning rate")[0]

    def state(self) -> dict:
        replicas = self.placed.results(self._each("state"), "reading the replicas' states")
        return {
            "server": super().state(),
            "replicas": {info["name"]: kept for info, kept in zip(self.info, replicas)},
            "in_round": self.in_round,
            "new_round": self.new_round,
        }

    def load_state(self, state: dict) -> None:
        super().load_state(state["server"])
        missing = [i["name"] for i in self.info if i["name"] not in state["replicas"]]
        if missing:  # lost before the checkpoint: its replica's round cannot be rebuilt
            raise RunFailed(f"{self.name}: the checkpoint holds no replica of {', '.join(missing)} (lost before it)")
        self.placed.each("load_state", [(state["replicas"][i["name"]],) for i in self.info], "resuming the replicas")
        self.in_round, self.new_round = state["in_round"], state["new_round"]

    def step(self, step: int, then: int | None = None) -> StepTiming:
        self.in_round += 1
        if self.in_round == self.every:  # (2)(3) the round's last step, then ray-ps's exchange
            timing = super().step(step)
            self.in_round, self.new_round = 0, True
            return timing
        # (1) a step on every replica, no exchange
        start = now()
        calls = [self.placed.call(rank, "inner", self._round_weights(), step) for rank in range(len(self.info))]
        self.new_round = False
        try:
            computes = self.placed.results(calls, f"step {step}", survivable=True)
            return StepTiming.synchronous({i["name"]: c for i, c in zip(self.info, computes)}, now() - start)
        except WorkersLost as e:  # the survivors' steps count; the lost worker's replica is gone
            survivors = self._survivors_computes(calls)
            self._lose(e.ranks, step)
            return StepTiming.synchronous(survivors, now() - start)

    def _compute(self, rank: int, step: int, ticket: int, after: int | None = None) -> tuple:
        return self.placed.call(rank, "compute", self._round_weights(), step, ticket, returns=2)

    def _round_weights(self) -> list | None:
        """The server's newest weights where a round begins; between, each replica keeps its own."""
        return self.newest if self.new_round else None
