"""What a run is doing while it works: the scenario (n of N), its repeat, steps done and an ETA. A
progress bar on a terminal; plain lines, at most one every EVERY_S, when stderr is not one (logs, CI)."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

EVERY_S = 30.0  # plain lines: often enough to see a run is alive, rarely enough to read a log


class Progress:
    """One scenario's steps: `update(n)` as steps finish, `repeat(r)` as a repeat starts."""

    def __init__(self, label: str, total: int, repeats: int, out=None) -> None:
        self.out = out or sys.stderr
        self.label, self.total, self.repeats = label, total, repeats
        self.done, self.skipped, self.current = 0, 0, 1
        self.started = self.printed = time.monotonic()
        self.bar = tqdm(total=total, desc=label, unit="step", file=self.out, leave=False) if self.out.isatty() else None

    def repeat(self, r: int) -> None:
        self.current = r + 1
        if self.bar is not None:
            self.bar.set_description(f"{self.label} repeat {self.current}/{self.repeats}")

    def update(self, n: int = 1, resumed: bool = False) -> None:
        self.done += n
        if resumed:  # steps done before an interruption: no part of this run's rate
            self.started, self.skipped = time.monotonic(), self.done
        if self.bar is not None:
            self.bar.update(n)
        elif time.monotonic() - self.printed >= EVERY_S or self.done == self.total:
            self.printed = time.monotonic()
            print(self.line(), file=self.out, flush=True)

    def line(self) -> str:
        ran = self.done - self.skipped
        elapsed = time.monotonic() - self.started
        left = self.total - self.done
        eta = f", ETA {_duration(elapsed / ran * left)}" if ran and left else ""
        return (
            f"{self.label}: repeat {self.current}/{self.repeats}, step {self.done}/{self.total} "
            f"({self.done / self.total:.0%}){eta}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
