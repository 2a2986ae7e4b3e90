"""What the HTTP routers need from the driver, handed to the app in one object."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.rendezvous.store import KeyValueStore
from elastic.protocol.http import JobStatus, StandbyAnswer


@dataclass
class Services:
    token: str
    kv: KeyValueStore
    rendezvous: Rendezvous
    status: Callable[[], JobStatus]
    durable: Callable[[], Awaitable[None]] | None = None
    """Waits until the state workers are about to be told is saved (durable backends)."""
    newest_commit: Callable[[], int] = lambda: 0
    """The newest commit count any worker of the job has reported."""
    keys_lost: Callable[[int], None] = lambda number: None
    """A worker waits for a key of round `number`, the round this driver took up from an
    earlier one, that this driver does not hold: the ranks were forming that round's group
    when the earlier driver died, and the keys it held are gone."""
    metrics: Callable[[], Awaitable[bytes]] | None = None
    """The Prometheus exposition of the job's metrics, served without the token."""
    set_drained: Callable[[str, bool], str] | None = None
    """Drain (True) or undrain (False) a host by name; returns the line to answer with.
    Raises `LookupError` when the job knows no such host, `ValueError` when it cannot drain
    (a static job). A drained host's workers leave at their next step boundary, and it gets
    no new workers until it is undrained. None: this driver cannot (a test's app)."""
    stop_job: Callable[[], None] | None = None
    """End the job cleanly: stop every worker, exit. None: this driver cannot."""
    standby_wait: Callable[[str, float], Awaitable[StandbyAnswer]] | None = None
    """A warm standby's long poll `(standby id, timeout)` (see
    `launch.standbys.StandbyPool.wait`). None: this driver keeps no standbys."""
