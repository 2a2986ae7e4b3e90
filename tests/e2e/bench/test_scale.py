"""The scale benchmark runs end to end at a tiny size and writes every figure it promises.

`python -m bench run driver_scale` with 20 simulated workers and the memory backend (a real
driver in its own process, two client processes), and `bench.support.tcpstore_rendezvous` with
20 TCPStore clients; the figures themselves are not judged here, only that they are there.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPOSITORY as ROOT


def test_scale_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "bench", "run", "driver_scale",
            "--sizes", "20", "--backends", "memory", "--no-tcpstore", "--client-processes", "2",
            "--idle-seconds", "1", "--death-fraction", "0.1", "--out", str(out),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "scale"
    assert doc["open_files_limit"]["raised_to"] >= doc["open_files_limit"]["before"][0]
    (record,) = doc["results"]
    assert record["ok"], record
    assert (record["n"], record["backend"], record["heartbeat_s"]) == (20, "memory", 1.0)
    start = record["start"]
    assert 0 < record["first_round_s"] == start["first_round_s"] <= start["run_to_first_round_s"]
    assert (start["joined_round_1"], start["settled_round"], start["declared_dead"]) == (20, 1, 0)
    assert set(record["idle"]) >= {"window_s", "workers", "driver_cpu_pct", "clients_cpu_pct"}
    assert record["driver_rss_mib"] > 0 and record["driver_peak_rss_mib"] > 0
    one, many = record["one_death"], record["one_percent"]
    assert (one["deaths"], one["survivors"], one["rounds"]) == (1, 19, 1)
    assert many["deaths"] == 2 and many["survivors"] == 17 and many["rounds"] >= 1
    for phase in (one, many):
        assert 0 < phase["told_s"] <= phase["reform_s"]
        assert phase["first_round_s"] <= phase["reform_s"]
        assert phase["declared_dead"] == 0
    rounds_target = [t for t in record["targets"] if t["metric"] == "one_percent.rounds"]
    assert rounds_target and rounds_target[0]["value"] == many["rounds"]
    assert "| 20 | memory |" in doc["table"]


def test_tcpstore_reference_times_a_rendezvous() -> None:
    from bench.support.tcpstore_rendezvous import tcpstore_rendezvous

    record = asyncio.run(tcpstore_rendezvous(20, 2, timeout=60))
    assert record["ok"], record
    assert record["connect_s"] > 0 and record["rendezvous_s"] > 0
    assert record["total_s"] == round(record["connect_s"] + record["rendezvous_s"], 4)
