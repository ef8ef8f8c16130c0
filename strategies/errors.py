"""The one exception type the CLI turns into a one-line message and exit code 2."""


class UserError(Exception):
    """Bad input from the user (config, data, device, address): say it in one sentence."""


class RunFailed(Exception):
    """A run could not finish (a worker died, a cluster went away): one sentence, records so far kept."""
