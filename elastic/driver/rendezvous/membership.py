"""A job's membership: the driver forms rounds (an ordered list of worker ids), workers join them.

A worker joins with its id and the last round it was in (0 at start) and receives its slot in
the first newer round that includes it, waiting for one to form; a worker that the driver
excluded (it leaves the job: SIGTERM, a removed host) is told so and exits. Every round's KV
keys live under `round_prefix(number)`, so a new round never sees an old one's keys, and a
newer round supersedes every wait of the older ones. (The worker protocol's fields still say
`epoch` for a round: `after_epoch`, `epoch`.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from elastic.driver.changes import ChangeNotifier
from elastic.driver.rendezvous.assignment import plan_slots
from elastic.errors import ElasticError
from elastic.protocol.http import SlotInfo

WaitListener = Callable[[str, int, int], None]
JoinListener = Callable[[str, int], None]


@dataclass(frozen=True)
class Joined:
    round: int
    slot: SlotInfo


class NotMemberError(ElasticError):
    """The worker was excluded from the job: it must leave (exit 0)."""


class Rendezvous:
    """Holds the current round's members and answers joins. Runs on the driver's event loop.

    `round` is the newest round's number (0 before the first). `on_wait(worker_id, after,
    commit)` is called when a worker starts waiting for a round newer than `after`, its state
    holding `commit` commits, so the driver can count who is ready to form the next one;
    `on_join(worker_id, number)` when a worker receives its slot in round `number`.
    """

    def __init__(
        self, on_wait: WaitListener | None = None, on_join: JoinListener | None = None
    ) -> None:
        self.round = 0
        self.members: list[str] = []
        self._slots: dict[str, SlotInfo] = {}
        self._excluded: set[str] = set()
        self._waiting: dict[str, int] = {}
        self._changes = ChangeNotifier()
        self._on_wait = on_wait
        self._on_join = on_join
        self._closed = False
        self.restored: int | None = None  # the round taken up from an earlier driver, if any

    @staticmethod
    def round_prefix(number: int) -> str:
        """Where round `number`'s key-value keys live in the rendezvous store."""
        return f"round/{number}/"

    def slot_of(self, worker_id: str) -> SlotInfo | None:
        return self._slots.get(worker_id)

    @property
    def slots(self) -> Mapping[str, SlotInfo]:
        """The newest round's members' slots, read-only (the next round brings a new one)."""
        return MappingProxyType(self._slots)

    @property
    def waiting(self) -> Mapping[str, int]:
        """Workers now waiting for a newer round, with the round each is leaving (a read-only
        view that changes as they come and go: copy it to keep it)."""
        return MappingProxyType(self._waiting)

    def form(self, members: list[tuple[str, str]]) -> int:
        """Form the next round from (worker_id, hostname) in rank order; return its number.

        Wakes every joiner it includes and supersedes every wait of older rounds.
        """
        self.round += 1
        self.members = [worker_id for worker_id, _ in members]
        slots = plan_slots([hostname for _, hostname in members])
        self._slots = dict(zip(self.members, slots, strict=True))
        self._changes.notify()
        return self.round

    def restore(self, number: int, members: list[tuple[str, str]]) -> None:
        """Take up round `number` with `members` as an earlier driver formed it (same slots);
        wakes nobody: its members already have their slots."""
        self.form(members)
        self.round = self.restored = number

    def advance_to(self, number: int) -> None:
        """Number the next round after `number`: an earlier driver of the job formed rounds up
        to it that were never saved. The current members and slots stay as they are."""
        self.round = max(self.round, number)

    def exclude(self, worker_id: str) -> None:
        """Tell `worker_id` at its next join that it is no longer part of the job."""
        self._excluded.add(worker_id)
        self._changes.notify()

    def forget(self, worker_id: str) -> None:
        """`worker_id` ended and its record is gone: stop remembering its exclusion (an id
        the driver does not know is refused by the control service, and its process ended)."""
        self._excluded.discard(worker_id)

    def close(self) -> None:
        """The job is ending: every later join (and every waiting one) answers `NotMemberError`."""
        self._closed = True
        self._changes.notify()

    async def join(
        self, worker_id: str, after: int, timeout: float, commit: int = 0
    ) -> Joined | None:
        """The worker's slot in the first round newer than `after` that includes it
        (`commit`: how many commits the worker's state holds, for `on_wait`).

        Returns None if none formed within `timeout`; raises `NotMemberError` if the worker was
        excluded.
        """

        def answered() -> bool:
            return (
                self._closed
                or worker_id in self._excluded
                or (self.round > after and worker_id in self._slots)
            )

        if not answered():
            self._waiting[worker_id] = after
            if self._on_wait is not None:
                self._on_wait(worker_id, after, commit)
            try:
                if not await self._changes.wait_until(answered, timeout):
                    return None
            finally:
                self._waiting.pop(worker_id, None)
        if self._closed or worker_id in self._excluded:
            raise NotMemberError(worker_id)
        if self._on_join is not None:
            self._on_join(worker_id, self.round)
        return Joined(self.round, self._slots[worker_id])

    async def wait_superseded(self, number: int, timeout: float) -> bool:
        """True as soon as a round newer than round `number` forms or the job ends (`close`);
        False after `timeout`."""
        return await self._changes.wait_until(lambda: self.round > number or self._closed, timeout)

    @property
    def closed(self) -> bool:
        """Whether the job is ending (`close`)."""
        return self._closed
