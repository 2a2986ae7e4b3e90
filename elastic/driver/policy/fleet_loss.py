"""When every worker of the job is lost: end the job, or start new workers from the hosts. Pure."""

from __future__ import annotations

import signal

from elastic.driver.policy.actions import (
    Decision,
    FillSlots,
    Finish,
    Log,
    RecordFleetLoss,
    WaitForWorkers,
)
from elastic.driver.policy.end_causes import signal_of
from elastic.driver.policy.view import FleetLoss, JobView
from elastic.driver.workers import Worker, WorkerState

FLEET_LOSS_REPEATS = 3  # the same loss of every worker, this many times in a row, ends the job
LOST_EXIT = 255  # ssh's code for a host it lost, and a detached worker's with no exit status


def fleet_lost(view: JobView, last: Worker, now: float) -> Decision:
    """`last` failed, and no other worker is alive. The job ends with `last`'s exit code when
    new workers could only fail the same way:

    * no commit was made since the job started, or since every worker was last lost (a
      script that fails before its first commit), and some failure was an exit with an error
      (a fleet lost only to signals, lost hosts and hangs, as spot hosts are, before it could
      commit again is started again: a replacement preempted while it starts is no crash
      loop; the third rule below bounds it);
    * every worker whose failure lost the fleet (`lost_with`) exited with an error code (an
      exception, `sys.exit(n)`; not a signal, a lost host or a hang: `exited_with_error`);
    * the same loss (the same exits at the same step, `FleetLoss.alike`) happened
      `FLEET_LOSS_REPEATS` times in a row.

    Otherwise (a fleet lost to preemption: signals, vanished hosts, hangs) it starts again on
    the offered hosts within --elastic-timeout, saying that the state is lost, or, with
    --checkpoint-dir, that the new workers resume from the newest durable commit."""
    elastic = view.elastic
    assert elastic is not None
    commit, previous = view.newest_commit, view.fleet_loss
    code = last.exit_code or 1
    failures = lost_with(view, last)
    no_progress = commit == 0 or (previous is not None and commit == previous.commit)
    if no_progress and any(exited_with_error(w) for w in failures):
        since = "since the last such loss" if commit else "since the job started"
        message = f"every worker of the job failed, with no commit {since}"
        return Decision((Finish(code, message),), message)
    exits = tuple(sorted({how_lost(w) for w in failures}))
    if all(exited_with_error(w) for w in failures):
        message = (
            f"every worker of the job exited with an error ({', '.join(exits)}): the job "
            "ends instead of starting new workers that would fail the same way (their output "
            "says why)"
        )
        return Decision((Finish(code, message),), message)
    loss = FleetLoss(commit, exits, commit - (previous.commit if previous is not None else 0))
    if previous is not None and loss.alike(previous):
        loss = FleetLoss(loss.commit, loss.exits, loss.progress, previous.times + 1)
    if loss.times >= FLEET_LOSS_REPEATS:
        message = (
            f"every worker of the job was lost the same way {loss.times} times in a row "
            f"({', '.join(exits)}, {loss.progress} commit(s) after they started): the job ends "
            "instead of starting new workers again"
        )
        return Decision((Finish(code, message),), message)
    if view.checkpoint_dir:
        state = f"new workers resume from the newest durable commit in {view.checkpoint_dir}"
    else:
        state = f"its training state (commit {commit}) is lost with them"
    reason = (
        f"every worker of the job failed: {state}; starting new workers on the offered hosts "
        f"(up to {elastic.elastic_timeout:g} s, --elastic-timeout)"
    )
    waiting = () if view.short_since is not None else (WaitForWorkers(now),)
    return Decision((Log("warning", reason), RecordFleetLoss(loss), *waiting, FillSlots()), reason)


def lost_with(view: JobView, last: Worker) -> list[Worker]:
    """The workers whose failures lost the fleet: the current round's failed members, and
    `last`. Workers taken out with a failed host (stopped) are not among them."""
    failed = [
        w
        for w in (view.workers[m] for m in view.members)
        if w.state is WorkerState.FAILED and w is not last
    ]
    return [*failed, last]


def how_lost(worker: Worker) -> str:
    """How a failed `worker` ended, in a few words: by a signal, with an exit code, or not
    yet (declared dead: hung, silent, stalled, and being killed)."""
    number = signal_of(worker)
    if number is not None:
        try:
            return f"killed by signal {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    if worker.exit_code is None:
        return "declared dead"
    return f"exit code {worker.exit_code}"


def exited_with_error(worker: Worker) -> bool:
    """Whether `worker` ended by exiting with an error code of its own: not by a signal, not
    declared dead, not with `LOST_EXIT` (ssh lost its host; no exit status was left)."""
    code = worker.exit_code
    return signal_of(worker) is None and code not in (None, 0, LOST_EXIT)
