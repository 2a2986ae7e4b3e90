"""The strangers' line (oldest first, per peer) and the one-line-a-minute log of the ports."""

from __future__ import annotations

import logging

import pytest

from elastic.driver.connection_limits import OverLimitLog, WaitingConnections


def test_a_peer_at_its_share_makes_room_with_its_own_oldest() -> None:
    waiting: WaitingConnections[str] = WaitingConnections(max_total=4, max_per_peer=2)
    waiting.add("a1", "A", 1.0)
    waiting.add("b1", "B", 2.0)
    assert waiting.to_evict("A") is None
    waiting.add("a2", "A", 3.0)
    assert waiting.to_evict("A") == "a1", "A holds its share: its oldest goes"
    waiting.add("c1", "C", 4.0)
    assert waiting.to_evict("D") == "a1", "all places taken: everyone's oldest goes"
    waiting.discard("a1")
    assert waiting.of_peer("A") == 1 and len(waiting) == 3
    assert list(waiting.opened_before(3.5)) == ["b1", "a2"]
    for name in ("b1", "a2", "c1"):
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
