"""What an operator sees, computed from plain data: rates, the rounds timeline with recovery
legs, stalls, the event loop's lag and the metrics' exposition. No sockets, a fake clock."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from elastic.driver.observe.loop_lag import LoopLag
from elastic.driver.observe.progress import RATE_WINDOW, WorkerProgress
from elastic.driver.observe.prometheus import JobMetrics
from elastic.driver.observe.stalls import RankActivity, find_stall
from elastic.driver.observe.timeline import (
    FORMED_TO_FIRST_STEP,
    NOTICED_TO_FIRST_STEP,
    NOTICED_TO_FORMED,
    RoundTimeline,
)
from elastic.protocol.beats import Activity
from elastic.protocol.http import (
    CollectiveStatus,
    HostStatus,
    JobStatus,
    StalledRank,
    StallReport,
    WorkerStatus,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rates_come_from_the_heartbeats_of_the_last_ten_seconds() -> None:
    progress = WorkerProgress()
    assert progress.step_rate is None  # nothing heard yet
    progress.heard(Activity(steps=0, samples=0), 1, now=0.0)
    assert progress.step_rate is None  # one beat is no rate
    for second in range(1, 21):  # 5 steps and 160 samples a second for 20 s
        progress.heard(Activity(steps=5 * second, samples=160 * second), 1, now=float(second))
    assert progress.step_rate == 5.0 and progress.sample_rate == 160.0
    for second in range(21, 21 + int(RATE_WINDOW) + 1):  # stopped: the rate falls to 0
        progress.heard(Activity(steps=100, samples=3200), 1, now=float(second))
    assert progress.step_rate == 0.0


def test_ages_in_a_beat_grow_with_the_time_since_it_arrived() -> None:
    progress = WorkerProgress()
    beat = Activity(commit_age=2.0, durable_age=-1.0, seq=4, kind="allreduce", blocked_for=1.5)
    progress.heard(beat, 3, now=50.0)
    assert progress.age(beat.commit_age, now=53.0) == 5.0
    assert progress.age(beat.durable_age, now=53.0) is None  # never written
    assert progress.age(math.nan, now=53.0) is None
    assert progress.collective(now=51.0) == CollectiveStatus(
        seq=4, kind="allreduce", blocked_for=2.5
    )


def test_a_failure_round_measures_both_recovery_legs_once() -> None:
    clock, told = Clock(), []
    timeline = RoundTimeline(clock, wall=lambda: 1e9, on_recovery=lambda *leg: told.append(leg))
    timeline.formed(1, 4, "start", "the job started")
    timeline.first_step(1, clock.now + 2.0)
    clock.now += 60
    timeline.noticed()
    clock.now += 0.1
    timeline.noticed()  # a second death before the round: recovery counts from the first
    clock.now += 0.2
    timeline.formed(2, 3, "failure", "rank 1 on host a was killed")
    formed = clock.now
    timeline.first_step(2, formed + 0.5)
    timeline.first_step(2, formed + 0.4)  # another member's, earlier: the round's first step
    timeline.first_step(1, formed + 0.1)  # an older round's: ignored
    first, second = timeline.records()
    assert (first.cause, first.noticed_to_formed) == ("start", None)
    assert first.formed_to_first_step == 2.0
    assert (second.number, second.size, second.cause) == (2, 3, "failure")
    assert math.isclose(second.noticed_to_formed, 0.3)
    assert math.isclose(second.formed_to_first_step, 0.4)
    legs = [leg for leg, _ in told]
    assert legs == [FORMED_TO_FIRST_STEP, NOTICED_TO_FORMED, FORMED_TO_FIRST_STEP,
                    NOTICED_TO_FIRST_STEP]  # fmt: skip
    assert timeline.reforms == {"failure": 1}  # the first round is no re-form


def _rank(rank: int, kind: str = "", seq: int = 0, blocked: float | None = None, steps: int = 9):
    return RankActivity(rank, f"h{rank}", seq, kind, blocked, steps)


def test_a_stall_names_the_ranks_behind_and_what_each_does() -> None:
    members = [
        _rank(0, "allreduce", 12, blocked=61.0),
        _rank(1, "allreduce", 11, blocked=None, steps=5),  # computing: has not issued #12
        _rank(2, "allgather", 12, blocked=60.5),  # issued another collective
        _rank(3, "allreduce", 12, blocked=61.2),
    ]
    stall = find_stall(7, members, warning=60.0)
    assert stall is not None
    assert stall.waiting == [0, 3] and stall.collective.kind == "allreduce"
    assert stall.missing == [
        StalledRank(rank=1, hostname="h1", doing="not in a collective, last step 5"),
        StalledRank(rank=2, hostname="h2", doing="in allgather #12"),
    ]
    assert stall.line == (
        "stall in round 7: ranks 0, 3 waited 61 s in allreduce #12 for rank 1 on host h1 "
        "(not in a collective, last step 5), rank 2 on host h2 (in allgather #12)"
    )


def test_no_stall_before_the_warning_or_when_every_rank_is_in_the_collective() -> None:
    behind = [_rank(0, "allreduce", 3, blocked=59.0), _rank(1, steps=2)]
    assert find_stall(1, behind, warning=60.0) is None
    together = [_rank(0, "allreduce", 3, blocked=600.0), _rank(1, "allreduce", 3, blocked=599)]
    assert find_stall(1, together, warning=60.0) is None  # slow, but nobody is missing
    issued = [_rank(0, "allreduce", 3, blocked=90.0), _rank(1, "allreduce", 3, blocked=None)]
    assert find_stall(1, issued, warning=60.0) is None  # rank 1 issued it (asynchronously)
    assert find_stall(1, [_rank(0), _rank(1)], warning=60.0) is None  # nobody waits


def test_loop_lag_is_the_worst_of_the_window() -> None:
    clock = Clock()
    lag = LoopLag(window=10.0, clock=clock)
    assert lag.worst == 0.0
    for value in (0.002, 0.300, 0.010):
        lag.record(value)
        clock.now += 1
    assert lag.worst == 0.300
    clock.now += 8.5  # the 0.3 s lag (at 101) is older than the window now (111.5)
    assert lag.worst == 0.010


def test_the_exposition_parses_and_holds_what_an_operator_reads() -> None:
    status = JobStatus(
        job_id="j1",
        round=3,
        size=2,
        hosts=[HostStatus(hostname="a", slots=2), HostStatus(hostname="b", slots=2)],
        workers=[
            WorkerStatus(
                worker_id="a[0]#1",
                rank=0,
                hostname="a",
                local_rank=0,
                state="member",
                steps=40,
                step_rate=4.0,
                commit_age=1.5,
                heartbeat_age=0.2,
            ),  # fmt: skip
            WorkerStatus(
                worker_id="b[0]#2",
                rank=1,
                hostname="b",
                local_rank=0,
                state="member",
                steps=40,
                step_rate=None,
            ),  # fmt: skip
            WorkerStatus(
                worker_id="b[1]#3",
                rank=None,
                hostname="b",
                local_rank=None,
                state="failed",
                exit_code=-9,
                end_cause="signal SIGKILL",
            ),  # fmt: skip
        ],
        # 40 more failed before it, whose records the driver no longer keeps
        ended_total=41,
        ended_by_state={"failed": 41},
        ended_by_cause={"signal SIGKILL": 40, "hung": 1},
        stall=StallReport(
            round=3,
            collective=CollectiveStatus(seq=2, kind="allreduce", blocked_for=70.0),
            waiting=[0],
            missing=[StalledRank(rank=1, hostname="b", doing="not in a collective")],
            seconds=70.0,
            line="stall",
        ),
    )
    metrics = JobMetrics()
    metrics.recovered("noticed_to_formed", 0.07)
    text = metrics.exposition(status, {"failure": 2, "join": 1}, 0.004).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("elasticrun_round", ())] == 3
    assert samples[("elasticrun_workers", (("state", "member"),))] == 2
    assert samples[("elasticrun_workers", (("state", "failed"),))] == 41
    assert samples[("elasticrun_workers_ended_total", (("cause", "signal SIGKILL"),))] == 40
    assert samples[("elasticrun_workers_ended_total", (("cause", "hung"),))] == 1
    assert samples[("elasticrun_hosts", (("state", "active"),))] == 2
    assert samples[("elasticrun_reforms_total", (("cause", "failure"),))] == 2
    worker0 = (("host", "a"), ("rank", "0"), ("worker", "1"))
    assert samples[("elasticrun_steps_per_second", worker0)] == 4.0
    assert samples[("elasticrun_commit_age_seconds", worker0)] == 1.5
    assert samples[("elasticrun_steps_total", worker0)] == 40
    assert (
        "elasticrun_steps_per_second",
        (("host", "b"), ("rank", "1"), ("worker", "2")),
    ) not in samples  # not measured yet: no sample rather than a made-up 0
    assert samples[("elasticrun_stalled_ranks", ())] == 1
    assert samples[("elasticrun_event_loop_lag_seconds", ())] == 0.004
    bucket = (("le", "0.1"), ("leg", "noticed_to_formed"))
    assert samples[("elasticrun_recovery_seconds_bucket", bucket)] == 1
    assert "j1" in text and "token" not in text.lower()
