"""Where a job is in its life, and which phases may form rounds and launch workers."""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    """Where the job is in its life. Only RUNNING and SHORT form rounds or launch workers."""

    RUNNING = "running"  # training (or starting) with at least --min-np workers
    SHORT = "short"  # fewer than --min-np workers: waiting up to --elastic-timeout for more
    FINISHING = "finishing"  # training is over (a member finished): the rest end their part
    ENDED = "ended"  # the job's result is set: every worker is being stopped
    ABANDONED = "abandoned"  # another driver took the job over: its workers are left to it

    @property
    def forms_rounds(self) -> bool:
        return self in (Phase.RUNNING, Phase.SHORT)
