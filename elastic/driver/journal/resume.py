"""What a driver saves about its job and how a restarted driver takes it up again."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from pydantic import TypeAdapter

from elastic.driver.journal.record import WorkerRecord
from elastic.driver.settings import BackendSettings, Settings
from elastic.driver.workers import Worker, WorkerState

ADOPT_GRACE = 10.0  # seconds a re-adopted worker has to reach the new driver
_SETTINGS = TypeAdapter(Settings)


def settings_document(settings: Settings) -> dict:
    """`settings` as JSON data, without the backend options (each driver has its own)."""
    return _SETTINGS.dump_python(settings, mode="json", exclude={"backend"})


def settings_from(document: dict, backend: BackendSettings) -> Settings:
    return _SETTINGS.validate_python({**document, "backend": backend})


def holder_description(driver_id: str) -> str:
    """Who claims a job: enough for a later driver to tell whether this one still runs."""
    return json.dumps(
        {"driver_id": driver_id, "host": socket.gethostname(), "pid": os.getpid(),
         "since": time.time()}
    )  # fmt: skip


def holder_alive(holder: bytes) -> bool:
    """Whether the driver described by `holder` may still run. On this host: its process
    still runs `elasticrun`. On another host it cannot be told: assumed alive (its claim
    expires with its lease)."""
    try:
        found = json.loads(holder)
        host, pid = found["host"], int(found["pid"])
    except (ValueError, KeyError, TypeError):
        return True
    if host != socket.gethostname():
        return True
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"elastic" in command and pid != os.getpid()


def describe_holder(holder: str) -> str:
    try:
        found = json.loads(holder)
        since = time.strftime("%H:%M:%S", time.localtime(found["since"]))
        return f"the driver with pid {found['pid']} on host {found['host']} (since {since})"
    except (ValueError, KeyError, TypeError):
        return "another driver"


def default_log_root(job_id: str) -> str:
    """Where detached local workers write their output and exit status."""
    return str(Path(os.environ.get("TMPDIR", "/tmp")) / f"elasticrun-{job_id}")


# Worker fields saved as they are (state and the launcher's pid are converted).
_SAVED = (
    "pid", "exit_code", "registered", "joined", "exiting", "log_dir", "offsets", "commit",
    "handing_over", "leave_reason",
)  # fmt: skip


def worker_record(worker: Worker) -> WorkerRecord:
    """What is saved of `worker`."""
    return WorkerRecord(
        worker_id=worker.worker_id,
        hostname=worker.hostname,
        host_slot=worker.host_slot,
        state=worker.state.value,
        process_id=worker.launcher_pid,
        **{name: getattr(worker, name) for name in _SAVED},
    )


def worker_from(record: WorkerRecord) -> Worker:
    """The worker `record` describes, without a process yet (see `worker_record`)."""
    worker = Worker(record.worker_id, record.hostname, record.host_slot, process=None)
    worker.state = WorkerState(record.state)
    worker.launcher_pid = record.process_id
    for name in _SAVED:
        setattr(worker, name, getattr(record, name))
    return worker
