"""What a trial's step lines tell: the first step that meets a condition, steady training,
when each milestone of a phase came, how long the incumbents stalled, and the summary of a
metric over trials. Pure functions of the lines `Output` collected (`trial_processes`).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable

from bench.support.trial_processes import PID, Output, Step


def first_step(steps: list[Step], accept: Callable[[Step], bool]) -> Step | None:
    """The first of `steps` that `accept` takes; None when none does."""
    return next((s for s in steps if accept(s)), None)


def steady(size: int, after: Step, count: int) -> Callable[[Output], Step | None]:
    """At least `count` steps past `after` at `size`, rank 1 among them: the latest line of
    rank 1 at `size`."""

    def check(out: Output) -> Step | None:
        mine = [s for s in out.steps if s.size == size and s.t >= after.t]
        if mine and max(s.step for s in mine) >= after.step + count:
            return next((s for s in reversed(mine) if s.rank == 1), None)
        return None

    return check


def milestones(
    out: Output, spec: list[tuple[str, str, str]], since: float, old_pids: set[int] = frozenset()
) -> dict[str, float | None]:
    """Seconds from `since` to the first line after it matching each milestone's pattern,
    ignoring the lines of workers in `old_pids` (a group that torchrun restarts)."""
    found: dict[str, float | None] = {}
    with out.cond:
        lines = list(out.lines)
    for label, pattern, stamp in spec:
        regex = re.compile(pattern)
        when = None
        for line in lines:
            t = line.stamp if stamp == "worker" and line.stamp is not None else line.arrived
            pid = PID.search(line.text)
            if pid and int(pid[1]) in old_pids:
                continue
            if t >= since and regex.search(line.text):
                when = round(t - since, 3)
                break
        found[label] = when
    return found


def incumbent_stall(out: Output, t_add: float, size: int = 3) -> tuple[float | None, float | None]:
    """(longest gap between consecutive steps of the incumbents' ranks 0 .. size - 2 from
    their last step before `t_add` to their first step at `size`, median gap at `size` - 1
    before `t_add`)."""
    worst, gaps_before = None, []
    with out.cond:
        steps = list(out.steps)
    for rank in range(size - 1):
        times = sorted(s.t for s in steps if s.rank == rank)
        grown = first_step(steps, lambda s, r=rank: s.size == size and s.rank == r and s.t >= t_add)
        before = [t for t in times if t < t_add]
        if grown is None or not before:
            continue
        window = [t for t in times if before[-1] <= t <= grown.t]
        gap = max(b - a for a, b in zip(window, window[1:], strict=False))
        worst = gap if worst is None else max(worst, gap)
        small = [s.t for s in steps if s.rank == rank and s.size == size - 1 and s.t < t_add]
        small = sorted(small)[-40:]
        gaps_before += [b - a for a, b in zip(small, small[1:], strict=False)]
    return worst, (statistics.median(gaps_before) if gaps_before else None)


def summarize(values: list[float]) -> dict[str, float | int]:
    """Median, min and max of a metric over trials (rounded to ms), and how many there were."""
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }
