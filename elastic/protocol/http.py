"""Request and response bodies of the driver's HTTP API (`/v1/...`).

Byte values travel base64-encoded inside JSON; nothing on the wire is pickled.

Words: a membership generation is a *round*. The worker protocol's fields that carry a
round number keep their first wire names (`epoch`, `after_epoch`): renaming them would break
every worker and driver of another version for nothing. `JobStatus` (read by people and their
scripts) says `round`, and keeps `epoch` beside it, deprecated, with the same value.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_ROUND = (1 << 53) - 1  # the largest integer that every JSON parser reads exactly
MAX_PID = (1 << 31) - 1  # pid_t
MAX_COMMIT = MAX_ROUND
MAX_KEY_LENGTH = 1024
MAX_VALUE_BYTES = 4 * 1024 * 1024
MAX_KEYS_PER_REQUEST = 1024
MAX_WAIT_SECONDS = 3600.0
WORKER_ID_MAX_LENGTH = 255

KeyName = Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH)]
RoundNumber = Annotated[int, Field(ge=0, le=MAX_ROUND)]  # on the wire: `epoch`
Base64 = Annotated[str, Field(max_length=(MAX_VALUE_BYTES * 4) // 3 + 4, description="base64")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorResponse(Strict):
    detail: str


# --- rendezvous ---------------------------------------------------------------------------


class SlotInfo(Strict):
    """One worker's place in a round; the same fields Horovod's SlotInfo has."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


class JoinRequest(Strict):
    """Join the first round newer than `after_epoch` (0 at start) that includes the worker."""

    worker_id: str = Field(min_length=1, max_length=WORKER_ID_MAX_LENGTH)
    after_epoch: RoundNumber = 0
    pid: int = Field(default=0, ge=0, le=MAX_PID)
    timeout: float = Field(default=30.0, ge=0.0, le=MAX_WAIT_SECONDS)
    commit: int = Field(default=0, ge=0, le=MAX_COMMIT)
    """How many state commits the worker's snapshot holds (0: none, a fresh worker)."""


class JoinResponse(Strict):
    """`formed`: the round (`epoch`) and `slot` are the worker's; `pending`: no such round
    formed within the timeout (ask again); `not_member`: the worker was excluded from the job
    and must exit.

    `job_commit` is the newest commit count any worker of the job has reported: when the
    members of a round hold less, a commit was lost with the workers that held it."""

    status: Literal["formed", "pending", "not_member"]
    epoch: int = 0
    slot: SlotInfo | None = None
    job_commit: int = 0


# --- warm standbys -----------------------------------------------------------------------


class StandbyWaitRequest(Strict):
    """A warm standby waits up to `timeout` seconds for a worker's slot to run in."""

    standby_id: str = Field(min_length=1, max_length=WORKER_ID_MAX_LENGTH)
    timeout: float = Field(default=30.0, ge=0.0, le=MAX_WAIT_SECONDS)


class StandbyAnswer(Strict):
    """`run`: become the worker whose whole environment is `env` and run the job's command
    (the standby was started for it); `pending`: nothing yet (ask again); `exit`: this driver
    does not want the standby (the job ends, its host went, or a restarted driver never
    started it): exit 0."""

    status: Literal["run", "pending", "exit"]
    env: dict[str, str] | None = None


# --- key-value store (the torch.distributed.Store operations) -----------------------------


class KeyRequest(Strict):
    epoch: RoundNumber
    key: KeyName


class SetRequest(KeyRequest):
    value: Base64


class GetRequest(KeyRequest):
    timeout: float = Field(default=0.0, ge=0.0, le=MAX_WAIT_SECONDS)


class ValueResponse(Strict):
    value: Base64


class AddRequest(KeyRequest):
    amount: int = Field(ge=-(1 << 62), le=1 << 62)


class AddResponse(Strict):
    value: int


class CompareSetRequest(KeyRequest):
    expected: Base64
    desired: Base64


class KeysRequest(Strict):
    epoch: RoundNumber
    keys: list[KeyName] = Field(max_length=MAX_KEYS_PER_REQUEST)


class WaitRequest(KeysRequest):
    timeout: float = Field(default=0.0, ge=0.0, le=MAX_WAIT_SECONDS)


class CheckResponse(Strict):
    ready: bool


class DeleteResponse(Strict):
    deleted: bool


class RoundRequest(Strict):
    epoch: RoundNumber


class CountResponse(Strict):
    count: int


# --- the page's logins ----------------------------------------------------------------------


class LoginCode(Strict):
    """A one-time login link to the driver's page (`POST /v1/login-codes`)."""

    url: str = Field(description="<api>/ui/login?code=...: opens the page, once")
    expires_in: float = Field(description="seconds the link stays usable")


# --- status ---------------------------------------------------------------------------------


class HostStatus(Strict):
    hostname: str
    slots: int
    state: Literal["active", "cooldown", "leaving", "drained"] = Field(
        default="active",
        description="active: usable; cooldown: excluded after a failure until `until`; "
        "leaving: a preemption notice says it goes at `until` (None: soon); drained: an "
        "operator took it out (`elasticrun drain`) until it is undrained",
    )
    until: float | None = Field(
        default=None, description="Unix seconds: the cooldown's end or the notice's deadline"
    )


