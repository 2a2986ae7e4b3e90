"""Forming and breaking rounds, and telling the workers about them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from elastic.driver.control.channels import ControlChannels
from elastic.driver.control.events import EpochBroken, HostsUpdated
from elastic.driver.journal.memory import MemoryKeyValueStore
from elastic.driver.launch.staffing import host_summary
from elastic.driver.rendezvous.batcher import RoundBatcher
from elastic.driver.rendezvous.rounds import Rendezvous
from elastic.driver.workers import Worker

log = logging.getLogger("elasticrun")

Spawn = Callable[[Coroutine[Any, Any, Any]], None]


class RoundKeeper:
    """The job's rounds: their numbers and slots (`rendezvous`), the gathering of requests
    for the next one (`batcher`, which calls `form_wanted(reasons)` when it is due), and
    what workers hear of them on their control channels.

    `form` tells the previous round's live members which hosts came and went; `break_round`
    tells every live worker, once per round, that a round is of no use any more: one blocked
    in a collective of it gives up at the first word.
    """

    def __init__(
        self,
        rendezvous: Rendezvous,
        channels: ControlChannels,
        kv: MemoryKeyValueStore,
        workers: Mapping[str, Worker],
        form_wanted: Callable[[list[str]], None],
        spawn: Spawn,
    ) -> None:
        self.rendezvous = rendezvous
        self.batcher = RoundBatcher(form_wanted)
        self._channels = channels
        self._kv = kv
        self._workers = workers
        self._spawn = spawn
        self._broken: set[int] = set()

    def want(self, why: str, awaited: Callable[[], set[str]] | None) -> None:
        """Ask for the next round for `why`; `awaited`: the round is broken, and the next
        waits for the survivors it returns (asked only when no round is wanted yet)."""
        first_broken = awaited is not None and not self.batcher.pending
        self.batcher.want(why, awaited() if first_broken and awaited is not None else None)
        self.batcher.arrived(self._is_alive)

    def arrived(self, worker_id: str) -> None:
        """Member `worker_id` is back at the rendezvous for the wanted round."""
        self.batcher.arrived(self._is_alive, worker_id)

    def form(self, members: list[str], update_version: int, why: str) -> int:
        """Form the next round with `members`, in rank order; tell the previous members'
        live ones (`HostsUpdated` numbered `update_version`); return its number."""
        workers = self._workers
        previous = self.rendezvous.members
        number = self.rendezvous.form([(w, workers[w].hostname) for w in members])
        # Nobody can still use the keys of the round before the previous one: drop them.
        self._spawn(self._kv.delete_prefix(Rendezvous.epoch_prefix(number - 2)))
        before, after = set(previous), set(members)  # sets: O(N), not O(N²), per round
        update = HostsUpdated(
            update_version,
            number,
            tuple(workers[w].hostname for w in members if w not in before),
            tuple(workers[w].hostname for w in previous if w not in after),
        )
        self._channels.send(update, [w for w in previous if workers[w].state.alive])
        summary = host_summary([workers[w] for w in members])
        log.info("round %d: %d worker(s) on %s (%s)", number, len(members), summary, why)
        return number

    def break_round(self, number: int, why: str, alive: Iterable[str]) -> None:
        """Tell the `alive` workers that round `number` is broken (once per round)."""
        if number not in self._broken:
            self._broken.add(number)
            self._channels.send(EpochBroken(number, why), alive)

    def cancel(self) -> None:
        self.batcher.cancel()

    def _is_alive(self, worker_id: str) -> bool:
        return self._workers[worker_id].state.alive
