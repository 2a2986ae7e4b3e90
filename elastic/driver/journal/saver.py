"""Saves the job's state behind the driver's back, and rides out backend outages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from elastic.driver.changes import ChangeNotifier
from elastic.driver.journal.backend import BackendError, ClaimLost, StateBackend

log = logging.getLogger("elasticrun")

# Seconds between checks for changes nobody asked to save at once (output offsets, a pid).
# Each check builds the whole state document: about 7 ms at 1,000 workers.
TICK = 1.0
PROGRESS_EVERY = 10.0  # seconds between lines while an outage outlasts the grace period


class StateSaver:
    """Writes `snapshot()` (the `state` document) when asked (`request`, `flush`) and every
    `TICK` seconds if it changed.

    The driver never waits on the backend while it is down: it keeps serving workers from
    memory, and the saver retries. The outage is logged once when it starts, clearly once it
    outlasts `grace` seconds (then every 10 s), and once when it ends, after the newest state
    is saved. `on_lost()` is called if the backend says another driver took the job.
    `seal` adds what goes with the state in the same save (its MAC).
    """

    def __init__(
        self,
        backend: StateBackend,
        snapshot: Callable[[], bytes],
        grace: float,
        on_lost: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        seal: Callable[[dict[str, bytes]], dict[str, bytes]] = dict,
    ) -> None:
        self._backend = backend
        self._seal = seal
        self._snapshot = snapshot
        self._grace = grace
        self._on_lost = on_lost
        self._clock = clock
        self._wanted = asyncio.Event()
        self._requests = 0  # `request()` calls so far
        self._done = 0  # the request count that the last good save covered
        self._saved: bytes | None = None
        self._down_since: float | None = None
        self._last_line = 0.0
        self._changes = ChangeNotifier()

    @property
    def outage(self) -> bool:
        """Whether the last save failed (the backend is unreachable)."""
        return self._down_since is not None

    def request(self) -> int:
        """Save as soon as possible; returns a number that `flush` can wait for."""
        self._requests += 1
        self._wanted.set()
        return self._requests

    async def flush(self, timeout: float = 5.0) -> bool:
        """Save now and wait for it; True once saved. Returns False at once during an outage
        (the driver does not wait for the backend) and after `timeout` seconds."""
        wanted = self.request()
        return (
            await self._changes.wait_until(lambda: self._done >= wanted or self.outage, timeout)
            and not self.outage
        )

    async def run(self) -> None:
        """Save until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wanted.wait(), TICK if not self.outage else 1.0)
            self._wanted.clear()
            covered = self._requests
            document = self._snapshot()
            if document == self._saved and not self.outage:
                self._mark_done(covered)
                continue
            try:
                await self._backend.save(self._seal({"state": document}))
            except ClaimLost:
                self._on_lost()
                return
            except BackendError as err:
                self._failed(err)
                continue
            self._saved = document
            self._recovered()
            self._mark_done(covered)

    def _mark_done(self, covered: int) -> None:
        self._done = covered
        self._changes.notify()

    def _failed(self, err: BackendError) -> None:
        now = self._clock()
        if self._down_since is None:
            self._down_since = now
            self._last_line = -PROGRESS_EVERY  # the grace line comes as soon as it is due
            log.warning("job state not saved, retrying (workers are served meanwhile): %s", err)
            self._changes.notify()  # flush() waiters stop waiting
        elif now - self._down_since > self._grace and now - self._last_line >= PROGRESS_EVERY:
            self._last_line = now
            log.error(
                "the state backend has been unreachable for %.0f s (grace %g s, --etcd-grace): "
                "the job goes on, but a driver restart now would lose every change since",
                now - self._down_since,
                self._grace,
            )

    def _recovered(self) -> None:
        if self._down_since is not None:
            log.warning(
                "the state backend is reachable again after %.0f s; job state saved",
                self._clock() - self._down_since,
            )
            self._down_since = None
