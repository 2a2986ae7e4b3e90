"""What the next epoch looks like and where to launch workers. Pure functions, no I/O."""

from __future__ import annotations

from itertools import islice

from elastic.driver.discovery.hosts import HostSpec


def next_members(
    survivors: list[str],
    joiners: list[str],
    max_np: int | None,
    handing_over: frozenset[str] = frozenset(),
) -> list[str]:
    """The next epoch's worker ids in rank order: surviving members keep their relative rank
    order (oldest first), ready joiners are appended in launch order, capped at `max_np`.

    Survivors in `handing_over` (leaving, but the only holders of the newest commit) stay
    members without counting against `max_np`: they leave once their state is passed on."""
    members, staying = [], 0
    for worker_id in survivors + [j for j in joiners if j not in survivors]:
        if worker_id in handing_over:
            members.append(worker_id)
        elif max_np is None or staying < max_np:
            members.append(worker_id)
            staying += 1
    return members


def free_slots(
    hosts: list[HostSpec], occupied: dict[str, set[int]], wanted: int
) -> list[tuple[str, int]]:
    """Up to `wanted` (hostname, slot index) pairs not in `occupied`, filling hosts in order.

    Walks no further than the `wanted`-th free slot: a host's slot count never becomes a list
    of that many places unless that many are wanted."""
    free = (
        (host.hostname, slot)
        for host in hosts
        for slot in range(host.slots)
        if slot not in occupied.get(host.hostname, set())
    )
    return list(islice(free, max(0, wanted)))
