"""The conductor hears reports and carries out the policy's decisions on real driver parts.

Real rendezvous, control channels, round keeper, fleet records and host watcher; the worker
processes are stand-ins (`Process`) that record the signals they get: nothing is launched.
"""

from __future__ import annotations

import asyncio
import random
import signal

import pytest

from elastic.driver.conductor import Conductor
from elastic.driver.control.channels import ControlChannels
from elastic.driver.control.events import HostsUpdated, RoundBroken
from elastic.driver.discovery import FixedHosts, HostTracker
from elastic.driver.discovery.cooldown import Cooldown
from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.discovery.watcher import HostWatcher
from elastic.driver.launch.fleet import Fleet
from elastic.driver.launch.host_access import HostAccess
from elastic.driver.launch.ssh import SshOptions
from elastic.driver.launch.staffing import Staffing
from elastic.driver.policy import host_changes
from elastic.driver.policy.phase import Phase
from elastic.driver.rendezvous import round_keeper
from elastic.driver.rendezvous.batcher import ROUND_AFTER_DEATH
from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.rendezvous.memory_store import MemoryKeyValueStore
from elastic.driver.reports import (
    DrainAsked,
    Heard,
    LeaveAsked,
    Reports,
    Waiting,
    WorkerExited,
)
from elastic.driver.settings import ElasticSettings, FailureScope, Settings
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol.leave import FINISHED

HOSTS = [HostSpec("localhost", 4)]


class Process:
    """A worker process stand-in: records the signals sent to it."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.signal: int | None = None
        self.ended_unwatched = False

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)

    def terminate(self) -> None:
        self.signals.append(signal.SIGTERM)


class Harness:
    """A conductor over `n` members of round 1 on `hosts` (one name per worker; default: all
    on localhost), and what it ended the job with. `scope`: --failure-scope; by default a
    failed worker's host-mates go on, as the tests of one death among its peers mean."""

    def __init__(
        self,
        n: int,
        elastic: bool,
        tmp_path,
        min_np: int = 1,
        scope: FailureScope = FailureScope.WORKER,
        hosts: list[str] | None = None,
    ) -> None:
        names = hosts or ["localhost"] * n
        specs = [HostSpec(name, names.count(name)) for name in dict.fromkeys(names)]
        settings = Settings(
            np=n, hosts=specs, command=["train.py"],
            elastic=ElasticSettings(min_np, n, None, cooldown_range=(600.0, 600.0),
                                    failure_scope=scope)
            if elastic else None,
        )  # fmt: skip
        reports: Reports = asyncio.Queue()
        hosts = HostAccess(SshOptions(), 1.0, 5.0)
        self.rendezvous = Rendezvous()
        self.channels = ControlChannels()
        self.fleet = Fleet(
            hosts, reports, self.rendezvous.slot_of, str(tmp_path), None, 1.0, job_id="conductor"
        )
        self.watcher = watcher = HostWatcher(
            FixedHosts(specs),
            HostTracker(Cooldown(600.0, 600.0, random.Random(0))),
            hosts,
            reports,
            1.0,
            lambda: 0.0,
        )
        staffing = Staffing(self.fleet, hosts, ["train.py"], lambda w: {}, elastic, print)
        self.ended: list[tuple[int, str | None]] = []
        self.spawned: list[str] = []  # the tasks the conductor started, not run here
        self.conductor = Conductor(
            settings, fleet=self.fleet, staffing=staffing, rendezvous=self.rendezvous,
            channels=self.channels, kv=MemoryKeyValueStore(), watcher=watcher,
            save_soon=lambda: None, spawn=self.spawn,
            finish=lambda code, message: self.ended.append((code, message)), clock=lambda: 0.0,
        )  # fmt: skip
        self.workers = [self.fleet.new_worker(name, names[:i].count(name))
                        for i, name in enumerate(names)]  # fmt: skip
        for worker in self.workers:
            worker.process, worker.state = Process(), WorkerState.MEMBER  # type: ignore[assignment]
        self.rendezvous.form([(w.worker_id, w.hostname) for w in self.workers])
        self.streams = {w.worker_id: self.channels.open(w.worker_id) for w in self.workers}

    def spawn(self, coroutine) -> None:
        self.spawned.append(coroutine.__qualname__)
        coroutine.close()

    def die(self, index: int, code: int = -9) -> None:
        worker = self.workers[index]
        worker.exit_code = code
        worker.process.signal = -code if code < 0 else None  # type: ignore[union-attr]
        self.conductor.hear(WorkerExited(worker))

    def wait(self, index: int) -> None:
        self.conductor.hear(Waiting(self.workers[index].worker_id, self.rendezvous.round, 0))

    def heard(self, index: int) -> list[object]:
        stream = self.streams[self.workers[index].worker_id]
        return [stream.get_nowait() for _ in range(stream.qsize())]


