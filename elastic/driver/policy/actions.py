"""What the policy can ask for: the actions a decision lists, in order, and the decision.

Each action is a frozen value that says what to do, never how: the conductor carries each one
out (one handler per type), so adding an action is one class here and one handler there. A
`Decision` is the actions plus the reason a user reads in the log and in `/v1/status`.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic.driver.policy.causes import Cause
from elastic.driver.policy.view import FleetLoss


@dataclass(frozen=True)
class FormRound:
    """Form the next round with `members`, in rank order, for `why`, and tell the previous
    members; `cause`: what it is for, unless a wanted round's causes say otherwise (`Reform`)."""

    members: tuple[str, ...]
    why: str
    cause: Cause = Cause.JOIN


@dataclass(frozen=True)
class WaitForWorkers:
    """Enter the SHORT phase: fewer than --min-np workers since `since`."""

    since: float


@dataclass(frozen=True)
class FillSlots:
    """Launch workers on the free slots of usable hosts (see `fill_slots`)."""


@dataclass(frozen=True)
class Launch:
    """Start one worker on each (hostname, slot index) of `places`."""

    places: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class AskToLeave:
    """Ask worker `worker_id` to leave at its next commit, for `why` (a `cause` of its own);
    `along`: the others asked to leave with it, none of which can hold its state for it."""

    worker_id: str
    why: str
    cause: Cause = Cause.LEAVE
    along: frozenset[str] = frozenset()


@dataclass(frozen=True)
class StopWorker:
    """Stop worker `worker_id` for good (it never became a member), for `why`."""

    worker_id: str
    why: str


@dataclass(frozen=True)
class HandOver:
    """Worker `worker_id` leaves for `why` once another member holds its newest commit: it
    stays a member until then (see `policy.leaving`)."""

    worker_id: str
    why: str
    cause: Cause = Cause.LEAVE


@dataclass(frozen=True)
class LetGo:
    """Exclude the leaving worker `worker_id` from the job, for `why`, and re-form."""

    worker_id: str
    why: str


@dataclass(frozen=True)
class Finish:
    """End the job with exit `code`; `message` is its last line."""

    code: int
    message: str = ""


@dataclass(frozen=True)
class Log:
    """Tell the user `line` at `level` ("info", "warning" or "error"); it reports `event` (see
    `elastic.driver.logs.tags`), about the worker `worker_id` if one is named."""

    level: str
    line: str
    event: str = "log"
    worker_id: str = ""


@dataclass(frozen=True)
class ShowProgress:
    """Tell the user `line` as a progress line (the caller limits how often)."""

    line: str


@dataclass(frozen=True)
class RecordFleetLoss:
    """Remember that every worker was lost (`loss`): no commit since, or the same loss
    `FLEET_LOSS_REPEATS` times in a row, ends the job."""

    loss: FleetLoss


@dataclass(frozen=True)
class MarkEnded:
    """Record that worker `worker_id` ended: `failed` (its state goes with it) or exited;
    `cause`: why, as the ended workers are counted (`policy.end_causes`)."""

    worker_id: str
    failed: bool
    cause: str = ""


@dataclass(frozen=True)
class MarkExiting:
    """Worker `worker_id` said it exits: judge it by its exit code from now on."""

    worker_id: str


@dataclass(frozen=True)
class TakeOut:
    """Take worker `worker_id` out of the job now, for `why` (its host failed: see
    `FailureScope.HOST`): it hears that round `number` is broken, so that a collective it is
    blocked in fails at once and it asks to join again, and is refused; it is stopped
    (SIGTERM, SIGKILL after --stop-grace). Its exit is no failure of its own."""

    worker_id: str
    why: str
    number: int


@dataclass(frozen=True)
class Signal:
    """Send worker `worker_id`'s process SIGKILL (`kill`) or SIGTERM."""

    worker_id: str
    kill: bool


@dataclass(frozen=True)
class CoolDown:
    """A worker on `hostname` failed for `why`: keep the host out for its cooldown."""

    hostname: str
    why: str


@dataclass(frozen=True)
class BreakRound:
    """Tell every live worker that round `number` is broken, for `why` (once per round)."""

    number: int
    why: str


@dataclass(frozen=True)
class Reform:
    """Ask for the next round, for `why`; `broken`: a member died, and the round waits for
    every survivor to come back to the rendezvous (see `RoundBatcher`); `cause`: what for."""

    why: str
    broken: bool
    cause: Cause


@dataclass(frozen=True)
class Arrived:
    """Member `worker_id` is back at the rendezvous for the round that is wanted."""

    worker_id: str


@dataclass(frozen=True)
class ReformIfStillWaiting:
    """Re-form after one heartbeat interval if round `number` is still the newest then."""

    number: int


@dataclass(frozen=True)
class AdvanceTo:
    """Number the rounds on from `number`: a worker is in it, formed by an earlier driver."""

    number: int


@dataclass(frozen=True)
class BeginFinishing:
    """Training is over: no new round or worker; joiners are stopped, the others end."""


@dataclass(frozen=True)
class SeeIfEnded:
    """Once the actions before it are done: end the job if no member lives (`job_end`)."""


@dataclass(frozen=True)
class SeeHandovers:
    """Once the actions before it are done: let go the leavers whose state is held
    elsewhere (`leaving.handovers`)."""


@dataclass(frozen=True)
class Drain:
    """Mark `hostname` drained by an operator (`drained`), or no longer: a drained host gets
    no new workers. A restarted driver keeps the mark."""

    hostname: str
    drained: bool


Action = (
    FormRound
    | WaitForWorkers
    | FillSlots
    | Launch
    | AskToLeave
    | StopWorker
    | HandOver
    | LetGo
    | Finish
    | Log
    | ShowProgress
    | RecordFleetLoss
    | MarkEnded
    | MarkExiting
    | TakeOut
    | Signal
    | CoolDown
    | BreakRound
    | Reform
    | Arrived
    | ReformIfStillWaiting
    | AdvanceTo
    | BeginFinishing
    | SeeIfEnded
    | SeeHandovers
    | Drain
)


@dataclass(frozen=True)
class Decision:
    """What to do, in order, and why, in words a user reads in the log and the status."""

    actions: tuple[Action, ...]
    reason: str


NOTHING = Decision((), "")
