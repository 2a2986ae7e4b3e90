"""The control service's calls as the driver takes them: liveness on the worker's record,
what needs a decision reported to the job, anything from an unknown or dead worker refused."""

from __future__ import annotations

import asyncio

import pytest

from elastic.driver.control.channels import ControlChannels
from elastic.driver.control.inputs import WorkerInputs
from elastic.driver.reports import Heard, LeaveAsked, Report
from elastic.driver.workers import Worker
from tests.support.policy_views import LV, F, L, M, S, X, worker

ROUND = 4  # the driver's newest round


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def inputs(*workers: Worker) -> tuple[WorkerInputs, asyncio.Queue[Report], Clock]:
    reports: asyncio.Queue[Report] = asyncio.Queue()
    clock = Clock()
    records = {w.worker_id: w for w in workers}
    return WorkerInputs(records, ControlChannels(), reports, lambda: ROUND, clock), reports, clock


def drained(reports: asyncio.Queue[Report]) -> list[Report]:
    found = []
    while not reports.empty():
        found.append(reports.get_nowait())
    return found


@pytest.mark.parametrize("state", [None, X, F, S], ids=["unknown", "exited", "failed", "stopped"])
def test_calls_of_an_unknown_or_dead_worker_are_refused_and_change_nothing(state) -> None:
    records = [] if state is None else [worker("w", state)]
    job, reports, _ = inputs(*records)
    assert job.registered("w", 321) is False
    assert job.heartbeat("w", ROUND + 1, 7) is False
    assert job.leave("w", "SIGTERM", 7) is False
    assert job.stream_opened("w") is None
    assert drained(reports) == []
    for record in records:
        assert (record.registered, record.pid, record.last_heartbeat) == (False, None, 0.0)


@pytest.mark.parametrize("state", [L, M, LV])
def test_register_and_heartbeat_record_liveness_on_the_worker(state) -> None:
    record = worker("w", state)
    job, _, clock = inputs(record)
    assert job.registered("w", 321) is True
    assert (record.registered, record.pid, record.last_heartbeat) == (True, 321, 100.0)
    clock.now = 103.5
    assert job.heartbeat("w", ROUND, 0) is True
    assert record.last_heartbeat == 103.5


@pytest.mark.parametrize(
    ("number", "commit", "heard"),
    [
        (ROUND, 5, False),  # nothing new
        (ROUND - 1, 5, False),  # an older round: the worker has not joined the newest yet
        (ROUND, 6, True),  # a new commit
        (ROUND, 4, True),  # a changed one (rolled back)
        (ROUND + 1, 5, True),  # a round this driver did not form (an earlier one, unsaved)
    ],
)
def test_a_heartbeat_is_reported_only_when_it_says_something_new(number, commit, heard) -> None:
    job, reports, _ = inputs(worker("w", M, commit=5))
    assert job.heartbeat("w", number, commit) is True
    assert drained(reports) == ([Heard("w", number, commit)] if heard else [])


def test_leave_is_reported_with_its_reason_and_commit() -> None:
    job, reports, _ = inputs(worker("w", M, commit=5))
    assert job.leave("w", "SIGTERM", 6) is True
    assert drained(reports) == [LeaveAsked("w", "SIGTERM", 6)]


def test_a_stream_closing_is_recorded_and_reopening_clears_it() -> None:
    record = worker("w", M)
    job, _, clock = inputs(record)
    stream = job.stream_opened("w")
    assert stream is not None
    clock.now = 101.0
    job.stream_closed("w", stream)
    assert record.stream_closed_at == 101.0
    assert job.stream_opened("w") is not None
    assert record.stream_closed_at is None


def test_an_older_stream_closing_after_a_reconnect_leaves_the_new_one_open() -> None:
    record = worker("w", M)
    job, _, _ = inputs(record)
    old = job.stream_opened("w")
    new = job.stream_opened("w")
    assert old is not None and new is not None and old is not new
    job.stream_closed("w", old)
    assert record.stream_closed_at is None
    job.stream_closed("w", new)
    assert record.stream_closed_at == 100.0