def test_deaths_heard_together_break_the_round_once_and_form_one_round(tmp_path) -> None:
    async def scenario() -> Harness:
        job = Harness(4, elastic=True, tmp_path=tmp_path)
        job.die(0)
        job.die(1)
        job.wait(2)
        job.wait(3)  # the last survivor back: the round forms at once
        return job

    job = asyncio.run(scenario())
    assert job.rendezvous.round == 2
    assert job.rendezvous.members == [job.workers[2].worker_id, job.workers[3].worker_id]
    called_back, event = job.heard(2)  # the break once, with the call back, then round 2
    assert isinstance(called_back, RoundBroken) and called_back.rejoin
    assert "rank 0 on host localhost was killed by signal" in called_back.reason
    assert isinstance(event, HostsUpdated)
    assert (event.broken_round, event.next_round) == (1, 2)
    assert job.conductor.tally.resets == 1 and job.ended == []
    reasons = [d.reason for d in job.conductor.decisions]
    assert reasons[-1].startswith("rank 0 on host localhost was killed by signal SIGKILL")
    assert "rank 1 on host localhost" in reasons[-1]  # both deaths, one round


def test_survivors_are_called_back_at_once_and_the_round_forms_when_they_are_back(
    tmp_path,
) -> None:
    """Survivors blocked in a collective only end it at the driver's word: they get it at
    once, asked back to the rendezvous, and the round forms as they arrive, not when the
    batcher's window ends."""

    async def scenario() -> tuple[Harness, list[list[object]], int]:
        job = Harness(4, elastic=True, tmp_path=tmp_path)
        job.die(0)
        await asyncio.sleep(0)  # the decision's turn ends
        heard_at_once = [job.heard(index) for index in (1, 2, 3)]
        for index in (1, 2, 3):
            job.wait(index)
        return job, heard_at_once, job.rendezvous.round

    job, heard_at_once, epoch_when_back = asyncio.run(scenario())
    reason = "rank 0 on host localhost was killed by signal SIGKILL (exit code -9)"
    assert heard_at_once == [[RoundBroken(1, reason, rejoin=True)]] * 3
    assert epoch_when_back == 2  # no window waited: the last one back formed it
    assert job.rendezvous.members == [job.workers[i].worker_id for i in (1, 2, 3)]
    for index in (1, 2, 3):
        (event,) = job.heard(index)
        assert isinstance(event, HostsUpdated) and event.next_round == 2


def test_many_survivors_of_a_death_hear_one_event_that_breaks_the_round_and_places_them(
    tmp_path, monkeypatch
) -> None:
    """Above `CALL_BACK_AT_MOST` survivors, calling each back would cost the driver more than
    the batcher's window: the break goes with each one's slot, in one event."""
    monkeypatch.setattr(round_keeper, "CALL_BACK_AT_MOST", 1)

    async def scenario() -> tuple[Harness, Worker]:
        job = Harness(3, elastic=True, tmp_path=tmp_path)
        joiner = job.fleet.new_worker("localhost", 3)  # started, not yet at the rendezvous
        joiner.process = Process()  # type: ignore[assignment]
        job.streams[joiner.worker_id] = job.channels.open(joiner.worker_id)
        job.die(0)
        # The survivors are blocked in a collective of round 1: none comes back by itself,
        # so the round forms when the batcher's window ends.
        await asyncio.sleep(ROUND_AFTER_DEATH * 4)
        return job, joiner

    job, joiner = asyncio.run(scenario())
    survivors = [job.workers[1].worker_id, job.workers[2].worker_id]
    assert job.rendezvous.round == 2 and job.rendezvous.members == survivors
    reason = "rank 0 on host localhost was killed by signal SIGKILL (exit code -9)"
    for index in (1, 2):
        (event,) = job.heard(index)
        assert isinstance(event, HostsUpdated)
        assert (event.next_round, event.broken_round, event.broken_reason) == (2, 1, reason)
        assert job.rendezvous.slot_of(job.workers[index].worker_id) is not None
    # A live worker that was no member of round 1 gets the word on its own.
    assert [job.streams[joiner.worker_id].get_nowait()] == [RoundBroken(1, reason)]
    assert job.heard(0) == []  # the dead one


