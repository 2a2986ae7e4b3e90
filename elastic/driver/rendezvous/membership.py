"""Epoch formation: the driver forms epochs (an ordered list of worker ids), workers join them.

A worker joins with its id and the last epoch it was in (0 at start) and receives its slot in
the first newer epoch that includes it, waiting for one to form; a worker that the driver
excluded (it leaves the job: SIGTERM, a removed host) is told so and exits. Every epoch's KV
keys live under `epoch_prefix(epoch)`, so a new epoch never sees an old one's keys, and a
newer epoch supersedes every wait of the older ones.
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
    epoch: int
    slot: SlotInfo


class NotMemberError(ElasticError):
    """The worker was excluded from the job: it must leave (exit 0)."""


class Rendezvous:
    """Holds the current epoch's members and answers joins. Runs on the driver's event loop.

    `on_wait(worker_id, after_epoch, commit)` is called when a worker starts waiting for an
    epoch newer than `after_epoch`, its state holding `commit` commits, so the driver can
    count who is ready to form the next one;
    `on_join(worker_id, epoch)` when a worker receives its slot.
    """

    def __init__(
        self, on_wait: WaitListener | None = None, on_join: JoinListener | None = None
    ) -> None:
        self.epoch = 0
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
    def epoch_prefix(epoch: int) -> str:
        return f"epoch/{epoch}/"

    def slot_of(self, worker_id: str) -> SlotInfo | None:
        return self._slots.get(worker_id)

    @property
    def slots(self) -> Mapping[str, SlotInfo]:
        """The newest epoch's members' slots, read-only (the next epoch brings a new one)."""
        return MappingProxyType(self._slots)

    @property
    def waiting(self) -> Mapping[str, int]:
        """Workers now waiting for a newer epoch, with the epoch each is leaving (a read-only
        view that changes as they come and go: copy it to keep it)."""
        return MappingProxyType(self._waiting)

    def form(self, members: list[tuple[str, str]]) -> int:
        """Form the next epoch from (worker_id, hostname) in rank order; return its number.

        Wakes every joiner it includes and supersedes every wait of older epochs.
        """
        self.epoch += 1
        self.members = [worker_id for worker_id, _ in members]
        slots = plan_slots([hostname for _, hostname in members])
        self._slots = dict(zip(self.members, slots, strict=True))
        self._changes.notify()
        return self.epoch

    def restore(self, epoch: int, members: list[tuple[str, str]]) -> None:
        """Take up epoch `epoch` with `members` as an earlier driver formed it (same slots);
        wakes nobody: its members already have their slots."""
        self.form(members)
        self.epoch = self.restored = epoch

    def advance_to(self, epoch: int) -> None:
        """Number the next epoch after `epoch`: an earlier driver of the job formed epochs up
        to it that were never saved. The current members and slots stay as they are."""
        self.epoch = max(self.epoch, epoch)

    def exclude(self, worker_id: str) -> None:
        """Tell `worker_id` at its next join that it is no longer part of the job."""
        self._excluded.add(worker_id)
        self._changes.notify()

    def close(self) -> None:
        """The job is ending: every later join (and every waiting one) answers `NotMemberError`."""
        self._closed = True
        self._changes.notify()

    async def join(
        self, worker_id: str, after_epoch: int, timeout: float, commit: int = 0
    ) -> Joined | None:
        """The worker's slot in the first epoch newer than `after_epoch` that includes it
        (`commit`: how many commits the worker's state holds, for `on_wait`).

        Returns None if none formed within `timeout`; raises `NotMemberError` if the worker was
        excluded.
        """

        def answered() -> bool:
            return (
                self._closed
                or worker_id in self._excluded
                or (self.epoch > after_epoch and worker_id in self._slots)
            )

        if not answered():
            self._waiting[worker_id] = after_epoch
            if self._on_wait is not None:
                self._on_wait(worker_id, after_epoch, commit)
            try:
                if not await self._changes.wait_until(answered, timeout):
                    return None
            finally:
                self._waiting.pop(worker_id, None)
        if self._closed or worker_id in self._excluded:
            raise NotMemberError(worker_id)
        if self._on_join is not None:
            self._on_join(worker_id, self.epoch)
        return Joined(self.epoch, self._slots[worker_id])

    async def wait_superseded(self, epoch: int, timeout: float) -> bool:
        """True as soon as an epoch newer than `epoch` forms or the job ends (`close`); False
        after `timeout`."""
        return await self._changes.wait_until(lambda: self.epoch > epoch or self._closed, timeout)

    @property
    def closed(self) -> bool:
        """Whether the job is ending (`close`)."""
        return self._closed
