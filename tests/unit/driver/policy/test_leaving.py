"""Leaving at a commit: pure decisions on who goes at once, who hands its state over first,
and when a worker is launched to take a leaver's state over."""

from __future__ import annotations

import pytest

from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.policy.actions import (
    NOTHING,
    BeginFinishing,
    Decision,
    HandOver,
    Launch,
    LetGo,
    Log,
    MarkExiting,
    Reform,
    SeeHandovers,
    StopWorker,
)
from elastic.driver.policy.causes import Cause
from elastic.driver.policy.leaving import asked, handovers, leave
from elastic.driver.policy.phase import Phase
from elastic.protocol.leave import EXITING, FINISHED
from tests.support.policy_views import ELASTIC, LV, F, L, M, S, X, kinds, view, worker

WHY = "host a was removed by discovery"

# --- leave -------------------------------------------------------------------------------


def test_a_joiner_asked_to_leave_is_stopped() -> None:
    job = view(worker("r0", M), worker("j", L, slot=1), members=("r0",))
    assert leave(job, "j", WHY) == Decision((StopWorker("j", WHY),), f"worker j is stopped: {WHY}")


@pytest.mark.parametrize(
    ("others", "elastic", "expected", "case"),
    [
        ((), None, LetGo, "a static job never hands over"),
        (((M, 5),), ELASTIC, LetGo, "another staying member holds the same commit"),
        (((M, 6),), ELASTIC, LetGo, "another staying member holds a newer commit"),
        (((M, 4),), ELASTIC, HandOver, "the other member is behind: r0 is the only holder"),
        (((LV, 5),), ELASTIC, HandOver, "a member that leaves itself does not count"),
        (((F, 5),), ELASTIC, HandOver, "a dead member does not count"),
        ((), ELASTIC, HandOver, "no other member"),
    ],
)
def test_a_member_goes_at_once_unless_it_holds_the_only_copy_of_its_commit(
    others, elastic, expected, case
) -> None:
    rest = [worker(f"r{n}", s, slot=n, commit=c) for n, (s, c) in enumerate(others, start=1)]
    members = ("r0", *(w.worker_id for w in rest))
    job = view(worker("r0", M, commit=5), *rest, members=members, elastic=elastic)
    decision = leave(job, "r0", WHY)
    assert decision.actions[0] == expected("r0", WHY), case
    then = {LetGo: [Log, Reform] if elastic else [Log], HandOver: [Log, SeeHandovers]}
    assert [type(a) for a in decision.actions[1:]] == then[expected], case


def test_a_member_leaving_along_does_not_count_as_a_holder() -> None:
    """Its host removed, r0 and r1 leave together: r1 cannot hold r0's state for it, so r0
    hands it over to r2, which stays (its report of commit 5 is still to come); both then
    go in one round once r2 reports it."""
    workers = (worker("r0", M, commit=5), worker("r1", M, slot=1, commit=5),
               worker("r2", M, "b", commit=4))  # fmt: skip
    job = view(*workers, members=("r0", "r1", "r2"))
    handing = leave(job, "r0", WHY, along={"r1"})
    assert kinds(handing) == [HandOver, Log], "the decision that asked both looks for holders"
    assert leave(job, "r0", WHY).actions[0] == LetGo("r0", WHY)  # alone, r1 would hold it


def test_a_joiner_holding_the_commit_does_not_count_as_a_holder() -> None:
    job = view(worker("r0", M, commit=5), worker("j", L, slot=1, commit=5), members=("r0",))
    assert leave(job, "r0", WHY).actions[0] == HandOver("r0", WHY)


def test_a_member_without_a_commit_goes_at_once() -> None:
    job = view(worker("r0", M), members=("r0",))
    assert leave(job, "r0", WHY).actions == (
        LetGo("r0", WHY),
        Log("info", f"rank 0 on host a leaves the job: {WHY}", "leave", "r0"),
        Reform(f"rank 0 on host a leaves: {WHY}", False, Cause.LEAVE),
    )


def test_a_member_handing_over_says_so_and_looks_for_a_holder() -> None:
    job = view(worker("r0", M, commit=5), members=("r0",))
    assert leave(job, "r0", WHY).actions == (
        HandOver("r0", WHY),
        Log("info", f"rank 0 on host a leaves the job ({WHY}) once another worker holds its "
            "state (commit 5)", "leave", "r0"),
        SeeHandovers(),
    )  # fmt: skip


def test_leave_says_why_in_words() -> None:
    goes = view(worker("r0", M, commit=5), worker("r1", M, slot=1, commit=5), members=("r0", "r1"))
    assert leave(goes, "r0", "SIGTERM").reason == "worker r0 leaves: SIGTERM"
    holds = view(worker("r0", M, commit=5), worker("r1", M, slot=1, commit=4), members=("r0", "r1"))
    assert leave(holds, "r0", "SIGTERM").reason == (
        "worker r0 leaves (SIGTERM) once another worker holds commit 5"
    )


@pytest.mark.parametrize("state", [LV, X, F, S])
def test_a_worker_already_leaving_or_ended_is_left_alone(state) -> None:
    job = view(worker("r0", state, commit=5), worker("r1", M, slot=1), members=("r0", "r1"))
    assert leave(job, "r0", WHY) is NOTHING


# --- handovers ---------------------------------------------------------------------------


def leaver(worker_id: str = "r0", slot: int = 0, commit: int = 5, **fields):
    return worker(
        worker_id, LV, slot=slot, commit=commit, handing_over=True, leave_reason="SIGTERM",
        **fields,
    )  # fmt: skip


