"""`python -m bench run host_faults` runs end to end: one trial of one scenario (a worker
SIGKILLed), elasticrun only, on a bed of 4 hosts.

The figures themselves are not judged here (the machine may be busy), only that the script
builds its bed, measures a recovery from the workers' step lines, leaves nothing running in
any namespace, and writes the JSON document it promises to stdout and to `--out`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.multihost.bed import missing_prerequisite
from tests.support.paths import REPOSITORY as ROOT

# a bench's smoke run (slow); tests/unit/bench checks every entry imports and takes argv
pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.timeout(150)]


def test_multihost_bench_measures_a_worker_kill(tmp_path: Path) -> None:
    if reason := missing_prerequisite():
        pytest.skip(reason)
    out = tmp_path / "multihost.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", "host_faults", "--trials", "1",
         "--systems", "elasticrun", "--scenarios", "worker_kill", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=140,
    )  # fmt: skip
    if "no bed on this machine" in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert json.loads(done.stdout) == doc
    assert doc["benchmark"] == "multihost" and doc["systems_run"] == ["elasticrun"]
    assert doc["bed"]["hosts"] == 4 and doc["git"]["commit"]

    (record,) = doc["trials"]
    assert record["ok"], record
    assert (record["system"], record["scenario"], record["trial"]) == (
        "elasticrun",
        "worker_kill",
        0,
    )
    assert record["victim"]["rank"] == 1 and record["victim"]["host"] in {"h1", "h2", "h3", "h4"}
    assert 0 < record["recovery_s"] < 10 and record["recovered_size"] == 3
    assert record["milestones"]["first step at size 3"] == record["recovery_s"]
    stop = record["stop"]
    assert stop["leftover_processes_sigkilled"] == [] and stop["namespace_leftovers"] == {}
    assert stop["bed_remains"] == [] and "errors" not in stop

    cell = doc["scenarios"]["worker_kill"]["systems"]["elasticrun"]
    assert (cell["trials"], cell["trials_ok"], cell["leftovers"]) == (1, 1, 0)
    assert cell["metrics"]["recovery_s"]["median"] == record["recovery_s"]
    assert cell["target"]["metric"] == "recovery_s"
    assert "| worker_kill | recovery_s |" in doc["table"]
    assert (out.with_suffix("") / "worker_kill-elasticrun-0.log").stat().st_size > 0
