"""Errors the driver reports to the user as one line, without a traceback."""


class UsageError(Exception):
    """Bad input from the user: flags, host lists, hostfiles. `elasticrun` exits 2."""


class LaunchError(Exception):
    """The job could not start or had to stop: unreachable host, start timeout. Exit 1."""


def positive(value: float, flag: str) -> float:
    """`value`, or `UsageError` naming `flag` when it is not above 0."""
    if not value > 0:
        raise UsageError(f"{flag} must be positive, got {value:g}")
    return value
