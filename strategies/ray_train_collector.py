"""Ray Train's ranks report to the driver through this actor: per-step timings from every rank,
rank 0's weights at evaluation steps, and the states a restarted or resumed group goes on from."""

from __future__ import annotations

import threading

import ray


class Collector:
    """Per-step timings from every rank and rank 0's weights at evaluation steps, for the driver.
    A plain class, tested without a cluster; the ranks and the driver reach it as `CollectorActor`."""

    def __init__(self, world: int) -> None:
        self.world, self.steps, self.snapshots = world, {}, {}
        self.ready = threading.Condition()
        self.released: set = set()
        self.stop = False
        self.repeat: int | None = None  # the repeat the driver is in, from its first wait for a step of it
        self.driver_at: tuple = (-1, -1)  # the latest (repeat, step) the driver took
        # (repeat, next step) -> rank 0's model + optimizer: where a restart, or a resumed run, begins.
        # `pending` until every rank has recorded the step it follows: a rank lost before it did would
        # otherwise leave the driver waiting for a step the restarted group goes on past
        self.states: dict = {}
        self.pending: dict = {}
        self.finished: set = set()  # the (repeat, step)s every rank recorded
        self.starts = 0  # how often the group started (Ray Train restarts it after a lost rank)
        self.resumed_from = 0  # the step the latest start began at
        self.near_target = False  # the driver's latest word: checks every fine_eval_every steps (Schedule.near)

    def begin(self, rank: int, timeout_s: float):
        """Where a (re)started group goes on: the driver's repeat (once it names one), from its latest
        state (or its start), checking as finely as the driver last said; None where the driver
        stopped, or named none within `timeout_s`."""
        with self.ready:
            if not self.ready.wait_for(lambda: self.repeat is not None or self.stop, timeout_s) or self.stop:
                return None
            kept = [k for k in self.states if k[0] == self.repeat]
            next_step, state = (max(kept)[1], self.states[max(kept)]) if kept else (0, None)
            if rank == 0:  # rank 0 begins before any rank of its start records a step (each all-reduces with it)
                self.starts, self.resumed_from = self.starts + 1, next_step
                # a lost group's half-recorded steps are trained again from here and timed afresh
                half = [k for k, v in self.steps.items() if k != ("ready",) and len(v) < self.world]
                for key in half:
                    self.steps.pop(key)
                    self.snapshots.pop(key, None)
                self.pending = {}
            return self.repeat, next_step, state, self.near_target

    def next_repeat(self, done: int, timeout_s: float) -> int | None:
        """The repeat the driver goes on to after `done`; None where it stopped, or went on to none
        within `timeout_s` (a row trains a repeat a start: runner.py's passes)."""
        with self.ready:
            if not self.ready.wait_for(lambda: (self.repeat or 0) > done or self.stop, timeout_s) or self.stop:
                return None
            return self.repeat

    def save_state(self, repeat: int, next_step: int, state: dict) -> None:
        """Rank 0's state after step next_step - 1; kept once every rank has recorded that step."""
        with self.ready:
            self.pending[(repeat, next_step)] = state
            self._commit()

    def resume_from(self, repeat: int, next_step: int, state: dict, near_target: bool) -> None:
        """A checkpoint the driver read back (hetbench run --resume): the group begins there."""
        with self.ready:
            self.states = {(repeat, next_step): state}
            self.near_target = near_target

    def state_at(self, repeat: int, next_step: int, timeout_s: float):
        """Rank 0's state from before `next_step`, for the driver's checkpoint; None on timeout."""
        with self.ready:
            if not self.ready.wait_for(lambda: (repeat, next_step) in self.states or self.stop, timeout_s):
                return None
            return self.states.get((repeat, next_step))

    def _commit(self) -> None:
        for repeat, next_step in [k for k in self.pending if (k[0], k[1] - 1) in self.finished]:
            self.states[(repeat, next_step)] = self.pending.pop((repeat, next_step))
        # the latest state, and those the driver may still ask for (it checkpoints behind the ranks)
        latest = max(self.states, default=None)
        self.states = {k: v for k, v in self.states.items() if k == latest or k > self.driver_at}
        self.ready.notify_all()

    def record(self, key: tuple, rank: int, timing: dict, weights=None) -> bool:
        with self.ready:
            self.steps.setdefault(key, {})[rank] = timing
            if weights is not None:
                self.snapshots[key] = weights
            if len(self.steps[key]) == self.world:
                self.finished.add(key)
                self._commit()
            self.ready.notify_all()
        return self.stop

    def wait(self, key: tuple, timeout_s: float):
        """All ranks' timings for (repeat, step), the weights if rank 0 sent them, and how often the
        group started and where the latest start began; None on timeout."""
        with self.ready:
            if isinstance(key[0], int) and key[0] != self.repeat:
                self.repeat = key[0]
                self.ready.notify_all()  # ranks waiting to begin it
            if not self.ready.wait_for(lambda: len(self.steps.get(key, {})) == self.world, timeout_s):
                return None
            if isinstance(key[0], int):
                self.driver_at = key
            return self.steps.pop(key), self.snapshots.pop(key, None), self.starts, self.resumed_from

    def hold(self, key: tuple, timeout_s: float) -> tuple[bool, bool]:
        """Ranks wait here after an evaluation step until the driver has evaluated (or stops them):
        whether to stop, and whether the checks go fine from here (Schedule.near)."""
        with self.ready:
            self.ready.wait_for(lambda: key in self.released or self.stop, timeout_s)
            return self.stop, self.near_target

    def release(self, key: tuple, near_target: bool) -> None:
        with self.ready:
            self.released.add(key)
            self.near_target = near_target
            self.ready.notify_all()

    def request_stop(self) -> None:
        with self.ready:
            self.stop = True
            self.ready.notify_all()


CollectorActor = ray.remote(num_cpus=0, max_concurrency=16)(Collector)
