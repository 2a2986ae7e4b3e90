"""No rollback past the step in flight (`--rollback step`, the default), with real workers.

Every job runs tests/support/workers/elastic_job.py: a Horovod-style loop (`DistributedOptimizer`,
an `ElasticSampler`, a per-step allreduce that counts the samples trained on, `record_batch`),
whose counts must end exactly `--epochs` for every sample. The commits are 1,000 steps apart,
so the only commit the job ever holds is its initial state: any rollback would show.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.e2e.elastic.test_elastic import (
    assert_exactly_once,
    discovery_args,
    ranks_to_pids,
    write_hosts,
)
from tests.support.paths import WORKERS

JOB = WORKERS / "elastic_job.py"
pytestmark = pytest.mark.timeout(180)

# one host, a killed worker's host-mates go on and its slot is not refilled for 600 s
KILLS_SHRINK = ("--min-np", "1", "--failure-scope", "worker",
                "--blacklist-cooldown-range", "600", "600")  # fmt: skip
FAR_APART = ("--commit-every", "1000")


def job_args(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, str(JOB), "--out", str(tmp_path), "--epochs", "2", *extra]


def steps_at(output: str, size: int) -> list[int]:
    return [int(s) for s in re.findall(rf"step (\d+) epoch \d+ size {size} ", output)]


@pytest.mark.parametrize(
    "model", ["DistributedOptimizer", pytest.param("DDP", marks=pytest.mark.slow)]
)
def test_each_kill_costs_no_completed_step_with_commits_1000_steps_apart(
    elasticrun, tmp_path: Path, model: str
) -> None:
    """Three SIGKILLs, one at a time (4 -> 3 -> 2 -> 1 workers): after each, the survivors'
    first step is the one after the newest step the job had printed (a step is printed once
    booked), so nothing was rolled back, and every sample is trained exactly once per epoch.
    Under `--rollback commit` the same kills send the job back to its initial state. The DDP
    model (`hvd.elastic.DistributedDataParallel`, a torch optimizer) reduces its gradients in
    backward, where a kill mostly lands."""
    ddp = ("--ddp", "elastic") if model == "DDP" else ()
    job = elasticrun(
        ["-np", "4", *KILLS_SHRINK,
         *job_args(tmp_path, "--samples", "1280", "--step-delay", "0.02", *FAR_APART, *ddp)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 4)
    for size in (4, 3, 2):
        newest = int(job.wait_for(rf"step (\d+) epoch \d+ size {size} ", timeout=60).group(1))
        job.wait_for(rf"step {newest + 5} epoch \d+ size {size} ", timeout=60)
        os.kill(pids[size - 1], signal.SIGKILL)  # a worker of the first round, still alive
        first = int(job.wait_for(rf"step (\d+) epoch \d+ size {size - 1} ", timeout=60).group(1))
        before = max(steps_at(job.output, size))
        assert first == before + 1, (
            f"after the kill at size {size}, training went on from step {first}, not "
            f"{before + 1}:\n{job.output}"
        )
    assert job.finish(120) == 0, job.output
    assert "restoring the last commit" not in job.output, job.output
    assert "rolling back" not in job.output, job.output
    assert assert_exactly_once(tmp_path)["size"] == 1


def test_a_rank_that_applied_the_interrupted_step_takes_the_state_of_one_that_did_not(
    elasticrun, tmp_path: Path
) -> None:
    """3 ranks. At step 8, rank 1's gradient allreduce 'fails' while rank 0's finishes (the
    race is made to happen: see `--lose-step` in the job), and the last rank dies. Rank 0
    applied step 8 but lost the peer in the count's allreduce before booking it; rank 1 is
    at step 7, booked. The job goes on from rank 1's state: step 8 again, nothing older, and
    every sample is still counted exactly once per epoch."""
    job = elasticrun(
        ["-np", "3", *KILLS_SHRINK,
         *job_args(tmp_path, "--samples", "480", "--step-delay", "0.02", *FAR_APART,
                   "--lose-step", "8", "--lose-step-on-rank", "1",
                   "--fail-once-file", str(tmp_path / "lost"))]
    )  # fmt: skip
    job.wait_for(r"losing step 8 on rank 1", timeout=60)
    first = int(job.wait_for(r"step (\d+) epoch \d+ size 2 ", timeout=60).group(1))
    assert job.finish(120) == 0, job.output
    assert first == 8, job.output
    assert max(steps_at(job.output, 3)) == 7, job.output
    assert "going on from rank 1's state after step 7, nothing rolled back" in job.output
    assert re.search(r"rank 0: .*its state after step 8 is not booked yet", job.output)
    assert assert_exactly_once(tmp_path)["size"] == 2


def test_when_no_survivor_booked_its_last_step_the_job_rolls_back_and_says_so(
    elasticrun, tmp_path: Path
) -> None:
    """The last rank SIGKILLs itself right after applying step 6: both survivors applied it
    too and lose their peer in the count's allreduce, before booking it. No survivor holds a
    consistent state, so every one rolls back to the last commit (the initial state), rank 0
    says so in one line, and every sample is still counted exactly once per epoch."""
    job = elasticrun(
        ["-np", "3", *KILLS_SHRINK,
         *job_args(tmp_path, "--samples", "480", "--step-delay", "0.02", *FAR_APART,
                   "--die-after-step", "6", "--fail-once-file", str(tmp_path / "died"))]
    )  # fmt: skip
    first = int(job.wait_for(r"step (\d+) epoch \d+ size 2 ", timeout=60).group(1))
    assert job.finish(120) == 0, job.output
    assert first == 1, job.output
    assert max(steps_at(job.output, 3)) == 5, job.output
    said = "no survivor holds a consistent state after its last step: rolling back to the last"
    assert job.output.count(said) == 1, job.output
    assert assert_exactly_once(tmp_path)["size"] == 2


def test_rollback_commit_goes_back_to_the_last_commit(elasticrun, tmp_path: Path) -> None:
    """`--rollback commit` keeps Horovod's behaviour: a kill sends the survivors back to their
    last commit (here the initial state, the commits being 1,000 steps apart)."""
    job = elasticrun(
        ["-np", "3", *KILLS_SHRINK, "--rollback", "commit",
         *job_args(tmp_path, "--samples", "480", "--step-delay", "0.02", *FAR_APART)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"step 6 epoch \d+ size 3 ", timeout=60)
    os.kill(pids[2], signal.SIGKILL)
    first = int(job.wait_for(r"step (\d+) epoch \d+ size 2 ", timeout=60).group(1))
    assert job.finish(120) == 0, job.output
    assert first == 1, job.output
    assert "restoring the last commit" in job.output
    assert assert_exactly_once(tmp_path)["size"] == 2


def test_a_joiner_waits_one_step_for_the_incumbents_not_their_next_commit(
    elasticrun, tmp_path: Path
) -> None:
    """A host is added to a job whose commits are 1,000 steps apart (epochs of 150 steps at
    size 2, so the next commit is an epoch's end). The incumbents hold at step 8 until the
    joiner waits at the rendezvous; once let go, they train at most two more steps at size 2
    (the step whose gradient allreduce carries the word, and one in flight) before the job
    goes on at size 3 from the next step, nothing rolled back or skipped, every sample
    counted exactly once per epoch."""
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:2\n")
    go = tmp_path / "go"
    job = elasticrun(
        ["--min-np", "1", *discovery_args(),
         *job_args(tmp_path, "--samples", "2400", "--step-delay", "0.02", *FAR_APART,
                   "--hold-at-step", "8", "--hold-file", str(go))],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    job.wait_for(r"step 8 epoch 0 size 2 ", timeout=60)
    write_hosts(hosts, "localhost:2\n127.0.0.1:1\n")
    job.wait_for(r"elasticrun: round 2: 3 worker\(s\)", timeout=60)
    go.touch()
    first = int(job.wait_for(r"step (\d+) epoch \d+ size 3 ", timeout=60).group(1))
    before = max(steps_at(job.output, 2))
    assert job.finish(120) == 0, job.output
    assert first == before + 1, job.output
    assert before <= 10, f"the incumbents trained on to step {before} at size 2:\n{job.output}"
    assert "restoring the last commit" not in job.output, job.output
    assert assert_exactly_once(tmp_path)["size"] == 3
