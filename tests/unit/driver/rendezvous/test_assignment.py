"""Slot assignment: rank, local and cross coordinates for every worker."""

import pytest

from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.errors import UsageError
from elastic.driver.policy.planning import first_places, free_slots, next_members
from elastic.driver.rendezvous.assignment import plan_slots
from elastic.protocol.http import SlotInfo


def assign_slots(hosts: list[HostSpec], np: int) -> list[SlotInfo]:
    """What the driver does for its first epoch: fill hosts in order, then plan the slots."""
    return plan_slots([hostname for hostname, _ in free_slots(hosts, {}, np)])


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


FOUR = [HostSpec("a", 2), HostSpec("b", 2)]


@pytest.mark.parametrize(
    ("np", "max_np", "expected"),
    [
        (2, 4, [("a", 0), ("a", 1), ("b", 0), ("b", 1)]),  # -np is not a cap
        (2, None, [("a", 0), ("a", 1), ("b", 0), ("b", 1)]),
        (None, 3, [("a", 0), ("a", 1), ("b", 0)]),  # --max-np is
        (1, 1, [("a", 0)]),
    ],
)
def test_an_elastic_job_starts_on_every_offered_slot_up_to_max_np(np, max_np, expected) -> None:
    assert first_places(FOUR, np, max_np, elastic=True) == expected


def test_a_static_job_starts_exactly_np_workers_and_refuses_too_few_slots() -> None:
    assert first_places(FOUR, 3, None, elastic=False) == [("a", 0), ("a", 1), ("b", 0)]
    with pytest.raises(UsageError, match="-np 5 is larger than the 4 slot"):
        first_places(FOUR, 5, None, elastic=False)


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


def test_free_slots_skip_occupied_ones_and_stop_at_the_wanted_count() -> None:
    hosts = [HostSpec("a", 2), HostSpec("b", 2)]
    assert free_slots(hosts, {"a": {0}}, 2) == [("a", 1), ("b", 0)]
    assert free_slots(hosts, {}, 0) == []
    assert len(free_slots(hosts, {}, 10)) == 4


def test_a_new_epoch_of_survivors_gets_dense_coordinates() -> None:
    slots = plan_slots(["b", "a", "b"])
    assert [(s.hostname, s.rank, s.local_rank, s.local_size) for s in slots] == [
        ("b", 0, 0, 2),
        ("a", 1, 0, 1),
        ("b", 2, 1, 2),
    ]
    assert [(s.cross_rank, s.cross_size) for s in slots] == [(0, 2), (1, 2), (0, 1)]


def test_next_epoch_keeps_survivors_first_in_rank_order_and_caps_at_max_np() -> None:
    assert next_members(["w3", "w1"], ["w7", "w5"], None) == ["w3", "w1", "w7", "w5"]
    assert next_members(["w3", "w1"], ["w7", "w5"], 3) == ["w3", "w1", "w7"]
    assert next_members(["w3"], ["w3", "w4"], None) == ["w3", "w4"]
    assert next_members([], [], 4) == []
