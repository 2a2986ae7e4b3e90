"""What watching a job costs the driver: one status build (on the event loop) and one
`/metrics` text made from it (off the loop, in a thread), at several job sizes.

    python -m bench run observe_cost

For each size (workers, all members, 4 per host, each with a heartbeat's progress) it builds
the driver's real `describe_job` status, its JSON (a page poll) and the real `JobMetrics` text
from it (a scrape), and reports the median of repeated runs in milliseconds. The heartbeat's
progress bookkeeping that feeds them is measured beside it, in microseconds per beat. JSON on
stdout and in bench/results/observe_cost.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from bench.support.paths import RESULTS
from bench.support.provenance import command_line, git_state
from elastic.driver.observe.prometheus import JobMetrics
from elastic.driver.observe.timeline import RoundTimeline
from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.server.status import describe_job
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol.beats import Activity
from elastic.protocol.http import HostStatus

SIZES = (4, 100, 1000, 10000)
PER_HOST = 4
RESULT_FILE = RESULTS / "observe_cost.json"


def _job(size: int) -> tuple[Rendezvous, list[Worker], list[HostStatus], RoundTimeline]:
    workers = [
        Worker(f"h{n // PER_HOST}[{n % PER_HOST}]#{n + 1}", f"h{n // PER_HOST}", n % PER_HOST,
               None, state=WorkerState.MEMBER, last_heartbeat=99.5, commit=40)
        for n in range(size)
    ]  # fmt: skip
    for step, worker in enumerate(workers):
        for second in range(3):
            beat = Activity(steps=10 * second + step % 3, samples=320 * second, commit_age=0.4,
                            seq=7, kind="allreduce", blocked_for=0.001)  # fmt: skip
            worker.progress.heard(beat, 2, 97.0 + second)
    rendezvous = Rendezvous()
    rendezvous.form([(w.worker_id, w.hostname) for w in workers])
    rendezvous.form([(w.worker_id, w.hostname) for w in workers])
    hosts = [HostStatus(hostname=f"h{k}", slots=PER_HOST) for k in range(size // PER_HOST)]
    timeline = RoundTimeline(lambda: 100.0)
    for number in (1, 2):
        timeline.formed(number, size, "start" if number == 1 else "failure", "why")
    return rendezvous, workers, hosts, timeline


def _median_ms(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 3)


def _median_us(work, repeats: int) -> float:
    """Mean microseconds of `work` over `repeats` calls (too short to time one by one)."""
    start = time.perf_counter()
    for _ in range(repeats):
        work()
    return round((time.perf_counter() - start) / repeats * 1e6, 2)


def measure(size: int) -> dict[str, float | int]:
    rendezvous, workers, hosts, timeline = _job(size)

    def status():
        return describe_job("bench", rendezvous, workers, hosts, [], now=100.0,
                            rounds=timeline.records())  # fmt: skip

    metrics = JobMetrics()
    repeats = max(5, 2000 // size)
    built = status()
    beat = Activity(steps=31, samples=960, commit_age=0.2, seq=8, kind="allreduce")
    worker = workers[0]
    return {
        "workers": size,
        "status_build_ms": _median_ms(status, repeats),
        "status_json_ms": _median_ms(built.model_dump_json, repeats),
        "metrics_text_ms": _median_ms(lambda: metrics.exposition(built, {}, 0.0), repeats),
        "metrics_bytes": len(metrics.exposition(built, {}, 0.0)),
        "beat_progress_us": _median_us(lambda: worker.progress.heard(beat, 2, 101.0), 5000),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None; it takes none)."""
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    rows = [measure(size) for size in SIZES]
    doc = {
        "benchmark": "observe_cost",
        "command": command_line("observe_cost", argv),
        "python": platform.python_version(),
        "git": git_state(),
        "what": "median ms of one status build, its JSON, and one /metrics answer; "
        "microseconds of one heartbeat's progress bookkeeping",
        "sizes": rows,
    }
    RESULT_FILE.parent.mkdir(parents=True, exist_ok=True)
    RESULT_FILE.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
