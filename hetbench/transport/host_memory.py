"""Flat buffers in shared memory, for a parameter server and the workers on its own node.

Across nodes, gradients and weights go through Ray's object store. Between processes on one
node, that store is shared memory too, but each message is a fresh object: every put faults new
pages in, and every reader asks the object's owner first (docs/design.md has the figures).
One file mapped by the server and its co-located workers, reused every step, makes each hop one
memcpy. The file is unlinked as soon as everyone has mapped it, so however the run ends (even
SIGKILL), nothing is left in /dev/shm.

Beside the buffers, counters let the processes hand each other the turn without any Ray or Dask
call in between (a "ticket" per step attempt): a worker waits for weights version t-1, computes,
sets its slot's counter to t; the server waits for every slot's t, steps, sets the version to t.
Waiting sleeps in the kernel on a futex: no spinning, which would take a core from training.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import tempfile
import time

import torch

SHM_DIR = "/dev/shm"
VERSION, ABANDONED, FIRST_SLOT = 0, 1, 2  # the counters: weights version, last abandoned ticket, one per slot
CHECK_EVERY_S = 0.5  # how often a wait looks up from its futex: limit, parent, the caller's own check
# Linux's futex syscall; only on x86-64, whose stores become visible in program order (a plain
# store of the counter after the buffer's writes is then a release). Elsewhere: no hand-off.
FUTEX = {"x86_64": 202}.get(platform.machine()) if sys.platform == "linux" else None
FUTEX_WAIT, FUTEX_WAKE = 0, 1


class Abandoned(RuntimeError):
    """The step attempt this wait belonged to was given up (a worker or the server was lost)."""


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class HostBuffers:
    """The weights, then one gradient slot per co-located worker, as float32 views of one shared file."""

    def __init__(self, path: str, numel: int, slots: int, limit_s: float) -> None:
        """`limit_s`: a hand-off this late means a peer is gone (the config's step timeout)."""
        self.path, self.numel, self.limit_s = path, numel, limit_s
        self.memory = torch.from_file(path, shared=True, size=_size(numel, slots) // 4, dtype=torch.float32)
        header = _header(slots)
        self.counters = self.memory[:header].view(torch.int32)
        self.weights = self.memory[header : header + numel]
        self.buffers = self.memory[header:]

    @classmethod
    def create(cls, numel: int, slots: int, limit_s: float) -> HostBuffers | None:
        """A new file, its pages faulted in once here; None where shared memory is missing or full
        (a container's /dev/shm is 64 MB by default): callers then use the object store."""
        try:
            fd, path = tempfile.mkstemp(prefix="hetbench-", dir=SHM_DIR)
            try:
                os.posix_fallocate(fd, 0, _size(numel, slots))  # ENOSPC now, not SIGBUS mid-run
            finally:
                os.close(fd)
            buffers = cls(path, numel, slots, limit_s)
        except OSError:
            return None
        buffers.memory.zero_()
        return buffers

    @classmethod
    def attach(cls, path: str, numel: int, slots: int, limit_s: float) -> HostBuffers | None:
        """The server's file, mapped in this process; None where this process cannot see it."""
        try:  # torch.from_file would create a missing file: check first that this is the server's
            if os.path.getsize(path) != _size(numel, slots):
                return None
            return cls(path, numel, slots, limit_s)
        except OSError:
            return None

    @staticmethod
    def can_hand_off() -> bool:
        """Whether this platform has the futex hand-off (callers otherwise order steps by their calls)."""
        return FUTEX is not None

    def gradient(self, slot: int) -> torch.Tensor:
        start = self.numel * (1 + slot)
        return self.buffers[start : start + self.numel]

    # the hand-off (see the module's docstring); tickets only grow, so old counters never match
    def publish_weights(self, ticket: int) -> None:
        self._set(VERSION, ticket)

    def publish_gradient(self, slot: int, ticket: int) -> None:
        self._set(FIRST_SLOT + slot, ticket)

    def wait_weights(self, ticket: int) -> None:
        self._wait(VERSION, ticket)

    def wait_gradient(self, slot: int, ticket: int, check=None) -> None:
        """`check()`, called while the wait goes on, may raise to end it (e.g. its worker is gone)."""
        self._wait(FIRST_SLOT + slot, ticket, check)

    def gradient_in(self, slot: int, ticket: int) -> bool:
        return int(self.counters[FIRST_SLOT + slot]) >= ticket

    def abandon(self, ticket: int) -> None:
        """Every wait for this ticket or an older one raises Abandoned (its step is being redone or ended)."""
        self.counters[ABANDONED] = max(ticket, int(self.counters[ABANDONED]))
        for index in range(len(self.counters)):
            _futex(self._address(index), FUTEX_WAKE, 2**31 - 1)

    def _set(self, index: int, value: int) -> None:
        ctypes.c_int32.from_address(self._address(index)).value = value
        _futex(self._address(index), FUTEX_WAKE, 2**31 - 1)

    def _wait(self, index: int, ticket: int, check=None) -> None:
        cell, abandoned = (ctypes.c_int32.from_address(self._address(i)) for i in (index, ABANDONED))
        started, parent = time.monotonic(), os.getppid()
        while (seen := cell.value) < ticket:
            if abandoned.value >= ticket:
                raise Abandoned(f"step attempt {ticket} was given up")
            if os.getppid() != parent:  # e.g. Ray's raylet was killed with the run: nobody will answer
                raise Abandoned("the process that started this one is gone")
            waited = time.monotonic() - started
            if waited > self.limit_s:
                raise TimeoutError(f"no hand-off within {self.limit_s:g} s (ticket {ticket})")
            if check and waited >= CHECK_EVERY_S:  # not at once: a hand-off on time costs no check
                check()
            _futex(self._address(index), FUTEX_WAIT, seen, Timespec(0, int(CHECK_EVERY_S * 1e9)))

    def _address(self, index: int) -> int:
        return self.counters.data_ptr() + 4 * index

    def unlink(self) -> None:
        """Remove the name; the memory lives on until the last process that mapped it lets go."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class HandsOff:
    """The side of the hand-off that gives steps their tickets (ray-ps's driver, dask-sync's client),
    for a strategy whose `host` maps the file (None: no hand-off)."""

    host: HostBuffers | None = None
    ticket = 0  # one per step attempt; the counters only ever grow

    def _next_ticket(self) -> int:
        self.ticket += 1
        return self.ticket

    def _give_up_hand_offs(self) -> None:
        """A worker (or the server) is gone: every wait in shared memory for a step attempt so far ends."""
        if self.host:
            self.host.abandon(self.ticket)


def _header(slots: int) -> int:
    """int32 counters before the buffers, padded to 64 bytes."""
    return 16 * -(-(FIRST_SLOT + slots) // 16)


def _size(numel: int, slots: int) -> int:
    return 4 * (_header(slots) + numel * (1 + slots))


_libc = ctypes.CDLL(None, use_errno=True) if FUTEX else None


def _futex(address: int, op: int, value: int, timeout: Timespec | None = None) -> None:
    _libc.syscall(
        FUTEX, ctypes.c_void_p(address), op, ctypes.c_int(value), ctypes.byref(timeout) if timeout else None, None, 0
    )
