"""The goodput benchmark runs end to end on a tiny trace and writes every figure it promises.

`python -m bench run goodput` on a made-up trace (3 hosts: one reclaimed with a notice, then
allocated again, in a 12 s replay), elasticrun only; the figures themselves are not judged
here, only that they are there and add up. Needs what the bed needs (root, namespaces,
sshd); skips with one line saying why elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.multihost.bed import missing_prerequisite

ROOT = Path(__file__).resolve().parents[2]
# 32 nodes -> 3 hosts; 21 nodes -> 2 (1.97, rounded). One trace hour is 12 s of replay.
TRACE = "ms,live_nodes\n0,32\n900000,21\n2160000,32\n3600000,32\n"


@pytest.mark.multihost
@pytest.mark.slow  # a bench's smoke run; tests/unit/bench checks every entry imports
@pytest.mark.timeout(300)
def test_goodput_writes_every_figure(tmp_path: Path) -> None:
    if reason := missing_prerequisite():
        pytest.skip(reason)
    trace, out = tmp_path / "trace.csv", tmp_path / "goodput.json"
    trace.write_text(TRACE)
    done = subprocess.run(
        [
            sys.executable, "-m", "bench", "run", "goodput",
            "--trace", str(trace), "--window", "0:1", "--hour-s", "12", "--hosts", "3",
            "--notice-lead-min", "10", "--systems", "elasticrun", "--out", str(out),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "goodput"
    counts = doc["trace"]["counts"]
    assert [count for _, count in counts] == [3, 2, 3]
    assert [at for at, _ in counts] == pytest.approx([0.0, 3.0, 7.2])
    (run,) = doc["runs"]
    assert run["ok"] and run["stop"]["leftover_processes_sigkilled"] == [], run
    assert [a["what"] for a in run["actions"]] == ["notice", "reclaim", "allocate"]
    transcript = (tmp_path / "goodput" / "elasticrun.log").read_text()
    assert "about to be preempted (notice)" in transcript, "the noticed host's worker left"
    mine = doc["systems"]["elasticrun"]
    assert 0 < mine["goodput"] <= 1.05
    lost = sum(mine["lost_share_of_ideal"].values())
    assert lost == pytest.approx(1 - mine["goodput"], abs=0.01)
    assert doc["verdict"]["elasticrun_goodput"] == mine["goodput"]
    assert "| goodput |" in doc["table"]
