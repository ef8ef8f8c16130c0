"""ray-ps-async's roles when every worker has its own channel: the server serves the workers itself.

Without it the driver stands between every batch and the next: it learns a gradient is ready,
asks the server to apply it, asks it for the weights, and calls the worker again, three Ray calls
on the worker's wait. Here each worker loops on its own (weights down its channel, compute, its
gradient up) and a thread of the server's per channel applies what comes up and sends the
newest weights straight back. The driver opens one global batch's worth of updates per step
(one call); before an evaluation it closes it, so evaluation reads weights that nothing changes
underneath, and otherwise updates go on while the driver is between steps.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable

import numpy as np

from hetbench.strategies.parameter_server import ParameterServer
from hetbench.strategies.ray_ps import RayReplica, RayServer
from hetbench.transport.direct import Silent

log = logging.getLogger(__name__)
POLL_S = 0.2  # how long a loop waits on its channel before it looks whether it was told to stop


def too_far_ahead(version: int, in_flight: Iterable[int], max_staleness: int) -> bool:
    """Bounded staleness: whether a batch started from weights `version` now would run more than
    `max_staleness` versions ahead of the oldest batch still in flight (`in_flight`: their versions)."""
    return version - min(in_flight, default=version) > max_staleness


class ServingReplica(RayReplica):
    """A worker that computes batch after batch from whatever weights come down its channel."""

    loop: threading.Thread | None = None
    stopping: threading.Event | None = None  # each loop's own, from start_loop

    def start_loop(self, first: int) -> None:
        """Start computing from weights version `first`; what comes later is newer, what came before
        (an earlier repeat's) is dropped. The server sends weights only when I am to start from them."""
        self.stopping = threading.Event()
        self.loop = threading.Thread(target=self._loop, args=(first,), daemon=True, name="ps-async-worker")
        self.loop.start()

    def stop_loop(self) -> None:
        """Stop after the batch in hand (its gradient is dropped by the server, which stopped first)."""
        if self.loop:
            self.stopping.set()
            self.loop.join(self.job.cluster.step_timeout_s)
            self.loop = None

    def retire(self) -> None:
        self.stop_loop()
        super().retire()

    def _loop(self, first: int) -> None:
        step = 0  # my own stream of slices
        while not self.stopping.is_set():
            try:  # (2a) the weights I start from, tagged with their version
                version, weights = self.channel.receive_tagged(first, POLL_S)
            except Silent:
                continue
            except ConnectionError:  # the server closed my channel: the row is over
                return
            idle_s = self.idle_s()
            # (1) my slice of my next batch; (2b) my gradient up, after what the server needs to weigh it
            compute_s = self.computed_at(weights, step)
            idle = math.nan if idle_s is None else idle_s
            self.channel.post(version, np.array([compute_s, idle, self.samples]))
            self.outbox.post([self.channel], version, self.flat.grads, self.job.run.wire_dtype)
            self.returned_at, step = time.perf_counter(), step + 1


class ServingServer(RayServer):
    """ray-ps-async's server: applies each gradient as it comes and sends that worker its next weights."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = threading.Condition()  # guards everything below; one update at a time
        self.threads: list[threading.Thread] = []
        self.stopping = False
        self.lost: list[str] = []  # workers whose channel closed, until the driver is told
        self.failure: str | None = None  # why a serving thread failed, for the step that waits on it
        # set by start_serving, for the repeat it serves:
        self.batch_size = 0  # the global batch, which weighs each gradient's share
        self.max_staleness = 0  # how many versions a worker may start ahead of the oldest in flight
        self.update_first = True  # a worker's next weights include its own gradient
        self.budget = 0  # samples' worth of gradients still to apply in this step (below 0: applied ahead)
        self.lead = 0  # how far below 0 the budget may go while the driver is between steps (0: hold)
        self.started_from: dict[str, int] = {}  # worker name -> the version its batch in hand started from
        self.parked_s: dict[str, float] = {}  # how long each worker was last held back by max_staleness
        self.figures: dict = {}  # what the step's updates saw, until run_step hands it to the driver

    def _post(self, weights) -> None:
        """Down no channel yet: each worker is sent the weights it starts from, when it starts."""

    def send_to(self, name: str) -> list:
        """The newest weights down `name`'s channel, for the batch it starts next: [None, version]."""
        self.outbox.post([self.channels[name]], self.version, self.flat.params, self.wire)
        return [None, self.version]

    def start_serving(self, batch_size: int, max_staleness: int, update_first: bool = True) -> int:
        """Every worker is sent the newest weights and served from now on; their version. `update_first`:
        a worker's next weights include its own gradient (else they leave before it is applied)."""
        self.batch_size, self.max_staleness, self.update_first = batch_size, max_staleness, update_first
        self.stopping, self.budget, self.lead, self.failure = False, 0, 0, None
        self.started_from = {name: self.send_to(name)[1] for name in self.channels}
        self.parked_s = {}
        self._clear()
        self.threads = [threading.Thread(target=self._serve, args=item, daemon=True) for item in self.channels.items()]
        for thread in self.threads:
            thread.start()
        return self.version

    def run_step(self, samples: int, timeout_s: float, hold: bool = True) -> dict:
        """Apply gradients until `samples` samples' worth are in (the last may overshoot), less what was
        applied ahead for it; what the step's updates saw. Then `hold` every further one until the next
        step (evaluation reads these weights), or go on applying up to the next step's worth, which
        counts against it: a worker is not kept waiting while the driver is between steps."""
        deadline = time.monotonic() + timeout_s
        with self.turn:
            self.budget, self.lead = self.budget + samples, 0
            self.turn.notify_all()
            while self.budget > 0 and self.started_from and not self.failure and time.monotonic() < deadline:
                self.turn.wait(max(0.0, deadline - time.monotonic()))
            done = self.budget <= 0
            if hold:  # an overshoot is forgiven, as the next step starts from weights read here
                self.budget = 0
            else:
                self.budget, self.lead = min(self.budget, 0), samples
                self.turn.notify_all()
            figures = {**self.figures, "done": done, "lost": self.lost, "failure": self.failure}
            self.lost = []
            self._clear()
            return figures

    def stop_serving(self) -> list[str]:
        """Every serving thread stopped; the workers lost since the last step, which did not hear of them."""
        with self.turn:
            self.stopping = True
            self.turn.notify_all()
        for thread in self.threads:
            thread.join(POLL_S + 5.0)
        self.threads, lost, self.lost = [], self.lost, []
        return lost

    def retire(self) -> None:
        self.stop_serving()
        super().retire()

    def _clear(self) -> None:
        self.figures = {"computes": {n: [] for n in self.channels}, "idles": [], "parks": [], "staleness": []}

    def _serve(self, name: str, channel) -> None:
        try:
            self._serve_worker(name, channel)
        except Exception as e:  # the step waiting on this thread ends with it, not at its timeout
            log.exception("serving worker '%s'", name)  # the whole story, in the server's log
            with self.turn:
                self.failure = f"serving worker '{name}' failed: {type(e).__name__}: {e}"
                self.turn.notify_all()

    def _serve_worker(self, name: str, channel) -> None:
        while not self.stopping:
            try:  # (2b) what the worker sends up with its gradient, then the gradient
                figures = channel.receive(self.started_from[name], POLL_S)
                gradient = channel.receive(self.started_from[name])
            except Silent:
                continue
            except ConnectionError:  # the worker is gone: the driver hears of it from the step
                with self.turn:
                    self.lost.append(name)
                    self.started_from.pop(name, None)
                    self.turn.notify_all()
                return
            with self.turn:
                if not self.update_first:  # its next weights leave now; it computes while its gradient is applied
                    started_from = self.started_from.pop(name)
                    self._send_next(name)
                while self.budget <= -self.lead and not self.stopping:  # held until a step lets it through
                    self.turn.wait()
                if self.stopping:
                    return
                if self.update_first:
                    started_from = self.started_from.pop(name)
                self._apply_one(name, gradient, started_from, *figures)
                self.turn.notify_all()  # a step may be complete, a worker held back free to go
                if self.update_first:
                    self._send_next(name)

    def _send_next(self, name: str) -> None:
        """Bounded staleness first: `name` starts again at most max_staleness versions ahead of the slowest."""
        parked = time.perf_counter()
        while not self.stopping and too_far_ahead(self.version, self.started_from.values(), self.max_staleness):
            self.turn.wait()
        self.parked_s[name] = time.perf_counter() - parked
        if not self.stopping:
            self.started_from[name] = self.send_to(name)[1]
            self.turn.notify_all()

    def _apply_one(self, name: str, gradient, started_from: int, compute_s: float, idle_s: float, batch: float):
        # (2c) (3) scaled by its share of the global batch, applied at once
        self.figures["staleness"].append(self.version - started_from)
        weights, _ = ParameterServer.apply(self, [batch / self.batch_size], gradient)  # the array in hand
        self._put(weights)
        self.budget -= int(batch)
        self.figures["computes"][name].append(compute_s)
        if not math.isnan(idle_s):  # its overhead: the wait beyond what max_staleness held it back
            self.figures["idles"].append(max(0.0, idle_s - self.parked_s.get(name, 0.0)))
            self.figures["parks"].append(self.parked_s.get(name, 0.0))
