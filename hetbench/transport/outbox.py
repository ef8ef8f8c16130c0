"""What a process posts down its direct channels: each buffer copied, in the wire dtype, into memory
of the outbox's own that it uses again once every channel it went down has sent it.

A post must not change until it is sent (the channel's thread sends it while the caller goes on),
so each was a fresh copy: on a GPU two (the device's pageable copy, then its copy), on a CPU one,
each step, each faulting in fresh pages. The outbox's buffers are those pages, kept: pinned where
they are copied off a GPU, so that copy is one DMA. A buffer down a channel that broke never comes
back (it may still be queued there): the next post of its size takes a new one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from hetbench.gradients import WIRE_DTYPES, wire_array
from hetbench.transport.direct import Channel


class Outbox:
    def __init__(self) -> None:
        self.free: dict[tuple, list[torch.Tensor]] = {}  # (size, dtype, pinned) -> buffers sent by every channel
        self.made = 0  # buffers made so far: a steady stream of posts makes none
        self.lock = threading.Lock()  # the channels' sender threads give buffers back

    def post(self, channels: Sequence[Channel], tag: int, source: torch.Tensor, wire_dtype: str, offset: int = 0):
        """`source` (a flat buffer or a part of one, on any device) down each of `channels`, tagged
        `tag`, as the part at element `offset` of its buffer."""
        key = (source.numel(), WIRE_DTYPES[wire_dtype], source.device.type == "cuda")
        buffer = self._take(key)
        buffer.copy_(source.detach().reshape(-1))
        left = [len(channels)]

        def sent() -> None:
            with self.lock:
                left[0] -= 1
                if left[0] == 0:
                    self.free[key].append(buffer)

        array = wire_array(buffer)
        for channel in channels:
            channel.post(tag, array, offset, sent)

    def _take(self, key: tuple) -> torch.Tensor:
        with self.lock:
            free = self.free.setdefault(key, [])
            if free:
                return free.pop()
            self.made += 1
        size, dtype, pinned = key
        return torch.empty(size, dtype=dtype, pin_memory=pinned)
