"""What the driver has announced to this worker: newer epochs (with its slot in them), broken
epochs, a leave request.

The control-stream listener thread writes it; collectives (waiting in slices) and
`State.commit()` / `check_host_updates()` read it. Thread-safe. One instance lives for the
whole worker process, carried from one epoch's context to the next.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from elastic.protocol.http import SlotInfo

# Seconds a member re-joining after its epoch broke waits for the driver to send its slot in
# the next one before it asks over HTTP: thousands of survivors' HTTP joins are most of a
# re-form's cost. The driver forms that round 50 ms after the death, but writing the two
# events to 4,000 streams took it ~3 s on 2 cores: at 0.5 s most survivors gave up waiting.
OFFER_WAIT = 2.0


@dataclass(frozen=True)
class HostsUpdate:
    """Epoch `next_epoch` is formed; `added` says whether it brings new workers (they need the
    state synced to them), `removed` whether some left."""

    next_epoch: int
    added: bool
    removed: bool


@dataclass(frozen=True)
class Offer:
    """The driver's word that this worker is a member of `epoch`, in `slot`, the job's newest
    commit count being `job_commit`: what joining `epoch` over HTTP would answer. It may be
    stale (a newer epoch formed since): forming the group then fails as a joined stale
    epoch's does (`EpochSuperseded`, or the epoch is broken)."""

    epoch: int
    slot: SlotInfo
    job_commit: int = 0


class MembershipEvents:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offered = threading.Condition(self._lock)
        self._offer: Offer | None = None
        self._update: HostsUpdate | None = None
        self._broken_up_to = 0
        self._broken_reason = ""
        self._called_back = 0  # the newest broken epoch whose successor waits for this worker
        self._leaving = False
        self._leave_reason: str | None = None

    def hosts_updated(self, update: HostsUpdate) -> None:
        """Record that epoch `update.next_epoch` exists (keeps the newest announcement)."""
        with self._lock:
            if self._update is None or update.next_epoch >= self._update.next_epoch:
                previous = self._update
                self._update = HostsUpdate(
                    update.next_epoch,
                    update.added or bool(previous and previous.added),
                    update.removed or bool(previous and previous.removed),
                )

    def offer(self, offer: Offer) -> None:
        """Record the driver's offer of a slot (keeps the newest epoch's)."""
        with self._lock:
            if self._offer is None or offer.epoch > self._offer.epoch:
                self._offer = offer
                self._offered.notify_all()

    def offer_after(self, epoch: int, wait: float = 0.0) -> Offer | None:
        """The newest offer of an epoch newer than `epoch`, waiting up to `wait` seconds for
        one to arrive; None if there is none by then."""
        with self._lock:
            self._offered.wait_for(
                lambda: self._offer is not None and self._offer.epoch > epoch, timeout=wait
            )
            offer = self._offer
        return offer if offer is not None and offer.epoch > epoch else None

    def pending_update(self, epoch: int) -> HostsUpdate | None:
        """The announced update that moves a worker now in `epoch` to a newer one, if any."""
        with self._lock:
            update = self._update
        return update if update is not None and update.next_epoch > epoch else None

    def break_epoch(self, epoch: int, reason: str, rejoin: bool = False) -> None:
        """Record that a member of `epoch` died: collectives of `epoch` and of every older
        epoch must fail at once (a worker may still be in an older epoch than the driver).
        `rejoin`: the next epoch waits for this worker to join it (`slot_follows`)."""
        with self._lock:
            if epoch > self._broken_up_to:
                self._broken_up_to = epoch
                self._broken_reason = reason
            if rejoin:
                self._called_back = max(self._called_back, epoch)

    def broken(self, epoch: int) -> str | None:
        """Why `epoch` is broken, or None if it is not."""
        with self._lock:
            return self._broken_reason if 0 < epoch <= self._broken_up_to else None

    def slot_follows(self, epoch: int) -> bool:
        """Whether the driver broke `epoch` and will send this worker its slot in the next
        epoch on the event stream, rather than waiting for it to join over HTTP."""
        with self._lock:
            return 0 < epoch <= self._broken_up_to and epoch > self._called_back

    def request_leave(self, reason: str | None = None) -> None:
        """This worker should leave the job at its next step boundary or commit. `reason`
        (SIGTERM, a preemption notice) is what the driver must hear, said again before this
        worker re-joins in case the first word was lost; None when the driver asked."""
        with self._lock:
            self._leaving = True
            if reason is not None:
                self._leave_reason = reason

    @property
    def leaving(self) -> bool:
        with self._lock:
            return self._leaving

    @property
    def leave_reason(self) -> str | None:
        """Why this worker wants to leave, for the driver; None when the driver asked it to
        (or nobody did)."""
        with self._lock:
            return self._leave_reason
