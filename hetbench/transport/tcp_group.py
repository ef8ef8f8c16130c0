"""A torch.distributed process group over plain TCP sockets, for ranks on different operating systems.

Stock gloo cannot join a Linux rank to a macOS one: torch builds gloo's tcp transport on Linux and
its libuv one on macOS, whose framings differ, and each rank publishes its address as the raw bytes
of its platform's `struct sockaddr_storage` (pytorch/gloo#383; docs/design.md "Collectives across
operating systems"). Sockets and a byte stream behave the same on both, so this group speaks only
those: every pair of ranks holds one TCP connection, each message is a header (the collective's
sequence number, its length) and the tensor's bytes, and a rank's address travels through the
rendezvous store as text.

It is a Python `ProcessGroup` (torch's extension point, as in torch's test_c10d_pypg.py): each
collective is queued to one thread of the group's own, in the order the caller issued it (every
rank issues the same order: the contract of any process group), and returns at once with a Work
over a Future that thread completes. Tensors may live on any device: what is not a contiguous CPU
tensor is copied to CPU first (pinned under CUDA) and back after, so DDP's own broadcasts of MPS
tensors work. All-reduce is a ring (reduce-scatter, then all-gather): each rank sends 2(n-1)/n of
the buffer, as gloo's ring does; with two ranks, one half each way and the reduced half back.

Every wait is bounded: forming by `connect_timeout_s`, every send and receive by the group's
timeout. A failed collective fails its Work and every one after it (the group is broken).
"""

from __future__ import annotations

import hmac
import logging
import queue
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from hetbench.transport.direct import read_exactly, read_into

log = logging.getLogger(__name__)

NAME = "hetbench-tcp"
HEADER = struct.Struct("!qq")  # the collective's sequence number, the payload's bytes
HELLO = struct.Struct("!16sq")  # the group's secret, the dialling rank
COMPLETERS = 4  # threads that complete the futures: how deep callbacks may wait on later collectives
STORE_KEYS = ("tcp-group/secret", "tcp-group/address/")  # in the rendezvous store: rank 0's secret, each host:port

REDUCTIONS: dict = {
    dist.ReduceOp.SUM: torch.Tensor.add_,
    dist.ReduceOp.PRODUCT: torch.Tensor.mul_,
    dist.ReduceOp.MIN: lambda into, other: torch.minimum(into, other, out=into),
    dist.ReduceOp.MAX: lambda into, other: torch.maximum(into, other, out=into),
}


class GroupBroken(RuntimeError):
    """A collective of this group failed (a peer gone, a timeout, a mismatch): no later one can run."""


def form(
    store, rank: int, size: int, host: str, ports: tuple[int, int] | None, connect_timeout_s: float
) -> dict[int, socket.socket]:
    """A connection to every other rank: this rank listens on `host` (the first free port of
    `ports`, else one the kernel picks), publishes where in `store`, dials every lower rank and
    accepts every higher one, each proving the group's secret (rank 0's, through the store)."""
    listener = _listen(host, ports)
    deadline = time.monotonic() + connect_timeout_s
    secret_key, address_key = STORE_KEYS
    try:
        if rank == 0:
            store.set(secret_key, secrets.token_bytes(16))
        store.set(f"{address_key}{rank}", f"{host}:{listener.getsockname()[1]}")
        _wait_keys(store, [secret_key, *(f"{address_key}{r}" for r in range(size))], deadline)
        secret = store.get(secret_key)
        peers: dict[int, socket.socket] = {}
        for peer in range(rank):
            peer_host, peer_port = store.get(f"{address_key}{peer}").decode().rsplit(":", 1)
            peers[peer] = _dial((peer_host, int(peer_port)), HELLO.pack(secret, rank), deadline)
        while len(peers) < size - 1:
            sock = _accept(listener, deadline, f"{size - 1 - len(peers)} higher rank(s) to connect")
            try:
                got_secret, peer = HELLO.unpack(read_exactly(sock, HELLO.size))
            except (OSError, ConnectionError):
                sock.close()
                continue
            if hmac.compare_digest(got_secret, secret) and rank < peer < size and peer not in peers:
                peers[peer] = sock
            else:
                sock.close()  # a stranger, or a rank of another group
        return peers
    finally:
        listener.close()


class Work(dist._Work):
    """A queued collective: `wait` returns once it is done and raises what failed it (torch's own
    work-from-future swallows the exception: its wait returns True all the same)."""

    def __init__(self, future: torch.futures.Future) -> None:
        super().__init__()
        self.future = future

    def wait(self, timeout=None) -> bool:
        self.future.wait()  # bounded: every send and receive of the group has its timeout
        return True

    def get_future(self) -> torch.futures.Future:
        return self.future


