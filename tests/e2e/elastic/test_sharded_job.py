"""FSDP2 jobs under `elasticrun` with `ShardedState`, on two host names of this machine
(`localhost` and `127.0.0.1`, so that replicas go to the other host), as a user runs them:
a SIGKILLed rank, a whole host lost, hosts joining, a worker leaving at a step boundary.

The job is tests/support/workers/sharded_job.py: after every re-form its rank 0 gathers the
full state (parameters, AdamW's moments and step counts) and compares it bit for bit with
the one it saved at the commit the state went on from, and prints the verdict; at the end
every sample must have been trained on exactly once per epoch. Tests wait on lines the job
prints, never on sleeps.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
from pathlib import Path

import pytest

from tests.e2e.elastic.test_elastic import assert_exactly_once, discovery_args, write_hosts
from tests.support.leaving import ROLLED_BACK
from tests.support.paths import WORKERS
from tests.support.running_job import RunningJob

pytestmark = pytest.mark.timeout(150)

JOB = WORKERS / "sharded_job.py"
REFORMED = r"re-formed round \d+ size {size} at step (\d+) \(commit (\d+)\): ([^;]*); (.*)"


def job_args(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, str(JOB), "--out", str(tmp_path), *extra]


def pids_by_host(job: RunningJob, size: int) -> dict[str, list[int]]:
    """The first round's workers' pids, by host, in rank order."""
    found: dict[int, tuple[str, int]] = {}
    while len(found) < size:
        match = job.wait_for(r"joined rank=(\d+) size=\d+ pid=(\d+) host=(\S+)")
        job.lines.remove(match.string)  # so the next wait finds the next rank
        found[int(match.group(1))] = (match.group(3), int(match.group(2)))
    hosts: dict[str, list[int]] = {}
    for rank in sorted(found):
        host, pid = found[rank]
        hosts.setdefault(host, []).append(pid)
    return hosts


def next_reform(job: RunningJob, size: int, timeout: float = 60) -> tuple[int, int, str]:
    """Wait for the next re-form at `size` workers (each line is taken once); assert that
    its state is bitwise the commit's; return (step, commit, where its shards came from)."""
    match = job.wait_for(REFORMED.format(size=size), timeout=timeout)
    job.lines.remove(match.string)
    assert match.group(3) == "bitwise equal to the commit", match.string
    return int(match.group(1)), int(match.group(2)), match.group(4)


def test_an_fsdp_job_goes_4_3_2_5_with_its_state_bitwise_the_commit_s_each_time(
    elasticrun, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:2\n127.0.0.1:2\n")
    go = tmp_path / "go"
    job = elasticrun(
        ["-np", "4", "--min-np", "2", "--max-np", "5", *discovery_args(),
         "--failure-scope", "worker",  # a killed rank's host-mate trains on
         "--blacklist-cooldown-range", "10", "10",  # host 127.0.0.1 is back 8-12 s after
         *job_args(tmp_path, "--hold-at-step", "6", "--hold-file", str(go))],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    pids = pids_by_host(job, 4)
    assert {host: len(p) for host, p in pids.items()} == {"localhost": 2, "127.0.0.1": 2}
    job.wait_for(r"holding at step 6 ", timeout=60)
    # 4 -> 3: one rank of 127.0.0.1 killed; its shards come from its replica on localhost
    os.kill(pids["127.0.0.1"][1], signal.SIGKILL)
    *_, source = next_reform(job, 3)
    assert "taken by 4 rank(s)" in source and "shard(s) of 3 from rank" in source, source
    # 3 -> 2: host 127.0.0.1 lost whole (its last rank); its shards come from localhost
    os.kill(pids["127.0.0.1"][0], signal.SIGKILL)
    *_, source = next_reform(job, 2)
    assert "taken by 3 rank(s)" in source and "shard(s) of 2 from rank" in source, source
    # 2 -> 5: localhost gets a third slot at once, 127.0.0.1 comes back after its cooldown
    # (in one re-form or two, as the joiners' starts fall); the joiners get their rows from
    # the incumbents
    write_hosts(hosts, "localhost:3\n127.0.0.1:2\n")
    step, _, source = next_reform(job, 5, timeout=90)
    assert step >= 6 and "every shard from the rank that took it" in source, source
    go.touch()
    assert job.finish(120) == 0, job.output
    assert "training state lost" not in job.output
    reforms = re.findall(REFORMED.format(size=r"(\d+)"), "\n".join(job.stdout))
    assert all(verdict == "bitwise equal to the commit" for *_, verdict, _ in reforms), reforms
    sizes = [int(size) for size, *_ in reforms]
    assert sizes[:2] == [3, 2] and sizes[-1] == 5 and set(sizes[2:-1]) <= {3, 4}, job.output
    assert assert_exactly_once(tmp_path)["size"] == 5


def test_a_worker_leaving_at_a_step_boundary_keeps_the_state_after_that_step(
    elasticrun, tmp_path: Path
) -> None:
    """Commits only at the start and at each epoch's end; the job checks for host updates
    after every step. A SIGTERMed worker leaves at the next step boundary, and the others go
    on from the state after that step (committed as they agree to re-form), not from the
    last commit: nothing rolled back."""
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", "localhost:2,127.0.0.1:1",
         *job_args(tmp_path, "--commit-every", "1000", "--check-every-step", "--epochs", "1",
                   "--samples", "144")]
    )  # fmt: skip
    pids = pids_by_host(job, 3)
    job.wait_for(r"step 4 ")
    os.kill(pids["localhost"][1], signal.SIGTERM)
    step, commit, _ = next_reform(job, 2)
    assert step >= 4, f"the state after the step the worker left at:\n{job.output}"
    assert commit == 1, f"commit 0 is the start's; 1 the step boundary's:\n{job.output}"
    assert job.finish(90) == 0, job.output
    assert not ROLLED_BACK.search(job.output), "a leave rolls nothing back"
    assert_exactly_once(tmp_path, epochs=1)


def test_two_of_three_hosts_lost_before_the_first_commit_start_over_on_the_host_left(
    elasticrun, tmp_path: Path
) -> None:
    """Before the job's first commit only commit 0 exists (the state as `build` made it);
    with two of three hosts lost it is not held whole, and the survivor starts over from
    `build` on the one host left, as a job that shrinks does (a warning), not with the
    job-start check that `replicas=1` needs two hosts (sharded fault soak seed 233303:
    every worker then failed with ShardedStateError), and with its sampler re-sharded for
    the one worker (else it trained on a third of epoch 0: samples counted once)."""
    hosts = ["localhost", "127.0.0.1", socket.gethostname()]
    assert len(set(hosts)) == 3, "this machine's name is a third name for it"
    go = tmp_path / "go"
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", ",".join(f"{h}:1" for h in hosts),
         "--failure-scope", "worker", "--blacklist-cooldown-range", "300", "300",
         *job_args(tmp_path, "--samples", "48", "--commit-every", "1000",
                   "--hold-at-step", "1", "--hold-file", str(go))],
    )  # fmt: skip
    pids = pids_by_host(job, 3)
    job.wait_for(r"holding at step 1 ", timeout=60)
    for host in hosts[1:]:
        os.kill(pids[host][0], signal.SIGKILL)
    step, commit, _ = next_reform(job, 1)
    assert (step, commit) == (0, 0), "back to the state build() made"
    go.touch()
    assert job.finish(120) == 0, job.output
    assert "ShardedStateError" not in job.output
    assert "commit 0 was not held whole by the workers left" in job.output
    assert assert_exactly_once(tmp_path)["size"] == 1
