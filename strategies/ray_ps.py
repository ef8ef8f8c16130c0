"""Ray parameter server: single.py's loop with (1) on Ray actors, one per worker on its labelled
node, and (2)(3) on a server actor on the driver's node (the shared driver: parameter_server.py).

What is Ray's own here: where the actors run and how calls reach them. A worker on another node
gets its own TCP connection to the server (transport/direct.py), so each buffer makes one hop and
no Ray call waits on it: the server is called before the gradients exist and takes each off its
channel by the step attempt's ticket, and the next step's call, queued before the update (4),
waits on the channel for the weights that come next. With `stream: true` the gradient goes up in
parts as backward produces them, and the server steps each parameter and sends it back down once
every worker's gradient of it is in, as DDP reduces a bucket: only the first layers, whose
gradients backward produces last, wait for its end. With `transport: object-store`, or when that
connection cannot be made, each buffer goes through Ray's object store instead, put once by the
process that made it (inside a list, so Ray passes the reference rather than the value) and read
zero-copy by the other; a call given a reference starts once Ray has it. Workers on the server's
node use shared memory instead (the driver's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import ray
import torch

from hetbench.cluster.nodes import direct_port
from hetbench.config import Job, setting
from hetbench.errors import UserError
from hetbench.gradients import from_wire, to_wire
from hetbench.strategies.parameter_server import ParameterServer, ParameterServerDriver
from hetbench.strategies.replica import Replica
from hetbench.transport.direct import Channel, Listener, Sent, gave_up, given_up, hello
from hetbench.transport.outbox import Outbox

TRANSPORTS = ("direct", "object-store")
POLL_S = 0.2  # while no gradient comes up a channel, how often the server looks whether its call failed


@dataclass(frozen=True)
class RayPsOptions:
    transport: str = setting("direct", "workers on other nodes: direct (a TCP connection each) or object-store")


def streams(job: Job) -> bool:
    """Whether the row streams (StreamOptions.stream): not in fp16, whose overflow check must see the
    whole gradient before any parameter is stepped (ScheduledOptimizer)."""
    return bool(job.options.get("stream")) and job.run.precision != "fp16"


@dataclass(frozen=True)
class StreamOptions(RayPsOptions):
    stream: bool = setting(
        True,
        "a worker with a direct channel posts each parameter's gradient as backward has it; the server "
        "steps each parameter once every gradient of it is in, and sends it down at once",
    )


class RayReplica(Replica):
    channel: Channel | None = None  # my own connection to the server, when I am off its node
    outbox: Outbox  # what I post down it
    version = -1  # the version of the weights I last took from it
    held = None  # those weights

    def connect(self, address: tuple[str, int], greeting: bytes) -> bool:
        self.channel = Channel.connect(tuple(address), greeting, self.job.cluster.step_timeout_s)
        self.outbox = Outbox()
        return self.channel is not None

    def disconnect(self) -> None:
        if self.channel:
            self.channel.close()
            self.channel = None

    retire = disconnect  # the row is over: this process serves the next one

    def compute(self, weights: list | None, step: int, ticket: int | None = None, after: int | None = None):
        if self.channel and ticket is not None and streams(self.job):
            return self.streamed(self.weights_in(weights, after), step, ticket)
        if self.shared:
            slot, compute_s = super().compute(None, step, ticket, after)
            return [slot], compute_s
        compute_s = self.computed_at(self.weights_in(weights, after), step)
        return [self.gradient_out(self.flat.grads, ticket)], compute_s

    def streamed(self, weights, step: int, ticket: int) -> tuple:
        """(2a) load `weights`, (1) forward+backward, (2b) each parameter's gradient posted up my
        channel as backward has it, tagged with the step attempt (through my outbox: the buffer is
        the next step's). The server puts them together at their offsets."""
        self.flat.load_params(from_wire(weights))
        wire = self.job.run.wire_dtype

        def post(offset: int, grad: torch.Tensor) -> None:
            self.outbox.post([self.channel], ticket, grad, wire, offset)

        self.streamed_step(step, post)
        return [Sent(self.spec.name, ticket)], self.watch.read().work_s

    def compute_after_idle(self, weights, step: int, ticket: int | None = None) -> tuple:
        # the weights fetched first: their way down is part of my wait for them, not of my compute
        if not self.shared:
            self.weights_in(weights)
        return super().compute_after_idle(weights, step, ticket)

    def weights_in(self, weights: list | None, after: int | None = None):
        """(2a) with `after`, the weights the update of step attempt `after` publishes: the next ones
        down my channel. Else those named by [object store reference, version]: over my channel, else
        from the object store (fetched once per version: a redone step, or a fetch ahead, has them)."""
        if after is not None:
            self.version, self.held = self._weights_from(self.version + 1, after)
        elif weights[1] != self.version:
            self.version, self.held = (
                self._weights_from(weights[1]) if self.channel else (weights[1], ray.get(weights[0]))
            )
        return self.held

    def _weights_from(self, version: int, attempt: int | None = None) -> tuple:
        """(version, weights): the first down my channel at `version` or newer, whole or put together
        from its parts (a streaming server sends each parameter as it steps it). The server's mark
        that it gave up step attempt `attempt` ends the wait; another attempt's mark drops the parts
        that came before it (that attempt's: they will never be whole)."""
        size, weights, missing = self.flat.params.numel(), None, 0
        while True:
            tag, offset, part = self.channel.receive_part(version)
            abandoned = gave_up(part)
            if abandoned is not None and abandoned == attempt:
                raise ConnectionError(f"the server gave up step attempt {attempt}: no weights come for it")
            if abandoned is not None:
                weights = None
                continue
            if weights is None and part.size == size:
                return tag, part
            if weights is None:  # a new buffer each time: the weights I hold stay whole if this one is cut
                weights, missing, version = np.empty(size, part.dtype), size, tag
            if tag != version:
                raise ConnectionError(f"the weights of version {version} were cut short by version {tag}'s")
            weights[offset : offset + part.size] = part
            missing -= part.size
            if not missing:
                return tag, weights

    def gradient_out(self, grad: torch.Tensor, ticket: int | None) -> Sent | ray.ObjectRef:
        """(2b) my gradient (a buffer on my device) over my channel, tagged with the step attempt,
        else into the object store in the wire dtype. Posted (through my outbox: the buffer is the
        next step's), so no dead link holds this call."""
        if self.channel is None:
            return ray.put(to_wire(grad, self.job.run.wire_dtype))
        self.outbox.post([self.channel], ticket, grad, self.job.run.wire_dtype)
        return Sent(self.spec.name, ticket)


class RayServer(ParameterServer):
    object_store = True  # whether any worker reads the weights from the object store
    listener: Listener | None = None
    version = 0  # of the weights, counted as they are published
    stream = False  # gradients come up direct channels in parts; each parameter goes down once stepped

    def __init__(self) -> None:
        self.channels: dict[str, Channel] = {}  # worker name -> its direct channel
        self.outbox = Outbox()  # what goes down them
        self.incoming: dict[str, object] = {}  # worker name -> the buffer its gradient's parts fill

    def listen(self, port: int, timeout_s: float) -> tuple | None:
        """A port on this node for workers elsewhere: (address, the run's secret), or None if it is taken."""
        try:
            self.listener = Listener(ray.util.get_node_ip_address(), port, timeout_s)
        except OSError:
            return None
        return self.listener.address, self.listener.secret

    def accept(self, names: list[str]) -> list[str]:
        self.channels = self.listener.accept(names)
        self.listener.close()
        return list(self.channels)

    def shared_by_all(self, by_value: bool = True) -> None:
        super().shared_by_all(by_value)
        self.object_store = by_value

    def reset(self, job: Job, seed: int) -> list:
        weights = super().reset(job, seed)
        self.stream = streams(job)
        self.incoming = {name: to_wire(torch.empty_like(self.flat.params), self.wire) for name in self.channels}
        return self._put(weights)

    def load_state(self, state: dict) -> list:
        return self._put(super().load_state(state))

    def apply(self, shares: list[float], *grads, ticket: int | None = None):
        # (2c) the gradients: [reference] lists from the object store or channels, or slots of shared memory
        grads = [g[0] if isinstance(g, list) else g for g in grads]
        sent = [g for g in grads if isinstance(g, Sent)]
        streamed = self.stream and bool(sent)
        try:
            refs = [g for g in grads if isinstance(g, ray.ObjectRef)]
            fetched = dict(zip(refs, ray.get(refs)))
            if streamed:
                # (3) each parameter stepped, and (4) sent down, once every worker's gradient of it is in
                grads = [self.incoming[g.name] if isinstance(g, Sent) else fetched.get(g, g) for g in grads]
                weights, update = self.apply_by_parameter(shares, grads, self._arrivals(sent), self._post_part, ticket)
            else:
                grads = [self._received(g) if isinstance(g, Sent) else fetched.get(g, g) for g in grads]
                weights, update = super().apply(shares, *grads, ticket=ticket)
        except BaseException:
            self._give_up({g.tag for g in sent})
            raise
        return self._put(weights, posted=streamed), update

    def _received(self, sent: Sent):
        """The gradient up `sent.name`'s channel, tagged with its step attempt, put together from its parts."""
        return self.channels[sent.name].gather(sent.tag, self.incoming[sent.name], POLL_S, self._check(sent))

    def _arrivals(self, sent: list[Sent]):
        """(each parameter's offset, when the last of it came in) once its gradient is in from every
        worker of `sent` (in `incoming`), in the order the first one sends them."""
        first, *others = [
            self.channels[s.name].parts(s.tag, self.incoming[s.name], POLL_S, self._check(s)) for s in sent
        ]
        seen: list[dict[int, float]] = [{} for _ in others]
        for offset, came_in in first:
            for parts, have in zip(others, seen):
                while offset not in have:
                    arrived = next(parts, None)
                    if arrived is None:
                        raise ConnectionError(f"no gradient of the parameter at {offset} came from every worker")
                    have[arrived[0]] = arrived[1]
            yield offset, max([came_in, *(have[offset] for have in seen)])

    @staticmethod
    def _check(sent: Sent):
        """While no part comes, the worker's call is looked at: its failure (the worker lost, or its
        compute failed) ends the wait."""

        def check() -> None:
            if sent.call and ray.wait(sent.call, timeout=0)[0]:
                ray.get(sent.call)  # raises the call's failure; its success: the gradient is on its way

        return check

    def _post_part(self, offset: int, size: int) -> None:
        """One parameter's new weights down every channel (through the outbox: the master weights move
        on), tagged with the version they are part of."""
        part = self.flat.params[offset : offset + size]
        self.outbox.post(list(self.channels.values()), self.version + 1, part, self.wire, offset)

    def _give_up(self, attempts: set[int]) -> None:
        """These step attempts' updates will not run: each worker waiting down its channel for their
        weights is told so, at once (the version those weights would have had)."""
        for attempt in attempts:
            for channel in self.channels.values():
                channel.post(self.version + 1, given_up(attempt))

    def forget(self, names: list[str]) -> None:
        """Lost workers' channels: closed, so nothing more waits on them."""
        for name in names:
            self.channels.pop(name).close()

    def retire(self) -> None:
        """The row is over: every channel and the port closed, as this process serves the next row."""
        self.forget(list(self.channels))
        if self.listener:
            self.listener.close()

    def _put(self, weights, posted: bool = False) -> list:
        """New weights out: posted down every channel (a copy: the master weights move on) unless
        already `posted` there in parts, or put in the object store; [reference, version]."""
        self.version += 1
        if not posted:
            self._post(weights)
        return [ray.put(weights) if self.object_store else None, self.version]

    def _post(self, weights) -> None:
        """The new master weights (`weights` as they leave by value) down every channel, through the outbox."""
        if self.channels:
            self.outbox.post(list(self.channels.values()), self.version, self.flat.params, self.wire)


class RayParameterServer(ParameterServerDriver):
    name = "ray-ps"
    via = "ray"
    replica, server = RayReplica, RayServer
    by_value = "object store"
    options = StreamOptions

    @property
    def overlap(self) -> str:
        """Streamed over direct channels: each gradient up as backward has it, each weight down once stepped."""
        return "parameters" if streams(self.job) and self.settings.transport == "direct" else ""

    @classmethod
    def check_options(cls, options: RayPsOptions) -> None:
        if options.transport not in TRANSPORTS:
            raise UserError(f"config key '{cls.name}.transport' must be one of {', '.join(TRANSPORTS)}")

    def _gradient_handle(self, rank: int, ticket: int):
        if not self.direct[rank]:
            return super()._gradient_handle(rank, ticket)
        # the server takes it off the worker's channel by its ticket: its update is called now, and
        # starts as the gradient arrives, not once Ray has seen the worker's call return
        return Sent(self.info[rank]["name"], ticket, [self.calls[rank][0]])

    def _lose(self, ranks: list[int], step: int) -> None:
        lost = [self.info[r]["name"] for r in ranks if self.direct[r]]
        if lost:
            self._server("forget", lost)
        super()._lose(ranks, step)

    def _connect_direct(self, ranks: list[int]) -> set[int]:
        if not ranks or self.settings.transport != "direct":
            return set()
        port = direct_port(bool(self.job.cluster.ray_address))
        listening = self._server("listen", port, self.job.cluster.step_timeout_s)
        if listening is None:
            return set()
        address, secret = listening
        names = [self.info[r]["name"] for r in ranks]
        calls = [self.placed.call(r, "connect", address, hello(secret, n)) for r, n in zip(ranks, names)]
        connected = [n for n, ok in zip(names, self.placed.results(calls, "connecting to the server")) if ok]
        accepted = set(self._server("accept", connected))
        unused = [r for r, n in zip(ranks, names) if n in connected and n not in accepted]
        self.placed.results([self.placed.call(r, "disconnect") for r in unused], "closing unused channels")
        return {r for r, n in zip(ranks, names) if n in accepted}