def test_every_live_worker_hears_the_break_when_no_round_can_form(tmp_path) -> None:
    async def scenario() -> Harness:
        job = Harness(3, elastic=True, tmp_path=tmp_path, min_np=3)
        job.die(0)
        await asyncio.sleep(ROUND_AFTER_DEATH * 4)  # the window ends: 2 workers, 3 needed
        return job

    job = asyncio.run(scenario())
    assert job.rendezvous.round == 1 and job.conductor.phase is Phase.SHORT
    reason = "rank 0 on host localhost was killed by signal SIGKILL (exit code -9)"
    for index in (1, 2):  # called back at once; then the word for every live worker
        assert job.heard(index) == [RoundBroken(1, reason, rejoin=True), RoundBroken(1, reason)]


def test_a_static_job_ends_with_its_first_failure_s_code(tmp_path) -> None:
    async def scenario() -> Harness:
        job = Harness(2, elastic=False, tmp_path=tmp_path)
        job.die(1, code=3)
        return job

    job = asyncio.run(scenario())
    assert job.ended == [
        (3, "rank 1 on host localhost exited with code 3; stopping the other workers")
    ]
    assert job.workers[1].state is WorkerState.FAILED
    assert job.rendezvous.round == 1


def test_a_member_let_go_hears_that_it_leaves_and_the_others_hear_the_new_round(
    tmp_path,
) -> None:
    """Its leave goes into its next step's allreduce, so the round ends at a step boundary
    on every rank, not at the next commit."""

    async def scenario() -> Harness:
        job = Harness(3, elastic=True, tmp_path=tmp_path)
        for worker in job.workers:
            worker.commit = 4  # the others hold its state: it goes at once
        job.conductor.hear(LeaveAsked(job.workers[2].worker_id, "SIGTERM", 4))
        await asyncio.sleep(ROUND_AFTER_DEATH)  # the batching window of a plain change
        return job

    job = asyncio.run(scenario())
    assert job.rendezvous.round == 2
    assert job.rendezvous.members == [job.workers[i].worker_id for i in (0, 1)]
    heard = [job.heard(i) for i in range(3)]
    assert all(len(events) == 1 and isinstance(events[0], HostsUpdated) for events in heard)
    assert [events[0].leave for events in heard] == [False, False, True]
    assert all(events[0].next_round == 2 for events in heard)


def test_a_member_that_finishes_ends_training_and_stops_joiners(tmp_path) -> None:
    async def scenario() -> Harness:
        job = Harness(2, elastic=True, tmp_path=tmp_path)
        joiner = job.fleet.new_worker("localhost", 3)
        joiner.process = Process()  # type: ignore[assignment]
        job.conductor.hear(LeaveAsked(job.workers[0].worker_id, FINISHED, 0))
        return job

    job = asyncio.run(scenario())
    assert job.conductor.phase is Phase.FINISHING
    assert job.workers[0].exiting
    joiner = list(job.fleet.workers.values())[-1]
    assert joiner.state is WorkerState.STOPPED


@pytest.mark.parametrize("code", [0, 1])
def test_the_last_member_s_exit_ends_the_job(tmp_path, code: int) -> None:
    async def scenario() -> Harness:
        job = Harness(1, elastic=True, tmp_path=tmp_path)
        job.workers[0].commit = 0
        job.die(0, code=code)
        return job

    job = asyncio.run(scenario())
    assert [c for c, _ in job.ended] == [code]


