"""What a worker's exit, verdict, failure or wait means: pure decisions, one case per rule."""

from __future__ import annotations

import signal
from dataclasses import replace
from types import SimpleNamespace

import pytest

from elastic.driver.policy.actions import (
    NOTHING,
    AdvanceTo,
    Arrived,
    BeginFinishing,
    BreakRound,
    CoolDown,
    FillSlots,
    Finish,
    Log,
    MarkEnded,
    RecordFleetLoss,
    Reform,
    ReformIfStillWaiting,
    SeeHandovers,
    SeeIfEnded,
    Signal,
    TakeOut,
    WaitForWorkers,
)
from elastic.driver.policy.causes import Cause
from elastic.driver.policy.liveness import Verdict
from elastic.driver.policy.phase import Phase
from elastic.driver.policy.worker_events import (
    caught_up,
    durable_stale,
    exited,
    failed,
    judged,
    keys_lost,
    stall_seen,
    stalled,
    waiting,
)
from elastic.driver.settings import FailureScope
from elastic.protocol.http import CollectiveStatus, StalledRank, StallReport
from tests.support.policy_views import ELASTIC, LV, NOW, L, M, S, kinds, view, worker


def ended(worker_id: str, state=M, code: int | None = 1, killed_by: int | None = None, **kw):
    """A worker record whose process ended with `code` (or was killed by `killed_by`)."""
    record = worker(worker_id, state, **kw)
    record.process = SimpleNamespace(signal=killed_by)  # type: ignore[assignment]
    record.exit_code = code
    return record


def pair(dead, **fields):
    """A two-member round of `dead` (rank 0) and a live r1 (rank 1) on another host."""
    return view(dead, worker("r1", M, "b"), members=(dead.worker_id, "r1"), **fields)


# --- exits -------------------------------------------------------------------------------


def test_a_killed_member_breaks_its_round_cools_its_host_and_the_job_re_forms() -> None:
    dead = ended("r0", code=-9, killed_by=signal.SIGKILL)
    decision = exited(pair(dead, round=3), dead, False, NOW)
    line = "rank 0 on host a was killed by signal SIGKILL (exit code -9)"
    assert decision.reason == line
    assert decision.actions == (
        MarkEnded("r0", failed=True, cause="signal SIGKILL"),
        Log("error", line, "failure", "r0"),
        CoolDown("a", "was killed by signal SIGKILL (exit code -9)"),
        BreakRound(3, line),
        Reform(line, True, Cause.FAILURE),
        FillSlots(),
        SeeHandovers(),
    )


def test_a_failed_worker_takes_its_host_s_other_workers_out_with_it() -> None:
    """--failure-scope host (the default, as horovodrun): its host's member and joiner are
    taken out at once (not as failures of their own), the round breaks and re-forms."""
    dead = ended("r0", code=1)
    host_mate, joiner = worker("r1", M, slot=1), worker("j", L, slot=2)
    job = view(dead, host_mate, joiner, worker("r2", M, "b"), members=("r0", "r1", "r2"), round=3)
    decision = exited(job, dead, False, NOW)
    line = "rank 0 on host a exited with code 1"
    why = "its host a failed with rank 0 on host a (--failure-scope host)"
    assert decision.actions == (
        MarkEnded("r0", failed=True, cause="exit 1"),
        Log("error", line, "failure", "r0"),
        CoolDown("a", "exited with code 1"),
        Log("warning", f"rank 1 on host a leaves the job: {why}", "leave", "r1"),
        TakeOut("r1", why, 3),
        Log("warning", f"worker j on host a leaves the job: {why}", "leave", "j"),
        TakeOut("j", why, 3),
        BreakRound(3, line),
        Reform(line, True, Cause.FAILURE),
        FillSlots(),
        SeeHandovers(),
    )


