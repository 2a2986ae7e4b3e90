"""Goodput of one replayed trace: what a job did against what an ideal system would have done
with the same hosts, and where the difference went. Pure functions over rank 0's step lines.

Work is counted in rank-steps: a step at size N trains N batches, so it counts N. An ideal
system trains every offered host from the moment the trace offers it to the moment it is
reclaimed, at the steady step time of its size, `T(N)`; it does

    ideal = integral over the replay of  alive(t) / T(alive(t))  dt

rank-steps. `T(N)` is the fastest median step time measured at size N among the systems
replayed (`ideal_step_times`). A job's useful work counts each step that survived: a step
redone after a rollback counts once, at its last doing (`on_lineage`). Goodput is useful over
ideal. The difference is split by cause over the intervals between rank 0's consecutive step
lines (`account`):

* `rollback`: the interval ended in a step that was later undone;
* `reform`: no step for over `STALL_FACTOR` times the step's ideal time: a re-form, a restart,
  the wait for a failure to be noticed;
* `left_on_notice`: hosts that left on a preemption notice, before their reclaim;
* `not_yet_joined`: other offered hosts outside the job (one being started, or not used);
* `step_time`: the rest, steps slower (positive) or faster (negative) than `T(N)`;
* `end`: the unfinished step when the replay ended.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

STALL_FACTOR = 2.0
CAUSES = ("reform", "rollback", "left_on_notice", "not_yet_joined", "step_time", "end")


@dataclass(frozen=True)
class StepLine:
    """Rank 0's line for one step: done at `t` s of replay, the job then at `size`."""

    t: float
    step: int
    size: int
    pid: int


@dataclass
class Ledger:
    """Rank-steps: ideal, useful, lost by cause (they add up: ideal = useful + lost)."""

    ideal: float
    useful: float
    done: float  # useful plus what was rolled back
    losses: dict[str, float] = field(default_factory=dict)

    @property
    def goodput(self) -> float:
        return self.useful / self.ideal if self.ideal else 0.0


def step_times(steps: Sequence[StepLine]) -> dict[int, float]:
    """The median time of a step at each size: the gaps between consecutive steps (k, k+1)
    by one process at one size. Sizes never seen twice in a row are absent."""
    gaps: dict[int, list[float]] = {}
    for before, after in zip(steps, steps[1:], strict=False):
        if (after.pid, after.size, after.step) == (before.pid, before.size, before.step + 1):
            gaps.setdefault(after.size, []).append(after.t - before.t)
    return {size: statistics.median(values) for size, values in gaps.items()}


def ideal_step_times(
    measured: Sequence[dict[int, float]], sizes: Sequence[int]
) -> dict[int, float]:
    """For each of `sizes`, the fastest of the `measured` step times; a size nobody ran
    takes the nearest measured size's (the larger on a tie). Raises ValueError if nothing
    was measured."""
    best: dict[int, float] = {}
    for times in measured:
        for size, seconds in times.items():
            best[size] = min(seconds, best.get(size, seconds))
    if not best:
        raise ValueError("no step time was measured at any size")
    return {
        size: best[size] if size in best else best[min(best, key=lambda m: (abs(m - size), -m))]
        for size in sizes
    }


def on_lineage(steps: Sequence[StepLine]) -> list[bool]:
    """For each line: does its step survive? A step done again later was rolled back, as
    was any step above the last line's."""
    last_doing = {line.step: index for index, line in enumerate(steps)}
    final = steps[-1].step if steps else 0
    return [
        line.step <= final and last_doing[line.step] == index for index, line in enumerate(steps)
    ]


def integrate(f: Callable[[float], float], a: float, b: float, breaks: Sequence[float]) -> float:
    """The integral over [a, b] of `f`, constant between the sorted `breaks`."""
    inner = breaks[bisect.bisect_right(breaks, a) : bisect.bisect_left(breaks, b)]
    edges = [a, *inner, b]
    return sum(f((x + y) / 2) * (y - x) for x, y in zip(edges, edges[1:], strict=False) if y > x)


def account(
    steps: Sequence[StepLine],
    *,
    duration: float,
    alive: Callable[[float], int],
    changes_at: Sequence[float],
    step_time: dict[int, float],
    notices: Sequence[tuple[float, float]] = (),
) -> Ledger:
    """The ledger of one replay of `duration` s: `steps` are rank 0's lines in time order
    (those outside [0, duration] are ignored), `alive(t)` the hosts offered at t,
    `changes_at` the times it changes, `step_time` T(N) for every N `alive` takes, and
    `notices` the (notice, reclaim) times of hosts told to leave."""
    steps = [line for line in steps if 0.0 <= line.t <= duration]
    kept = on_lineage(steps)
    breaks = sorted({*changes_at, *(t for pair in notices for t in pair)})

    def rate(t: float) -> float:
        return alive(t) / step_time[alive(t)]

    def noticed(t: float) -> int:
        return sum(1 for notice, reclaim in notices if notice <= t < reclaim)

    ledger = Ledger(
        ideal=integrate(rate, 0.0, duration, breaks),
        useful=sum(line.size for line, keep in zip(steps, kept, strict=True) if keep),
        done=sum(line.size for line in steps),
        losses=dict.fromkeys(CAUSES, 0.0),
    )
    start = 0.0
    for line, keep in zip(steps, kept, strict=True):
        ideal = integrate(rate, start, line.t, breaks)
        credit = line.size if keep else 0
        if not keep:
            ledger.losses["rollback"] += ideal
        elif line.t - start > STALL_FACTOR * step_time.get(line.size, step_time[alive(line.t)]):
            ledger.losses["reform"] += ideal - credit
        else:
            size = line.size

            def outside(t: float, size: int = size) -> float:
                return max(0, alive(t) - size) / step_time[alive(t)]

            def left(t: float, size: int = size) -> float:
                return min(max(0, alive(t) - size), noticed(t)) / step_time[alive(t)]

            unused = integrate(outside, start, line.t, breaks)
            early = integrate(left, start, line.t, breaks)
            ledger.losses["left_on_notice"] += early
            ledger.losses["not_yet_joined"] += unused - early
            ledger.losses["step_time"] += ideal - credit - unused
        start = line.t
    tail = integrate(rate, start, duration, breaks)
    last_size = steps[-1].size if steps else 0
    long_tail = not steps or duration - start > STALL_FACTOR * step_time.get(last_size, 0.0)
    ledger.losses["reform" if long_tail else "end"] += tail
    return ledger