class TcpProcessGroup(dist.ProcessGroup):
    """Rank `rank` of `size`, over `peers` (from `form`); every send and receive bounded by `timeout_s`."""

    def __init__(self, rank: int, size: int, peers: dict[int, socket.socket], timeout_s: float) -> None:
        super().__init__(rank, size)
        self._rank, self._size, self.timeout_s = rank, size, timeout_s
        self.peers = peers
        for sock in peers.values():
            sock.settimeout(timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sequence = 0  # collectives queued so far: each message names its own, so a mismatch is caught
        self.broken: BaseException | None = None
        self.closed = False  # shut down: collectives issued from now on fail at once
        self.queue: queue.Queue = queue.Queue()
        # a rank sends to several peers at once while it receives (one thread each way per peer)
        self.senders = ThreadPoolExecutor(max_workers=max(1, size - 1), thread_name_prefix="tcp-group-send")
        # Futures complete on threads of their own, as gloo's do on its pool: a callback may issue the
        # next collective and wait on it (PowerSGD's hook does), which the runner must stay free to run
        self.completers = ThreadPoolExecutor(max_workers=COMPLETERS, thread_name_prefix="tcp-group-done")
        self.runner = threading.Thread(target=self._run, daemon=True, name="tcp-group")
        self.runner.start()

    # the collectives torch.distributed, DDP, its comm hooks and Ray Train call

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        combine = next((fn for known, fn in REDUCTIONS.items() if op == known), None)
        if combine is None:
            raise ValueError(f"{NAME}: all-reduce supports SUM, PRODUCT, MIN and MAX, not {op}")
        return self._queue(tensors, tensors, lambda staged: [self._ring_allreduce(t, combine) for t in staged])

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        return self._queue(tensors, tensors, lambda staged: [self._broadcast(t, root) for t in staged])

    def allgather(self, output_tensors, input_tensors, opts=None):
        outputs = [t for per_input in output_tensors for t in per_input]
        per_input = len(output_tensors[0]) if output_tensors else 0

        def gather(staged):
            ins, outs = staged[: len(input_tensors)], staged[len(input_tensors) :]
            for i, tensor in enumerate(ins):
                self._allgather(tensor, outs[i * per_input : (i + 1) * per_input])

        return self._queue([*input_tensors, *outputs], output_tensors, gather, written=outputs)

    def _allgather_base(self, output, input, opts=None):
        def gather(staged):
            tensor, out = staged
            self._allgather(tensor, list(out.view(-1).chunk(self._size)))

        return self._queue([input, output], output, gather, written=[output])

    def barrier(self, opts=None):
        everyone = dict.fromkeys(self.peers)  # the header alone, to and from every peer
        return self._queue([], [], lambda _: self._exchange(everyone, everyone))

    def getBackendName(self) -> str:
        return NAME

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    def shutdown(self) -> None:
        """Close every connection and the group's threads; a queued collective fails (GroupBroken)."""
        if self.broken is None:
            self.broken = GroupBroken(f"{NAME}: the group was shut down")
        self.closed = True
        self.queue.put(None)
        for sock in self.peers.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self.senders.shutdown(wait=False, cancel_futures=True)
        self.completers.shutdown(wait=False)

    abort = shutdown

    # staging and the queue

    def wire_takes(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s own memory can be sent and received as it is: a contiguous CPU tensor."""
        return tensor.device.type == "cpu" and tensor.is_contiguous()

    def _queue(self, tensors, result, work: Callable, written=None):
        """`work(staged)` on the group's thread after every collective queued before it, with each of
        `tensors` as a CPU tensor the wire takes (a copy where it is not, copied back after for those in
        `written`, default all); a Work whose Future holds `result` when done."""
        written_ids = {id(t) for t in (tensors if written is None else written)}
        staged = [t if self.wire_takes(t) else _to_host(t) for t in tensors]
        back = [(t, s) for t, s in zip(tensors, staged) if s is not t and id(t) in written_ids]
        future = torch.futures.Future()
        if self.closed:  # the runner has stopped: nothing would ever complete it
            future.set_exception(self.broken)
            return Work(future)
        self.sequence += 1
        self.queue.put((self.sequence, work, staged, back, future, result))
        return Work(future)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            self.current, work, staged, back, future, result = item
            try:
                if self.broken is not None:
                    raise self.broken
                work(staged)
                for tensor, copy in back:
                    tensor.copy_(copy)
            except BaseException as e:
                if self.broken is None:
                    self.broken = e if isinstance(e, GroupBroken) else GroupBroken(f"{NAME}: {e}")
                self.completers.submit(future.set_exception, self.broken)
                continue
            self.completers.submit(future.set_result, result)

    # the algorithms, on CPU tensors, on the group's thread

    def _ring_allreduce(self, tensor: torch.Tensor, combine) -> None:
        flat = tensor.view(-1)
        n, rank = self._size, self._rank
        if n == 1:
            return
        chunks = list(flat.tensor_split(n))
        after, before = (rank + 1) % n, (rank - 1) % n
        incoming = torch.empty(max(c.numel() for c in chunks), dtype=flat.dtype)
        for s in range(n - 1):  # reduce-scatter: chunk (rank + 1) % n ends whole here
            sent, got = (rank - s) % n, (rank - s - 1) % n
            part = incoming[: chunks[got].numel()]
            self._exchange({after: chunks[sent]}, {before: part})
            combine(chunks[got], part)
        for s in range(n - 1):  # all-gather: every reduced chunk goes round
            sent, got = (rank + 1 - s) % n, (rank - s) % n
            self._exchange({after: chunks[sent]}, {before: chunks[got]})

    def _broadcast(self, tensor: torch.Tensor, root: int) -> None:
        if self._rank == root:
            self._exchange({p: tensor for p in self.peers}, {})
        else:
            self._exchange({}, {root: tensor})

    def _allgather(self, tensor: torch.Tensor, outputs: list[torch.Tensor]) -> None:
        outputs[self._rank].copy_(tensor)
        self._exchange({p: tensor for p in self.peers}, {p: outputs[p] for p in self.peers})

    def _exchange(self, sends: dict, receives: dict) -> None:
        """Send each of `sends` (peer -> tensor, or None: the header alone) while receiving each of
        `receives` into its tensor; returns when all are done."""
        pending = [self.senders.submit(self._send, peer, t) for peer, t in sends.items()]
        try:
            for peer, tensor in receives.items():
                self._receive(peer, tensor)
        finally:
            for sent in pending:
                sent.result(timeout=self.timeout_s)  # a send's own socket timeout ends it sooner

    def _send(self, peer: int, tensor: torch.Tensor | None) -> None:
        payload = _bytes_of(tensor)
        sock = self.peers[peer]
        sock.sendall(HEADER.pack(self.current, payload.nbytes))
        if payload.nbytes:
            sock.sendall(payload)

    def _receive(self, peer: int, tensor: torch.Tensor | None) -> None:
        into = _bytes_of(tensor)
        sequence, nbytes = HEADER.unpack(read_exactly(self.peers[peer], HEADER.size))
        if (sequence, nbytes) != (self.current, into.nbytes):
            raise GroupBroken(
                f"{NAME}: rank {peer} sent collective {sequence} ({nbytes} bytes) where rank {self._rank} "
                f"runs collective {self.current} ({into.nbytes} bytes): the ranks issued different collectives"
            )
        read_into(self.peers[peer], into)


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy of `tensor` (pinned under CUDA, so the copy back is a DMA)."""
    pinned = tensor.device.type == "cuda"
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)
    return host.copy_(tensor.detach())


def _bytes_of(tensor: torch.Tensor | None) -> memoryview:
    if tensor is None or tensor.numel() == 0:
        return memoryview(b"")
    return memoryview(tensor.view(-1).view(torch.uint8).numpy())


def _listen(host: str, ports: tuple[int, int] | None) -> socket.socket:
    for port in range(ports[0], ports[1] + 1) if ports else [0]:
        try:
            return socket.create_server((host, port))
        except OSError as e:
            last = e
    raise ConnectionError(f"{NAME}: no free port in {ports[0]}-{ports[1]} on {host}: {last}")


def _wait_keys(store, keys: list[str], deadline: float) -> None:
    from datetime import timedelta

    try:
        store.wait(keys, timedelta(seconds=max(0.01, deadline - time.monotonic())))
    except RuntimeError as e:  # torch's DistStoreError: a rank never published where it listens
        missing = [k for k in keys if not store.check([k])]
        raise ConnectionError(f"{NAME}: the group did not form: {', '.join(missing) or e} not published") from None


def _dial(address: tuple[str, int], hello: bytes, deadline: float) -> socket.socket:
    while True:
        try:
            sock = socket.create_connection(address, timeout=max(0.01, min(5.0, deadline - time.monotonic())))
            sock.sendall(hello)
            return sock
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"{NAME}: cannot reach rank at {address[0]}:{address[1]}: {e.strerror or e} "
                    "(docs/deployment.md: Ports)"
                ) from None
            time.sleep(0.1)


def _accept(listener: socket.socket, deadline: float, waiting_for: str) -> socket.socket:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ConnectionError(
            f"{NAME}: the group did not form: still waiting for {waiting_for} (docs/deployment.md: Ports)"
        )
    listener.settimeout(left)
    try:
        sock, _ = listener.accept()
    except TimeoutError:
        raise ConnectionError(
            f"{NAME}: the group did not form: still waiting for {waiting_for} (docs/deployment.md: Ports)"
        ) from None
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    return sock
