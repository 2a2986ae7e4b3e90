"""Errors the driver reports to the user as one line, without a traceback."""


class UsageError(Exception):
    """Bad input from the user: flags, host lists, hostfiles. `elasticrun` exits 2."""


class LaunchError(Exception):
    """The job could not start or had to stop: unreachable host, start timeout. Exit 1."""
