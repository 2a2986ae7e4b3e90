"""Where each rank's shards are replicated: on `replicas` ranks of other hosts. Pure.

Each rank's commit is copied to `replicas` other ranks, each on a different host than the
rank and than one another, so losing any `replicas` hosts at once leaves every shard with a
holder. Replicas go to the least loaded candidates first (fewest replicas held so far), then
to the next host round the ring of hosts, then to the next rank; so on hosts of equal size
every rank holds `replicas` replicas, and on uneven hosts the load spreads as evenly as the
hosts allow.

A round with fewer other hosts than `replicas` (the job shrank to one host) places what it
cannot put on another host on other ranks of the same host: those replicas survive a lost
process, not a lost host (`Placement.across_hosts` says so). At the job's first commit that
is an error instead (`check_replicas`): the job was started with too few hosts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from elastic.state.sharded.errors import ShardedStateError

__all__ = ["Placement", "check_replicas", "place_replicas"]


@dataclass(frozen=True)
class Placement:
    """`holders[k]`: the ranks that keep a replica of rank k's shards, in the order chosen."""

    holders: tuple[tuple[int, ...], ...]
    across_hosts: bool  # every replica is on another host than its rank's

    def backed_up_by(self, rank: int) -> list[int]:
        """The ranks whose shards `rank` keeps a replica of, in rank order."""
        return [k for k, held in enumerate(self.holders) if rank in held]


def check_replicas(hosts: Sequence[str], replicas: int) -> None:
    """Raise `ShardedStateError` (one line) unless `replicas` fits the job's hosts: at least
    0, and fewer than the number of distinct hosts in `hosts` (one entry per rank)."""
    if replicas < 0:
        raise ShardedStateError(f"ShardedState(replicas={replicas}): replicas must be 0 or more")
    distinct = list(dict.fromkeys(hosts))
    if replicas and replicas >= len(distinct):
        raise ShardedStateError(
            f"ShardedState(replicas={replicas}) keeps each shard on {replicas} other host(s), "
            f"but the job has {len(distinct)} host(s) ({', '.join(distinct)}): run on at least "
            f"{replicas + 1} hosts or lower replicas"
        )


def place_replicas(hosts: Sequence[str], replicas: int) -> Placement:
    """Choose `replicas` holders for every rank; `hosts[k]` is rank k's host name.

    Deterministic: every rank computes the same placement from the same hosts."""
    order = list(dict.fromkeys(hosts))
    index = {host: i for i, host in enumerate(order)}
    world = len(hosts)
    load = [0] * world
    holders: list[tuple[int, ...]] = []
    across = True
    for rank in range(world):
        chosen: list[int] = []
        used = {hosts[rank]}
        for _ in range(replicas):
            candidates = [q for q in range(world) if hosts[q] not in used]
            if not candidates:  # too few hosts: another rank of a host already used
                candidates = [q for q in range(world) if q != rank and q not in chosen]
                if not candidates:
                    break
                across = False

            def preference(q: int, rank: int = rank) -> tuple[int, int, int]:
                ring = (index[hosts[q]] - index[hosts[rank]]) % len(order)
                return load[q], ring, (q - rank) % world

            pick = min(candidates, key=preference)
            chosen.append(pick)
            used.add(hosts[pick])
            load[pick] += 1
        if len(chosen) < replicas:
            across = False
        holders.append(tuple(chosen))
    return Placement(tuple(holders), across)
