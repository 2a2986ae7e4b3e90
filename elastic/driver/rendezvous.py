"""Epoch formation: the driver forms an epoch (slots by host and local rank), workers join it."""

from __future__ import annotations

from collections.abc import Callable

from elastic.driver.changes import ChangeNotifier
from elastic.protocol.http import SlotInfo

JoinListener = Callable[[SlotInfo, int], None]


class Rendezvous:
    """Holds the current epoch and answers joins with the joining worker's slot.

    `join` returns the slot for (hostname, local_rank) in the newest formed epoch, waiting up to
    its timeout for an epoch that has such a slot. Every epoch's KV keys live under
    `epoch_prefix(epoch)`, so a new epoch never sees an old one's keys.
    """

    def __init__(self, on_join: JoinListener | None = None) -> None:
        self.epoch = 0
        self._slots: dict[tuple[str, int], SlotInfo] = {}
        self._changes = ChangeNotifier()
        self._on_join = on_join

    @staticmethod
    def epoch_prefix(epoch: int) -> str:
        return f"epoch/{epoch}/"

    @property
    def slots(self) -> list[SlotInfo]:
        return sorted(self._slots.values(), key=lambda s: s.rank)

    def form(self, epoch: int, slots: list[SlotInfo]) -> None:
        """Make `epoch` current with `slots`, waking every waiting joiner."""
        if epoch <= self.epoch:
            raise ValueError(f"epoch {epoch} is not newer than the current epoch {self.epoch}")
        self.epoch = epoch
        self._slots = {(s.hostname, s.local_rank): s for s in slots}
        self._changes.notify()

    async def join(
        self, hostname: str, local_rank: int, timeout: float
    ) -> tuple[int, SlotInfo] | None:
        """Return (epoch, slot) for the worker, or None if no epoch has its slot by `timeout`."""
        key = (hostname, local_rank)
        if not await self._changes.wait_until(lambda: key in self._slots, timeout):
            return None
        slot = self._slots[key]
        if self._on_join is not None:
            self._on_join(slot, self.epoch)
        return self.epoch, slot
