"""Stalls: ranks of one round that are not all in the same collective for too long. Pure.

Every rank numbers the collectives it issues in a round alike (`Activity.seq`), so ranks
blocked in collective #12 wait for the ranks that have not issued #12: those still computing
(or sleeping) before it, and those that issued something else. The collective most blocked
ranks wait in is the one the others are missing from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elastic.driver.workers import Worker
from elastic.protocol.http import CollectiveStatus, SlotInfo, StalledRank, StallReport


@dataclass(frozen=True, slots=True)
class RankActivity:
    """What one member of the round is doing, as the driver knows it: the collective it
    issued last in the round (`seq` 0: none yet) and how long it has waited in it (None:
    it is not waiting), and its optimizer steps."""

    rank: int
    hostname: str
    seq: int
    kind: str
    blocked_for: float | None
    steps: int


def rank_activities(
    number: int, slots: Mapping[str, SlotInfo], workers: Mapping[str, Worker], now: float
) -> list[RankActivity]:
    """What each member of round `number` (`slots`: their places) is doing, from their
    workers' newest heartbeats (`WorkerProgress`): one that has not beaten in this round yet
    is in no collective of it."""
    members = []
    for worker_id, slot in slots.items():
        progress = workers[worker_id].progress
        activity = progress.activity
        if activity is None or progress.round != number:
            steps = activity.steps if activity is not None else 0
            members.append(RankActivity(slot.rank, slot.hostname, 0, "", None, steps))
            continue
        blocked = progress.age(activity.blocked_for, now)
        members.append(
            RankActivity(slot.rank, slot.hostname, activity.seq, activity.kind, blocked,
                         activity.steps)
        )  # fmt: skip
    return members


def _doing(member: RankActivity) -> str:
    if member.seq and member.blocked_for is not None:
        return f"in {member.kind} #{member.seq}"
    return f"not in a collective, last step {member.steps}"


def find_stall(round_: int, members: Sequence[RankActivity], warning: float) -> StallReport | None:
    """The stall of round `round_`, if its ranks blocked longest in one collective have
    waited `warning` seconds or more while some members are not in it; else None."""
    groups: dict[tuple[int, str], list[RankActivity]] = {}
    for member in members:
        if member.seq and member.blocked_for is not None:
            groups.setdefault((member.seq, member.kind), []).append(member)
    if not groups:
        return None

    def weight(key: tuple[int, str]) -> tuple[int, float]:
        waiting = groups[key]
        return len(waiting), max(m.blocked_for or 0.0 for m in waiting)

    key = max(groups, key=weight)
    waiting = groups[key]
    seconds = weight(key)[1]
    missing = [m for m in members if not m.seq or (m.seq, m.kind) != key]
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


def same_stall(one: StallReport, other: StallReport) -> bool:
    """Whether two looks found the same stall: the same round, collective and missing ranks
    (it is logged once, and again when it changes)."""

    def key(stall: StallReport) -> tuple[int, int, str, list[int]]:
        return (
            stall.round,
            stall.collective.seq,
            stall.collective.kind,
            [m.rank for m in stall.missing],
        )

    return key(one) == key(other)
