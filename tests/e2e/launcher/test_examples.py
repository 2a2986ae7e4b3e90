"""The shipped examples run under `elasticrun` and learn (their printed loss falls)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.support.paths import EXAMPLES
from tests.support.processes import processes_naming


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("train_synthetic.py", ["--epochs", "3", "--samples", "2048"]),
        ("train_cnn.py", ["--epochs", "2", "--samples", "512"]),
        ("ddp_elastic.py", ["--epochs", "3", "--samples", "2048"]),
    ],
)
def test_example_trains_and_rank0_reports_a_falling_loss(
    elasticrun, script: str, args: list[str]
) -> None:
    job = elasticrun(["-np", "2", sys.executable, str(EXAMPLES / script), *args])
    assert job.finish(180) == 0, job.output
    losses = [
        float(m.group(1))
        for m in re.finditer(r"\[0\]<stdout>:epoch \d+/\d+: loss (\S+)", job.output)
    ]
    assert len(losses) == int(args[1])
    assert losses[-1] < losses[0]
    assert "[1]<stdout>:epoch" not in job.output, "only rank 0 prints"


@pytest.mark.parametrize("script", ["elastic_train.py", "ddp_elastic.py"])
def test_elastic_example_survives_a_killed_worker(elasticrun, script: str) -> None:
    """DistributedOptimizer's example, and the DDP one (hvd.elastic.DistributedDataParallel)."""
    script = EXAMPLES / script
    job = elasticrun(
        ["-np", "2", "--min-np", "1", "-H", "localhost:2", "--failure-scope", "worker",
         "--blacklist-cooldown-range", "60", "60",
         sys.executable, str(script), "--epochs", "4", "--samples", "2048"]
    )  # fmt: skip
    job.wait_for(r"\[0\]<stdout>:epoch 1/4", timeout=120)
    os.kill(_worker_with_rank(script, 1), signal.SIGKILL)
    assert job.finish(180) == 0, job.output
    assert "[0]<stdout>:epoch 4/4" in job.output
    assert "on 1 worker(s)" in job.output


def _worker_with_rank(script: Path, rank: int) -> int:
    """The pid of the worker running `script` that started as `rank` (from its environment)."""
    for pid in processes_naming(str(script)):
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"ELASTIC_RANK={rank}".encode() in environ:
                return pid
    raise AssertionError(f"no worker of rank {rank} runs {script}")


def test_the_fsdp_example_learns_through_a_joining_host_and_a_failing_worker(
    elasticrun, tmp_path: Path
) -> None:
    """examples/fsdp_elastic.py (FSDP2 with `hvd.elastic.ShardedState`) on two host names, as
    a user runs it with a discovery script: a slot joins as soon as the job runs (2 -> 3
    workers once the joiner is up, the joiner gets its shards from the others), then that
    worker is SIGKILLed (3 -> 2, its shards come from
    their replicas), and the loss still falls from the first epoch to the last."""
    from tests.e2e.elastic.test_elastic import discovery_args, write_hosts

    script = EXAMPLES / "fsdp_elastic.py"
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:1\n127.0.0.1:1\n")
    job = elasticrun(
        ["-np", "2", "--min-np", "2", "--max-np", "3", *discovery_args(),
         "--failure-scope", "worker", "--blacklist-cooldown-range", "60", "60",
         sys.executable, str(script), "--epochs", "16", "--samples", "768",
         "--commit-every", "4"],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    job.wait_for(r"elasticrun: round 1: 2 worker\(s\)", timeout=60)
    first = set(processes_naming(str(script)))
    write_hosts(hosts, "localhost:2\n127.0.0.1:1\n")
    job.wait_for(r"elasticrun: round \d+: 3 worker\(s\)", timeout=120)
    joiner = set(processes_naming(str(script))) - first
    assert len(joiner) == 1, (first, joiner)
    job.wait_for(r"<stdout>:epoch \d+/16: loss \S+ on 3 worker\(s\)", timeout=120)
    os.kill(joiner.pop(), signal.SIGKILL)
    assert job.finish(180) == 0, job.output
    losses = [float(m) for m in re.findall(r"\[0\]<stdout>:epoch \d+/16: loss (\S+)", job.output)]
    # an epoch the kill interrupted after its line, before its commit, is trained again
    assert len(losses) >= 16 and losses[-1] < losses[0], job.output
    assert "[0]<stdout>:epoch 16/16" in job.output
    after_kill = job.output.split("was killed by signal SIGKILL", 1)[1]
    assert "on 2 worker(s)" in after_kill, job.output
