"""What the sharded recovery benchmark reads off its workloads' lines: step time over a window
of steps, the `metric` and `phase` lines (`bench/workloads/sharded_elastic.py`), where a
recovery's time went, and host memory against the `(1 + r)` bound. Pure functions of the
lines `Output` collected (`trial_processes`)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bench.support.trial_processes import Output, Step

READING = re.compile(
    r"\b(metric|phase) (\w+) (-?\d+(?:\.\d+)?) rank (-?\d+) pid (\d+) t (\d+\.\d+)"
)


@dataclass(frozen=True)
class Reading:
    kind: str  # "metric" or "phase"
    name: str
    value: float
    rank: int
    pid: int
    t: float


def readings(out: Output, kind: str, name: str | None = None) -> list[Reading]:
    """Every `kind` line (of `name`, when given), in arrival order."""
    found = []
    with out.cond:
        lines = list(out.lines)
    for line in lines:
        if (m := READING.search(line.text)) and m[1] == kind and name in (None, m[2]):
            found.append(Reading(m[1], m[2], float(m[3]), int(m[4]), int(m[5]), float(m[6])))
    return found


def mean_step_s(steps: Iterable[Step], rank: int, first: int, last: int) -> float | None:
    """The mean time between `rank`'s step k - 1 and step k for k in `first..last` (the gap
    of step k holds whatever ran after step k - 1: a commit taken after it included); None
    when no such gap was seen."""
    times = {s.step: s.t for s in steps if s.rank == rank}
    gaps = [
        times[k] - times[k - 1] for k in range(first, last + 1) if k in times and k - 1 in times
    ]
    return statistics.fmean(gaps) if gaps else None


def phase_seconds(out: Output, since: float, until: float) -> dict[str, float]:
    """Seconds spent in each phase between `since` and `until`: summed per process, the
    slowest process' sum."""
    per_pid: dict[tuple[str, int], float] = {}
    for r in readings(out, "phase"):
        if since <= r.t <= until:
            per_pid[(r.name, r.pid)] = per_pid.get((r.name, r.pid), 0.0) + r.value
    worst: dict[str, float] = {}
    for (name, _), seconds in per_pid.items():
        worst[name] = round(max(worst.get(name, 0.0), seconds), 3)
    return worst


def metric_values(out: Output, name: str, since: float = 0.0, until: float = 1e20) -> list[float]:
    return [r.value for r in readings(out, "metric", name) if since <= r.t <= until]


def memory(out: Output, replicas: int, until: float) -> dict[str, Any]:
    """Host memory per rank (MiB) before `until`, each figure the largest over the ranks:
    its share of the state (`share_mib`: its rows of the parameters and Adam's moments),
    resident memory at rest (just before the last commit) and at its peak from the second
    commit on (sampled every 10 ms), and what the commits held at rest and at the peak, as a
    multiple of the share, beside the bound `1 + replicas`.

    The training's own memory (`live_mib`) is estimated from the resident memory before the
    first commit after the quiet steps (`base_mib`), when the state holds only commit 0,
    taken before Adam had state: `(1 + replicas)` copies of the parameters' share."""
    by_pid: dict[int, dict[str, list[float]]] = {}
    for r in readings(out, "metric"):
        if r.t <= until:
            by_pid.setdefault(r.pid, {}).setdefault(r.name, []).append(r.value)
    ranks = []
    for values in by_pid.values():
        needed = ("share_mib", "param_share_mib", "base_mib", "rest_mib", "peak_mib")
        if not all(values.get(key) for key in needed) or len(values["peak_mib"]) < 2:
            continue
        share = values["share_mib"][0]
        live = values["base_mib"][0] - (1 + replicas) * values["param_share_mib"][0]
        rest, peak = values["rest_mib"][-1], max(values["peak_mib"][1:])
        ranks.append(
            {
                "share_mib": share,
                "live_mib": live,
                "rest_mib": rest,
                "peak_mib": peak,
                "held_at_rest_x_share": (rest - live) / share,
                "held_at_peak_x_share": (peak - live) / share,
            }
        )
    if not ranks:
        return {}
    found: dict[str, Any] = {key: round(max(rank[key] for rank in ranks), 2) for key in ranks[0]}
    found["bound_x_share"] = 1 + replicas
    found["ranks"] = len(ranks)
    return found
