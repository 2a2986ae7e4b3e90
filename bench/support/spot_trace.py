"""A spot availability trace, scaled to the multi-host bed: which bed host is reclaimed or
allocated when, in seconds of replay.

The trace is a CSV of `ms,live_nodes` rows (from that millisecond on, that many nodes are
alive; rows at one time are one burst: the last one holds). `scale` maps a window of it onto
the bed: a trace hour becomes `hour_s` seconds, and `nodes / trace_nodes * hosts` nodes,
rounded, become hosts (at least 1). `schedule` turns the host counts into changes of named
hosts, the same for every system replayed: a reclaim takes a random live host, an allocation
brings back the host that has been away longest (a fresh machine; never one the job may still
hold in its cooldown). Pure functions: no bed, no clock.
"""

from __future__ import annotations

import bisect
import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bench.support.paths import ROOT

AWS_P3_TRACE = ROOT.parent / "shared" / "data" / "traces" / "aws_p3_spot_availability.csv"
TRACE_NODES = 32  # the AWS p3 trace's most nodes


class TraceError(ValueError):
    """The trace file cannot be used; the message says which row and why."""


@dataclass(frozen=True)
class Change:
    """At `at` s of replay, `host` is reclaimed (it vanishes) or allocated (it comes back)."""

    at: float
    kind: Literal["reclaim", "allocate"]
    host: str


@dataclass(frozen=True)
class Replay:
    """The bed's side of a trace window: the hosts alive at 0 s, then every change."""

    start: tuple[str, ...]
    changes: tuple[Change, ...]
    duration: float
    counts: tuple[tuple[float, int], ...]  # (replay s, hosts alive from then on)

    def alive(self, t: float) -> int:
        """How many hosts the trace offers at `t` s of replay."""
        times = [at for at, _ in self.counts]
        return self.counts[max(0, bisect.bisect_right(times, t) - 1)][1]


def read_trace(path: Path) -> list[tuple[int, int]]:
    """The trace's (ms, live nodes) points, one per time (a burst's last row), in order.
    Raises TraceError for a missing file, a bad header or row, or time going backwards."""
    try:
        text = path.read_text()
    except OSError as err:
        raise TraceError(f"cannot read the trace {path}: {err.strerror}") from None
    rows = csv.reader(text.splitlines())
    if next(rows, None) != ["ms", "live_nodes"]:
        raise TraceError(f"{path}: the first line must be the header `ms,live_nodes`")
    points: dict[int, int] = {}
    last = -1
    for number, row in enumerate(rows, start=2):
        try:
            ms, nodes = (int(field) for field in row)
        except ValueError:
            raise TraceError(f"{path}:{number}: expected `ms,live_nodes` integers: {row}") from None
        if ms < last or nodes < 0:
            raise TraceError(f"{path}:{number}: time goes backwards or nodes < 0: {row}")
        points[ms] = nodes
        last = ms
    if not points:
        raise TraceError(f"{path}: no rows")
    return sorted(points.items())


def scale(
    points: list[tuple[int, int]],
    *,
    hosts: int,
    hour_s: float,
    window_h: tuple[float, float],
    trace_nodes: int = TRACE_NODES,
) -> tuple[list[tuple[float, int]], float]:
    """Host counts over replay time for the trace window `window_h` (trace hours, from, to),
    and the replay's duration in s. Consecutive equal counts are merged."""
    begin, end = (h * 3_600_000 for h in window_h)
    if not 0 <= begin < end:
        raise TraceError(f"the window {window_h} must be 0 <= from < to hours")
    if begin >= points[-1][0]:
        raise TraceError(f"the window starts after the trace ends ({points[-1][0] / 3.6e6:.2f} h)")
    counts: list[tuple[float, int]] = []
    for index, (ms, nodes) in enumerate(points):
        following = points[index + 1][0] if index + 1 < len(points) else math.inf
        if following <= begin or ms >= end:
            continue  # over before the window, or after it
        at = max(0.0, (ms - begin) / 3_600_000 * hour_s)
        count = max(1, math.floor(nodes * hosts / trace_nodes + 0.5))
        if counts and counts[-1][0] == at:
            counts.pop()
        if not counts or counts[-1][1] != count:
            counts.append((at, count))
    return counts, (min(end, points[-1][0]) - begin) / 3_600_000 * hour_s


def schedule(
    counts: list[tuple[float, int]], duration: float, names: list[str], seed: int
) -> Replay:
    """Name the hosts behind `counts` (at most len(names) alive at once); `seed` picks the
    reclaimed ones, so every system replays the same changes."""
    rng = random.Random(seed)
    start_count = counts[0][1]
    if start_count > len(names) or any(count > len(names) for _, count in counts):
        raise TraceError(f"the scaled trace needs more hosts than the bed's {len(names)}")
    alive = list(names[:start_count])
    away = {name: -math.inf for name in names[start_count:]}  # since when
    changes: list[Change] = []
    for at, count in counts[1:]:
        while len(alive) > count:
            host = alive.pop(rng.randrange(len(alive)))
            away[host] = at
            changes.append(Change(at, "reclaim", host))
        while len(alive) < count:
            host = min(away, key=lambda name: (away[name], names.index(name)))
            del away[host]
            alive.append(host)
            changes.append(Change(at, "allocate", host))
    return Replay(tuple(names[:start_count]), tuple(changes), duration, tuple(counts))
