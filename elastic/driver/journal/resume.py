"""What a driver saves about its job and how a restarted driver takes it up again.

A restarted driver acts on nothing it read from etcd before `check_saved` passed: the token it
was given must match the job's `token_check`, and `spec` and `state` must carry their MACs
under that token (`elastic.protocol.etcd_trust`). Else it refuses, in one line, having run
nothing.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter

from elastic.driver.discovery.hosts import parse_host_list
from elastic.driver.discovery.tracker import HostTracker
from elastic.driver.errors import LaunchError
from elastic.driver.journal.job_token import HOW, GivenToken
from elastic.driver.journal.record import (
    CooldownRecord,
    JobSpec,
    JobState,
    WorkerRecord,
)
from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.settings import BackendSettings, Settings
from elastic.driver.worker_history import EndedCounts, has_ended
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol.etcd import LEGACY_SECRET, SEALED, mac_key
from elastic.protocol.etcd_trust import document_authentic, token_matches

ADOPT_GRACE = 10.0  # seconds a re-adopted worker has to reach the new driver
ENDED_KEPT = 100  # records of ended workers a snapshot keeps at most (the newest)
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
    "handing_over", "leave_reason", "leave_cause", "end_cause",
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
    ended: EndedCounts | None = None,
) -> bytes:
    """The job's state as saved (`JobState` JSON): the round, live workers, the round's
    members and the newest `ENDED_KEPT` other ended ones, the ended workers not among them
    counted (`ended`: those whose records the driver dropped already), discovery's last
    answer, cooldowns (in wall time: monotonic time plus `wall_offset`), counters (`serial`:
    the last worker's number), and whether training is over."""
    workers = list(workers)
    members = set(rendezvous.members)  # a dead member stays in its round until the next
    ended_records = [w for w in workers if has_ended(w) and w.worker_id not in members]
    left_out = ended_records[:-ENDED_KEPT] if ENDED_KEPT else ended_records
    dropped = {id(w) for w in left_out}
    kept = [w for w in workers if id(w) not in dropped]  # in launch order
    counts = (ended or EndedCounts()).plus(left_out)
    state = JobState(
        round=rendezvous.round,
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
        ended_by_state=dict(counts.by_state),
        ended_by_cause=dict(counts.by_cause),
    )
    return state.model_dump_json().encode()


class SavedJobRefused(LaunchError):
    """What etcd holds of a job cannot be trusted with the token given: a wrong token, a
    document changed by someone other than the job's driver, a job saved by an older version.
    The message is one line that names the key and what to do."""


def check_saved(
    documents: dict[str, bytes], job_id: str, token: GivenToken, key_of: Callable[[str], str]
) -> None:
    """Raise `SavedJobRefused` unless `token` is job `job_id`'s and `spec` and `state` carry
    valid MACs under it (`key_of(name)`: where document `name` lives, for the message)."""
    check = documents.get("token_check")
    if check is None and LEGACY_SECRET in documents:
        raise SavedJobRefused(
            f"job {job_id} was saved by an older elasticrun, which kept its token in etcd in "
            f"clear ({key_of(LEGACY_SECRET)}) and did not authenticate what the job runs: "
            "this version does not take it up; finish it with the version that started it, "
            "or delete its keys and start it again (see docs/security.md)"
        )
    if check is None:
        raise SavedJobRefused(
            f"job {job_id} has no {key_of('token_check')} in etcd: its keys were not all "
            "written by its driver; refusing to take it up (nothing was run). `elasticrun "
            f"status --saved --job-id {job_id}` shows what etcd holds"
        )
    if not token_matches(token.token, job_id, check):
        raise SavedJobRefused(
            f"the token from {token.source} is not job {job_id}'s (it does not match "
            f"{key_of('token_check')}): {HOW}"
        )
    for name in SEALED:
        value = documents.get(name)
        if value is None or not document_authentic(
            token.token, job_id, name, value, documents.get(mac_key(name))
        ):
            raise SavedJobRefused(
                f"job {job_id}'s {name} in etcd ({key_of(name)}) does not verify with the "
                "job's token: someone other than its driver changed it, so nothing was run. "
                f"Find who can write {key_of('')} in etcd (`elasticrun status --saved "
                f"--job-id {job_id}` shows what it holds), then delete the job's keys and "
                "start it again"
            )


@dataclass
class Resumed:
    """A job as an earlier driver saved it."""

    settings: Settings
    log_root: str
    token: str
    state: JobState
    workers: list[Worker]


SERIAL_GAP = 1000  # worker numbers a restarted driver skips


def resumed(
    documents: dict[str, bytes],
    backend: BackendSettings,
    job_id: str,
    token: GivenToken,
    key_of: Callable[[str], str],
) -> Resumed:
    """Read the saved documents (the saved settings, with this driver's `backend`), once
    `check_saved` passed (else `SavedJobRefused`).

    The dead driver may have launched workers after its last save (etcd down): the serial
    skips `SERIAL_GAP` numbers so that their ids are never given to new workers."""
    check_saved(documents, job_id, token, key_of)
    spec = JobSpec.model_validate_json(documents["spec"])
    state = JobState.model_validate_json(documents["state"])
    state.serial += SERIAL_GAP
    return Resumed(
        settings=settings_from(spec.settings, backend),
        log_root=spec.log_root,
        token=token.token,
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
