"""Errors the driver reports to the user as one line, without a traceback, and the check every
duration flag goes through."""

import math

from elastic.errors import ElasticError


class UsageError(ElasticError):
    """Bad input from the user: flags, host lists, hostfiles. `elasticrun` exits 2."""


class SettingsError(UsageError, ValueError):
    """A setting's value is out of range or contradicts another, raised where `Settings` (or a
    part of it) is built. The message names the flag that gives the value, so `elasticrun`
    prints it like any other usage error (exit 2)."""


class LaunchError(ElasticError):
    """The job could not start or had to stop: unreachable host, start timeout. Exit 1."""


MAX_SECONDS = 365 * 24 * 3600.0
"""The longest duration a flag may give (a year): every timeout, interval and grace period
fits a timedelta, torch's int64 milliseconds and `threading.TIMEOUT_MAX` with room to spare."""


def seconds(value: float, flag: str, *, zero: bool = False) -> float:
    """`value` if it is a finite number of seconds above 0 (or 0 itself, with `zero`) and at
    most `MAX_SECONDS`; else `SettingsError` naming `flag` (nan, inf and negatives included)."""
    least = "0 or more" if zero else "positive"
    at_least = value >= 0 if zero else value > 0
    if not (math.isfinite(value) and at_least and value <= MAX_SECONDS):
        raise SettingsError(
            f"{flag} must be {least} and at most {MAX_SECONDS:.0f} seconds (a year), got {value:g}"
        )
    return value
