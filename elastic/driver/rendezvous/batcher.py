"""Requests for the next round, gathered until it is worth forming."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

ROUND_BATCH = 0.005  # seconds a round waits for more changes seen at the same time...
ROUND_AFTER_DEATH = 0.05  # ...and after a death, at most, for more deaths (or the survivors)


class RoundBatcher:
    """Every request made until the next round forms is answered by that one round.

    The round forms (`form(reasons)` is called once, with every request's reason in order)
    `ROUND_BATCH` after the first request; after a death (`broken`: the current round is of
    no use any more), once every awaited survivor has come to the rendezvous, or after
    `ROUND_AFTER_DEATH`, whichever is first: deaths seen meanwhile (those of one host, those
    one liveness look finds) join the same round, so k deaths cost one round, not k. Survivors
    need not have come: each is sent its slot in the new round on its event stream.
    """

    def __init__(self, form: Callable[[list[str]], None]) -> None:
        self._form = form
        self._reasons: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._awaited: set[str] | None = None  # survivors a broken round's successor awaits

    @property
    def pending(self) -> bool:
        """Whether a round is wanted and not formed yet."""
        return self._timer is not None

    def want(self, why: str, awaited: set[str] | None) -> None:
        """Ask for the next round for `why`; `awaited`: the round is broken and waits for
        these survivors (ignored when a round is already wanted)."""
        self._reasons.append(why)
        if self._timer is None:
            delay = ROUND_AFTER_DEATH if awaited is not None else ROUND_BATCH
            self._timer = asyncio.get_running_loop().call_later(delay, self._form_now)
            self._awaited = awaited

    def arrived(self, alive: Callable[[str], bool], worker_id: str | None = None) -> None:
        """`worker_id` came to the rendezvous (None: just look again); form the wanted round
        now if no awaited survivor is missing (dead ones are no longer awaited)."""
        awaited = self._awaited
        if awaited is None or self._timer is None:
            return
        if worker_id is not None:
            awaited.discard(worker_id)
        else:  # a look after a death: only then can an awaited one have died (O(N), not O(N²))
            for gone in [w for w in awaited if not alive(w)]:
                awaited.discard(gone)
        if not awaited:
            self._timer.cancel()
            self._form_now()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _form_now(self) -> None:
        self._timer, self._awaited = None, None
        reasons, self._reasons = self._reasons, []
        self._form(reasons)
