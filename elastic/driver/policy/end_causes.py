"""Why a worker ended, in a word or two: what `/v1/status`, the page and the metrics count
ended workers by (`ended_by_cause`). Pure.

A cause is one of the words below, `"exit N"` (it exited with code N, not 0) or `"signal
NAME"` (a signal ended it). The set of causes a job can show is small and fixed (the words,
exit codes 1-255, signal names), so they make bounded Prometheus labels.
"""

from __future__ import annotations

import signal

from elastic.driver.policy.liveness import Verdict
from elastic.driver.workers import Worker, WorkerState

FINISHED = "finished"  # exited 0 at training's end
LEFT = "left"  # left the job (asked to, its host drained, removed or preempted), any exit code
STOPPED = "stopped"  # stopped by the driver: taken out with its host, not needed, the job ended
NOT_STARTED = "not started"  # its process could not be started
STALLED = "stalled"  # kept its round waiting past --stall-timeout, and was killed
UNREACHABLE = "unreachable"  # its host was cut off from its peers, and it was killed
EXITED = "exited"  # exited 0 (a record that does not say more: saved by an older driver)
FAILED = "failed"  # failed, how unknown (a record saved by an older driver)

_VERDICTS = {
    Verdict.HUNG: "hung",  # missed heartbeats, and was killed
    Verdict.STREAM_CLOSED: "stream closed",  # closed its control stream without exiting
    Verdict.NOT_JOINED: "not joined",  # did not join within --start-timeout
    Verdict.LINGERING: LEFT,  # (a lingering leaver is only sent SIGTERM)
}


def signal_of(worker: Worker) -> int | None:
    """The signal that ended `worker`, known or read from its exit code (negative, as
    asyncio gives it, or 128+N, as a shell or keeper does)."""
    number = worker.process.signal if worker.process is not None else None
    code = worker.exit_code
    if number is None and code is not None and code < 0:
        number = -code
    elif number is None and code is not None and 128 < code < 160:
        number = code - 128
    return number


def of_exit(worker: Worker) -> str:
    """The cause of `worker`'s death by its exit: `"signal NAME"` or `"exit N"`."""
    number = signal_of(worker)
    if number is not None:
        try:
            return f"signal {signal.Signals(number).name}"
        except ValueError:
            return f"signal {number}"
    return f"exit {worker.exit_code}" if worker.exit_code is not None else FAILED


def of_verdict(verdict: Verdict) -> str:
    """The cause of a death the liveness watch declared (`verdict`)."""
    return _VERDICTS[verdict]


def end_cause(worker: Worker) -> str:
    """Why the ended `worker` ended: the cause the driver recorded (`Worker.end_cause`), else
    (a record an older driver saved) what its state and exit code say."""
    if worker.end_cause:
        return worker.end_cause
    if worker.state is WorkerState.STOPPED:
        return STOPPED
    if worker.state is WorkerState.EXITED:
        return EXITED
    return of_exit(worker) if worker.exit_code is not None else FAILED
