"""Ray Train's ranks report to the driver through this actor: per-step timings from every rank,
rank 0's weights at evaluation steps, and where a restarted group goes on from."""

from __future__ import annotations

import threading

import ray


@ray.remote(num_cpus=0, max_concurrency=16)
class Collector:
    """Per-step timings from every rank and rank 0's weights at evaluation steps, for the driver."""

    def __init__(self, world: int) -> None:
        self.world, self.steps, self.snapshots = world, {}, {}
        self.ready = threading.Condition()
        self.released: set = set()
        self.stop = False
        self.repeat: int | None = None  # the repeat the driver is in, from its first wait for a step of it
        self.states: dict = {}  # repeat -> (next step, rank 0's model + optimizer): where a restart begins
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
            next_step, state = self.states.get(self.repeat, (0, None))
            if rank == 0:
                self.starts, self.resumed_from = self.starts + 1, next_step
            return self.repeat, next_step, state, self.near_target

    def next_repeat(self, done: int, timeout_s: float) -> int | None:
        """The repeat the driver goes on to after `done`; None where it stopped, or went on to none
        within `timeout_s` (a row trains a repeat a start: runner.py's passes)."""
        with self.ready:
            if not self.ready.wait_for(lambda: (self.repeat or 0) > done or self.stop, timeout_s) or self.stop:
                return None
            return self.repeat

    def save_state(self, repeat: int, next_step: int, state: dict) -> None:
        with self.ready:
            self.states = {repeat: (next_step, state)}

    def record(self, key: tuple, rank: int, timing: dict, weights=None) -> bool:
        with self.ready:
            self.steps.setdefault(key, {})[rank] = timing
            if weights is not None:
                self.snapshots[key] = weights
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
