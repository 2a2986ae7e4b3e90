"""The sharded recovery benchmark runs end to end at a toy size and writes every figure it
promises: `python -m bench run sharded_recovery` with a model of a few thousand parameters,
both systems for real (elasticrun with `ShardedState` over 4 workers on 2 host names, then a
SIGKILL, a joiner and a lost host; torchrun's agents with DCP checkpoints, a SIGKILL and a
lost agent). The figures themselves are not judged here, only that each is there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPOSITORY as ROOT

TOY = [
    "--dim", "32", "--layers", "1", "--vocab", "64", "--seq", "8", "--commit-every", "2",
    "--quiet-steps", "4", "--commit-steps", "4", "--steady-steps", "2", "--wait-s", "90",
]  # fmt: skip
BOTH = [
    "launch_to_first_step_s", "step_s_no_commits", "step_s_with_commits", "commit_cost_pct",
    "commit_blocking_s", "recovery_s", "steps_lost", "host_recovery_s", "host_steps_lost",
]  # fmt: skip
GROW = ["scale_up_s", "joiner_first_step_s", "incumbent_stall_s", "step_interval_s",
        "scale_up_steps_lost"]  # fmt: skip
PHASES = ["rejoin", "restore", "sync", "agree", "rewrap", "transfer", "to_dtensor", "snapshot"]


@pytest.mark.slow  # a bench's smoke run; tests/unit/bench checks every entry imports
def test_sharded_recovery_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "sharded.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", "sharded_recovery", *TOY, "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "sharded_recovery" and "--dim 32" in doc["command"]
    elastic, torch = doc["systems"]["elasticrun"], doc["systems"]["torchrun"]
    for system in (elastic, torch):
        assert system["trials_ok"] == 1, system["failures"]
        assert system["leftovers"] == 0
        assert set(system["metrics"]) >= set(BOTH), sorted(set(BOTH) - set(system["metrics"]))
        assert set(system["recovery_milestones"]) and set(system["host_recovery_milestones"])
    assert set(elastic["metrics"]) >= set(GROW)
    assert "scale_up_s" not in torch["metrics"], "torchrun is not grown"
    assert set(elastic["memory"]) >= {"share_mib", "rest_mib", "peak_mib", "held_at_rest_x_share",
                                      "held_at_peak_x_share", "bound_x_share"}  # fmt: skip
    assert set(elastic["recovery_phases_s"]) >= set(PHASES) - {"restore"}
    (kill,) = [t for t in doc["trials"] if t["system"] == "elasticrun"]
    assert (kill["recovery_size"], kill["host_recovery_size"]) == (3, 2)
    assert kill["host_lost"] == {"host": "localhost", "workers": 2}
    (theirs,) = [t for t in doc["trials"] if t["system"] == "torchrun"]
    assert (theirs["recovery_size"], theirs["host_recovery_size"]) == (4, 2)
    assert len(doc["targets"]) == 7 and all(t["value"] is not None for t in doc["targets"])
    assert "| recovery_s |" in doc["table"] and "| held_at_rest_x_share |" in doc["table"]
    assert (out.parent / "sharded" / "elasticrun-0.log").exists()
