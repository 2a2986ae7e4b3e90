"""Elastic mode with real processes: workers die, hang, leave and join while the job trains.

Every job runs tests/support/workers/elastic_job.py, whose ranks count with an allreduce how often
each sample was trained on; after E epochs every count must be exactly E, however the job
shrank, grew or rolled back (the sampler's exactly-once accounting). Tests wait on lines the
job prints, never on sleeps.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.support.leaving import ROLLED_BACK, assert_left_at_a_step_and_got_no_successor
from tests.support.paths import DISCOVERY_SCRIPTS, WORKERS
from tests.support.processes import pids_alive
from tests.support.running_job import RunningJob
from tests.support.scripts import write_script

JOB = WORKERS / "elastic_job.py"
HOSTS_FILE_SCRIPT = DISCOVERY_SCRIPTS / "hosts_file.sh"

pytestmark = pytest.mark.timeout(120)

# These jobs run on one host: a failed worker must leave its host-mates training, which is
# `--failure-scope worker` (by default its host's workers leave with it, as in horovodrun).
ONE_WORKER_FAILS = ("--failure-scope", "worker")


def job_args(tmp_path: Path, *extra: str, epochs: int = 2) -> list[str]:
    return [sys.executable, str(JOB), "--out", str(tmp_path), "--epochs", str(epochs), *extra]


def ranks_to_pids(job: RunningJob, size: int) -> dict[int, int]:
    pids = {}
    for _ in range(size):
        match = job.wait_for(r"joined rank=(\d+) size=\d+ pid=(\d+)")
        job.lines.remove(match.string)  # so the next wait finds the next rank
        pids[int(match.group(1))] = int(match.group(2))
    return pids


def assert_exactly_once(tmp_path: Path, epochs: int = 2) -> dict:
    result = json.loads((tmp_path / "result.json").read_text())
    assert set(result["counts"]) == {float(epochs)}, "every sample trained on once per epoch"
    return result


def sizes_after(job: RunningJob, marker: str) -> set[int]:
    after = job.output.split(marker, 1)[1]
    return {int(size) for size in re.findall(r"step \d+ epoch \d+ size (\d+)", after)}


@pytest.mark.parametrize(
    "victim",
    [pytest.param(0, marks=pytest.mark.slow), pytest.param(1, marks=pytest.mark.slow), 2],
    ids=["rank0", "middle", "last"],
)
def test_a_killed_worker_leaves_the_job_training_at_a_smaller_size(
    elasticrun, tmp_path: Path, victim: int
) -> None:
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", "localhost:3", "--collective-timeout", "120",
         *ONE_WORKER_FAILS, "--blacklist-cooldown-range", "300", "300", *job_args(tmp_path)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"step 6 ")
    os.kill(pids[victim], signal.SIGKILL)
    killed = time.monotonic()
    job.wait_for(r"elasticrun: round 2: 2 worker\(s\)", timeout=30)
    job.wait_for(r"step \d+ epoch \d+ size 2", timeout=30)
    recovered = time.monotonic() - killed
    assert job.finish(90) == 0, job.output
    assert f"rank {victim} on host localhost was killed by signal SIGKILL" in job.output
    assert recovered < 15, f"with a 120 s collective timeout, recovery took {recovered:.1f} s"
    assert sizes_after(job, "round 2: 2 worker") == {2}
    assert assert_exactly_once(tmp_path)["size"] == 2


def test_uneven_shards_are_padded_so_a_plain_loop_takes_the_same_steps_everywhere(
    elasticrun, tmp_path: Path
) -> None:
    """241 samples (no size divides them) on 3 workers, then on 2 after a kill mid-epoch: the
    job's plain DataLoader loop over the padded shards takes the same steps on every rank
    (no hang in the last allreduce), and the padding repeats are not counted."""
    go = tmp_path / "go"
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", "localhost:3", *ONE_WORKER_FAILS,
         "--blacklist-cooldown-range", "300", "300",
         *job_args(tmp_path, "--samples", "241", "--hold-at-step", "5", "--hold-file", str(go))]
    )  # fmt: skip
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"holding for")
    os.kill(pids[2], signal.SIGKILL)
    go.touch()
    assert job.finish(90) == 0, job.output
    assert assert_exactly_once(tmp_path)["size"] == 2
    steps = [len(re.findall(rf"step \d+ epoch 1 size 2 rank {r}\b", job.output)) for r in (0, 1)]
    assert steps == [math.ceil(math.ceil(241 / 2) / 8)] * 2  # 121 samples each: 16 steps


def test_workers_killed_at_once_cost_one_round_with_its_reasons(elasticrun, tmp_path: Path) -> None:
    """Two of three workers SIGKILLed together: one new round, not two; `--verbose` logs the
    decision with both reasons, and `/v1/status` lists it."""
    status = tmp_path / "status.json"
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", "localhost:3", "--verbose", *ONE_WORKER_FAILS,
         "--blacklist-cooldown-range", "300", "300",
         *job_args(tmp_path, "--status-file", str(status))]
    )  # fmt: skip
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"step 6 ")
    for rank in (1, 2):
        os.kill(pids[rank], signal.SIGKILL)
    job.wait_for(r"elasticrun: round 2: 1 worker\(s\) on localhost:1", timeout=30)
    assert job.finish(90) == 0, job.output
    assert "elasticrun: round 3" not in job.output, "two deaths seen together cost two rounds"
    both = r"rank [12] on host localhost was killed by signal SIGKILL.*; rank [12] on host"
    assert re.search(rf"elasticrun: decision: {both}", job.output), job.output
    decisions = json.loads(status.read_text())["decisions"]
    assert any(re.match(both, d["reason"]) and d["round"] == 1 for d in decisions), decisions


def test_a_hung_worker_is_declared_dead_and_killed(elasticrun, tmp_path: Path) -> None:
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", "localhost:3", "--heartbeat-interval", "0.5",
         *ONE_WORKER_FAILS, "--blacklist-cooldown-range", "300", "300", *job_args(tmp_path)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"step 4 ")
    os.kill(pids[1], signal.SIGSTOP)
    stopped = time.monotonic()
    job.wait_for(r"rank 1 on host localhost missed 3 heartbeats", timeout=30)
    detected = time.monotonic() - stopped
    assert job.finish(90) == 0, job.output
    assert detected < 5, f"3 heartbeat intervals of 0.5 s, detected after {detected:.1f} s"
    assert not pids_alive([pids[1]]), "the hung worker must be killed"
    assert_exactly_once(tmp_path)


def test_sigterm_makes_a_worker_leave_without_rollback_or_cooldown(
    elasticrun, tmp_path: Path
) -> None:
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", "localhost:3", *job_args(tmp_path)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"step 4 ")
    os.kill(pids[2], signal.SIGTERM)
    job.wait_for(r"leaves the job: SIGTERM", timeout=30)
    job.wait_for(r"step \d+ epoch \d+ size 2", timeout=30)
    assert job.finish(90) == 0, job.output
    assert not ROLLED_BACK.search(job.output), "a leave rolls nothing back"
    assert "cooldown" not in job.output
    assert not pids_alive([pids[2]])
    assert_exactly_once(tmp_path)


def test_sigterm_leaves_at_a_step_boundary_not_at_the_next_commit(
    elasticrun, tmp_path: Path
) -> None:
    """Commits only at the end of each epoch: the leaver still goes within two steps of its
    SIGTERM, and the others go on from the step after the last one at size 3 (nothing rolled
    back, nothing skipped)."""
    args = job_args(tmp_path, "--commit-every", "1000", "--step-delay", "0.1")
    job = elasticrun(["-np", "3", "--min-np", "1", "-H", "localhost:3", *args])
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"step 4 ")
    os.kill(pids[2], signal.SIGTERM)  # the newest step read: 4 (at most one behind)
    first_small = int(job.wait_for(r"step (\d+) epoch \d+ size 2", timeout=30).group(1))
    steps_at_3 = [int(n) for n in re.findall(r"step (\d+) epoch \d+ size 3", job.output)]
    assert max(steps_at_3) <= 4 + 3, "left within two steps of SIGTERM (one more: read lag)"
    assert first_small == max(steps_at_3) + 1, "nothing rolled back, nothing skipped"
    assert job.finish(90) == 0, job.output
    assert not ROLLED_BACK.search(job.output)
    assert_exactly_once(tmp_path)


def test_a_leaver_whose_word_never_reached_the_driver_still_leaves(
    elasticrun, tmp_path: Path
) -> None:
    """A worker wants to leave (SIGTERM, a preemption notice) but its Leave or Notice call
    was lost: the ranks still agree to re-form at the next step, and the leaver says it
    again before re-joining, so the driver lets it go once, instead of taking it back into
    every round while it interrupts every step."""
    args = job_args(tmp_path, "--leave-unheard-at-step", "4", "--step-delay", "0.05")
    job = elasticrun(["-np", "3", "--min-np", "1", "-H", "localhost:3", *args])
    job.wait_for(r"leaves the job: its word to the driver was lost", timeout=30)
    assert job.finish(90) == 0, job.output
    rounds = set(re.findall(r"elasticrun: round (\d+):", job.output))
    assert rounds == {"1", "2"}, f"one re-form, not one per step: rounds {sorted(rounds)}"
    assert not ROLLED_BACK.search(job.output)
    assert assert_exactly_once(tmp_path)["size"] == 2


def write_hosts(path: Path, text: str) -> None:
    staged = path.with_suffix(".new")
    staged.write_text(text)
    staged.replace(path)  # atomic: the discovery script never reads half a file


def discovery_args() -> list[str]:
    return [
        "--host-discovery-script", str(HOSTS_FILE_SCRIPT), "--discovery-interval", "0.2",
    ]  # fmt: skip


def test_discovery_adds_a_host_and_the_job_grows(elasticrun, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:2\n")
    go = tmp_path / "go"
    job = elasticrun(
        ["--min-np", "1", *discovery_args(),
         *job_args(tmp_path, "--hold-at-step", "8", "--hold-file", str(go))],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    job.wait_for(r"step 4 ")
    write_hosts(hosts, "localhost:2\n127.0.0.1:1\n")
    job.wait_for(r"elasticrun: round 2: 3 worker\(s\) on localhost:2, 127.0.0.1:1", timeout=60)
    go.touch()  # the joiner waits at the rendezvous: let the incumbents reach their commit
    job.wait_for(r"step \d+ epoch \d+ size 3", timeout=60)
    assert job.finish(90) == 0, job.output
    assert not ROLLED_BACK.search(job.output)
    assert assert_exactly_once(tmp_path)["size"] == 3


def test_an_elastic_job_starts_on_every_offered_slot_up_to_max_np(
    elasticrun, tmp_path: Path
) -> None:
    """`-np 2 --max-np 4` with discovery offering 4 slots: round 1 has 4 workers, as in
    Horovod Elastic (-np is what the job waits for, not a cap), and none stays idle."""
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:4\n")
    job = elasticrun(
        ["-np", "2", "--min-np", "1", "--max-np", "4", *discovery_args(), *job_args(tmp_path)],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    job.wait_for(r"elasticrun: round 1: 4 worker\(s\) on localhost:4", timeout=60)
    assert job.finish(90) == 0, job.output
    joined = re.findall(r"joined rank=(\d+) size=(\d+)", job.output)
    assert sorted(joined) == [("0", "4"), ("1", "4"), ("2", "4"), ("3", "4")], job.output
    assert "round 2" not in job.output, "the job grew after its first round"
    assert sizes_after(job, "round 1: 4 worker") == {4}
    assert assert_exactly_once(tmp_path)["size"] == 4


@pytest.mark.parametrize(
    ("before", "after", "said", "size"),
    [
        pytest.param(
            "localhost:2\n127.0.0.1:1\n",
            "localhost:2\n",
            r"host 127.0.0.1 was removed",
            2,
            marks=pytest.mark.slow,
        ),
        ("localhost:3\n", "localhost:1\n", r"leaves the job: host localhost now offers 1 slot", 1),
    ],
    ids=["host-removed", "host-offers-fewer-slots"],
)
def test_discovery_takes_slots_away_and_the_job_shrinks_without_rollback(
    elasticrun, tmp_path: Path, before: str, after: str, said: str, size: int
) -> None:
    hosts = tmp_path / "hosts"
    write_hosts(hosts, before)
    go = tmp_path / "go"
    job = elasticrun(
        ["--min-np", "1", *discovery_args(),
         *job_args(tmp_path, "--hold-at-step", "8", "--hold-file", str(go))],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    job.wait_for(r"step 4 ")
    write_hosts(hosts, after)
    job.wait_for(said, timeout=30)
    go.touch()
    job.wait_for(rf"step \d+ epoch \d+ size {size}\b", timeout=30)
    assert job.finish(90) == 0, job.output
    assert not ROLLED_BACK.search(job.output)
    assert assert_exactly_once(tmp_path)["size"] == size


def test_a_discovery_notice_makes_the_host_s_worker_leave_at_a_step_and_get_no_successor(
    elasticrun, tmp_path: Path
) -> None:
    """`127.0.0.1:1 leaving=T`: its worker leaves within a few steps, long before the next
    commit (the end of the epoch, step 20), and nothing is launched there before T."""
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:2\n127.0.0.1:1\n")
    args = job_args(tmp_path, "--batch", "4", "--commit-every", "1000", "--step-delay", "0.15")
    job = elasticrun(
        ["--min-np", "1", *discovery_args(), *args], env={"ELASTIC_HOSTS_FILE": str(hosts)}
    )
    job.wait_for(r"step 4 epoch 0 size 3")
    write_hosts(hosts, f"localhost:2\n127.0.0.1:1 leaving={time.time() + 120:.0f}\n")
    assert_left_at_a_step_and_got_no_successor(job, "discovery's notice", "127.0.0.1")
    assert assert_exactly_once(tmp_path)["size"] == 2


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("echo 'localhost:two'", "slot count in 'localhost:two' is not a number"),
        pytest.param("exit 7", "exited with code 7", marks=pytest.mark.slow),
        pytest.param("sleep 30", "did not finish within 1 s", marks=pytest.mark.slow),
    ],
    ids=["malformed", "failing", "hanging"],
)
def test_broken_discovery_keeps_the_last_good_hosts(
    elasticrun, tmp_path: Path, script: str, message: str
) -> None:
    broken = tmp_path / "broken"
    discover = write_script(
        tmp_path,
        "discover.sh",
        f"#!/bin/sh\nif [ -e {broken} ]; then {script}; fi\necho localhost:2\n",
    )
    discover.chmod(0o755)
    job = elasticrun(
        ["--min-np", "2", "--host-discovery-script", str(discover),
         "--discovery-interval", "0.2", "--discovery-timeout", "1", *job_args(tmp_path)]
    )  # fmt: skip
    job.wait_for(r"step 4 ")
    broken.touch()
    job.wait_for(re.escape(message), timeout=30)
    assert job.finish(90) == 0, job.output
    assert job.output.count(message) == 1, "a persisting problem is logged once"
    assert assert_exactly_once(tmp_path)["size"] == 2


def test_a_host_comes_back_after_its_cooldown(elasticrun, tmp_path: Path) -> None:
    go = tmp_path / "go"
    job = elasticrun(
        ["-np", "2", "--min-np", "1", "-H", "localhost:2", *ONE_WORKER_FAILS,
         "--blacklist-cooldown-range", "1", "1",
         *job_args(tmp_path, "--epochs", "3", "--hold-at-step", "10", "--hold-file", str(go))]
    )  # fmt: skip
    pids = ranks_to_pids(job, 2)
    job.wait_for(r"step 4 ")
    os.kill(pids[1], signal.SIGKILL)
    job.wait_for(r"host localhost in cooldown", timeout=30)
    job.wait_for(r"round 3: 2 worker\(s\) on localhost:2", timeout=60)
    go.touch()
    job.wait_for(r"step \d+ epoch \d+ size 2", timeout=30)
    assert job.finish(90) == 0, job.output
    assert_exactly_once(tmp_path, epochs=3)


def test_a_failed_worker_takes_its_host_out_until_the_host_s_cooldown_ends(
    elasticrun, tmp_path: Path
) -> None:
    """By default (--failure-scope host, as horovodrun) a failed worker's host leaves the job
    with it: its other worker is taken out at once, not counted as a failure of its own; the
    job goes on on the other host, and the host comes back, all its slots, after its
    cooldown."""
    go = tmp_path / "go"
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", "localhost:2,127.0.0.1:1",
         "--blacklist-cooldown-range", "1", "1",
         *job_args(tmp_path, "--epochs", "3", "--hold-at-step", "10", "--hold-file", str(go))]
    )  # fmt: skip
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"step 4 ")
    os.kill(pids[0], signal.SIGKILL)
    job.wait_for(r"rank 1 on host localhost leaves the job: its host localhost failed with rank 0",
                 timeout=30)  # fmt: skip
    job.wait_for(r"round 2: 1 worker\(s\) on 127\.0\.0\.1:1 ", timeout=30)
    job.wait_for(r"round 3: 3 worker\(s\) on 127\.0\.0\.1:1, localhost:2", timeout=60)
    go.touch()
    assert job.finish(90) == 0, job.output
    assert not re.search(r"rank 1 on host localhost (was killed|exited)", job.output)
    assert not pids_alive([pids[1]]), "the host's other worker left the job"
    assert_exactly_once(tmp_path, epochs=3)


def test_the_reset_limit_ends_the_job_with_its_message(elasticrun, tmp_path: Path) -> None:
    job = elasticrun(
        ["-np", "2", "--min-np", "1", "-H", "localhost:2", "--reset-limit", "0",
         *ONE_WORKER_FAILS, *job_args(tmp_path)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 2)
    job.wait_for(r"step 4 ")
    os.kill(pids[0], signal.SIGKILL)
    assert job.finish(60) == 1
    assert "reset limit reached: 0 re-rendezvous (--reset-limit)" in job.output


def test_the_elastic_timeout_ends_a_job_with_too_few_workers(elasticrun, tmp_path: Path) -> None:
    job = elasticrun(
        ["-np", "2", "--min-np", "2", "-H", "localhost:2", "--elastic-timeout", "2",
         *ONE_WORKER_FAILS, "--blacklist-cooldown-range", "300", "300", *job_args(tmp_path)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 2)
    job.wait_for(r"step 4 ")
    os.kill(pids[1], signal.SIGKILL)
    assert job.finish(60) == 1
    assert "fewer than --min-np 2 workers for 2 s (--elastic-timeout)" in job.output


def test_an_exception_in_training_fails_that_worker_with_its_traceback(
    elasticrun, tmp_path: Path
) -> None:
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", "localhost:3", *ONE_WORKER_FAILS,
         "--blacklist-cooldown-range", "300", "300",
         *job_args(tmp_path, "--fail-at-step", "5", "--fail-once-file", str(tmp_path / "once"))]
    )  # fmt: skip
    assert job.finish(90) == 0, job.output
    stderr = r"\[\d\]<stderr>:(\[rank\d\]: )?"  # torch prefixes tracebacks with the rank
    assert re.search(stderr + r"ValueError: injected failure at step 5", job.output)
    assert re.search(stderr + r"Traceback \(most recent call last\):", job.output)
    assert re.search(r"rank \d on host localhost exited with code 1", job.output)
    assert assert_exactly_once(tmp_path)["size"] == 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("echo localhost:1", "discovery found 1 slot(s), fewer than --min-np 2"),
        ("exit 3", "exited with code 3"),
        ("sleep 30", "did not finish within 1 s"),
    ],
    ids=["too-few-slots", "failing", "hanging"],
)
def test_discovery_that_never_offers_enough_slots_fails_the_start(
    elasticrun, tmp_path: Path, body: str, message: str
) -> None:
    discover = write_script(tmp_path, "discover.sh", f"#!/bin/sh\n{body}\n")
    discover.chmod(0o755)
    job = elasticrun(
        ["--min-np", "2", "--host-discovery-script", str(discover), "--start-timeout", "3",
         "--discovery-interval", "0.2", "--discovery-timeout", "1", *job_args(tmp_path)]
    )  # fmt: skip
    started = time.monotonic()
    assert job.finish(30) == 1
    assert time.monotonic() - started < 15
    errors = [line for line in job.stderr if line.startswith("elasticrun: error:")]
    assert len(errors) == 1 and "within 3 s (--start-timeout)" in errors[0], job.output
    assert message in job.output
    assert "Traceback" not in job.output


def test_a_discovery_script_that_cannot_run_is_a_usage_error(elasticrun, tmp_path: Path) -> None:
    job = elasticrun(["--min-np", "1", "--host-discovery-script", str(tmp_path / "nope"), "true"])
    assert job.finish(30) == 2
    assert job.lines == [
        f"elasticrun: error: --host-discovery-script: discovery script {tmp_path / 'nope'} "
        "does not exist"
    ]