class CollectiveStatus(Strict):
    """The collective a worker issued last in its round (`seq` counts them alike on every
    rank of the round), and whether it is blocked in it now."""

    seq: int = Field(description="the collective's number in the round, from 1")
    kind: str = Field(description="allreduce, allgather, broadcast, gradients, ...")
    blocked_for: float | None = Field(
        default=None, description="seconds it has waited in it so far; None: not waiting"
    )


class WorkerStatus(Strict):
    worker_id: str
    rank: int | None = Field(description="rank in the current round; None when not a member")
    hostname: str
    local_rank: int | None
    state: str = Field(description="launching | member | leaving | exited | failed | stopped")
    pid: int | None = None
    exit_code: int | None = None
    steps: int = Field(default=0, description="optimizer steps this process has taken")
    step_rate: float | None = Field(
        default=None, description="optimizer steps per second lately (None: not measured yet)"
    )
    sample_rate: float | None = Field(
        default=None, description="samples per second lately, as its ElasticSampler counts"
    )
    commit: int = Field(default=0, description="state commits this worker has made")
    commit_age: float | None = Field(
        default=None, description="seconds since its last commit (None: none yet)"
    )
    durable_age: float | None = Field(
        default=None, description="seconds since it last wrote a durable commit (None: never)"
    )
    heartbeat_age: float | None = Field(
        default=None, description="seconds since its last heartbeat reached the driver"
    )
    collective: CollectiveStatus | None = None
    end_cause: str | None = Field(
        default=None,
        description="an ended worker's cause, as `JobStatus.ended_by_cause` counts it (\"signal "
        'SIGKILL", "exit 1", "hung", "left", "stopped", ...); None while it lives',
    )


class DecisionRecord(Strict):
    """One decision of the driver's re-forming policy, with its reason in words."""

    time: float  # seconds since the Unix epoch
    round: int  # the round that was current when the decision was taken
    reason: str


class DurableStatus(Strict):
    """The job's durable commits (`--checkpoint-dir`), as the workers' heartbeats say."""

    newest: int = Field(description="the newest commit written to the directory (0: none yet)")
    stale: bool = Field(
        description="the last write failed: the durable copy lags the job (the writing "
        "worker's log says why)"
    )


class RoundRecord(Strict):
    """One formed round: when, how big, why, and how long the job took to recover."""

    number: int
    formed_at: float = Field(description="Unix seconds")
    size: int
    cause: str = Field(
        description="what the re-form was for: start, failure, join, leave, preemption, "
        "drain, discovery, partition, driver-restart (several: the first one's)"
    )
    reason: str = Field(description="the driver's words")
    noticed_to_formed: float | None = Field(
        default=None, description="seconds from the failure noticed to this round formed"
    )
    formed_to_first_step: float | None = Field(
        default=None, description="seconds from this round formed to its first step"
    )


class StalledRank(Strict):
    rank: int
    hostname: str
    doing: str = Field(description='"in allgather #12", or "not in a collective, last step 7"')


class StallReport(Strict):
    """Ranks of one round that are not all in the same collective for too long."""

    round: int
    collective: CollectiveStatus = Field(description="what the waiting ranks wait in")
    waiting: list[int] = Field(description="the ranks waiting in it")
    missing: list[StalledRank] = Field(description="the ranks not in it")
    seconds: float = Field(description="how long the waiting ranks have waited")
    line: str = Field(description="the line the driver logged")


class StandbyStatus(Strict):
    """A warm standby waiting on a host (see docs/launcher.md#warm-standbys)."""

    standby_id: str
    hostname: str
    pid: int | None = Field(description="its process (the keeper's with --backend etcd)")
    ready: bool = Field(description="its imports are done: a refilled slot may take it")


class DriverUrls(Strict):
    api: str
    metrics: str
    page: str


class JobStatus(Strict):
    """The job as `/v1/status` shows it. Give `round`; `epoch` (deprecated) follows it, and
    a reader of an older driver's answer, which has only `epoch`, gets `round` from it."""

    job_id: str
    round: int = 0
    epoch: int = Field(default=0, description="deprecated: the same as `round`")
    size: int
    hosts: list[HostStatus]
    workers: list[WorkerStatus]  # the live ones, and the newest ended ones (--worker-history)
    ended_total: int = Field(default=0, description="workers that ended since the job began")
    ended_by_state: dict[str, int] = Field(
        default_factory=dict, description="ended workers by state: exited, failed, stopped"
    )
    ended_by_cause: dict[str, int] = Field(
        default_factory=dict,
        description="ended workers by cause (see `WorkerStatus.end_cause`), listed or not",
    )
    decisions: list[DecisionRecord] = []  # the newest last, at most 50
    durable: DurableStatus | None = None  # None: no durable commits (no --checkpoint-dir)
    rounds: list[RoundRecord] = []  # the newest last, at most 100
    stall: StallReport | None = None  # the current stall, if any
    log_tail: list[str] = []  # the launcher's newest log lines, at most 200
    urls: DriverUrls | None = None
    standbys: list[StandbyStatus] = []  # waiting now (--standby)
    standbys_taken: int = Field(default=0, description="standbys that became workers")

    @model_validator(mode="after")
    def _one_round_number(self) -> JobStatus:
        if self.round != self.epoch:
            self.round = self.epoch = self.round or self.epoch
        return self


# --- operations -------------------------------------------------------------------------------


class DrainResponse(Strict):
    hostname: str
    drained: bool
    message: str = Field(description="what happens now, in words")


class StopResponse(Strict):
    message: str
