"""The goodput benchmark's arithmetic: the trace scaled to the bed, the changes named, and the
ledger of a replay (ideal, useful, lost by cause), on hand-made step lines whose answers are
worked out in each test."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.support.goodput_ledger import (
    StepLine,
    account,
    ideal_step_times,
    on_lineage,
    step_times,
)
from bench.support.spot_trace import AWS_P3_TRACE, Change, TraceError, read_trace, scale, schedule


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_a_burst_is_its_last_row_and_bad_rows_name_their_line(tmp_path: Path) -> None:
    assert read_trace(write(tmp_path, "ms,live_nodes\n0,1\n0,2\n0,3\n500,2\n")) == [
        (0, 3),
        (500, 2),
    ]
    with pytest.raises(TraceError, match=r"trace.csv:3: expected"):
        read_trace(write(tmp_path, "ms,live_nodes\n0,1\n5,x\n"))
    with pytest.raises(TraceError, match=r"trace.csv:3: time goes backwards"):
        read_trace(write(tmp_path, "ms,live_nodes\n9,1\n5,2\n"))
    with pytest.raises(TraceError, match="header"):
        read_trace(write(tmp_path, "when,nodes\n0,1\n"))
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "absent.csv")


def test_a_window_is_time_and_node_scaled() -> None:
    hour = 3_600_000
    points = [(0, 32), (hour // 2, 20), (hour, 9), (2 * hour, 1), (3 * hour, 30)]
    # 32 nodes -> 8 hosts: 20 -> 5, 9 -> 2 (2.25), 1 -> 1 (never 0), 30 -> 8 (7.5 rounds up)
    counts, duration = scale(points, hosts=8, hour_s=60, window_h=(0.25, 3.5))
    assert counts == [(0.0, 8), (15.0, 5), (45.0, 2), (105.0, 1), (165.0, 8)]
    assert duration == pytest.approx(165.0)  # the trace ends at 3 h
    with pytest.raises(TraceError, match="after the trace ends"):
        scale(points, hosts=8, hour_s=60, window_h=(4, 5))


def test_changes_are_named_the_same_for_every_seed_and_never_bring_back_a_recent_host() -> None:
    counts = [(0.0, 3), (10.0, 1), (20.0, 2), (30.0, 4)]
    names = ["h1", "h2", "h3", "h4"]
    replay = schedule(counts, 40.0, names, seed=7)
    assert replay == schedule(counts, 40.0, names, seed=7)
    assert replay.start == ("h1", "h2", "h3")
    reclaims = [c for c in replay.changes if c.kind == "reclaim"]
    allocations = [c for c in replay.changes if c.kind == "allocate"]
    assert [c.at for c in reclaims] == [10.0, 10.0]
    # h4, never up, is allocated before the hosts reclaimed at 10 s; then they come back.
    assert allocations[0] == Change(20.0, "allocate", "h4")
    assert sorted(c.host for c in allocations[1:]) == sorted(c.host for c in reclaims)
    assert [replay.alive(t) for t in (0, 9.9, 10, 25, 39)] == [3, 3, 1, 2, 4]
    with pytest.raises(TraceError, match="more hosts"):
        schedule([(0.0, 5)], 1.0, names, seed=0)


def test_the_shipped_trace_scales_to_the_bed() -> None:
    if not AWS_P3_TRACE.exists():
        pytest.skip(f"the AWS trace is not beside this checkout ({AWS_P3_TRACE})")
    counts, duration = scale(read_trace(AWS_P3_TRACE), hosts=8, hour_s=60, window_h=(0, 4))
    assert duration == pytest.approx(240.0)
    assert all(1 <= count <= 8 for _, count in counts) and len(counts) > 10


def lines(*spec: tuple[float, int, int, int]) -> list[StepLine]:
    return [StepLine(t, step, size, pid) for t, step, size, pid in spec]


def test_a_step_redone_after_a_rollback_counts_once() -> None:
    steps = lines((1, 1, 2, 10), (2, 2, 2, 10), (3, 3, 2, 10), (6, 2, 1, 11), (7, 3, 1, 11))
    # Steps 2 and 3 were redone at size 1: their first doings are lost.
    assert on_lineage(steps) == [True, False, False, True, True]
    # A step above the last line's was rolled back too.
    assert on_lineage(lines((1, 1, 1, 5), (2, 2, 1, 5), (5, 1, 1, 6))) == [False, False, True]


def test_step_times_take_consecutive_steps_of_one_process_and_the_fastest_system() -> None:
    steps = lines((1.0, 1, 2, 10), (1.5, 2, 2, 10), (2.0, 3, 2, 10), (9.0, 3, 2, 11))
    assert step_times(steps) == {2: 0.5}  # the restarted process's step is no interval
    ideal = ideal_step_times([{2: 0.5, 4: 1.0}, {2: 0.4}], sizes=[1, 2, 3, 4, 5])
    assert ideal == {1: 0.4, 2: 0.4, 3: 1.0, 4: 1.0, 5: 1.0}  # 3: a tie, the larger's


def test_the_ledger_adds_up_and_names_each_loss() -> None:
    """2 hosts until 10 s, then 1 (a reclaim at 10 s, noticed at 8 s) until 20 s; T(N) = 1 s,
    so ideal = 2 * 10 + 1 * 10 = 30 rank-steps. The job trains at size 2 (steps 1-8, to
    8 s), leaves on the notice (step 9 at size 1, 8-9 s: one host unused), does step 10 at
    9-10 s, stalls until 15 s and redoes step 10 (rolled back: the first one is lost), then
    trains steps 11-15 until 20 s."""
    steps = lines(
        *((float(k), k, 2, 1) for k in range(1, 9)),
        (9.0, 9, 1, 1), (10.0, 10, 1, 1),
        *((float(k + 5), k, 1, 1) for k in range(10, 16)),
    )  # fmt: skip
    ledger = account(
        steps,
        duration=20.0,
        alive=lambda t: 2 if t < 10 else 1,
        changes_at=[10.0],
        step_time={1: 1.0, 2: 1.0},
        notices=[(8.0, 10.0)],
    )
    assert ledger.ideal == pytest.approx(30.0)
    assert ledger.useful == 8 * 2 + 1 + 6
    assert ledger.done == ledger.useful + 1
    assert ledger.goodput == pytest.approx(23 / 30)
    assert ledger.losses == pytest.approx(
        {
            "left_on_notice": 1.0,  # 8-9 s: the noticed host, gone early
            "rollback": 2.0,  # 9-10 s: both hosts' work on the first step 10
            "reform": 5.0 - 1.0,  # 10-15 s: one host, one step credited
            "not_yet_joined": 0.0,
            "step_time": 0.0,
            "end": 0.0,
        }
    )


def test_a_host_outside_the_job_and_a_slow_step_are_told_apart() -> None:
    """3 hosts offered for 4 s, T(2) = T(3) = 1 s: the job trains at size 2 (one host not
    joined yet) and one step takes 1.5 s; the replay ends half a step after the last."""
    steps = lines((1.0, 1, 2, 1), (2.5, 2, 2, 1), (3.5, 3, 2, 1))
    ledger = account(
        steps, duration=4.0, alive=lambda t: 3, changes_at=[], step_time={2: 1.0, 3: 1.0}
    )
    assert ledger.ideal == pytest.approx(12.0)
    assert ledger.losses == pytest.approx(
        {
            "not_yet_joined": 3.5,  # one host for 3.5 s
            "step_time": 1.0,  # step 2: 1.5 s at 2 hosts = 3 ideal rank-steps, credited 2
            "end": 1.5,  # 3.5-4 s at 3 hosts
            "reform": 0.0,
            "rollback": 0.0,
            "left_on_notice": 0.0,
        }
    )
