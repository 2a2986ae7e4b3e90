"""The documents a driver saves about its job, as JSON: enough for a restarted driver to resume.

Times are wall-clock (`time.time()`): a restarted driver has a new monotonic clock. The token
is not among them: a restarted driver is given it (`elastic.driver.journal.job_token`) and
checks these documents' MACs with it. No TLS private key is saved either: a restarted driver
re-reads the user's `--tls-key` file (its path is in the saved settings) or makes a new
self-signed certificate, which it publishes, signed with the token, in its `DriverAddress`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator


class JobSpec(BaseModel):
    """What the job runs, where and with which limits (`Settings`, as JSON), and where its
    local workers write their output."""

    job_id: str
    created: float
    settings: dict  # elastic.driver.settings.Settings, dumped by pydantic
    log_root: str


class WorkerRecord(BaseModel):
    worker_id: str
    hostname: str
    host_slot: int
    state: str  # WorkerState's value
    process_id: int | None = None  # the launcher-side process (keeper or ssh client)
    pid: int | None = None  # as the worker reported it
    exit_code: int | None = None
    registered: bool = False
    joined: bool = False
    exiting: bool = False
    log_dir: str | None = None  # where a detached worker's output and exit status go
    offsets: dict[str, int] = Field(default_factory=dict)  # output already shown, per stream
    commit: int = 0  # the state commits the worker had made at its last heartbeat
    handing_over: bool = False  # leaving, but holds the newest commit: stays until passed on
    leave_reason: str = ""  # why it leaves, while it hands its state over
    leave_cause: str = "leave"  # what for (preemption, drain, ...), while it hands it over
    end_cause: str = ""  # why it ended, once it has ("": not said, or saved by an older driver)


class CooldownRecord(BaseModel):
    hostname: str
    failures: int
    until: float


class JobState(BaseModel):
    """The driver's view of the job at one moment. `epoch` is `round`'s deprecated first
    name, saved beside it for drivers and readers that know only it (`elasticrun status
    --json` prints this document when no driver runs the job)."""

    round: int = 0  # the newest round's number
    epoch: int = 0  # deprecated: the same as `round`
    members: list[str] = Field(default_factory=list)  # worker ids in rank order
    workers: list[WorkerRecord] = Field(default_factory=list)
    discovered: list[str] = Field(default_factory=list)  # last good discovery, "host:slots"
    cooldowns: list[CooldownRecord] = Field(default_factory=list)
    drained: list[str] = Field(default_factory=list)  # hosts an operator drained
    serial: int = 0  # worker ids issued so far
    resets: int = 0
    update_version: int = 0
    finishing: bool = False
    newest_commit: int = 0  # the newest commit count any worker reported
    # Ended workers whose records are not among `workers`, counted (none: an older driver
    # saved every record it had, or the newest 100 ended ones)
    ended_by_state: dict[str, int] = Field(default_factory=dict)
    ended_by_cause: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _both_names(cls, data: Any) -> Any:
        """Either name given alone sets both: the driver gives `round`, a document an older
        driver saved has `epoch` alone."""
        if isinstance(data, dict) and ("round" in data) != ("epoch" in data):
            number = data["round"] if "round" in data else data["epoch"]
            return {**data, "round": number, "epoch": number}
        return data


class JobResult(BaseModel):
    code: int
    message: str = ""
    ended: float