def test_with_failure_scope_worker_its_host_s_other_workers_go_on() -> None:
    dead = ended("r0", code=1)
    workers = (dead, worker("r1", M, slot=1), worker("r2", M, "b"))
    elastic = replace(ELASTIC, failure_scope=FailureScope.WORKER)
    job = view(*workers, members=("r0", "r1", "r2"), elastic=elastic)
    decision = exited(job, dead, False, NOW)
    assert kinds(decision) == [MarkEnded, Log, CoolDown, BreakRound, Reform, FillSlots,
                               SeeHandovers]  # fmt: skip


def test_a_failed_joiner_takes_out_its_host_s_members_and_breaks_their_round() -> None:
    joiner = ended("j", L, code=1, slot=1)
    job = view(worker("r0", M), joiner, worker("r1", M, "b"), members=("r0", "r1"), round=2)
    decision = exited(job, joiner, False, NOW)
    assert kinds(decision) == [MarkEnded, Log, CoolDown, Log, TakeOut, BreakRound, Reform,
                               FillSlots, SeeHandovers]  # fmt: skip
    assert TakeOut("r0", "its host a failed with worker j on host a (--failure-scope host)", 2) in (
        decision.actions
    )


def test_a_failed_host_that_held_every_worker_loses_the_fleet() -> None:
    """Its host-mate is taken out, not counted: the one failure exited with an error, so the
    job ends instead of starting new workers."""
    dead = ended("r0", code=1)
    job = view(dead, worker("r1", M, slot=1), members=("r0", "r1"), newest_commit=7)
    decision = exited(job, dead, False, NOW)
    assert kinds(decision)[-3:] == [BreakRound, Reform, Finish]
    assert "every worker of the job exited with an error (exit code 1)" in decision.reason


def test_ranks_behind_a_stall_on_one_host_fail_once_with_it() -> None:
    """r1 and r2 kept the round waiting; with --failure-scope host r1's failure takes r2 out
    with host a, so r2 is not failed (nor its host-mates taken out) a second time."""
    workers = (worker("r0", M, "b"), worker("r1", M), worker("r2", M, slot=1))
    job = view(*workers, members=("r0", "r1", "r2"))
    decision = stalled(job, ["r1", "r2"], "stall in round 1", NOW)
    assert [a.worker_id for a in decision.actions if isinstance(a, Signal)] == ["r1"]
    assert [a.worker_id for a in decision.actions if isinstance(a, TakeOut)] == ["r2"]
    assert [a.worker_id for a in decision.actions if isinstance(a, MarkEnded)] == ["r1"]


def stall(seconds: float, *behind: int) -> StallReport:
    return StallReport(
        round=1, collective=CollectiveStatus(seq=12, kind="allreduce", blocked_for=seconds),
        waiting=[0], seconds=seconds, line="stall in round 1",
        missing=[StalledRank(rank=r, hostname="a", doing="not in a collective") for r in behind],
    )  # fmt: skip


def test_a_stall_past_stall_timeout_fails_the_ranks_behind_and_none_before() -> None:
    """The ranks behind are found by rank in the round's slots; before --stall-timeout, or
    with none set, a stall is only said (the conductor logs it)."""
    workers = (worker("r0", M, "b"), worker("r1", M), worker("r2", M, "c"))
    job = view(*workers, members=("r0", "r1", "r2"))  # one host each: none taken out
    past = stall_seen(job, stall(30.0, 1, 2), 30.0, NOW)
    assert [a.worker_id for a in past.actions if isinstance(a, Signal)] == ["r1", "r2"]
    assert past.reason == "stall in round 1"
    assert stall_seen(job, stall(29.9, 1), 30.0, NOW) is NOTHING
    assert stall_seen(job, stall(1e6, 1), None, NOW) is NOTHING


def test_the_durable_copy_going_stale_is_a_warning_and_its_recovery_a_line() -> None:
    writer = worker("r0", M, "b")
    stale = durable_stale(writer, stale=True, written=0)
    assert [a.level for a in stale.actions if isinstance(a, Log)] == ["warning"]
    assert "worker r0 on b failed to write a durable commit (newest written: none" in (
        stale.actions[0].line
    )
    again = durable_stale(writer, stale=False, written=8)
    assert again.actions == (Log("info", "durable commits are written again (newest: 8)"),)
    assert stale.reason == again.reason == ""


