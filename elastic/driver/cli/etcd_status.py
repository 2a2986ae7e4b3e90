"""A job's state as etcd holds it, for `elasticrun status` when no driver runs it (never its
secret)."""

from __future__ import annotations

import time

from elastic.driver.journal.record import JobResult, JobSpec, JobState
from elastic.protocol.etcd import DriverAddress

PUBLIC = ("driver", "spec", "state", "result")  # every document but the lock and the secret


def describe(job_id: str, documents: dict[str, bytes]) -> str:
    """A few lines a person reads: who runs the job, its round and workers, how it ended."""
    if "spec" not in documents:
        return f"job {job_id}: no such job"
    spec = JobSpec.model_validate_json(documents["spec"])
    command = " ".join(spec.settings["command"])
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(spec.created))
    lines = [f"job {job_id}: {command} (started {started})"]
    if "result" in documents:
        result = JobResult.model_validate_json(documents["result"])
        lines.append(
            f"ended with exit code {result.code}" + (f": {result.message}" * bool(result.message))
        )
    elif "driver" in documents:
        driver = DriverAddress.model_validate_json(documents["driver"])
        lines.append(f"running: driver pid {driver.pid} on host {driver.host}, {driver.url}")
    else:
        lines.append(
            "no driver: it died; run the same elasticrun command with "
            f"--job-id {job_id} to take the job up again"
        )
    state = JobState.model_validate_json(documents.get("state", b"{}"))
    ranks = {worker_id: rank for rank, worker_id in enumerate(state.members)}
    lines.append(
        f"round {state.round}: {len(state.members)} worker(s); {state.resets} re-rendezvous"
    )
    for worker in sorted(state.workers, key=lambda w: ranks.get(w.worker_id, 1 << 30)):
        rank = ranks.get(worker.worker_id)
        where = f"rank {rank}" if rank is not None else "-"
        code = f" exit {worker.exit_code}" if worker.exit_code is not None else ""
        pid = f" pid {worker.pid}" if worker.pid is not None else ""
        commits = f" commits {worker.commit}" if worker.commit else ""
        lines.append(f"  {where:<8} {worker.worker_id:<28} {worker.state}{pid}{commits}{code}")
    if dropped := sum(state.ended_by_cause.values()):
        causes = sorted(state.ended_by_cause.items(), key=lambda item: (-item[1], item[0]))
        counted = ", ".join(f"{count} {cause}" for cause, count in causes)
        lines.append(f"  and {dropped} older ended worker(s): {counted}")
    now = time.time()
    for cooldown in state.cooldowns:
        if cooldown.until > now:
            lines.append(
                f"  host {cooldown.hostname} in cooldown for {cooldown.until - now:.0f} s "
                f"({cooldown.failures} failure(s))"
            )
    return "\n".join(lines)
