"""Slot assignment: rank, local and cross coordinates for every worker."""

import pytest

from elastic.driver.assignment import assign_slots
from elastic.driver.errors import UsageError
from elastic.driver.hosts import HostSpec


def table(hosts: list[HostSpec], np: int) -> list[tuple]:
    return [
        (s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size, s.size)
        for s in assign_slots(hosts, np)
    ]


def test_one_host() -> None:
    assert table([HostSpec("a", 4)], 3) == [
        ("a", 0, 0, 3, 0, 1, 3),
        ("a", 1, 1, 3, 0, 1, 3),
        ("a", 2, 2, 3, 0, 1, 3),
    ]


def test_uneven_hosts_fill_in_order_with_horovod_cross_ranks() -> None:
    assert table([HostSpec("a", 2), HostSpec("b", 3), HostSpec("c", 1)], 6) == [
        ("a", 0, 0, 2, 0, 3, 6),
        ("a", 1, 1, 2, 0, 2, 6),
        ("b", 2, 0, 3, 1, 3, 6),
        ("b", 3, 1, 3, 1, 2, 6),
        ("b", 4, 2, 3, 0, 1, 6),
        ("c", 5, 0, 1, 2, 3, 6),
    ]


def test_more_slots_than_np_leaves_later_hosts_unused() -> None:
    rows = table([HostSpec("a", 2), HostSpec("b", 2), HostSpec("c", 2)], 3)
    assert [r[0] for r in rows] == ["a", "a", "b"]
    assert rows[2] == ("b", 2, 0, 1, 1, 2, 3)


def test_many_hosts_one_slot_each() -> None:
    hosts = [HostSpec(f"h{i}", 1) for i in range(64)]
    slots = assign_slots(hosts, 64)
    assert [s.cross_rank for s in slots] == list(range(64))
    assert {(s.local_rank, s.local_size, s.cross_size) for s in slots} == {(0, 1, 64)}


def test_every_rank_is_unique_and_local_ranks_are_dense() -> None:
    hosts = [HostSpec("a", 3), HostSpec("b", 1), HostSpec("c", 5)]
    slots = assign_slots(hosts, 9)
    assert [s.rank for s in slots] == list(range(9))
    for host in hosts:
        mine = [s.local_rank for s in slots if s.hostname == host.hostname]
        assert mine == list(range(host.slots))


def test_np_larger_than_slots_is_refused() -> None:
    with pytest.raises(UsageError, match="-np 5 is larger than the 3 slot"):
        assign_slots([HostSpec("a", 2), HostSpec("b", 1)], 5)


def test_np_must_be_positive() -> None:
    with pytest.raises(UsageError):
        assign_slots([HostSpec("a", 2)], 0)