def test_a_hung_leaver_breaks_the_round_it_left_and_none_is_wanted() -> None:
    hung = worker("r2", LV, slot=2)
    others = (worker("r0", M, "b"), worker("r1", M, "b", slot=1))
    job = view(hung, *others, members=("r0", "r1"), round=4)
    decision = failed(job, hung, "missed 3 heartbeats", NOW, "hung")
    assert kinds(decision) == [MarkEnded, Log, CoolDown, BreakRound, FillSlots, SeeHandovers]
    assert decision.actions[3] == BreakRound(3, "worker r2 on host a missed 3 heartbeats")


def test_the_last_worker_killed_after_a_commit_starts_over() -> None:
    dead = ended("r0", code=-9, killed_by=signal.SIGKILL)
    decision = exited(view(dead, members=("r0",), newest_commit=7), dead, False, NOW)
    assert kinds(decision)[-4:] == [Log, RecordFleetLoss, WaitForWorkers, FillSlots]


def test_the_last_worker_exiting_with_an_error_after_a_commit_ends_the_job() -> None:
    dead = ended("r0", code=2)
    decision = exited(view(dead, members=("r0",), newest_commit=7), dead, False, NOW)
    assert kinds(decision)[-1] is Finish and decision.actions[-1].code == 2
    assert "every worker of the job exited with an error (exit code 2)" in decision.reason


def test_the_last_worker_failing_before_any_commit_ends_the_job_with_its_code() -> None:
    dead = ended("r0", code=3)
    decision = exited(view(dead, members=("r0",)), dead, False, NOW)
    message = "every worker of the job failed, with no commit since the job started"
    assert decision.actions[-1] == Finish(3, message)


def test_in_a_static_job_the_first_failure_ends_the_job_with_its_code() -> None:
    dead = ended("r0", code=4)
    decision = exited(pair(dead, elastic=None), dead, False, NOW)
    message = "rank 0 on host a exited with code 4; stopping the other workers"
    assert decision.actions == (MarkEnded("r0", failed=True, cause="exit 4"), Finish(4, message))


def test_a_failure_while_finishing_only_asks_whether_the_job_has_ended() -> None:
    dead = ended("r0")
    decision = exited(pair(dead, phase=Phase.FINISHING), dead, False, NOW)
    assert kinds(decision) == [MarkEnded, Log, CoolDown, SeeIfEnded]


@pytest.mark.parametrize(("code", "says"), [(127, "not found"), (126, "not executable")])
def test_a_command_that_cannot_run_ends_the_job(code: int, says: str) -> None:
    dead = ended("r0", code=code)
    decision = exited(pair(dead), dead, False, NOW)
    assert decision.actions == (Finish(code, decision.reason),)
    assert f"could not run 'train.py' (exit code {code}: {says})" in decision.reason


def test_a_command_that_failed_after_registering_is_a_failure_not_a_bad_command() -> None:
    dead = ended("r0", code=127, registered=True)
    assert kinds(exited(pair(dead), dead, False, NOW))[0] is MarkEnded


@pytest.mark.parametrize("code", [0, 1])
def test_a_leaver_that_exits_frees_its_slot(code: int) -> None:
    gone = ended("r0", LV, code=code)
    decision = exited(pair(gone), gone, False, NOW)
    assert kinds(decision)[0] is MarkEnded and kinds(decision)[-1] is FillSlots
    assert decision.actions[0] == MarkEnded("r0", failed=False, cause="left")


