"""The one exception type the CLI turns into a one-line message and exit code 2."""


class UserError(Exception):
    """Bad input from the user (config, data, device, address): say it in one sentence."""


class RunFailed(Exception):
    """A run could not finish (a worker died, a cluster went away): one sentence, records so far kept."""


class WorkersLost(Exception):
    """Workers of a synchronous step died (a fault, a lost machine); a strategy that survives goes on without them."""

    def __init__(self, ranks: list[int]) -> None:
        super().__init__(f"workers lost: {ranks}")
        self.ranks = ranks