ONE_SLOT = [HostSpec("a", 1)]
TWO_SLOTS = [HostSpec("a", 2)]


def test_a_leaver_goes_once_another_member_reports_its_commit() -> None:
    behind = view(leaver(), worker("r1", M, slot=1, commit=4), members=("r0", "r1"))
    assert handovers(behind, TWO_SLOTS) is NOTHING  # r1 will report holding it
    caught_up = view(leaver(), worker("r1", M, slot=1, commit=5), members=("r0", "r1"))
    decision = handovers(caught_up, TWO_SLOTS)
    assert decision.actions[0] == (
        LetGo("r0", "SIGTERM; another worker holds its state now (commit 5)")
    )
    assert decision.reason == "1 worker(s) handing their state over"


def test_a_joiner_starting_is_waited_for_rather_than_another_launched() -> None:
    job = view(leaver(), worker("j", L, slot=1), members=("r0",))
    assert handovers(job, [HostSpec("a", 3)]) is NOTHING


def test_a_worker_is_launched_on_a_free_slot_when_none_can_take_the_state_over() -> None:
    job = view(leaver(), members=("r0",))
    decision = handovers(job, TWO_SLOTS)
    assert decision.actions == (Launch((("a", 1),)),)
    assert decision.reason == "1 worker(s) handing their state over"


@pytest.mark.parametrize(
    ("hosts", "phase"),
    [(ONE_SLOT, Phase.RUNNING), (TWO_SLOTS, Phase.FINISHING), ([], Phase.RUNNING)],
    ids=["every slot taken", "the job is finishing", "no usable host"],
)
def test_a_leaver_goes_with_a_warning_when_no_worker_can_be_launched(hosts, phase) -> None:
    job = view(leaver(), members=("r0",), phase=phase)
    assert handovers(job, hosts).actions == (
        Log(
            "warning",
            "worker r0 takes the only copy of the job's state (commit 5) with it: no other "
            "worker can be started to take it over",
        ),
        LetGo("r0", "SIGTERM; nobody can take its state over"),
        Log(
            "info",
            "rank 0 on host a leaves the job: SIGTERM; nobody can take its state over",
            "leave",
            "r0",
        ),
        Reform(
            "rank 0 on host a leaves: SIGTERM; nobody can take its state over", False, Cause.LEAVE
        ),
    )


def test_several_leavers_share_one_launch() -> None:
    job = view(leaver("r0"), leaver("r1", slot=1), members=("r0", "r1"))
    decision = handovers(job, [HostSpec("a", 3)])
    assert decision.actions == (Launch((("a", 2),)),)
    assert decision.reason == "2 worker(s) handing their state over"


def test_leavers_go_together_once_every_one_s_state_is_held() -> None:
    """r0's commit is held by r2, r1's newer one by nobody yet: r0 waits with r1 (a removed
    host's two workers leave in one round, as Horovod re-forms once per host change); both
    go in one decision once r2 reports commit 6."""

    def job(r2_commit: int):
        return view(
            leaver("r0", commit=5), leaver("r1", slot=1, commit=6),
            worker("r2", M, slot=2, commit=r2_commit), members=("r0", "r1", "r2"),
        )  # fmt: skip

    assert handovers(job(5), [HostSpec("a", 4)]) is NOTHING
    decision = handovers(job(6), [HostSpec("a", 4)])
    assert [a for a in decision.actions if isinstance(a, LetGo)] == [
        LetGo("r0", "SIGTERM; another worker holds its state now (commit 5)"),
        LetGo("r1", "SIGTERM; another worker holds its state now (commit 6)"),
    ]


def test_a_member_leaving_along_waits_for_its_companions_even_when_its_state_is_held() -> None:
    """The CI failure this guards: a removed host's r1 had reported commit 19 like the
    survivor r2, r0 already 20; r1 went at once and r0 a round later (two re-forms for one
    host change). Asked together, r1 waits silently as a leaver."""
    workers = (worker("r0", M, commit=20), worker("r1", M, slot=1, commit=19),
               worker("r2", M, "b", commit=19))  # fmt: skip
    job = view(*workers, members=("r0", "r1", "r2"))
    decision = leave(job, "r1", WHY, along={"r0"})
    assert decision.actions == (HandOver("r1", WHY),), "no line saying it waits for a holder"
    assert leave(job, "r1", WHY).actions[0] == LetGo("r1", WHY)  # alone, it goes at once


def test_a_leaver_that_ended_is_not_handed_over() -> None:
    gone = leaver()
    gone.state = F
    assert handovers(view(gone, members=("r0",)), TWO_SLOTS) is NOTHING


# --- a worker's own word -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "member", "expected"),
    [
        (FINISHED, True, [MarkExiting, BeginFinishing]),
        (FINISHED, False, [MarkExiting]),
        (EXITING, True, [MarkExiting]),
    ],
    ids=["a member finished", "a joiner finished", "a member exits after an error"],
)
def test_a_worker_that_says_it_exits_is_judged_by_its_exit_code(reason, member, expected) -> None:
    job = view(worker("r0", M), worker("j", L, slot=1), members=("r0",))
    who = job.workers["r0" if member else "j"]
    assert kinds(asked(job, who, reason)) == expected


def test_any_other_reason_is_a_request_to_leave_the_job() -> None:
    job = view(worker("r0", M), worker("r1", M, slot=1), members=("r0", "r1"))
    assert asked(job, job.workers["r0"], "SIGTERM") == leave(job, "r0", "SIGTERM")


def test_an_ended_worker_s_word_changes_nothing() -> None:
    job = view(worker("r0", F), members=("r0",))
    assert asked(job, job.workers["r0"], FINISHED) is NOTHING