@pytest.mark.parametrize("code", [-9, 1])
def test_a_leaver_that_dies_before_it_left_breaks_the_round_it_left(code: int) -> None:
    """A host removed by discovery whose workers are killed before they reach their commit
    (a spot host gone): the round they were to leave at that commit has formed its successor
    without them, and a survivor still in one of its collectives, waiting on a peer that went
    to the new round, is freed only by that round's break (a sharded benchmark hung on it)."""
    killed = signal.SIGKILL if code == -9 else None
    gone = ended("r2", LV, code=code, killed_by=killed, slot=2)
    others = (worker("r0", M, "b"), worker("r1", M, "b", slot=1))
    decision = exited(view(gone, *others, members=("r0", "r1"), round=4), gone, False, NOW)
    assert kinds(decision) == [MarkEnded, Log, BreakRound, FillSlots]
    assert decision.actions[2] == BreakRound(3, decision.reason)
    still_member = exited(view(gone, *others, members=("r0", "r1", "r2"), round=4), gone,
                          False, NOW)  # fmt: skip
    assert kinds(still_member) == [MarkEnded, Log, BreakRound, Reform, FillSlots]
    assert still_member.actions[2] == BreakRound(4, still_member.reason)


def test_a_leaver_that_exits_0_breaks_nothing() -> None:
    gone = ended("r2", LV, code=0, slot=2)
    others = (worker("r0", M, "b"), worker("r1", M, "b", slot=1))
    decision = exited(view(gone, *others, members=("r0", "r1"), round=4), gone, False, NOW)
    assert kinds(decision) == [MarkEnded, FillSlots]


def test_a_leaver_whose_exit_comes_as_training_ends_lets_the_job_end() -> None:
    """A member asked to leave (a SIGTERM, its host drained) that finished training before it
    could: training is over, nobody fills its slot, and the job looks whether it has ended
    (a restarted driver that adopted it leaving waited for ever: a soak's hang)."""
    gone = ended("r0", LV, code=0)
    decision = exited(pair(gone, phase=Phase.FINISHING), gone, False, NOW)
    assert kinds(decision) == [MarkEnded, SeeIfEnded]
    assert decision.actions[0] == MarkEnded("r0", failed=False, cause="left")


def test_a_member_that_finishes_ends_training_for_every_worker() -> None:
    done = ended("r0", code=0)
    assert kinds(exited(pair(done), done, False, NOW)) == [MarkEnded, BeginFinishing, SeeIfEnded]


def test_a_joiner_that_exits_0_does_not_end_training() -> None:
    done = ended("j", L, code=0, slot=2)
    assert kinds(exited(pair(worker("r0", M)), done, False, NOW)) == [MarkEnded, SeeIfEnded]


def test_a_member_that_exited_0_while_no_driver_watched_left_and_the_job_re_forms() -> None:
    gone = ended("r0", code=0)
    decision = exited(pair(gone), gone, True, NOW)
    assert kinds(decision) == [MarkEnded, Log, Reform, FillSlots]
    assert decision.actions[2] == Reform("rank 0 on host a left", False, Cause.LEAVE)


def test_the_last_worker_exiting_0_unwatched_asks_whether_the_job_ended() -> None:
    gone = ended("r0", code=0)
    assert kinds(exited(view(gone, members=("r0",)), gone, True, NOW))[-1] is SeeIfEnded


def test_a_stopped_worker_s_exit_is_ignored() -> None:
    stopped = ended("r0", S)
    assert exited(pair(stopped), stopped, False, NOW) is NOTHING


# --- verdicts ----------------------------------------------------------------------------


def test_a_hung_member_is_killed_and_has_failed() -> None:
    hung = worker("r0", M)
    decision = judged(pair(hung), hung, Verdict.HUNG, 30.0, NOW)
    assert decision.actions[:2] == (
        Signal("r0", kill=True),
        MarkEnded("r0", failed=True, cause="hung"),
    )
    assert decision.reason == f"rank 0 on host a {Verdict.HUNG.value}"


def test_a_lingering_leaver_is_sent_sigterm_only() -> None:
    leaver = worker("r0", LV)
    decision = judged(pair(leaver), leaver, Verdict.LINGERING, 30.0, NOW)
    assert decision.actions == (Signal("r0", kill=False),)


def test_a_worker_that_ended_since_it_was_judged_is_left_alone() -> None:
    gone = ended("r0")
    gone.state = S
    assert judged(pair(gone), gone, Verdict.HUNG, 30.0, NOW) is NOTHING


