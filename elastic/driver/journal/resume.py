"""What a driver saves about its job and how a restarted driver takes it up again."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter

from elastic.driver.discovery.hosts import parse_host_list
from elastic.driver.discovery.tracker import HostTracker
from elastic.driver.journal.record import (
    CooldownRecord,
    JobSecret,
    JobSpec,
    JobState,
    WorkerRecord,
)
from elastic.driver.rendezvous.rounds import Rendezvous
from elastic.driver.settings import BackendSettings, Settings
from elastic.driver.workers import Worker, WorkerState

ADOPT_GRACE = 10.0  # seconds a re-adopted worker has to reach the new driver
ENDED_KEPT = 100  # records of ended workers a snapshot keeps (the newest)
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


# Worker fields saved as they are (state and the launcher's pid are converted).
_SAVED = (
    "pid", "exit_code", "registered", "joined", "exiting", "log_dir", "offsets", "commit",
    "handing_over", "leave_reason", "leave_cause",
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


@dataclass
class Tally:
    """The job's counters that outlive its driver."""

    resets: int = 0  # rounds formed after the first
    update_version: int = 0  # membership changes told to workers
    newest_commit: int = 0  # the newest commit count any worker reported


def snapshot(
    rendezvous: Rendezvous,
    workers: Iterable[Worker],
    tracker: HostTracker,
    tally: Tally,
    serial: int,
    finishing: bool,
    wall_offset: float,
) -> bytes:
    """The job's state as saved (`JobState` JSON): the round, live workers, the round's
    members and the newest `ENDED_KEPT` other ended ones, discovery's last answer, cooldowns
    (in wall time: monotonic time plus `wall_offset`), counters (`serial`: the last worker's
    number), and whether training is over."""
    workers = list(workers)
    members = set(rendezvous.members)  # a dead member stays in its round until the next
    ended = [w for w in workers if not w.state.alive and w.worker_id not in members]
    dropped = {id(w) for w in ended[:-ENDED_KEPT]}
    kept = [w for w in workers if id(w) not in dropped]  # in launch order
    state = JobState(
        epoch=rendezvous.epoch,
        members=rendezvous.members,
        workers=[worker_record(w) for w in kept],
        discovered=[f"{h.hostname}:{h.slots}" for h in tracker.discovered_hosts],
        cooldowns=[
            CooldownRecord(hostname=host, failures=failures, until=until + wall_offset)
            for host, (failures, until) in tracker.cooldown.records().items()
        ],
        drained=sorted(tracker.drained),
        serial=serial,
        resets=tally.resets,
        update_version=tally.update_version,
        finishing=finishing,
        newest_commit=tally.newest_commit,
    )
    return state.model_dump_json().encode()


@dataclass
class Resumed:
    """A job as an earlier driver saved it."""

    settings: Settings
    log_root: str
    token: str
    state: JobState
    workers: list[Worker]


SERIAL_GAP = 1000  # worker numbers a restarted driver skips


def resumed(documents: dict[str, bytes], backend: BackendSettings) -> Resumed:
    """Read the saved documents (the saved settings, with this driver's `backend`).

    The dead driver may have launched workers after its last save (etcd down): the serial
    skips `SERIAL_GAP` numbers so that their ids are never given to new workers."""
    spec = JobSpec.model_validate_json(documents["spec"])
    state = JobState.model_validate_json(documents["state"])
    state.serial += SERIAL_GAP
    return Resumed(
        settings=settings_from(spec.settings, backend),
        log_root=spec.log_root,
        token=JobSecret.model_validate_json(documents["secret"]).token,
        state=state,
        workers=[worker_from(record) for record in state.workers],
    )


def restore_hosts(tracker: HostTracker, state: JobState, wall_offset: float, now: float) -> None:
    """Put discovery's last answer, the cooldowns and the drained hosts of `state` back into
    `tracker`."""
    for saved in state.cooldowns:
        tracker.cooldown.restore(saved.hostname, saved.failures, saved.until - wall_offset)
    for hostname in state.drained:
        tracker.drain(hostname, True, now)
    if state.discovered:
        tracker.discovered(parse_host_list(",".join(state.discovered)), now)
