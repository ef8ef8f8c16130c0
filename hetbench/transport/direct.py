"""Flat buffers straight between a parameter server and a worker on another machine: one TCP
connection each, one hop, where Ray's object store takes two (the sender's store, then the
receiver's pulls it) and a call's round trip to say where the buffer is.

Each message is a tagged array: the step attempt's ticket for a gradient, the weights' version for
weights. A reader thread at each end takes every message in as it arrives (so a sender never waits
for the other end's method to run) and `receive(tag)` returns the first one tagged at least `tag`,
dropping older ones (what a failed step attempt left behind). A message of one int32 is no
buffer but a step attempt the server gave up (`given_up`): what waits on that attempt's weights ends.

A buffer may also travel in parts, each with its offset into the whole (a gradient sent parameter by
parameter as backward produces it): `gather(tag, out)` puts them together as they arrive.
"""

from __future__ import annotations

import hmac
import queue
import secrets
import socket
import struct
import threading
import time
from typing import NamedTuple

import numpy as np

# tag, offset (in elements), payload bytes, dtype char (f float32, e float16, h bfloat16 bits, i given up)
HEADER = struct.Struct("!qqqc")
SECRET_BYTES = 16  # a run's secret, given to both ends through the cluster: a stranger's connection is closed


class Silent(ConnectionError):
    """Nothing came within the wait: the other end may be gone, or only busy."""


class Sent(NamedTuple):
    """A gradient sent over worker `name`'s channel, tagged `tag`: what the worker hands back in its
    place, or what the driver hands the server before the worker has sent it."""

    name: str
    tag: int
    call: list | None = None  # [the worker's call's handle], in a list so Ray passes it unresolved


GIVEN_UP = np.int32  # the dtype of a given-up mark: no buffer travels in it


def given_up(attempt: int) -> np.ndarray:
    """The mark the server sends down a channel when it gives up step attempt `attempt`."""
    return np.array([attempt], GIVEN_UP)


def gave_up(message: np.ndarray) -> int | None:
    """The step attempt a given-up mark names; None for a buffer."""
    return int(message[0]) if message.dtype == GIVEN_UP else None


def hello(secret: bytes, name: str) -> bytes:
    """What worker `name` says first: the run's secret (from the server, through the cluster) and its name."""
    encoded = name.encode()
    return secret + struct.pack("!H", len(encoded)) + encoded


