"""Flat buffers in shared memory, for a parameter server and the workers on its own node.

Across nodes, gradients and weights go through Ray's object store. Between processes on one
node, that store is shared memory too, but each message is a fresh object: a put of 4.8 MB costs
3.7-5.7 ms here (new pages faulted in), plus a round trip to the object's owner for every reader.
One file mapped by the server and its co-located workers, reused every step, makes each hop one
memcpy. The file is unlinked as soon as everyone has mapped it, so however the run ends (even
SIGKILL), nothing is left in /dev/shm.
"""
from __future__ import annotations

import os
import tempfile

import torch

SHM_DIR = "/dev/shm"


class HostBuffers:
    """The weights, then one gradient slot per co-located worker, as float32 views of one shared file."""

    def __init__(self, path: str, numel: int, slots: int) -> None:
        self.path, self.numel = path, numel
        self.memory = torch.from_file(path, shared=True, size=numel * (1 + slots), dtype=torch.float32)
        self.weights = self.memory[:numel]

    @classmethod
    def create(cls, numel: int, slots: int) -> HostBuffers | None:
        """A new file, its pages faulted in once here; None where shared memory is missing or full
        (a container's /dev/shm is 64 MB by default): callers then use the object store."""
        try:
            fd, path = tempfile.mkstemp(prefix="hetbench-", dir=SHM_DIR)
            try:
                os.posix_fallocate(fd, 0, 4 * numel * (1 + slots))  # ENOSPC now, not SIGBUS mid-run
            finally:
                os.close(fd)
            buffers = cls(path, numel, slots)
        except OSError:
            return None
        buffers.memory.zero_()
        return buffers

    @classmethod
    def attach(cls, path: str, numel: int, slots: int) -> HostBuffers | None:
        """The server's file, mapped in this process; None where this process cannot see it."""
        try:  # torch.from_file would create a missing file: check first that this is the server's
            if os.path.getsize(path) != 4 * numel * (1 + slots):
                return None
            return cls(path, numel, slots)
        except OSError:
            return None

    def gradient(self, slot: int) -> torch.Tensor:
        start = self.numel * (1 + slot)
        return self.memory[start:start + self.numel]

    def unlink(self) -> None:
        """Remove the name; the memory lives on until the last process that mapped it lets go."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
