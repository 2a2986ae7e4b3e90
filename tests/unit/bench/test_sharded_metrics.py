"""The sharded recovery benchmark's arithmetic on hand-made workload lines: step time over a
window, where a recovery's time went, host memory against the `(1 + r)` bound, the targets
and the table. The answers are worked out in each test."""

from __future__ import annotations

from bench.support.sharded_metrics import mean_step_s, memory, phase_seconds
from bench.support.sharded_report import markdown, summarize_system, targets
from bench.support.trial_processes import Output, Step
from bench.workloads.transformer import LanguageModel, parameter_count


def output(*lines: str) -> Output:
    out = Output()
    for line in lines:
        out.feed("test", line)
    return out


def test_the_step_time_of_a_window_is_its_mean_gap_and_skips_what_is_missing() -> None:
    steps = [Step("step", k, 4, 0, 1, t) for k, t in [(1, 0.0), (2, 1.0), (3, 3.0), (5, 9.0)]]
    steps.append(Step("step", 4, 4, 1, 2, 4.0))  # another rank's
    assert mean_step_s(steps, 0, 2, 3) == 1.5  # gaps 1 and 2
    assert mean_step_s(steps, 0, 2, 5) == 1.5  # steps 4 and 5 have no gap of rank 0
    assert mean_step_s(steps, 0, 6, 9) is None


def test_phases_are_summed_per_process_and_the_slowest_process_counts() -> None:
    out = output(
        "phase rejoin 0.5000 rank 0 pid 10 t 100.000000",
        "phase agree 0.1000 rank 0 pid 10 t 100.500000",
        "phase agree 0.2000 rank 0 pid 10 t 100.700000",
        "phase agree 0.2500 rank 1 pid 11 t 100.700000",
        "phase agree 9.0000 rank 1 pid 11 t 200.000000",  # after the window
        "metric commit_s 0.1000 rank 0 pid 10 t 100.100000",  # not a phase
    )
    assert phase_seconds(out, 99.0, 101.0) == {"rejoin": 0.5, "agree": 0.3}


def test_memory_counts_what_the_commits_hold_beside_the_training_s_own() -> None:
    # share 300 MiB, parameters 100 of it; before the first commit the rank held commit 0
    # (parameters only, own + 1 replica = 200): the training's own is 1000 - 200 = 800.
    lines = [
        f"metric {name} {value} rank 0 pid 7 t 1.0"
        for name, value in [("share_mib", 300), ("param_share_mib", 100), ("base_mib", 1000)]
    ]
    for t, rest, peak in [(1, 1000, 1900), (2, 1400, 2000), (3, 1450, 1800)]:
        lines.append(f"metric rest_mib {rest} rank 0 pid 7 t {t}.5")
        lines.append(f"metric peak_mib {peak} rank 0 pid 7 t {t}.5")
    found = memory(output(*lines), 1, 10.0)
    assert found["live_mib"] == 800 and found["rest_mib"] == 1450 and found["peak_mib"] == 2000
    assert found["held_at_rest_x_share"] == round(650 / 300, 2)  # the last rest
    assert found["held_at_peak_x_share"] == 4.0  # the first peak (before any commit) is left out
    assert found["bound_x_share"] == 2 and found["ranks"] == 1
    assert memory(output(*lines), 1, 1.2) == {}, "too early: no rest and peak yet"


def record(system: str, recovery: float, lost: int, ok: bool = True) -> dict:
    return {
        "system": system, "ok": ok, "trial": 0, "recovery_s": recovery, "steps_lost": lost,
        "host_recovery_s": 2 * recovery, "host_steps_lost": lost, "commit_cost_pct": 4.0,
        "recovery_phases_s": {"rejoin": 0.4, "transfer": 0.2},
        "memory": {"held_at_rest_x_share": 2.1, "bound_x_share": 2},
    }  # fmt: skip


def test_targets_and_table_compare_elasticrun_with_torchrun() -> None:
    failed = {**record("torchrun", 30.0, 9), "ok": False, "error": "launch: boom", "trial": 1}
    doc = {
        "systems": {
            "elasticrun": summarize_system([record("elasticrun", 2.0, 3)]),
            "torchrun": summarize_system([record("torchrun", 20.0, 9), failed]),
        }
    }
    assert doc["systems"]["torchrun"]["metrics"]["recovery_s"]["median"] == 25.0
    assert doc["systems"]["torchrun"]["failures"] == ["trial 1: launch: boom"]
    met = {t["target"]: (t["value"], t["met"]) for t in targets(doc, 10)}
    assert met["recovery_s at most 3 s"] == (2.0, True)
    assert met["host_recovery_s at most 3 s"] == (4.0, False)
    assert met["recovery_s: torchrun + DCP / elasticrun at least 5"] == (12.5, True)
    assert met["commits cost at most 5 % of step time"] == (4.0, True)
    assert met["steps_lost at most the commit interval (10)"] == (3, True)
    table = markdown(doc)
    assert "| recovery_s | 2 | 25 [20–30] | 12.5x |" in table
    assert "| trials ok | 1/1 | 1/2 | |" in table
    assert "rejoin 0.4, transfer 0.2" in table


def test_the_parameter_count_is_the_model_s() -> None:
    model = LanguageModel(48, 2, 100)
    assert parameter_count(48, 2, 100) == sum(p.numel() for p in model.parameters())
