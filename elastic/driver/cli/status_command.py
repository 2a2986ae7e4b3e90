"""`elasticrun status --job-id ID`: a job's state as etcd holds it (never its secret)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from elastic.driver.cli.backend_flags import FlagParser, add_backend_flags, backend_settings
from elastic.driver.errors import UsageError
from elastic.driver.journal.backend import BackendError
from elastic.driver.journal.etcd import EtcdBackend
from elastic.driver.journal.record import JobResult, JobSpec, JobState
from elastic.protocol.etcd import DriverAddress

PUBLIC = ("driver", "spec", "state", "result")  # every document but the lock and the secret


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        prog="elasticrun status",
        description="Show a job's state as saved in etcd: its driver, round, workers, result.",
    )
    add_backend_flags(parser)
    parser.set_defaults(backend="etcd")
    parser.add_argument("--json", action="store_true", help="print the saved documents as JSON")
    return parser


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
        f"round {state.epoch}: {len(state.members)} worker(s); {state.resets} re-rendezvous"
    )
    for worker in sorted(state.workers, key=lambda w: ranks.get(w.worker_id, 1 << 30)):
        rank = ranks.get(worker.worker_id)
        where = f"rank {rank}" if rank is not None else "-"
        code = f" exit {worker.exit_code}" if worker.exit_code is not None else ""
        pid = f" pid {worker.pid}" if worker.pid is not None else ""
        commits = f" commits {worker.commit}" if worker.commit else ""
        lines.append(f"  {where:<8} {worker.worker_id:<28} {worker.state}{pid}{commits}{code}")
    now = time.time()
    for cooldown in state.cooldowns:
        if cooldown.until > now:
            lines.append(
                f"  host {cooldown.hostname} in cooldown for {cooldown.until - now:.0f} s "
                f"({cooldown.failures} failure(s))"
            )
    return "\n".join(lines)


async def _read(backend: EtcdBackend, job_id: str) -> dict[str, bytes]:
    try:
        return await backend.read(job_id)
    finally:
        await backend.close()


def status_main(argv: list[str]) -> int:
    """Exit 0 when the job exists, 1 when it does not or etcd cannot be read, 2 on bad flags."""
    try:
        args = build_parser().parse_args(argv)
        settings = backend_settings(args)
        if settings.etcd is None or settings.job_id is None:
            raise UsageError("elasticrun status needs --job-id and --etcd-endpoints")
        documents = asyncio.run(_read(EtcdBackend(settings.etcd, retry_for=5.0), settings.job_id))
    except UsageError as err:
        print(f"elasticrun status: error: {err}", file=sys.stderr)
        return 2
    except BackendError as err:
        print(f"elasticrun status: error: {err}", file=sys.stderr)
        return 1
    if args.json:
        public = {name: json.loads(documents[name]) for name in PUBLIC if name in documents}
        print(json.dumps({"job_id": settings.job_id, **public}, indent=2))
    else:
        print(describe(settings.job_id, documents))
    return 0 if "spec" in documents else 1
