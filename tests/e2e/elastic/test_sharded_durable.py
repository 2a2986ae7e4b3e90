"""An FSDP2 job under `elasticrun` loses more hosts at once than its replicas cover and goes
on from its durable checkpoint, at the step of that checkpoint, saying so in one line.

Real processes only: `elasticrun` on three local host names (`localhost`, `127.0.0.1` and
this machine's own name), one worker each, `hvd.elastic.ShardedState(replicas=1)` with
`--checkpoint-dir`; the job is tests/support/workers/sharded_durable_job.py. The workers of
two hosts SIGKILL themselves at the same step, once the checkpoint in flight is written, so
no commit survives whole in memory (every shard has one replica, on one other host).
"""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path

import pytest

from tests.support.paths import WORKERS

pytestmark = pytest.mark.timeout(240)

JOB = WORKERS / "sharded_durable_job.py"


def test_losing_two_of_three_hosts_with_one_replica_resumes_from_the_durable_checkpoint(
    elasticrun, tmp_path: Path
) -> None:
    hosts = ["localhost", "127.0.0.1", socket.gethostname()]
    assert len(set(hosts)) == 3, "this machine's name is a third name for it"
    checkpoints = tmp_path / "checkpoints"
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", ",".join(f"{h}:1" for h in hosts),
         "--blacklist-cooldown-range", "300", "300",  # the lost hosts stay lost
         "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "1",
         sys.executable, str(JOB), "--out", str(tmp_path), "--steps", "20",
         "--commit-every", "5", "--lose-at-step", "12", "--lose-hosts", ",".join(hosts[1:])]
    )  # fmt: skip
    job.wait_for(r"step 12 size 3", timeout=120)
    line = job.wait_for(r"more hosts lost than the 1 replica covers: .*", timeout=90)
    assert line.group(0) == (
        "more hosts lost than the 1 replica covers: resuming from the durable checkpoint of "
        f"step 10 (commit 2) in {checkpoints}, 2 steps lost"
    )
    assert job.finish(120) == 0, job.output
    # size 1 is after the loss (the line is on stderr: it may come out after a step line)
    steps = [int(n) for n in re.findall(r"step (\d+) size 1 host localhost", job.output)]
    assert steps == list(range(11, 21)), "training goes on from step 10's checkpoint"
    assert "done steps 20 host localhost" in job.output
    assert job.output.count("more hosts lost than") == 1, "one line"
    markers = [json.loads(p.read_text()) for p in sorted(checkpoints.glob("*.json"))]
    assert [(m["commit"], m["step"], m["world"]) for m in markers] == [(3, 15, 1), (4, 20, 1)]
