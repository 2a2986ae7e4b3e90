"""Stalls: ranks of one round that are not all in the same collective for too long. Pure.

Every rank numbers the collectives it issues in a round alike (`Activity.seq`), so ranks
blocked in collective #12 wait for the ranks that have not issued #12: those still computing
(or sleeping) before it, and those that issued something else. The collective most blocked
ranks wait in is the one the others are missing from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from elastic.protocol.http import CollectiveStatus, StalledRank, StallReport


@dataclass(frozen=True)
class RankActivity:
    """What one member of the round is doing, as the driver knows it."""

    rank: int
    hostname: str
    collective: CollectiveStatus | None  # None: it issued none in this round yet
    steps: int


def _doing(member: RankActivity) -> str:
    collective = member.collective
    if collective is not None and collective.blocked_for is not None:
        return f"in {collective.kind} #{collective.seq}"
    return f"not in a collective, last step {member.steps}"


def find_stall(round_: int, members: Sequence[RankActivity], warning: float) -> StallReport | None:
    """The stall of round `round_`, if its ranks blocked longest in one collective have
    waited `warning` seconds or more while some members are not in it; else None."""
    groups: dict[tuple[int, str], list[RankActivity]] = {}
    for member in members:
        collective = member.collective
        if collective is not None and collective.blocked_for is not None:
            groups.setdefault((collective.seq, collective.kind), []).append(member)
    if not groups:
        return None

    def weight(key: tuple[int, str]) -> tuple[int, float]:
        waiting = groups[key]
        return len(waiting), max(m.collective.blocked_for or 0.0 for m in waiting)  # type: ignore[union-attr]

    key = max(groups, key=weight)
    waiting = groups[key]
    seconds = weight(key)[1]
    missing = [
        m for m in members if m.collective is None or (m.collective.seq, m.collective.kind) != key
    ]
    if seconds < warning or not missing:
        return None
    seq, kind = key
    ranks = ", ".join(str(m.rank) for m in waiting)
    behind = ", ".join(f"rank {m.rank} on host {m.hostname} ({_doing(m)})" for m in missing)
    line = (
        f"stall in round {round_}: rank{'s' if len(waiting) > 1 else ''} {ranks} "
        f"waited {seconds:.0f} s in {kind} #{seq} for {behind}"
    )
    return StallReport(
        round=round_,
        collective=CollectiveStatus(seq=seq, kind=kind, blocked_for=seconds),
        waiting=sorted(m.rank for m in waiting),
        missing=[StalledRank(rank=m.rank, hostname=m.hostname, doing=_doing(m)) for m in missing],
        seconds=seconds,
        line=line,
    )
