"""The driver's liveness verdicts: pure, from worker records and the time."""

from __future__ import annotations

import pytest

from elastic.driver.policy.liveness import (
    MISSED_HEARTBEATS,
    Ending,
    Limits,
    Verdict,
    ending,
    judge,
)
from elastic.driver.workers import Worker, WorkerState

LIMITS = Limits(heartbeat_interval=1.0, stop_grace=5.0, start_timeout=30.0)
STARTED = object()  # stands for a started process: judge only asks whether there is one


def worker(**fields) -> Worker:
    record = Worker("w", "host", 0, process=STARTED)  # type: ignore[arg-type]
    record.state = WorkerState.MEMBER
    record.registered = True
    record.joined = True
    record.last_heartbeat = 100.0
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def verdict(record: Worker, now: float) -> Verdict | None:
    found = judge([record], now, LIMITS)
    return found[0][1] if found else None


def test_a_healthy_worker_gets_no_verdict() -> None:
    assert verdict(worker(), 100.5) is None


def test_missed_heartbeats_make_a_worker_hung_only_after_three_intervals() -> None:
    assert verdict(worker(), 100.0 + MISSED_HEARTBEATS * 1.0) is None
    assert verdict(worker(), 100.0 + MISSED_HEARTBEATS * 1.0 + 0.01) is Verdict.HUNG


def test_a_worker_neither_registered_nor_heard_nor_joined_is_not_judged_by_heartbeats() -> None:
    unknown = worker(registered=False, joined=False, last_heartbeat=0.0, launched_at=99.0)
    assert verdict(unknown, 100.0) is None


def test_a_worker_that_joined_unregistered_and_unheard_is_judged_by_heartbeats() -> None:
    """Re-adopted from a record saved before it registered (so neither registered nor heard
    here), it then joined a round of this driver: it registered with the earlier driver, so
    heartbeats are due from it; stopped before any reached this driver, it must be hung."""
    adopted = worker(registered=False, heard=False, joined=True)
    assert verdict(adopted, 100.0 + MISSED_HEARTBEATS * 1.0) is None
    assert verdict(adopted, 100.0 + MISSED_HEARTBEATS * 1.0 + 0.01) is Verdict.HUNG


def test_a_worker_heard_before_it_registers_is_judged_by_heartbeats() -> None:
    """After a driver restart a worker's heartbeats may come back before its event stream
    registers; if it then stops (SIGSTOP, a hang), it must still be found hung."""
    silent = worker(registered=False, heard=True)
    assert verdict(silent, 100.0 + MISSED_HEARTBEATS * 1.0 + 0.01) is Verdict.HUNG


def test_a_closed_stream_waits_for_the_exit_for_the_grace_period() -> None:
    closed = worker(stream_closed_at=100.0, last_heartbeat=105.0)  # heartbeats go on
    assert verdict(closed, 104.0) is None  # closed 4 s ago: it may still exit by itself
    assert verdict(closed, 105.5) is Verdict.STREAM_CLOSED


def test_a_worker_that_said_it_exits_is_left_alone() -> None:
    assert verdict(worker(exiting=True, stream_closed_at=0.0, last_heartbeat=0.0), 100.0) is None


def test_a_leaving_worker_lingering_past_the_grace_is_reported() -> None:
    leaving = worker(state=WorkerState.LEAVING, stream_closed_at=100.0, last_heartbeat=0.0)
    assert verdict(leaving, 104.0) is None
    assert verdict(leaving, 105.5) is Verdict.LINGERING


def test_a_worker_that_never_joins_fails_the_start_timeout() -> None:
    late = worker(state=WorkerState.LAUNCHING, joined=False, registered=False, launched_at=0.0)
    assert verdict(late, 29.0) is None
    assert verdict(late, 30.5) is Verdict.NOT_JOINED


@pytest.mark.parametrize("state", [WorkerState.EXITED, WorkerState.FAILED, WorkerState.STOPPED])
def test_ended_workers_are_never_judged(state: WorkerState) -> None:
    assert verdict(worker(state=state, last_heartbeat=0.0), 1000.0) is None


def test_a_worker_not_yet_started_is_never_judged() -> None:
    assert verdict(worker(process=None, joined=False, launched_at=0.0), 1000.0) is None


def test_hung_wins_over_a_closed_stream() -> None:
    assert verdict(worker(stream_closed_at=100.0, last_heartbeat=90.0), 106.0) is Verdict.HUNG


@pytest.mark.parametrize(
    ("fields", "unwatched", "expected"),
    [
        ({"state": WorkerState.STOPPED, "exit_code": 143}, False, Ending.IGNORED),
        ({"state": WorkerState.FAILED, "exit_code": 137}, False, Ending.IGNORED),
        ({"state": WorkerState.LEAVING, "exit_code": 0}, False, Ending.LEFT),
        ({"state": WorkerState.LEAVING, "exit_code": 1}, False, Ending.LEFT),
        # a leaver still handing its state over is a member until then
        (
            {"state": WorkerState.LEAVING, "handing_over": True, "exit_code": 1},
            False,
            Ending.FAILED,
        ),
        (
            {"state": WorkerState.LEAVING, "handing_over": True, "exit_code": 0},
            False,
            Ending.FINISHED,
        ),
        ({"exit_code": 0}, False, Ending.FINISHED),
        ({"exit_code": 0}, True, Ending.LEFT_UNSEEN),
        ({"exit_code": 0, "exiting": True}, True, Ending.FINISHED),  # it said so first
        ({"exit_code": 127, "registered": False}, False, Ending.CANNOT_RUN),
        ({"exit_code": 126, "registered": False}, False, Ending.CANNOT_RUN),
        ({"exit_code": 127}, False, Ending.FAILED),  # its script's own 127, once running
        ({"exit_code": 137}, False, Ending.FAILED),
        ({"state": WorkerState.LAUNCHING, "exit_code": 1}, False, Ending.FAILED),
    ],
)
def test_what_an_exit_means(fields: dict, unwatched: bool, expected: Ending) -> None:
    assert ending(worker(**fields), unwatched) is expected
