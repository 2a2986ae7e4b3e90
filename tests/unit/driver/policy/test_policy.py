"""The re-forming policy: pure decisions from a view of the job, an event and the time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.discovery.tracker import HostChange
from elastic.driver.policy.actions import (
    AskToLeave,
    Decision,
    Drain,
    FillSlots,
    Finish,
    FormRound,
    Launch,
    Log,
    RecordFleetLoss,
    SeeHandovers,
    ShowProgress,
    WaitForWorkers,
)
from elastic.driver.policy.causes import Cause
from elastic.driver.policy.fleet_loss import fleet_lost
from elastic.driver.policy.forming import (
    JOIN_WINDOW,
    fill_slots,
    job_end,
    joiner_waiting,
    next_round,
    summarize,
    survivors_not_waiting,
    tick,
)
from elastic.driver.policy.host_changes import (
    drain_asked,
    hosts_changed,
    hosts_removed,
    hosts_resized,
)
from elastic.driver.policy.phase import Phase
from elastic.driver.policy.planning import Start, start_check
from elastic.driver.policy.view import FleetLoss
from tests.support.policy_views import ELASTIC, LV, NOW, F, L, M, S, X, kinds, view, worker


def formed(decision: Decision) -> tuple[str, ...] | None:
    rounds = [a for a in decision.actions if isinstance(a, FormRound)]
    return rounds[0].members if rounds else None


# --- the next round ----------------------------------------------------------------------

THREE = (worker("r0", M), worker("r1", M, slot=1), worker("r2", M, slot=2))


@pytest.mark.parametrize(
    ("states", "waiting", "expected", "case"),
    [
        ((M, M, F), (), ("r0", "r1"), "a dead member is dropped, survivors keep their order"),
        ((F, M, M), (), ("r1", "r2"), "the survivors close up in rank order"),
        ((M, F, F), (), None, "fewer than --min-np 2: no round"),
        ((M, M, M, L), ("j",), ("r0", "r1", "r2", "j"), "a waiting joiner is appended"),
        ((M, M, M, L), (), ("r0", "r1", "r2"), "a joiner not yet waiting is not"),
        ((M, M, M, L, L), ("j", "k"), ("r0", "r1", "r2", "j"), "--max-np 4 caps the joiners"),
        ((M, F, F, L), ("j",), ("r0", "j"), "a joiner brings a short job back to --min-np"),
        ((M, M, S), (), ("r0", "r1"), "a stopped member is dropped"),
    ],
)
def test_the_next_round_takes_survivors_then_ready_joiners(states, waiting, expected, case):
    ids = ["r0", "r1", "r2", "j", "k"][: len(states)]
    workers = [worker(i, s, slot=n) for n, (i, s) in enumerate(zip(ids, states, strict=True))]
    decision = next_round(
        view(*workers, members=("r0", "r1", "r2"), waiting=frozenset(waiting)), "why", NOW
    )
    assert formed(decision) == expected, case


def test_a_round_short_of_min_np_waits_says_why_once_and_fills_slots() -> None:
    workers = (worker("r0", M), worker("r1", F, slot=1))
    decision = next_round(view(*workers, members=("r0", "r1")), "rank 1 died", NOW)
    assert kinds(decision) == [Log, WaitForWorkers, FillSlots]
    assert decision.actions[1] == WaitForWorkers(NOW)
    assert decision.reason == (
        "rank 1 died: 1 worker(s) left, fewer than --min-np 2; waiting up to 60 s "
        "(--elastic-timeout) for more"
    )
    already = view(*workers, members=("r0", "r1"), phase=Phase.SHORT, short_since=NOW - 5)
    assert kinds(next_round(already, "rank 1 died", NOW)) == [FillSlots]  # said before


def test_a_leaver_handing_its_state_over_stays_a_member_beyond_max_np() -> None:
    workers = [worker(f"r{n}", M, slot=n) for n in range(4)]
    workers[0].state, workers[0].handing_over = LV, True
    workers.append(worker("j", L, slot=4))
    decision = next_round(
        view(*workers, members=("r0", "r1", "r2", "r3"), waiting=frozenset({"j"})), "why", NOW
    )
    assert formed(decision) == ("r0", "r1", "r2", "r3", "j")


def test_a_leaver_that_handed_over_is_not_in_the_next_round() -> None:
    workers = (worker("r0", LV), worker("r1", M, slot=1), worker("r2", M, slot=2))
    decision = next_round(view(*workers, members=("r0", "r1", "r2")), "r0 leaves", NOW)
    assert formed(decision) == ("r1", "r2")


def test_the_reset_limit_ends_the_job_with_its_reason() -> None:
    limited = replace(ELASTIC, reset_limit=3)
    workers = (worker("r0", M), worker("r1", M, slot=1), worker("r2", F, slot=2))
    under = view(*workers, members=("r0", "r1", "r2"), elastic=limited, resets=2)
    assert formed(next_round(under, "rank 2 died", NOW)) == ("r0", "r1")
    decision = next_round(replace(under, resets=3), "rank 2 died", NOW)
    assert decision.actions == (
        Finish(1, "reset limit reached: 3 re-rendezvous (--reset-limit); rank 2 died"),
    )


@pytest.mark.parametrize("phase", [Phase.FINISHING, Phase.ENDED, Phase.ABANDONED])
def test_no_round_once_the_job_ends(phase: Phase) -> None:
    workers = (worker("r0", M), worker("r1", F, slot=1), worker("r2", M, slot=2))
    decision = next_round(view(*workers, members=("r0", "r1", "r2"), phase=phase), "x", NOW)
    assert decision.actions == ()


def test_a_static_job_never_re_forms() -> None:
    workers = (worker("r0", M), worker("r1", F, slot=1))
    assert next_round(view(*workers, members=("r0", "r1"), elastic=None), "x", NOW).actions == ()


# --- joiners -----------------------------------------------------------------------------


def test_joiners_form_a_round_once_every_launched_worker_waits() -> None:
    base = (worker("r0", M), worker("r1", M, slot=1), worker("j", L, slot=2), worker("k", L, 3))
    one = view(*base, members=("r0", "r1"), waiting=frozenset({"j"}))
    assert joiner_waiting(one, NOW).actions == ()
    both = replace(one, waiting=frozenset({"j", "k"}))
    decision = joiner_waiting(both, NOW)
    assert formed(decision) == ("r0", "r1", "j", "k")
    assert decision.reason == "2 worker(s) joined"


def test_ready_joiners_go_without_a_hung_one_after_the_join_window() -> None:
    ready = worker("j", L, slot=2, waiting_since=NOW)
    hung = worker("k", L, slot=3)
    job = view(
        worker("r0", M), worker("r1", M, slot=1), ready, hung,
        members=("r0", "r1"), waiting=frozenset({"j"}),
    )  # fmt: skip
    assert tick(job, NOW + JOIN_WINDOW - 0.01).actions == ()
    decision = tick(job, NOW + JOIN_WINDOW)
    assert formed(decision) == ("r0", "r1", "j")
    assert decision.reason == "1 worker(s) joined, 1 still starting"


def test_ready_joiners_wait_while_max_np_members_stay() -> None:
    members = [worker(f"r{n}", M, slot=n) for n in range(4)]
    job = view(
        *members, worker("j", L, slot=4, waiting_since=NOW),
        members=("r0", "r1", "r2", "r3"), waiting=frozenset({"j"}),
    )  # fmt: skip
    assert tick(job, NOW + 10).actions == ()


# --- the elastic timeout -----------------------------------------------------------------


def test_a_short_job_says_how_long_it_still_waits_then_ends_at_the_elastic_timeout() -> None:
    job = view(
        worker("r0", M), worker("r1", F, slot=1), members=("r0", "r1"),
        phase=Phase.SHORT, short_since=NOW,
    )  # fmt: skip
    waiting = tick(job, NOW + 20)
    assert waiting.actions == (
        ShowProgress("waiting for workers: 1 alive, --min-np 2, 40 s left (--elastic-timeout)"),
    )
    assert tick(job, NOW + 60).actions == (
        ShowProgress("waiting for workers: 1 alive, --min-np 2, 0 s left (--elastic-timeout)"),
    )
    ended = tick(job, NOW + 60.01)
    assert ended.actions == (
        Finish(1, "fewer than --min-np 2 workers for 60 s (--elastic-timeout)"),
    )


# --- the job's end -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("states", "elastic", "expected"),
    [
        ((M, X), ELASTIC, None),  # one still trains
        ((X, X), ELASTIC, Finish(0)),
        ((X, F), ELASTIC, Finish(9, "1 of the 2 worker(s) of the last round failed")),
        ((F, F), ELASTIC, Finish(9, "2 of the 2 worker(s) of the last round failed")),
        ((X, X), None, Finish(0)),
        ((X, F), None, None),  # a static job ended at its first failure already
    ],
)
def test_the_job_ends_when_no_member_of_the_last_round_is_alive(states, elastic, expected):
    workers = [
        worker(f"r{n}", s, slot=n, exit_code=9 if s is F else 0) for n, s in enumerate(states)
    ]
    decision = job_end(view(*workers, members=("r0", "r1"), elastic=elastic))
    assert (decision.actions[0] if decision.actions else None) == expected


def killed(worker_id: str, slot: int = 0, code: int = -9, **fields):
    """A failed worker record that ended with `code` (-9: SIGKILL)."""
    return worker(worker_id, F, slot=slot, exit_code=code, **fields)


def test_losing_every_worker_after_a_commit_starts_again_and_says_the_state_is_lost() -> None:
    dead = (killed("r0"), killed("r1", 1))
    job = view(*dead, members=("r0", "r1"), newest_commit=7)
    decision = fleet_lost(job, dead[1], NOW)
    assert kinds(decision) == [Log, RecordFleetLoss, WaitForWorkers, FillSlots]
    assert decision.actions[1] == RecordFleetLoss(FleetLoss(7, ("killed by signal SIGKILL",), 7))
    assert "its training state (commit 7) is lost" in decision.reason


def test_losing_every_worker_with_durable_commits_says_the_new_ones_resume_from_them() -> None:
    dead = (killed("r0"), killed("r1", 1))
    job = view(*dead, members=("r0", "r1"), newest_commit=7, checkpoint_dir="s3://b/run")
    decision = fleet_lost(job, dead[1], NOW)
    assert kinds(decision) == [Log, RecordFleetLoss, WaitForWorkers, FillSlots]
    assert "resume from the newest durable commit in s3://b/run" in decision.reason
    assert "is lost" not in decision.reason


@pytest.mark.parametrize(
    ("commit", "lost_at", "since"),
    [(0, None, "since the job started"), (7, 7, "since the last such loss")],
)
def test_losing_every_worker_without_a_new_commit_ends_the_job(commit, lost_at, since):
    dead = (killed("r0", code=3), killed("r1", 1, code=3))
    earlier = FleetLoss(lost_at, ("exit code 3",), lost_at) if lost_at is not None else None
    job = view(*dead, members=("r0", "r1"), newest_commit=commit, fleet_loss=earlier)
    assert fleet_lost(job, dead[1], NOW).actions == (
        Finish(3, f"every worker of the job failed, with no commit {since}"),
    )


@pytest.mark.parametrize("commit", [0, 7])
def test_a_fleet_lost_only_to_signals_with_no_new_commit_is_started_again(commit) -> None:
    """Spot hosts: the fleet was lost, and the replacement was preempted (SIGTERM) while it
    started, before any commit (sharded fault soak seed 95510: the job ended there)."""
    dead = killed("r2", code=143)
    earlier = FleetLoss(commit, ("killed by signal SIGKILL",), commit) if commit else None
    job = view(dead, members=("r2",), newest_commit=commit, fleet_loss=earlier)
    decision = fleet_lost(job, dead, NOW)
    assert kinds(decision)[-1] is FillSlots, decision.reason
    assert "starting new workers" in decision.reason


@pytest.mark.parametrize(
    ("codes", "ends"),
    [
        ((1, 1), True),  # every rank raised
        ((1, 2), True),  # errors, not the same one
        ((1, -9), False),  # one was killed: a preemption may have taken the fleet
        ((1, 137), False),  # 128 + SIGKILL: killed, through a keeper or ssh
        ((1, 255), False),  # ssh lost its host, or no exit status was left
        ((1, None), False),  # declared dead (hung): being killed
    ],
)
def test_a_fleet_whose_every_failure_exited_with_an_error_is_not_started_again(codes, ends):
    dead = (killed("r0", code=codes[0]), killed("r1", 1, code=codes[1]))
    job = view(*dead, members=("r0", "r1"), newest_commit=7)
    decision = fleet_lost(job, dead[1], NOW)
    assert (kinds(decision) == [Finish]) is ends, decision
    if ends:
        assert decision.reason.startswith("every worker of the job exited with an error (exit")
        assert decision.actions[0] == Finish(codes[1], decision.reason)


def test_workers_taken_out_with_their_host_are_no_failures_of_the_fleet() -> None:
    """r1 was stopped with r0's host (its exit, whatever it was, is not counted): r0's error
    and r2's are all the fleet's failures."""
    workers = (killed("r0", code=1), worker("r1", S, slot=1, exit_code=-15),
               killed("r2", 2, code=1, hostname="b"))  # fmt: skip
    job = view(*workers, members=("r0", "r1", "r2"), newest_commit=7)
    assert kinds(fleet_lost(job, workers[2], NOW)) == [Finish]


def test_the_same_loss_of_every_worker_three_times_in_a_row_ends_the_job() -> None:
    dead = (killed("r0"), killed("r1", 1))
    previous: FleetLoss | None = None
    decisions = []
    # Each new fleet made 11 commits, then was killed; the driver heard of 11, 10 and 11.
    for commit in (11, 21, 32):
        job = view(*dead, members=("r0", "r1"), newest_commit=commit, fleet_loss=previous)
        decisions.append(decision := fleet_lost(job, dead[1], NOW))
        recorded = [a for a in decision.actions if isinstance(a, RecordFleetLoss)]
        previous = recorded[0].loss if recorded else previous
    assert [kinds(d)[-1] for d in decisions] == [FillSlots, FillSlots, Finish]
    assert previous == FleetLoss(21, ("killed by signal SIGKILL",), 10, times=2)
    assert decisions[-1].reason == (
        "every worker of the job was lost the same way 3 times in a row (killed by signal "
        "SIGKILL, 11 commit(s) after they started): the job ends instead of starting new "
        "workers again"
    )


@pytest.mark.parametrize(
    ("earlier", "case"),
    [
        (FleetLoss(11, ("killed by signal SIGKILL",), 11, times=2), "further this time"),
        (FleetLoss(15, ("killed by signal SIGTERM",), 4, times=2), "another signal"),
    ],
)
def test_a_loss_unlike_the_last_starts_the_count_again(earlier, case) -> None:
    dead = (killed("r0"), killed("r1", 1))
    job = view(*dead, members=("r0", "r1"), newest_commit=19, fleet_loss=earlier)
    (recorded,) = [
        a for a in fleet_lost(job, dead[1], NOW).actions if isinstance(a, RecordFleetLoss)
    ]
    assert recorded.loss.times == 1, case


# --- slots and hosts ---------------------------------------------------------------------

HOSTS = [HostSpec("a", 2), HostSpec("b", 2)]


@pytest.mark.parametrize(
    ("workers", "elastic", "hosts", "expected"),
    [
        ((), ELASTIC, HOSTS, (("a", 0), ("a", 1), ("b", 0), ("b", 1))),
        ((worker("r0", M),), ELASTIC, HOSTS, (("a", 1), ("b", 0), ("b", 1))),
        ((worker("r0", F),), ELASTIC, HOSTS, (("a", 0), ("a", 1), ("b", 0), ("b", 1))),
        # a leaver holds its slot but does not count against --max-np
        ((worker("r0", LV), worker("r1", M, slot=1)), ELASTIC, HOSTS,
         (("b", 0), ("b", 1), )),
        ((worker("r0", M),), replace(ELASTIC, max_np=2), HOSTS, (("a", 1),)),
        ((worker("r0", M),), replace(ELASTIC, max_np=None), [HostSpec("b", 1)], (("b", 0),)),
        # a host in cooldown is not among the usable hosts the caller passes
        ((worker("r0", M),), ELASTIC, [HostSpec("a", 2)], (("a", 1),)),
    ],
)  # fmt: skip
def test_free_slots_are_filled_up_to_max_np(workers, elastic, hosts, expected) -> None:
    decision = fill_slots(view(*workers, elastic=elastic), hosts)
    assert decision.actions == ((Launch(expected),) if expected else ())


def test_no_launch_once_the_job_ends_or_in_a_static_job() -> None:
    assert fill_slots(view(phase=Phase.FINISHING), HOSTS).actions == ()
    assert fill_slots(view(elastic=None), HOSTS).actions == ()


def test_workers_on_a_removed_host_leave_and_those_in_cooldown_stay() -> None:
    workers = (
        worker("r0", M, host="a"), worker("r1", M, host="b"), worker("j", L, host="b", slot=1),
        worker("old", F, host="b", slot=2), worker("c0", M, host="c"),
    )  # fmt: skip
    decision = hosts_removed(view(*workers), ["b", "c"], discovered={"a", "c"})
    assert decision.actions == (
        AskToLeave("r1", "host b was removed by discovery", Cause.DISCOVERY, frozenset({"j"})),
        AskToLeave("j", "host b was removed by discovery", Cause.DISCOVERY, frozenset({"r1"})),
        SeeHandovers(),
    )
    assert decision.reason == "host(s) b removed by discovery"


def test_workers_on_a_noticed_host_leave_saying_it_is_about_to_be_preempted() -> None:
    workers = (worker("r0", M, host="a"), worker("r1", M, host="b"), worker("r2", M, host="c"))
    decision = hosts_removed(view(*workers), ["b"], discovered={"a", "c"}, noticed={"b": 9.0})
    assert decision.actions == (
        AskToLeave("r1", "host b is about to be preempted (notice)", Cause.PREEMPTION),
    )
    assert decision.reason == "host(s) b about to be preempted (notice)"
    both = hosts_removed(view(*workers), ["b", "c"], discovered={"a"}, noticed={"b": 9.0})
    assert both.reason == "host(s) b, c removed by discovery"
    assert both.actions[1] == AskToLeave(
        "r2", "host c was removed by discovery", Cause.DISCOVERY, frozenset({"r1"})
    )


def test_workers_beyond_a_shrunk_hosts_slots_leave_and_the_others_stay() -> None:
    workers = (
        worker("a0", M, host="a"), worker("a1", M, host="a", slot=1),
        worker("a2", L, host="a", slot=2), worker("a3", F, host="a", slot=3),
        worker("b3", M, host="b", slot=3),
    )  # fmt: skip
    decision = hosts_resized(view(*workers), {"a": 1, "b": 8})
    assert decision.actions == (
        AskToLeave("a1", "host a now offers 1 slot(s)", along=frozenset({"a2"})),
        AskToLeave("a2", "host a now offers 1 slot(s)", along=frozenset({"a1"})),
        SeeHandovers(),
    )
    assert decision.reason == "host(s) offer fewer slots: a:1"
    assert hosts_resized(view(*workers), {"b": 4}).actions == ()


def change(hosts: dict[str, int], added=(), removed=(), resized=()) -> HostChange:
    specs = tuple(HostSpec(name, slots) for name, slots in hosts.items())
    return HostChange(1, specs, tuple(added), tuple(removed), tuple(resized))


def test_a_host_change_asks_the_removed_and_shrunk_hosts_workers_to_leave_then_fills() -> None:
    """One decision for one change: host b is gone, host a shrank to 1 slot, host d came."""
    workers = (worker("a0", M, host="a"), worker("a1", M, host="a", slot=1),
               worker("b0", M, host="b"))  # fmt: skip
    now = change({"a": 1, "d": 2}, added=["d"], removed=["b"], resized=["a"])
    decision = hosts_changed(view(*workers), now, offered={"a", "d"}, noticed={}, drained=set())
    assert decision.actions == (
        AskToLeave("b0", "host b was removed by discovery", Cause.DISCOVERY),
        AskToLeave("a1", "host a now offers 1 slot(s)"),
        Log("info", "hosts available: d", "join"),
        FillSlots(),
    )
    assert decision.reason == "host(s) b removed by discovery; host(s) offer fewer slots: a:1"


@pytest.mark.parametrize(
    ("noticed", "drained", "why", "cause"),
    [
        ({}, set(), None, None),
        ({"b": 9.0}, set(), "host b is about to be preempted (notice)", Cause.PREEMPTION),
        ({}, {"b"}, "host b is drained (elasticrun drain)", Cause.DRAIN),
    ],
)
def test_a_host_still_offered_keeps_its_workers_unless_noticed_or_drained(
    noticed, drained, why, cause
) -> None:
    """Discovery still offers b (it left the usable hosts for its cooldown, a notice or a
    drain): only a notice or a drain sends its workers away."""
    job = view(worker("a0", M, host="a"), worker("b0", M, host="b"))
    now = change({"a": 1}, removed=["b"])
    decision = hosts_changed(job, now, {"a", "b"}, noticed, drained)
    leaves = [a for a in decision.actions if isinstance(a, AskToLeave)]
    assert leaves == ([AskToLeave("b0", why, cause)] if why else [])
    assert decision.actions[-1] == FillSlots() and (decision.reason != "") == bool(why)


def test_draining_says_so_marks_the_host_and_only_a_host_in_cooldown_sends_workers_away() -> None:
    """A usable host's workers leave through the host change its drain brings about; a host
    in cooldown is not usable, so no change comes and the drain sends them away itself."""
    job = view(worker("a0", M, host="a"), worker("a1", M, host="a", slot=1))
    usable = drain_asked(job, "a", drained=True, was_drained=False, cooling=False)
    assert kinds(usable) == [Log, Drain] and usable.actions[1] == Drain("a", True)
    assert usable.actions[0].level == "warning" and usable.reason == ""
    cooling = drain_asked(job, "a", drained=True, was_drained=False, cooling=True)
    assert kinds(cooling) == [Log, Drain, AskToLeave, AskToLeave, SeeHandovers]
    assert cooling.actions[2].cause is Cause.DRAIN
    assert cooling.reason == "host(s) a drained"


def test_undraining_marks_the_host_and_asking_twice_changes_nothing() -> None:
    job = view(worker("a0", M, host="a"))
    undrained = drain_asked(job, "a", drained=False, was_drained=True, cooling=True)
    assert undrained.actions == (
        Log("info", "host a is undrained: its free slots are filled again"),
        Drain("a", False),
    )
    assert drain_asked(job, "a", drained=True, was_drained=True, cooling=True).actions == ()
    assert drain_asked(job, "a", drained=False, was_drained=False, cooling=False).actions == ()


def test_reasons_for_one_round_are_said_once_each_and_counted_past_three() -> None:
    assert summarize(["a died", "b died", "a died"]) == "a died; b died"
    assert summarize([f"{n} died" for n in range(10)]) == "0 died; 1 died; and 8 more"


def test_a_broken_round_waits_for_the_survivors_not_yet_at_the_rendezvous() -> None:
    leaver = worker("r3", LV, slot=3, handing_over=True)
    gone = worker("r4", LV, slot=4)
    workers = (worker("r0", M), worker("r1", M, slot=1), worker("r2", F, slot=2), leaver, gone)
    job = view(*workers, members=("r0", "r1", "r2", "r3", "r4"), waiting=frozenset({"r0"}))
    assert survivors_not_waiting(job) == {"r1", "r3"}
    assert survivors_not_waiting(replace(job, waiting=frozenset({"r0", "r1", "r3"}))) == set()


# --- the first round's start --------------------------------------------------------------


@pytest.mark.parametrize(
    ("offered", "waited", "expected", "case"),
    [
        (4, 0.0, Start.NOW, "-np 4 offered: at once"),
        (6, 0.0, Start.NOW, "more than -np offered: at once (all are taken)"),
        (3, 0.0, Start.WAIT, "--min-np offered, not -np: wait for -np"),
        (3, 29.9, Start.WAIT, "until --start-timeout"),
        (3, 30.0, Start.NOW, "past it, --min-np will do"),
        (1, 30.0, Start.FAIL, "past it, fewer than --min-np fails"),
        (0, 0.0, Start.WAIT, "nothing offered yet"),
    ],
)
def test_an_elastic_job_starts_once_np_slots_are_offered(offered, waited, expected, case):
    assert start_check(offered, 4, 2, waited, 30.0) is expected, case
