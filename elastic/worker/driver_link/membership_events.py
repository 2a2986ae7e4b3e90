"""What the driver has announced to this worker: newer rounds (with its slot in them), broken
rounds, a leave request.

The control-stream listener thread writes it; collectives (waiting in slices) and
`State.commit()` / `check_host_updates()` read it. Thread-safe. One instance lives for the
whole worker process, carried from one round's context to the next.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from elastic.protocol.http import SlotInfo

# Seconds a member re-joining after its round broke waits for the driver to send its slot in
# the next one before it asks over HTTP: thousands of survivors' HTTP joins are most of a
# re-form's cost. The driver forms that round 50 ms after the death, but writing the two
# events to 4,000 streams took it ~3 s on 2 cores: at 0.5 s most survivors gave up waiting.
OFFER_WAIT = 2.0


@dataclass(frozen=True)
class HostsUpdate:
    """Round `next_round` is formed; `added` says whether it brings new workers (they need the
    state synced to them), `removed` whether some left."""

    next_round: int
    added: bool
    removed: bool


@dataclass(frozen=True)
class Offer:
    """The driver's word that this worker is a member of `round`, in `slot`, the job's newest
    commit count being `job_commit`: what joining `round` over HTTP would answer. It may be
    stale (a newer round formed since): forming the group then fails as a joined stale
    round's does (`RoundSuperseded`, or the round is broken)."""

    round: int
    slot: SlotInfo
    job_commit: int = 0


class MembershipEvents:
    """The mailbox of what the driver announced on the event stream: the newest offer of a
    slot, the newest hosts update, the newest broken round, whether to leave. It keeps only
    the newest of each, which is all a worker acts on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offered = threading.Condition(self._lock)
        self._offer: Offer | None = None
        # the announced rounds not yet known to be behind this worker, by number
        self._updates: dict[int, HostsUpdate] = {}
        self._broken_up_to = 0
        self._broken_reason = ""
        self._called_back = 0  # the newest broken round whose successor waits for this worker
        self._leaving = False
        self._leave_reason: str | None = None

    def hosts_updated(self, update: HostsUpdate) -> None:
        """Record that round `update.next_round` exists."""
        with self._lock:
            known = self._updates.get(update.next_round)
            if known is not None:  # the same round announced twice: what either said
                update = HostsUpdate(
                    update.next_round, update.added or known.added, update.removed or known.removed
                )
            self._updates[update.next_round] = update

    def offer(self, offer: Offer) -> None:
        """Record the driver's offer of a slot (keeps the newest round's)."""
        with self._lock:
            if self._offer is None or offer.round > self._offer.round:
                self._offer = offer
                self._offered.notify_all()

    def offer_after(self, round_: int, wait: float = 0.0) -> Offer | None:
        """The newest offer of a round newer than `round_`, waiting up to `wait` seconds for
        one to arrive; None if there is none by then."""
        with self._lock:
            self._offered.wait_for(
                lambda: self._offer is not None and self._offer.round > round_, timeout=wait
            )
            offer = self._offer
        return offer if offer is not None and offer.round > round_ else None

    def pending_update(self, round_: int) -> HostsUpdate | None:
        """The announced update that moves a worker now in `round_` to a newer one, if any:
        the newest announced round, bringing workers if any round announced since `round_`
        does, losing some if any does. Rounds up to `round_` are forgotten: a worker never
        goes back, and their flags are not this move's (a grow after a shrink is a grow)."""
        with self._lock:
            for number in [n for n in self._updates if n <= round_]:
                del self._updates[number]
            pending = list(self._updates.values())
        if not pending:
            return None
        return HostsUpdate(
            max(u.next_round for u in pending),
            any(u.added for u in pending),
            any(u.removed for u in pending),
        )

    def break_round(self, round_: int, reason: str, rejoin: bool = False) -> None:
        """Record that a member of `round_` died: collectives of `round_` and of every older
        round must fail at once (a worker may still be in an older round than the driver).
        `rejoin`: the next round waits for this worker to join it (`slot_follows`)."""
        with self._lock:
            if round_ > self._broken_up_to:
                self._broken_up_to = round_
                self._broken_reason = reason
            if rejoin:
                self._called_back = max(self._called_back, round_)

    def broken(self, round_: int) -> str | None:
        """Why `round_` is broken, or None if it is not."""
        with self._lock:
            return self._broken_reason if 0 < round_ <= self._broken_up_to else None

    def slot_follows(self, round_: int) -> bool:
        """Whether the driver broke `round_` and will send this worker its slot in the next
        round on the event stream, rather than waiting for it to join over HTTP."""
        with self._lock:
            return 0 < round_ <= self._broken_up_to and round_ > self._called_back

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
