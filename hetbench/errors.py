"""What goes wrong, in the kinds the CLI reports: one sentence each (exit 2 for bad input)."""

import logging
import threading

# Set by the SIGTERM handler (`interrupt`), which also raises KeyboardInterrupt. Python ignores an
# exception raised while it runs a __del__ or a callback ("Exception ignored in"), and a signal
# can land there (it did in CI: the run trained on); the runner checks this between steps.
INTERRUPTED = threading.Event()


def interrupt(signum, frame) -> None:
    """SIGTERM's handler (a kill, CI's `timeout`) in the CLI and in test sessions: unwind as Ctrl-C
    does, through every `finally` that stops a cluster or a namespace (by default SIGTERM ends the
    process at once, and its clusters outlive it). A second one while that runs is ignored (`timeout`
    passes its own on): it must not cut the stopping short."""
    if INTERRUPTED.is_set():
        return
    INTERRUPTED.set()
    raise KeyboardInterrupt(f"signal {signum}")


def stop_if_interrupted() -> None:
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt


class UserError(Exception):
    """Bad input from the user (config, data, device, address): say it in one sentence."""


class RunFailed(Exception):
    """A run could not finish (a worker died, a cluster went away): one sentence, records so far kept."""


class WorkersLost(Exception):
    """Workers of a synchronous step died (a fault, a lost machine); a strategy that survives goes on without them."""

    def __init__(self, ranks: list[int]) -> None:
        super().__init__(f"workers lost: {ranks}")
        self.ranks = ranks


def quiet_loggers(*names: str) -> None:
    """Keep a cluster library's own chatter (and its tracebacks) off the terminal, unless the user
    asked for logs (-v): the strategies report every failure themselves, in one sentence."""
    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        for name in names:
            logging.getLogger(name).setLevel(logging.CRITICAL)