def test_draining_a_host_in_cooldown_makes_its_surviving_workers_leave(tmp_path) -> None:
    """A host in cooldown keeps its live workers, and draining it changes no usable host:
    the drain itself asks them to leave."""

    async def scenario() -> Harness:
        job = Harness(2, elastic=True, tmp_path=tmp_path)
        job.watcher.tracker.discovered(HOSTS, now=0.0)
        job.watcher.host_failed("localhost", "a worker failed")
        job.conductor.hear(DrainAsked("localhost", True))
        return job

    job = asyncio.run(scenario())
    assert job.watcher.tracker.drained == {"localhost"}
    assert [w.state for w in job.workers] == [WorkerState.LEAVING] * 2
    reasons = [d.reason for d in job.conductor.decisions]
    assert reasons.count("host(s) localhost drained") == 1


def test_a_failed_worker_s_host_mates_are_told_the_break_stopped_and_not_counted(
    tmp_path,
) -> None:
    """--failure-scope host: rank 0 on host a fails; rank 1 on a hears at once that round 1
    is broken (its collective fails, it asks to join and is refused), gets SIGTERM and is
    stopped; the round forms from host b's workers, and rank 1's own exit changes nothing."""

    async def scenario() -> Harness:
        job = Harness(4, True, tmp_path, scope=FailureScope.HOST, hosts=["a", "a", "b", "b"])
        job.die(0, code=1)
        job.wait(2)
        job.wait(3)
        job.die(1, code=1)  # the host-mate's exit, once stopped
        return job

    job = asyncio.run(scenario())
    why = "its host a failed with rank 0 on host a (--failure-scope host)"
    mate = job.workers[1]
    assert job.heard(1) == [RoundBroken(1, why, rejoin=True)]
    assert mate.process.signals == [signal.SIGTERM]  # type: ignore[union-attr]
    assert mate.state is WorkerState.STOPPED
    assert job.rendezvous.round == 2
    assert job.rendezvous.members == [job.workers[2].worker_id, job.workers[3].worker_id]
    assert job.watcher.tracker.cooldown.in_cooldown("a", 0.0)
    assert job.ended == []
    assert not any("rank 1 on host a exited" in d.reason for d in job.conductor.decisions)


def test_a_fleet_whose_every_worker_exited_with_an_error_ends_instead_of_starting_again(
    tmp_path,
) -> None:
    async def scenario() -> Harness:
        job = Harness(2, elastic=True, tmp_path=tmp_path)
        job.conductor.tally.newest_commit = 11
        job.die(0, code=1)
        job.die(1, code=1)
        return job

    job = asyncio.run(scenario())
    message = (
        "every worker of the job exited with an error (exit code 1): the job ends instead of "
        "starting new workers that would fail the same way (their output says why)"
    )
    assert job.ended == [(1, message)]
    assert not any("grow" in name for name in job.spawned), "no new workers were launched"


def test_a_removed_host_s_workers_hand_over_to_a_stayer_and_leave_in_one_round(
    tmp_path,
) -> None:
    """Host a's two workers hold commit 16; the driver has heard host b's worker report 15
    only. Neither of a's workers holds the other's state for it: both wait for b's report,
    then leave in one round (Horovod's scripts count one rendezvous per host change)."""

    async def scenario() -> tuple[Harness, int]:
        job = Harness(3, True, tmp_path, hosts=["a", "a", "b"])
        for worker, commit in zip(job.workers, (16, 16, 15), strict=True):
            worker.commit = commit
        job.conductor.apply(host_changes.hosts_removed(job.conductor.view(), ["a"], {"b"}))
        await asyncio.sleep(ROUND_AFTER_DEATH * 4)
        round_before_report = job.rendezvous.round
        job.conductor.hear(Heard(job.workers[2].worker_id, 1, 16))
        await asyncio.sleep(ROUND_AFTER_DEATH * 4)  # the batching window of a plain change
        return job, round_before_report

    job, round_before_report = asyncio.run(scenario())
    assert round_before_report == 1, "a's workers waited for a holder that stays"
    assert job.rendezvous.round == 2 and job.rendezvous.members == [job.workers[2].worker_id]