class Channel:
    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        sock.settimeout(timeout_s)  # bounds a send (a peer behind a cut link takes nothing); the reader waits on
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.timeout_s = sock, timeout_s
        self.inbox: queue.Queue = queue.Queue()
        self.unsent: queue.Queue = queue.Queue()  # what `post` leaves for the sender thread
        self.send_lock = threading.Lock()
        self.broken = False  # a send failed: the other end is gone, or unreachable past the timeout
        threading.Thread(target=self._read, daemon=True, name="direct-reader").start()
        threading.Thread(target=self._send_posted, daemon=True, name="direct-sender").start()

    @classmethod
    def connect(cls, address: tuple[str, int], hello: bytes, timeout_s: float) -> Channel | None:
        """The worker's end: None when the server cannot be reached (a firewall, say)."""
        try:
            sock = socket.create_connection(address, timeout=min(timeout_s, 5.0))
            sock.sendall(hello)
        except OSError:
            return None
        return cls(sock, timeout_s)

    def send(self, tag: int, array: np.ndarray, offset: int = 0) -> bool:
        """`array`, the part of a buffer that starts at element `offset`. False when the other end is
        gone (a lost worker: the driver finds out from its call)."""
        payload = memoryview(np.ascontiguousarray(array)).cast("B")
        try:
            with self.send_lock:
                self.sock.sendall(HEADER.pack(tag, offset, payload.nbytes, array.dtype.char.encode()))
                self.sock.sendall(payload)
            return True
        except OSError:
            self.broken = True
            return False

    def post(self, tag: int, array: np.ndarray, offset: int = 0, sent=None) -> None:
        """`send` from a thread of the channel's own, so the caller never waits for the other end
        (e.g. one behind a cut link). `array` must not change until it is sent: post a copy (an
        Outbox's), and `sent()` is called once it is."""
        self.unsent.put((tag, offset, array, sent))

    def receive(self, tag: int, timeout_s: float | None = None) -> np.ndarray:
        """The first message tagged `tag` or later; Silent when none came within `timeout_s` (default:
        the channel's), ConnectionError when the other end is gone."""
        return self.receive_tagged(tag, timeout_s)[1]

    def receive_tagged(self, tag: int, timeout_s: float | None = None) -> tuple[int, np.ndarray]:
        """As `receive`, with the message's tag."""
        got_tag, _, array = self.receive_part(tag, timeout_s)
        return got_tag, array

    def receive_part(self, tag: int, timeout_s: float | None = None) -> tuple[int, int, np.ndarray]:
        """As `receive`: (tag, the part's offset in its buffer, the part)."""
        return self._next(tag, self.timeout_s if timeout_s is None else timeout_s)[:3]

    def gather(self, tag: int, out: np.ndarray, poll_s: float, check=None) -> np.ndarray:
        """`out` filled from the parts of buffer `tag`, each at its offset, as they come (`parts`)."""
        for _ in self.parts(tag, out, poll_s, check):
            pass
        return out

    def parts(self, tag: int, out: np.ndarray, poll_s: float, check=None):
        """Each part of buffer `tag` put into `out` at its offset as it comes; yields (that offset, when
        the part came in, on this process's perf_counter clock). While none comes for `poll_s`,
        `check()` is called (it may raise to end the wait); Silent when none came within the
        channel's timeout. A message of another tag or kind before the last part cut the buffer
        short: ConnectionError."""
        missing, silent_s = out.size, 0.0
        while missing:
            try:
                got_tag, offset, part, came_in = self._next(tag, poll_s)
            except Silent:
                silent_s += poll_s
                if check:
                    check()
                if silent_s >= self.timeout_s:
                    raise
                continue
            silent_s = 0.0
            if got_tag != tag or part.dtype != out.dtype or offset + part.size > out.size:
                raise ConnectionError(f"buffer {tag}'s parts were cut short by another message")
            out[offset : offset + part.size] = part
            missing -= part.size
            yield offset, came_in

    def _next(self, tag: int, wait_s: float) -> tuple[int, int, np.ndarray, float]:
        """The next message tagged `tag` or later, (tag, offset, array, when it came in); older ones
        are dropped."""
        while True:
            try:
                got_tag, offset, array, came_in = self.inbox.get(timeout=wait_s)
            except queue.Empty:
                raise Silent(f"nothing came over the direct channel within {wait_s:g} s") from None
            if array is None:
                self.inbox.put((got_tag, 0, None, came_in))  # the end stays visible to later calls
                raise ConnectionError("the direct channel's other end closed")
            if got_tag >= tag:
                return got_tag, offset, array, came_in

    def close(self) -> None:
        self.unsent.put((-1, 0, None, None))
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _send_posted(self) -> None:
        while not self.broken:
            tag, offset, array, sent = self.unsent.get()
            if array is None or not self.send(tag, array, offset):
                return
            if sent:
                sent()

    def _read(self) -> None:
        try:
            while True:
                tag, offset, size, char = HEADER.unpack(read_exactly(self.sock, HEADER.size, patient=True))
                array = np.empty(size // np.dtype(char.decode()).itemsize, char.decode())
                read_into(self.sock, memoryview(array).cast("B"), patient=True)
                self.inbox.put((tag, offset, array, time.perf_counter()))
        except (OSError, ConnectionError, ValueError):
            self.inbox.put((-1, 0, None, time.perf_counter()))


class Listener:
    """The server's end: a port on its node's address that the workers' channels connect to."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.sock = socket.create_server((host, port))
        self.timeout_s = timeout_s
        self.secret = secrets.token_bytes(SECRET_BYTES)

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    def accept(self, names: list[str]) -> dict[str, Channel]:
        """A channel per named worker that connected (the backlog holds them) within the timeout."""
        channels: dict[str, Channel] = {}
        deadline = time.monotonic() + self.timeout_s
        while set(channels) != set(names) and time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                sock, _ = self.sock.accept()
                sock.settimeout(self.timeout_s)
                secret = read_exactly(sock, SECRET_BYTES)
                (length,) = struct.unpack("!H", read_exactly(sock, 2))
                name = read_exactly(sock, length).decode()
            except (OSError, ConnectionError, UnicodeDecodeError):
                continue
            if hmac.compare_digest(secret, self.secret) and name in names:
                channels[name] = Channel(sock, self.timeout_s)
            else:
                sock.close()
        return channels

    def close(self) -> None:
        self.sock.close()


def read_exactly(sock: socket.socket, size: int, patient: bool = False) -> bytes:
    buffer = bytearray(size)
    read_into(sock, memoryview(buffer), patient)
    return bytes(buffer)


def read_into(sock: socket.socket, view: memoryview, patient: bool = False) -> None:
    """Fill `view`; `patient`: wait past the socket's timeout (`receive` bounds the reader's waits)."""
    while view.nbytes:
        try:
            got = sock.recv_into(view)
        except TimeoutError:
            if patient:
                continue
            raise
        if not got:
            raise ConnectionError("the other end closed")
        view = view[got:]
