"""The driver's watch for the current round's stall: a look at most once a second, the
stall logged once (and again when it changes). What to do about it is the policy's
(`worker_events.stall_seen`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from elastic.driver.observe.stalls import find_stall, rank_activities, same_stall
from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.workers import Worker
from elastic.protocol.http import StallReport

log = logging.getLogger("elasticrun")

LOOK_EVERY = 1.0  # seconds between two looks for a stall


class StallWatch:
    """`stall` is the current round's stall as last seen (None: none), for status."""

    def __init__(self, warning_after: float) -> None:
        self._warning_after = warning_after
        self._looked = float("-inf")
        self.stall: StallReport | None = None

    def look(
        self, rendezvous: Rendezvous, workers: Mapping[str, Worker], now: float
    ) -> StallReport | None:
        """The stall the round's members show at `now` (it reads every member, so at most
        once every `LOOK_EVERY` s; None between looks and when nothing stalls). A stall
        new or changed since the last look is logged."""
        if now - self._looked < LOOK_EVERY:
            return None
        self._looked = now
        number = rendezvous.round
        members = rank_activities(number, rendezvous.slots, workers, now)
        previous, self.stall = self.stall, find_stall(number, members, self._warning_after)
        if self.stall is not None and (previous is None or not same_stall(previous, self.stall)):
            log.warning("%s", self.stall.line, extra={"event": "stall"})
        return self.stall