def test_a_static_job_whose_worker_did_not_join_ends_naming_every_missing_rank() -> None:
    late = worker("r0", M)
    job = view(late, worker("r1", M, slot=1), worker("r2", M, slot=2, joined=True),
               members=("r0", "r1", "r2"), elastic=None)  # fmt: skip
    decision = judged(job, late, Verdict.NOT_JOINED, 30.0, NOW)
    message = (
        "rank(s) [0, 1] on host(s) a did not join the rendezvous within 30 s (--start-timeout)"
    )
    assert decision.actions == (Signal("r0", kill=True), Finish(1, message))


def test_an_elastic_joiner_that_did_not_join_in_time_has_failed() -> None:
    late = worker("j", L, slot=2)
    decision = judged(pair(worker("r0", M)), late, Verdict.NOT_JOINED, 30.0, NOW)
    assert decision.reason == "worker j on host a did not join within 30 s (--start-timeout)"
    assert CoolDown("a", "did not join within 30 s (--start-timeout)") in decision.actions


# --- waits at the rendezvous -------------------------------------------------------------


def test_a_member_back_for_a_wanted_round_counts_as_arrived() -> None:
    back = worker("r0", M)
    decision = waiting(pair(back, round_wanted=True), back, 1, NOW)
    assert decision.actions == (Arrived("r0"),)


def test_a_member_reporting_a_failed_round_first_re_forms_after_a_heartbeat() -> None:
    back = worker("r0", M)
    decision = waiting(pair(back, round=2), back, 2, NOW)
    assert decision.actions == (ReformIfStillWaiting(2),)
    assert decision.reason == "rank 0 on host a reports round 2 failed"
    assert waiting(pair(back, round=2, failures_reported={2}), back, 2, NOW) is NOTHING


def test_a_member_waiting_after_an_older_round_changes_nothing() -> None:
    back = worker("r0", M)
    assert waiting(pair(back, round=3), back, 2, NOW) is NOTHING


def test_the_last_joiner_waiting_completes_the_round() -> None:
    joiner = worker("j", L, slot=2)
    job = view(worker("r0", M), worker("r1", M, slot=1), joiner, members=("r0", "r1"),
               waiting=frozenset({"j"}))  # fmt: skip
    assert waiting(job, joiner, 1, NOW).reason == "1 worker(s) joined"


@pytest.mark.parametrize("fields", [{"elastic": None}, {"phase": Phase.FINISHING}])
def test_waits_change_nothing_in_a_static_or_finishing_job(fields) -> None:
    back = worker("r0", M)
    assert waiting(pair(back, round_wanted=True, **fields), back, 1, NOW) is NOTHING


# --- rounds an earlier driver formed -----------------------------------------------------


def test_a_worker_in_a_round_never_saved_makes_the_job_re_form_past_it() -> None:
    decision = caught_up(pair(worker("r0", M), round=5), 7)
    assert decision.actions[1:] == (
        AdvanceTo(7),
        BreakRound(7, "the driver restarted"),
        Reform("round 7 was never saved", True, Cause.DRIVER_RESTART),
    )
    assert "this driver resumed at round 5" in decision.reason


def test_a_worker_in_a_known_round_changes_nothing() -> None:
    assert caught_up(pair(worker("r0", M), round=5), 5) is NOTHING


def test_a_taken_up_round_whose_keys_were_lost_is_broken_and_re_formed() -> None:
    job = view(worker("r0", M), worker("r1", M, slot=1), members=("r0", "r1"), round=7)
    decision = keys_lost(job, 7)
    assert kinds(decision) == [Log, BreakRound, Reform]
    assert decision.actions[1] == BreakRound(7, "the driver restarted while the round formed")
    assert decision.actions[2].broken
    assert "round 7 was forming when the previous driver died" in decision.reason
    assert keys_lost(job, 6) is NOTHING  # an older round: a newer one formed already
    static = view(worker("r0", M), members=("r0",), round=7, elastic=None)
    assert keys_lost(static, 7) is NOTHING
