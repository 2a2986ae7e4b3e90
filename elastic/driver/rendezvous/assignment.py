"""Slot assignment: which rank runs where. Pure functions, no I/O."""

from __future__ import annotations

from elastic.protocol.http import SlotInfo


def plan_slots(hostnames: list[str]) -> list[SlotInfo]:
    """Coordinates for workers given the host of each, in rank order.

    `local_rank` counts the workers before this one on the same host. `cross_rank` is the
    host's index among the hosts that have a worker with the same `local_rank` (hosts ordered
    by their first rank), and `cross_size` the number of such hosts: Horovod's definition, so
    uneven hosts get smaller cross groups for their higher local ranks.
    """
    local_sizes: dict[str, int] = {}
    local_ranks = []
    for hostname in hostnames:
        local_ranks.append(local_sizes.get(hostname, 0))
        local_sizes[hostname] = local_ranks[-1] + 1
    host_order = list(local_sizes)
    cross: dict[int, dict[str, int]] = {}  # local rank -> its hosts' cross ranks: O(N) in all
    for local_rank in range(max(local_sizes.values(), default=0)):
        peers = [h for h in host_order if local_sizes[h] > local_rank]
        cross[local_rank] = {h: index for index, h in enumerate(peers)}
    slots = []
    for rank, (hostname, local_rank) in enumerate(zip(hostnames, local_ranks, strict=True)):
        slots.append(
            SlotInfo(
                hostname=hostname,
                rank=rank,
                local_rank=local_rank,
                cross_rank=cross[local_rank][hostname],
                size=len(hostnames),
                local_size=local_sizes[hostname],
                cross_size=len(cross[local_rank]),
            )
        )
    return slots
