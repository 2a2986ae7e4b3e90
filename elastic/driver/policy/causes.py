"""Why a round was formed: the causes the metrics, the page and the timeline count re-forms by."""

from __future__ import annotations

import enum


class Cause(enum.StrEnum):
    """What a round was formed for, as the metrics and the page count re-forms."""

    START = "start"  # the job's first round
    FAILURE = "failure"  # a member died or was declared dead
    JOIN = "join"  # new workers joined
    LEAVE = "leave"  # a member left (SIGTERM, its slot went away, it exited early)
    PREEMPTION = "preemption"  # its host had a preemption notice
    DRAIN = "drain"  # an operator drained its host
    DISCOVERY = "discovery"  # discovery stopped offering its host
    DRIVER_RESTART = "driver-restart"  # a restarted driver lost or never saw a round
