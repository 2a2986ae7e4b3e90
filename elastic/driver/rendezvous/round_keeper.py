"""Forming and breaking rounds, and telling the workers about them."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from elastic.driver.control.channels import ControlChannels
from elastic.driver.control.events import HostsUpdated, RoundBroken
from elastic.driver.launch.staffing import host_summary
from elastic.driver.rendezvous.batcher import RoundBatcher
from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.rendezvous.memory_store import MemoryKeyValueStore
from elastic.driver.workers import Worker

log = logging.getLogger("elasticrun")

CALL_BACK_AT_MOST = 64  # survivors of a broken round told at once to come back (see `want`)
BREAKS_KEPT = 8  # rounds before the newest whose break is remembered (told once, see `form`)

Spawn = Callable[[Coroutine[Any, Any, Any]], None]


class RoundKeeper:
    """The job's rounds: their numbers and slots (`rendezvous`), the gathering of requests
    for the next one (`batcher`, which calls `form_wanted(reasons)` when it is due), and
    what workers hear of them on their control channels.

    `form` tells the previous round's live members which hosts came and went; `break_round`
    tells every live worker (`alive()`), once per round, that a round is of no use any more:
    one blocked in a collective of it gives up at the first word. After a death that word
    and the next round go out together, one event per survivor (see `break_round`).
    """

    def __init__(
        self,
        rendezvous: Rendezvous,
        channels: ControlChannels,
        kv: MemoryKeyValueStore,
        workers: Mapping[str, Worker],
        form_wanted: Callable[[list[str]], None],
        spawn: Spawn,
        alive: Callable[[], Iterable[str]],
    ) -> None:
        self.rendezvous = rendezvous
        self.batcher = RoundBatcher(self._form_wanted)
        self._form_wanted_now = form_wanted
        self._channels = channels
        self._kv = kv
        self._workers = workers
        self._spawn = spawn
        self._alive = alive
        self._broken: set[int] = set()  # rounds whose break was told, the newest ones
        self._held: RoundBroken | None = None  # the current round's break, told with the next

    def want(self, why: str, awaited: Callable[[], set[str]] | None) -> None:
        """Ask for the next round for `why`; `awaited`: the round is broken, and the next
        waits for the survivors it returns (asked only when no round is wanted yet).

        Those survivors are mostly blocked in a collective that only the driver's word ends,
        so they are told the break at once and asked back (`RoundBroken.rejoin`): the round
        forms as soon as they are back, not when the batcher's window ends. Above
        `CALL_BACK_AT_MOST` of them, the extra event each would cost the driver more than the
        window saves; they hear of the break with their slot."""
        first_broken = awaited is not None and not self.batcher.pending
        survivors = awaited() if first_broken and awaited is not None else None
        self.batcher.want(why, survivors)
        held = self._held
        if survivors and held is not None and len(survivors) <= CALL_BACK_AT_MOST:
            self._channels.send(RoundBroken(held.round, held.reason, rejoin=True), survivors)
        self.batcher.arrived(self._is_alive)

    def arrived(self, worker_id: str) -> None:
        """Member `worker_id` is back at the rendezvous for the wanted round."""
        self.batcher.arrived(self._is_alive, worker_id)

    def form(self, members: list[str], update_version: int, why: str) -> int:
        """Form the next round with `members`, in rank order; tell the previous members'
        live ones (`HostsUpdated` numbered `update_version`; to those not in the new round,
        with `leave` set); return its number."""
        workers = self._workers
        previous = self.rendezvous.members
        number = self.rendezvous.form([(w, workers[w].hostname) for w in members])
        # Nobody can still use the keys of the round before the previous one: drop them.
        self._spawn(self._kv.delete_prefix(Rendezvous.round_prefix(number - 2)))
        # A break of a round this old is no news to anybody: forget them (one per round).
        self._broken = {n for n in self._broken if n > number - BREAKS_KEPT}
        before, after = set(previous), set(members)  # sets: O(N), not O(N²), per round
        held, self._held = self._held, None
        update = HostsUpdated(
            update_version,
            number,
            tuple(workers[w].hostname for w in members if w not in before),
            tuple(workers[w].hostname for w in previous if w not in after),
            broken_round=held.round if held is not None else 0,
            broken_reason=held.reason if held is not None else "",
        )
        told = [w for w in previous if workers[w].state.alive]
        self._channels.send(update, [w for w in told if w in after])
        if let_go := [w for w in told if w not in after]:  # they leave at a step boundary
            self._channels.send(dataclasses.replace(update, leave=True), let_go)
        if held is not None:  # joiners and older rounds' leavers: the word on its own
            heard = set(told)
            self._channels.send(held, [w for w in self._alive() if w not in heard])
        summary = host_summary([workers[w] for w in members])
        log.info("round %d: %d worker(s) on %s (%s)", number, len(members), summary, why,
                 extra={"event": "round"})  # fmt: skip
        return number

    def break_round(self, number: int, why: str) -> None:
        """Tell the live workers that round `number` is broken (once per round).

        The break of the current round is held while its successor is wanted (asked for in
        the same decision; at most the batcher's window, `ROUND_AFTER_DEATH`): `form` then
        sends the broken round's live members one `HostsUpdated` that carries both the break
        and their slot, and the other live workers a `RoundBroken`. When no round is wanted,
        or none forms when the window ends (too few workers: the job waits), every live
        worker gets a `RoundBroken`. An older round's break is sent at once; one older than
        `BREAKS_KEPT` rounds is news to nobody, and is not sent."""
        if number in self._broken or number <= self.rendezvous.round - BREAKS_KEPT:
            return
        self._broken.add(number)
        word = RoundBroken(number, why)
        if number != self.rendezvous.round:
            self._channels.send(word, self._alive())
            return
        if self._held is None or number > self._held.round:
            self._held = word
        # The decision that broke it asks for the next round next, in the same turn.
        asyncio.get_running_loop().call_soon(self._release_unless_wanted)

    def cancel(self) -> None:
        """No round is wanted any more; a held break is told at once."""
        self.batcher.cancel()
        self._release()

    def _form_wanted(self, reasons: list[str]) -> None:
        """The batcher's window ended: form the wanted round if the policy will, and tell a
        break that no round carried."""
        try:
            self._form_wanted_now(reasons)
        finally:
            self._release()

    def _release_unless_wanted(self) -> None:
        if not self.batcher.pending:
            self._release()

    def _release(self) -> None:
        """Send a held break, if any, as a `RoundBroken` to every live worker."""
        held, self._held = self._held, None
        if held is not None:
            self._channels.send(held, self._alive())

    def _is_alive(self, worker_id: str) -> bool:
        worker = self._workers.get(worker_id)  # None: ended, its record dropped since
        return worker is not None and worker.state.alive
