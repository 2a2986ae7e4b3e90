"""Churn never accumulates: after thousands of replaced workers the driver's status, saved
state, metrics and memory are what they were after hundreds.

The driver's real parts replace SIGKILLed workers in this process (`ChurningDriver`: only
the worker processes are simulated). Sizes and counts are compared, which are
deterministic; the time of one status build only as a loose ratio (bench/ has timings).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from elastic.driver.journal.record import JobState
from elastic.driver.reports import DurableStale, Heard, LeaveAsked
from elastic.driver.worker_history import WorkerHistory
from elastic.driver.workers import Worker, WorkerState
from tests.support.churning_driver import ChurningDriver
from tests.support.policy_views import LV, F, M, S, X, worker

REPLACEMENTS = 5_000
EARLY = 500
KEPT = 32
SIZE = 4


@dataclass(frozen=True)
class Look:
    """What the driver holds after some replacements."""

    status_bytes: int
    listed: int
    ended_listed: int
    ended_total: int
    ended_by_cause: dict[str, int]
    ended_by_state: dict[str, int]
    state_bytes: int
    state_records: int
    scrape_bytes: int
    memory: int  # bytes allocated (tracemalloc), after a collection
    build_s: float  # the fastest of several status builds


def look(driver: ChurningDriver) -> Look:
    gc.collect()
    memory = tracemalloc.get_traced_memory()[0]
    status = driver.status()
    builds = []
    for _ in range(15):
        started = time.perf_counter()
        driver.status()
        builds.append(time.perf_counter() - started)
    state = driver.saved_state()
    return Look(
        status_bytes=len(status.model_dump_json()),
        listed=len(status.workers),
        ended_listed=sum(1 for w in status.workers if w.state == "failed"),
        ended_total=status.ended_total,
        ended_by_cause=status.ended_by_cause,
        ended_by_state=status.ended_by_state,
        state_bytes=len(state),
        state_records=len(JobState.model_validate_json(state).workers),
        scrape_bytes=len(driver.scrape()),
        memory=memory,
        build_s=min(builds),
    )


@pytest.fixture
def quiet_driver() -> Iterator[None]:
    """The driver logs an error per death: 5,000 of them would be kept by pytest's log
    capture (and counted by tracemalloc)."""
    logger = logging.getLogger("elasticrun")
    logger.disabled = True
    yield
    logger.disabled = False


@pytest.mark.e2e  # no process of its own, but 20 s of churn: kept out of the fast layer
def test_five_thousand_replacements_leave_status_state_metrics_and_memory_flat(
    quiet_driver: None,
) -> None:
    async def churn() -> tuple[Look, Look]:
        driver = ChurningDriver(SIZE, history=KEPT)
        await driver.start()
        tracemalloc.start()
        try:
            for _ in range(EARLY):
                await driver.replace_one()
            early = look(driver)
            for _ in range(REPLACEMENTS - EARLY):
                await driver.replace_one()
            late = look(driver)
        finally:
            tracemalloc.stop()
            await driver.close()
        return early, late

    early, late = asyncio.run(churn())
    # Every death is counted, by cause and state, though only the newest are listed.
    assert (early.ended_total, late.ended_total) == (EARLY, REPLACEMENTS)
    assert late.ended_by_cause == {"signal SIGKILL": REPLACEMENTS}
    assert late.ended_by_state == {"failed": REPLACEMENTS}
    assert early.ended_listed == late.ended_listed == KEPT
    assert early.listed == late.listed == SIZE + KEPT
    assert early.state_records == late.state_records == SIZE + KEPT
    # What is served and saved stays the same size (a few digits grow: worker ids, counts).
    assert late.status_bytes <= early.status_bytes * 1.05
    assert late.state_bytes <= early.state_bytes * 1.05
    assert late.scrape_bytes <= early.scrape_bytes * 1.05
    # A record kept per worker costs kilobytes: 4,500 more would be megabytes.
    assert late.memory - early.memory < 256 * 1024, (early.memory, late.memory)
    assert late.build_s < early.build_s * 5 + 0.005  # loose: the machine is shared


def test_a_saved_state_keeps_the_counts_of_the_workers_it_does_not_list(
    quiet_driver: None,
) -> None:
    async def churn() -> bytes:
        driver = ChurningDriver(SIZE, history=3)
        await driver.start()
        for _ in range(20):
            await driver.replace_one()
        await driver.close()
        return driver.saved_state()

    state = JobState.model_validate_json(asyncio.run(churn()))
    listed = [w for w in state.workers if w.state == "failed"]
    assert len(listed) == 3 and all(w.end_cause == "signal SIGKILL" for w in listed)
    assert state.ended_by_cause == {"signal SIGKILL": 17}
    assert state.ended_by_state == {"failed": 17}
    assert sum(1 for w in state.workers if w.state == "member") == SIZE


def test_a_report_about_a_worker_whose_record_was_dropped_is_no_error(quiet_driver: None) -> None:
    """A worker's heartbeat or leave, made while it lived, may be heard after its death and
    the drop of its record (--worker-history 0)."""

    async def churn() -> tuple[dict[str, int], int]:
        driver = ChurningDriver(SIZE, history=0)
        await driver.start()
        first = driver.rendezvous.members[0]
        await driver.replace_one()
        assert first not in driver.fleet.workers
        for report in (Heard(first, 1, 5), LeaveAsked(first, "SIGTERM", 5),
                       DurableStale(first, True, 0)):  # fmt: skip
            driver.conductor.hear(report)
        await driver.replace_one()  # and the job goes on
        await driver.close()
        return driver.status().ended_by_cause, driver.conductor.tally.newest_commit

    causes, newest_commit = asyncio.run(churn())
    assert causes == {"signal SIGKILL": 2}
    assert newest_commit == 0  # nothing taken from the dead one


def test_a_state_saved_before_ended_workers_were_counted_still_loads() -> None:
    """An older driver saved every ended record (up to 100), without counts or causes."""
    older = (
        b'{"round": 3, "members": ["h[0]#3"], "workers": ['
        b'{"worker_id": "h[0]#1", "hostname": "h", "host_slot": 0, "state": "failed", '
        b'"exit_code": 137}, '
        b'{"worker_id": "h[0]#2", "hostname": "h", "host_slot": 0, "state": "stopped"}, '
        b'{"worker_id": "h[0]#3", "hostname": "h", "host_slot": 0, "state": "member"}], '
        b'"serial": 3}'
    )
    state = JobState.model_validate_json(older)
    assert (state.ended_by_state, state.ended_by_cause) == ({}, {})
    records: dict[str, Worker] = {}
    for record in state.workers:
        records[record.worker_id] = worker(record.worker_id, WorkerState(record.state),
                                           exit_code=record.exit_code)  # fmt: skip
    history = WorkerHistory(records, kept=1)
    history.restore(state.ended_by_state, state.ended_by_cause)
    counts = history.counts()
    assert counts.by_cause == {"signal SIGKILL": 1, "stopped": 1}
    assert counts.by_state == {"failed": 1, "stopped": 1}


# --- what may be dropped ------------------------------------------------------------------


def ended(worker_id: str, state: WorkerState, at: float, **fields) -> Worker:
    record = worker(worker_id, state, exit_code=fields.pop("exit_code", 1), **fields)
    record.ended_at = at
    return record


def test_only_the_newest_ended_records_are_kept_and_every_ended_one_is_counted() -> None:
    records = {
        w.worker_id: w
        for w in [
            ended("a", F, at=5.0, end_cause="hung"),  # launched first, ended last
            ended("b", F, at=1.0, end_cause="signal SIGKILL"),
            ended("c", X, at=2.0, end_cause="left", exit_code=0),
            worker("d", M),
            ended("e", S, at=3.0),
        ]
    }
    history = WorkerHistory(records, kept=2)
    gone = history.retire(in_use=())
    assert [w.worker_id for w in gone] == ["b", "c"]  # the two that ended first
    assert list(records) == ["a", "d", "e"]
    counts = history.counts()
    assert counts.total == 4
    assert counts.by_cause == {"hung": 1, "signal SIGKILL": 1, "left": 1, "stopped": 1}
    assert counts.by_state == {"failed": 2, "exited": 1, "stopped": 1}


def test_live_workers_members_and_workers_still_being_stopped_are_never_dropped() -> None:
    stopping = worker("stopping", S, exit_code=None)  # SIGTERMed, not yet seen to exit
    dead_member = ended("dead-member", F, at=1.0)  # its round lasts until the next forms
    records = {
        w.worker_id: w
        for w in [worker("live", M), worker("leaving", LV), stopping, dead_member,
                  ended("x", F, at=2.0)]
    }  # fmt: skip
    history = WorkerHistory(records, kept=0)
    assert [w.worker_id for w in history.retire(in_use={"dead-member"})] == ["x"]
    assert set(records) == {"live", "leaving", "stopping", "dead-member"}
    assert history.counts().total == 3  # x, dropped; the dead member and the stopped one
