"""The strangers' line (oldest first, per peer) and the one-line-a-minute log of the ports."""

from __future__ import annotations

import logging

import pytest

from elastic.driver.connection_limits import OverLimitLog, WaitingConnections


def test_past_its_share_a_peer_loses_its_own_oldest_and_the_young_are_spared() -> None:
    waiting: WaitingConnections[str] = WaitingConnections(max_total=4, max_per_peer=2)
    for name, peer, opened in [("a1", "A", 1), ("b1", "B", 2), ("a2", "A", 3), ("a3", "A", 4)]:
        waiting.add(name, peer, opened)
    assert waiting.over_limits(opened_before=10) == ["a1"], "A has 3, its share is 2"
    assert waiting.over_limits(opened_before=1) == [], "a1 is in its grace"
    waiting.add("c1", "C", 5)
    assert waiting.over_limits(opened_before=10) == ["a1"], "5 wait: one must go, A's oldest"
    waiting.add("c2", "C", 6)
    assert waiting.over_limits(opened_before=10) == ["a1", "b1"], "then everyone's oldest"
    assert waiting.over_limits(opened_before=4) == [], "the young ones do not count"
    waiting.discard("a1")
    assert waiting.of_peer("A") == 2 and len(waiting) == 5
    assert waiting.opened_before(3.5) == ["b1", "a2"]
    for name in ("b1", "a2", "a3", "c1", "c2"):
        waiting.discard(name)
    assert len(waiting) == 0 and waiting.of_peer("A") == 0 and waiting.oldest() is None


def test_a_limit_acting_thousands_of_times_logs_a_line_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    said = OverLimitLog(logging.getLogger("test.ports"), "some port", 60.0, lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.ports"):
        for _ in range(1_000):
            said.note("closed a connection")
        said.note("refused a connection")
        now[0] = 61.0
        said.note("closed a connection")
    assert [r.getMessage() for r in caplog.records] == [
        "some port: closed a connection",
        "some port: refused a connection",
        "some port: closed a connection (999 more since the last such line)",
    ]
