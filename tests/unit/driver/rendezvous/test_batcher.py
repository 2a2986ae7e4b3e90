"""Round batching on a real event loop: which requests one round answers, and when it forms."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from elastic.driver.rendezvous import batcher
from elastic.driver.rendezvous.batcher import RoundBatcher

WAIT = 5.0  # seconds a test waits for a round at most: far beyond any delay of the batcher


class Rounds:
    """The rounds a batcher formed, each as the list of reasons it was formed for."""

    def __init__(self) -> None:
        self.formed: list[list[str]] = []
        self.at: list[float] = []
        self._new = asyncio.Event()

    def form(self, reasons: list[str]) -> None:
        self.formed.append(reasons)
        self.at.append(asyncio.get_running_loop().time())
        self._new.set()

    async def next(self) -> list[str]:
        await asyncio.wait_for(self._new.wait(), WAIT)
        self._new.clear()
        return self.formed[-1]


def run(scenario: Callable[[Rounds, RoundBatcher], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        rounds = Rounds()
        await scenario(rounds, RoundBatcher(rounds.form))

    asyncio.run(main())


def alive_except(*dead: str) -> Callable[[str], bool]:
    return lambda worker_id: worker_id not in dead


@pytest.fixture
def slow_death_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken round waits long enough that only arrivals can have formed it."""
    monkeypatch.setattr(batcher, "ROUND_AFTER_DEATH", 60.0)


def test_requests_within_the_batch_window_form_one_round_with_every_reason() -> None:
    async def scenario(rounds: Rounds, batch: RoundBatcher) -> None:
        batch.want("host b added", None)
        batch.want("worker j joined", None)
        batch.want("worker r2 died", {"r0"})  # a round is wanted already: no wait for r0
        assert batch.pending
        assert await rounds.next() == ["host b added", "worker j joined", "worker r2 died"]
        assert not batch.pending
        batch.want("worker k joined", None)
        assert await rounds.next() == ["worker k joined"]
        assert len(rounds.formed) == 2

    run(scenario)


def test_a_broken_round_forms_once_every_awaited_survivor_arrived(slow_death_wait) -> None:
    async def scenario(rounds: Rounds, batch: RoundBatcher) -> None:
        batch.want("worker r2 died", {"r0", "r1"})
        batch.arrived(alive_except("r2"), "r0")
        batch.want("worker r3 died", None)  # seen meanwhile: taken into the same round
        batch.arrived(alive_except("r2", "r3"), "j")  # not awaited
        await asyncio.sleep(0.05)
        assert rounds.formed == [] and batch.pending
        batch.arrived(alive_except("r2", "r3"), "r1")
        assert rounds.formed == [["worker r2 died", "worker r3 died"]]
        assert not batch.pending

    run(scenario)


def test_dead_awaited_survivors_are_not_waited_for(slow_death_wait) -> None:
    async def scenario(rounds: Rounds, batch: RoundBatcher) -> None:
        batch.want("worker r2 died", {"r0", "r1"})
        batch.arrived(alive_except("r2"), "r0")
        assert rounds.formed == []
        batch.arrived(alive_except("r2", "r1"))  # no arrival: r1 died meanwhile
        assert rounds.formed == [["worker r2 died"]]

    run(scenario)


def test_a_broken_round_without_arrivals_forms_after_round_after_death(monkeypatch) -> None:
    monkeypatch.setattr(batcher, "ROUND_AFTER_DEATH", 0.1)

    async def scenario(rounds: Rounds, batch: RoundBatcher) -> None:
        asked = asyncio.get_running_loop().time()
        batch.want("worker r2 died", {"r0", "r1"})
        assert await rounds.next() == ["worker r2 died"]
        assert rounds.at[0] - asked >= 0.09  # not at the batch window (5 ms)

    run(scenario)


def test_cancel_stops_the_wanted_round(monkeypatch) -> None:
    monkeypatch.setattr(batcher, "ROUND_AFTER_DEATH", 0.05)

    async def scenario(rounds: Rounds, batch: RoundBatcher) -> None:
        batch.want("worker r2 died", {"r0"})
        batch.cancel()
        assert not batch.pending
        batch.arrived(alive_except(), "r0")
        await asyncio.sleep(0.15)  # past both delays
        assert rounds.formed == []

    run(scenario)
