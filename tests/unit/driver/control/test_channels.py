"""Control event delivery: open streams get events at once, closed ones get them on reopening."""

from __future__ import annotations

import asyncio

from elastic.driver.control.channels import MAX_UNDELIVERED, ControlChannels
from elastic.driver.control.events import RoundBroken


def drain(queue: asyncio.Queue) -> list:
    events = []
    while not queue.empty():
        events.append(queue.get_nowait())
    return events


def test_an_open_stream_gets_events_and_a_closed_one_gets_them_when_it_reopens() -> None:
    channels = ControlChannels()
    open_one = channels.open("a")
    channels.send(RoundBroken(1, "x"), ["a", "b"])
    assert drain(open_one) == [RoundBroken(1, "x")]
    assert drain(channels.open("b")) == [RoundBroken(1, "x")]  # kept while b had no stream
    assert drain(channels.open("b")) == [], "kept events are delivered once"


def test_only_the_newest_events_are_kept_for_a_worker_without_a_stream() -> None:
    channels = ControlChannels()
    for number in range(MAX_UNDELIVERED + 5):
        channels.send(RoundBroken(number, "x"), ["a"])
    kept = drain(channels.open("a"))
    assert [e.round for e in kept] == list(range(5, MAX_UNDELIVERED + 5))


def test_closing_an_older_stream_leaves_the_newer_one_open() -> None:
    channels = ControlChannels()
    old = channels.open("a")
    new = channels.open("a")
    assert not channels.close("a", old)
    channels.send(RoundBroken(2, "x"), ["a"])
    assert drain(new) == [RoundBroken(2, "x")] and drain(old) == []
    assert channels.close("a", new)
    channels.send(RoundBroken(3, "x"), ["a"])
    channels.forget("a")  # it exited
    assert drain(channels.open("a")) == []
