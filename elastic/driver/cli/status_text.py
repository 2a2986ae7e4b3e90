"""A running job's status as a few lines a person reads (`elasticrun status`). Pure."""

from __future__ import annotations

import time

from elastic.protocol.http import HostStatus, JobStatus, RoundRecord, WorkerStatus

ROUNDS_SHOWN = 5
DECISIONS_SHOWN = 5
CAUSES_SHOWN = 5  # the most frequent causes of ended workers named; the rest are summed


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _clock(unix: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(unix))


def _host(host: HostStatus, now: float) -> str:
    state = host.state
    if host.until is not None and host.state in ("cooldown", "leaving"):
        state += f" for {max(0.0, host.until - now):.0f} s"
    return f"{host.hostname} ({host.slots} slot{'s' if host.slots != 1 else ''}, {state})"


def _worker(worker: WorkerStatus) -> list[str]:
    rank = "-" if worker.rank is None else str(worker.rank)
    if worker.state not in ("launching", "member", "leaving"):
        how = worker.end_cause or (None if worker.exit_code is None else f"exit {worker.exit_code}")
        return [rank, worker.hostname, worker.state + (f" ({how})" if how else ""), "", "", "", ""]
    rate = "-" if worker.step_rate is None else f"{worker.step_rate:.2f}"
    collective = "-"
    if worker.collective is not None:
        c = worker.collective
        collective = f"{c.kind} #{c.seq}"
        if c.blocked_for is not None:
            collective += f", waiting {c.blocked_for:.1f} s"
    return [
        rank, worker.hostname, worker.state, rate, _seconds(worker.commit_age),
        _seconds(worker.heartbeat_age), collective,
    ]  # fmt: skip


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]  # fmt: skip


def _round(entry: RoundRecord) -> str:
    legs = []
    if entry.noticed_to_formed is not None:
        legs.append(f"failure to round {entry.noticed_to_formed:.2f} s")
    if entry.formed_to_first_step is not None:
        legs.append(f"round to first step {entry.formed_to_first_step:.2f} s")
    recovery = f" ({', '.join(legs)})" if legs else ""
    return (
        f"  {entry.number:>4}  {_clock(entry.formed_at)}  size {entry.size}  {entry.cause}"
        f"{recovery}: {entry.reason}"
    )


def ended_line(status: JobStatus) -> str | None:
    """ "ended workers: 214 (212 signal SIGKILL, 2 stopped); the newest 32 listed", or None
    when no worker ended."""
    if not status.ended_total:
        return None
    causes = sorted(status.ended_by_cause.items(), key=lambda item: (-item[1], item[0]))
    named = [f"{count} {cause}" for cause, count in causes[:CAUSES_SHOWN]]
    if rest := sum(count for _, count in causes[CAUSES_SHOWN:]):
        named.append(f"{rest} other")
    listed = sum(1 for w in status.workers if w.state not in ("launching", "member", "leaving"))
    shown = "" if listed >= status.ended_total else f"; the newest {listed} listed"
    return f"ended workers: {status.ended_total} ({', '.join(named)}){shown}"


def standbys_line(status: JobStatus) -> str | None:
    """ "standbys: localhost (ready), h2 (starting); 3 taken so far", or None when the job
    has none and took none."""
    if not status.standbys and not status.standbys_taken:
        return None
    waiting = ", ".join(
        f"{s.hostname} ({'ready' if s.ready else 'starting'})" for s in status.standbys
    )
    return f"standbys: {waiting or 'none now'}; {status.standbys_taken} taken so far"


def render(status: JobStatus, now: float | None = None) -> str:
    """The job's round and size, hosts, workers, stall, newest rounds and decisions, URLs."""
    now = time.time() if now is None else now
    lines = [f"job {status.job_id}: round {status.round}, {status.size} worker(s) in it"]
    if status.urls is not None:
        u = status.urls
        lines.append(f"  api {u.api}  metrics {u.metrics}  page {u.page}")
    lines.append("hosts: " + (", ".join(_host(h, now) for h in status.hosts) or "none"))
    order = sorted(status.workers, key=lambda w: (w.rank is None, w.rank or 0, w.worker_id))
    if order:
        header = ["rank", "host", "state", "steps/s", "commit age", "heartbeat", "collective"]
        lines += _table([header, *(_worker(w) for w in order)])
    if (ended := ended_line(status)) is not None:
        lines.append(ended)
    if (standbys := standbys_line(status)) is not None:
        lines.append(standbys)
    if status.stall is not None:
        lines.append(f"STALL: {status.stall.line}")
    if status.durable is not None:
        stale = " (stale: the last write failed)" if status.durable.stale else ""
        lines.append(f"durable commits: newest {status.durable.newest}{stale}")
    if status.rounds:
        lines.append("rounds (newest last):")
        lines += [_round(r) for r in status.rounds[-ROUNDS_SHOWN:]]
    if status.decisions:
        lines.append("decisions (newest last):")
        lines += [
            f"  {_clock(d.time)}  round {d.round}: {d.reason}"
            for d in status.decisions[-DECISIONS_SHOWN:]
        ]
    return "\n".join(lines)
