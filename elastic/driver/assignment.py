"""Slot assignment: which rank runs where. Pure functions, no I/O."""

from __future__ import annotations

from elastic.driver.errors import UsageError
from elastic.driver.hosts import HostSpec
from elastic.protocol.http import SlotInfo


def assign_slots(hosts: list[HostSpec], np: int) -> list[SlotInfo]:
    """Give `np` workers their slots, filling hosts in the order given.

    Ranks are contiguous per host. `cross_rank` is the host's index among the hosts that have a
    slot with the same `local_rank`, and `cross_size` the number of such hosts (Horovod's
    definition, so uneven hosts get smaller cross groups for their higher local ranks).
    Raises `UsageError` when the hosts have fewer than `np` slots.
    """
    if np < 1:
        raise UsageError(f"-np must be at least 1, got {np}")
    total = sum(h.slots for h in hosts)
    if np > total:
        raise UsageError(
            f"-np {np} is larger than the {total} slot(s) available on "
            + ", ".join(f"{h.hostname}:{h.slots}" for h in hosts)
        )
    placed: list[tuple[str, int]] = []  # (hostname, local_rank) in rank order
    local_sizes: dict[str, int] = {}
    for host in hosts:
        take = min(host.slots, np - len(placed))
        if take == 0:
            break
        placed.extend((host.hostname, local_rank) for local_rank in range(take))
        local_sizes[host.hostname] = take
    host_order = list(local_sizes)
    slots = []
    for rank, (hostname, local_rank) in enumerate(placed):
        peers = [h for h in host_order if local_sizes[h] > local_rank]
        slots.append(
            SlotInfo(
                hostname=hostname,
                rank=rank,
                local_rank=local_rank,
                cross_rank=peers.index(hostname),
                size=np,
                local_size=local_sizes[hostname],
                cross_size=len(peers),
            )
        )
    return slots
