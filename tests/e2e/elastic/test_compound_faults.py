"""Faults that overlap each other, or a normal event, with real processes: nothing is lost
and nothing is left behind.

Every job runs tests/support/workers/elastic_job.py (per-sample counts must come out exactly once
per epoch). Where a test checks that no progress was lost, it reads the step numbers the ranks
print: without a failure (a leave or a removed host is none) they never go backwards.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.elastic.test_elastic import (
    ONE_WORKER_FAILS,
    assert_exactly_once,
    discovery_args,
    job_args,
    ranks_to_pids,
    write_hosts,
)
from tests.e2e.etcd.test_driver_restart import durable_args, kill_driver
from tests.support.etcd_server import EtcdServer
from tests.support.leaving import ROLLED_BACK
from tests.support.processes import pids_alive, processes_naming
from tests.support.running_job import RunningJob

pytestmark = pytest.mark.timeout(180)

STEP = re.compile(r"\]<stdout>:step (\d+) epoch (\d+) size (\d+)")


def steps(job: RunningJob) -> list[tuple[int, int]]:
    """(step, training epoch) of every step line, in output order."""
    return [(int(m.group(1)), int(m.group(2))) for m in map(STEP.search, job.lines) if m]


def assert_never_backwards(job: RunningJob) -> None:
    seen = steps(job)
    assert seen, job.output
    for (step, epoch), (later_step, later_epoch) in zip(seen, seen[1:], strict=False):
        assert later_step >= step and later_epoch >= epoch, (
            f"training went back from step {step} (epoch {epoch}) to step {later_step} "
            f"(epoch {later_epoch}):\n{job.output}"
        )


def worker_pid(job: RunningJob, host: str, timeout: float = 60.0) -> int:
    """The pid a worker launched on `host` prints first (its label is still its id)."""
    match = job.wait_for(rf"\[{re.escape(host)}\[\d+\]#\d+\]<stdout>:worker pid=(\d+)", timeout)
    return int(match.group(1))


# --- 1. nothing lost when the last holder of the state leaves ----------------------------


def test_removing_the_host_of_the_only_worker_hands_its_state_to_the_replacement(
    elasticrun, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:1\n")
    go = tmp_path / "go"
    job = elasticrun(
        ["--min-np", "1", *discovery_args(),
         *job_args(tmp_path, "--hold-at-step", "40", "--hold-file", str(go), epochs=4)],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    job.wait_for(r"step 40 epoch 1 ", timeout=60)
    write_hosts(hosts, "127.0.0.1:1\n")
    job.wait_for(r"leaves the job \(host localhost was removed by discovery\) once another", 30)
    job.wait_for(r"round 2: 2 worker\(s\) on localhost:1, 127.0.0.1:1", timeout=60)
    go.touch()  # the joiner waits for the holder's state: let the holder reach its commit
    job.wait_for(r"leaves the job: .*; another worker holds its state now", timeout=60)
    job.wait_for(r"round 3: 1 worker\(s\) on 127.0.0.1:1", timeout=30)
    assert job.finish(120) == 0, job.output
    assert_never_backwards(job)
    assert "training state lost" not in job.output
    assert not ROLLED_BACK.search(job.output)
    assert_exactly_once(tmp_path, epochs=4)


@pytest.mark.slow
def test_a_holder_that_dies_while_handing_over_is_not_waited_for(
    elasticrun, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:1\n")
    job = elasticrun(
        ["--min-np", "1", "--heartbeat-interval", "0.2", *discovery_args(),
         *job_args(tmp_path, epochs=3)],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    holder = ranks_to_pids(job, 1)[0]
    job.wait_for(r"step \d+ epoch 1 ", timeout=60)
    write_hosts(hosts, "127.0.0.1:1\n")
    job.wait_for(r"leaves the job \(host localhost was removed by discovery\) once another", 30)
    os.kill(holder, signal.SIGKILL)  # before the replacement could take its state
    job.wait_for(r"training state lost: no worker of the job holds its newest commit", 60)
    assert job.finish(120) == 0, job.output
    assert re.search(r"round \d+: 1 worker\(s\) on 127\.0\.0\.1:1", job.output), job.output
    assert_exactly_once(tmp_path, epochs=3)


@pytest.mark.parametrize(
    "heartbeat",
    [pytest.param("1", marks=pytest.mark.slow), "30"],
    ids=["heartbeat-1s", "no-heartbeat-since-commit"],
)
def test_sigterm_to_the_only_worker_hands_its_state_over_before_it_exits(
    elasticrun, tmp_path: Path, heartbeat: str
) -> None:
    """With a 30 s heartbeat the driver learns of the worker's commits only from its leave
    request (as a driver that has just restarted does)."""
    job = elasticrun(
        ["-np", "1", "--min-np", "1", "--max-np", "1", "-H", "localhost:2",
         "--heartbeat-interval", heartbeat, *job_args(tmp_path, epochs=4)]
    )  # fmt: skip
    pid = ranks_to_pids(job, 1)[0]
    job.wait_for(r"step \d+ epoch 1 ", timeout=60)
    os.kill(pid, signal.SIGTERM)
    job.wait_for(r"leaves the job: .*; another worker holds its state now", timeout=60)
    assert job.finish(120) == 0, job.output
    assert not pids_alive([pid])
    assert_never_backwards(job)
    assert not ROLLED_BACK.search(job.output)
    assert "cooldown" not in job.output
    assert_exactly_once(tmp_path, epochs=4)


def test_a_fresh_start_after_every_holder_died_is_said_in_one_line(
    elasticrun, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:1\n")
    go = tmp_path / "go"  # the job cannot end before the joiner is seen, however slow it is
    job = elasticrun(
        ["--min-np", "1", "--heartbeat-interval", "0.2", "--blacklist-cooldown-range", "300",
         "300", *discovery_args(),
         *job_args(tmp_path, "--hold-at-step", "40", "--hold-file", str(go), epochs=3)],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    holder = ranks_to_pids(job, 1)[0]
    job.wait_for(r"step \d+ epoch 1 ", timeout=60)
    write_hosts(hosts, "localhost:1\n127.0.0.1:1\n")
    worker_pid(job, "127.0.0.1")  # the joiner starts; it holds nothing yet
    go.touch()
    os.kill(holder, signal.SIGKILL)
    job.wait_for(r"training state lost: no worker of the job holds its newest commit", 60)
    assert job.finish(120) == 0, job.output
    lost = [line for line in job.lines if "training state lost" in line]
    assert len(lost) == 1, job.output
    assert "going on from the initial state" in lost[0]
    assert_exactly_once(tmp_path, epochs=3)


@pytest.mark.slow
def test_losing_every_worker_at_once_starts_new_ones_and_says_the_state_is_lost(
    elasticrun, tmp_path: Path
) -> None:
    """Both workers SIGKILLed together (a whole fleet reclaimed): the job is not over while
    hosts are offered. New workers start once the cooldown ends, from the initial state, and
    the driver and rank 0 each say in one line that the state was lost."""
    job = elasticrun(
        ["-np", "2", "--min-np", "1", "-H", "localhost:2", "--heartbeat-interval", "0.2",
         "--blacklist-cooldown-range", "1", "1", *job_args(tmp_path, epochs=3)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 2)
    job.wait_for(r"step 12 ", timeout=60)  # commits every 2 steps, heartbeats tell the driver
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    job.wait_for(r"every worker of the job failed: its training state \(commit \d+\) is lost")
    job.wait_for(r"training state lost: no worker of the job holds its newest commit", 60)
    assert job.finish(120) == 0, job.output
    assert_exactly_once(tmp_path, epochs=3)


def test_a_script_that_fails_before_its_first_commit_everywhere_ends_the_job(
    elasticrun, tmp_path: Path
) -> None:
    job = elasticrun(
        ["-np", "2", "--min-np", "1", "-H", "localhost:2", "--blacklist-cooldown-range", "0.5",
         "0.5", *job_args(tmp_path, "--fail-at-step", "0")]
    )  # fmt: skip
    assert job.finish(90) == 1, job.output
    assert "every worker of the job failed, with no commit since the job started" in job.output
    assert "launched" not in job.output, "no new workers for a script that cannot commit"


# --- 2. SIGTERM while the job re-forms ------------------------------------------------------


@pytest.mark.slow
def test_sigterm_while_waiting_for_the_next_epoch_lets_the_worker_leave(
    elasticrun, tmp_path: Path
) -> None:
    """The survivor waits at the rendezvous (one worker, --min-np 2): no epoch, no context."""
    job = elasticrun(
        ["-np", "2", "--min-np", "2", "-H", "localhost:2", "--elastic-timeout", "15",
         *ONE_WORKER_FAILS, "--blacklist-cooldown-range", "300", "300",
         *job_args(tmp_path, epochs=3)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 2)
    job.wait_for(r"step 6 ")
    os.kill(pids[0], signal.SIGKILL)
    # The survivor hears of the loss from its collective or from the driver, whichever is first.
    job.wait_for(
        r"rank 1: (a collective of round 1 failed|round 1 is broken): .*; "
        r"(restoring the last commit|keeping the state after step \d+)",
        30,
    )
    time.sleep(0.5)  # past the restore: the survivor now waits to join the next epoch
    os.kill(pids[1], signal.SIGTERM)
    job.wait_for(r"takes the only copy of the job's state \(commit \d+\) with it", 30)
    assert job.finish(60) == 1, job.output
    assert "fewer than --min-np 2 workers for 15 s (--elastic-timeout)" in job.output
    assert "NotInitializedError" not in job.output
    assert "rank 1 on host localhost exited" not in job.output
    assert "left with exit code" not in job.output
    assert not pids_alive([pids[1]])


@pytest.mark.parametrize("delay", [0.0, pytest.param(0.05, marks=pytest.mark.slow)])
def test_sigterm_during_a_re_form_lets_the_worker_leave(
    elasticrun, tmp_path: Path, delay: float
) -> None:
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", "localhost:3", *ONE_WORKER_FAILS,
         "--blacklist-cooldown-range", "300", "300", *job_args(tmp_path, epochs=3)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"step 6 ")
    os.kill(pids[0], signal.SIGKILL)
    time.sleep(delay)
    os.kill(pids[1], signal.SIGTERM)
    assert job.finish(120) == 0, job.output
    assert "NotInitializedError" not in job.output
    assert "rank 1 on host localhost exited" not in job.output
    assert re.search(r"host localhost (was killed|leaves)", job.output)
    assert not pids_alive([pids[1]])
    assert_exactly_once(tmp_path, epochs=3)


# --- 3. a stopped joiner does not outlive the job -------------------------------------------


def test_a_stopped_joiner_is_killed_even_across_a_driver_restart(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:1\n")
    go = tmp_path / "go"
    args = durable_args(
        etcd, "stopped-joiner", "--min-np", "1", "--stop-grace", "2", *discovery_args(),
        *job_args(tmp_path, "--hold-at-step", "10", "--hold-file", str(go)),
    )  # fmt: skip
    env = {"ELASTIC_HOSTS_FILE": str(hosts), "TMPDIR": str(tmp_path)}
    job = elasticrun(args, env=env)
    job.wait_for(r"step 4 ")
    write_hosts(hosts, "localhost:1\n127.0.0.1:1\n")
    joiner = worker_pid(job, "127.0.0.1")
    os.kill(joiner, signal.SIGSTOP)
    write_hosts(hosts, "localhost:1\n")
    job.wait_for(r"127\.0\.0\.1\[0\]#\d+ on host 127\.0\.0\.1 is stopped: host 127\.0\.0\.1", 30)
    kill_driver(job)  # before --stop-grace ends: the SIGTERM it sent is still pending
    restarted = elasticrun(args, env=env)
    restarted.wait_for(r"resuming job stopped-joiner", timeout=30)
    go.touch()
    assert restarted.finish(120) == 0, restarted.output
    assert not pids_alive([joiner]), "the stopped joiner must be killed"
    assert etcd.process is not None
    left = set(processes_naming(str(tmp_path))) - {etcd.process.pid}
    assert not left, "no worker or keeper outlives the job"
    assert_exactly_once(tmp_path)


def test_a_worker_launched_after_the_last_save_is_killed_by_the_restarted_driver(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    """etcd down, so the driver cannot save that it launched a joiner; the joiner is
    stopped and the driver SIGKILLed. No record names the joiner: the restarted driver finds
    its keeper under the job's log folder and kills it, or it would outlive the job."""
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:1\n")
    go = tmp_path / "go"  # the job cannot end before the joiner is seen, however slow it is
    args = durable_args(
        etcd, "unsaved-joiner", "--min-np", "1", *discovery_args(),
        *job_args(tmp_path, "--hold-at-step", "12", "--hold-file", str(go)),
    )  # fmt: skip
    env = {"ELASTIC_HOSTS_FILE": str(hosts), "TMPDIR": str(tmp_path)}
    job = elasticrun(args, env=env)
    job.wait_for(r"step 4 ")
    etcd.stop()  # killed, so no request already sent can still be applied later
    try:
        write_hosts(hosts, "localhost:1\n127.0.0.1:1\n")
        joiner = worker_pid(job, "127.0.0.1")
        os.kill(joiner, signal.SIGSTOP)
        kill_driver(job)
    finally:
        etcd.start()
    restarted = elasticrun(args, env=env)
    restarted.wait_for(r"stopping worker\.\d+ \(keeper pid \d+\): the earlier driver", 60)
    go.touch()
    assert restarted.finish(120) == 0, restarted.output
    assert not pids_alive([joiner]), "the unsaved joiner must be killed"
    assert etcd.process is not None
    left = set(processes_naming(str(tmp_path))) - {etcd.process.pid}
    assert not left, "no worker or keeper outlives the job"
    assert_exactly_once(tmp_path)


# --- 4. a slot freed by SIGTERM is filled again ---------------------------------------------


def test_a_slot_freed_by_sigterm_is_refilled(elasticrun, tmp_path: Path) -> None:
    go = tmp_path / "go"
    job = elasticrun(
        ["-np", "2", "--min-np", "1", "-H", "localhost:2",
         *job_args(tmp_path, "--hold-at-step", "12", "--hold-file", str(go), epochs=3)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 2)
    job.wait_for(r"step 4 ")
    os.kill(pids[1], signal.SIGTERM)
    job.wait_for(r"leaves the job: SIGTERM", timeout=30)
    job.wait_for(r"round \d+: 2 worker\(s\) on localhost:2 \(1 worker\(s\) joined", timeout=60)
    go.touch()
    job.wait_for(r"step \d+ epoch \d+ size 2", timeout=60)
    assert job.finish(120) == 0, job.output
    assert "cooldown" not in job.output
    assert assert_exactly_once(tmp_path, epochs=3)["size"] == 2


# --- 5. one hung joiner does not hold a healthy one back ------------------------------------


@pytest.mark.slow
def test_a_hung_joiner_does_not_get_a_healthy_one_killed(elasticrun, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:1\n")
    go = tmp_path / "go"
    job = elasticrun(
        ["--min-np", "1", "--start-timeout", "10", *ONE_WORKER_FAILS, *discovery_args(),
         *job_args(tmp_path, "--hold-at-step", "10", "--hold-file", str(go), epochs=3)],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    job.wait_for(r"step 4 ")
    write_hosts(hosts, "localhost:1\n127.0.0.1:2\n")
    hung = worker_pid(job, "127.0.0.1")
    os.kill(hung, signal.SIGSTOP)
    job.wait_for(r"round \d+: 2 worker\(s\) .*1 worker\(s\) joined, 1 still starting", 60)
    job.wait_for(r"did not join within 10 s", timeout=60)  # while training holds: the
    go.touch()  # job cannot end (and stop the hung joiner unjudged) before the timeout
    job.wait_for(r"step \d+ epoch \d+ size 2", timeout=60)
    assert job.finish(120) == 0, job.output
    not_joined = [
        line for line in job.lines if line.endswith("did not join within 10 s (--start-timeout)")
    ]
    assert len(not_joined) == 1, job.output
    assert not pids_alive([hung])
    assert_exactly_once(tmp_path, epochs=3)


# --- 6. an etcd freeze longer than the lease ------------------------------------------------


def test_the_driver_takes_its_claim_back_after_an_etcd_freeze(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    job = elasticrun(
        durable_args(
            etcd, "frozen-etcd", "-np", "2", "--min-np", "1", "-H", "localhost:2",
            *job_args(tmp_path, "--hold-at-step", "6", "--hold-file", str(go)),
        ),
        env={"TMPDIR": str(tmp_path)},
    )  # fmt: skip
    job.wait_for(r"step 6 ")
    assert etcd.process is not None
    os.kill(etcd.process.pid, signal.SIGSTOP)
    try:
        time.sleep(14)  # longer than the 10 s lease
    finally:
        os.kill(etcd.process.pid, signal.SIGCONT)
    job.wait_for(r"no other driver held it: taken back", timeout=30)
    go.touch()
    assert job.finish(120) == 0, job.output
    assert "another driver took" not in job.output
    assert_exactly_once(tmp_path)


# --- 6b. a death the restarted driver sees before the survivors find it --------------------


def test_a_worker_that_dies_while_the_driver_is_down_breaks_its_epoch_for_every_survivor(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    """The restarted driver sees the death at once (its keeper's exit file) and tells the
    survivors that their epoch is broken before they have found it: a survivor blocked in a
    collective with a live peer that gave up learns it only from that message, so the
    message must wait for its stream to open (seed 8 of the soak stalled here)."""
    args = durable_args(
        etcd, "death-while-down", "-np", "4", "--min-np", "1", "-H", "localhost:4",
        "--heartbeat-interval", "0.5", *ONE_WORKER_FAILS,
        *job_args(tmp_path, "--step-delay", "0.01", epochs=4),
    )  # fmt: skip
    env = {"TMPDIR": str(tmp_path)}
    job = elasticrun(args, env=env)
    pids = ranks_to_pids(job, 4)
    job.wait_for(r"step 10 ")
    kill_driver(job)
    os.kill(pids[1], signal.SIGKILL)
    time.sleep(1.0)
    restarted = elasticrun(args, env=env)
    restarted.wait_for(r"round \d+: 3 worker\(s\)", timeout=30)
    restarted.wait_for(r"step \d+ epoch \d+ size 3", timeout=20)
    assert restarted.finish(120) == 0, restarted.output
    assert_exactly_once(tmp_path, epochs=4)


def test_a_leave_the_driver_could_not_save_is_no_end_of_training(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    """etcd down: rank 1 leaves on SIGTERM and exits 0, and the driver dies before it can
    save that. The restarted driver finds a member that exited 0 unwatched and without having
    said it finished: a leave, not the end of training (soak seed 9 ended there, early)."""
    args = durable_args(
        etcd, "unsaved-leave", "-np", "2", "--min-np", "1", "-H", "localhost:2",
        *job_args(tmp_path, epochs=4),
    )  # fmt: skip
    env = {"TMPDIR": str(tmp_path)}
    job = elasticrun(args, env=env)
    pids = ranks_to_pids(job, 2)
    job.wait_for(r"step 6 ")
    etcd.stop()
    try:
        os.kill(pids[1], signal.SIGTERM)
        job.wait_for(r"rank 1 on host localhost leaves the job", timeout=30)
        deadline = time.monotonic() + 30
        while pids_alive([pids[1]]) and time.monotonic() < deadline:
            time.sleep(0.05)
        kill_driver(job)
    finally:
        etcd.start()
    restarted = elasticrun(args, env=env)
    restarted.wait_for(r"exited with code 0 while no driver watched it", timeout=30)
    assert restarted.finish(120) == 0, restarted.output
    assert_exactly_once(tmp_path, epochs=4)


# --- 7. bad input that reaches the driver or a worker ---------------------------------------


def test_an_excluded_joiner_exits_0_from_init(elasticrun, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:1\n")
    go = tmp_path / "go"
    job = elasticrun(
        ["--min-np", "1", *discovery_args(),
         *job_args(tmp_path, "--hold-at-step", "8", "--hold-file", str(go))],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    job.wait_for(r"step 4 ")
    write_hosts(hosts, "localhost:1\n127.0.0.1:1\n")
    job.wait_for(r"round 2: 2 worker\(s\)", timeout=60)  # the joiner is inside hvd.init()
    write_hosts(hosts, "localhost:1\n")
    job.wait_for(r"host 127.0.0.1 was removed by discovery", timeout=30)
    go.touch()
    assert job.finish(120) == 0, job.output
    assert "NotMemberError" not in job.output
    assert "left with exit code" not in job.output
    assert_exactly_once(tmp_path)


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "etcd"])
def test_an_elastic_job_whose_command_does_not_exist_fails_in_one_line(
    elasticrun, etcd: EtcdServer, tmp_path: Path, durable: bool
) -> None:
    backend = durable_args(etcd, f"nocommand-{durable}") if durable else []
    job = elasticrun(
        [*backend, "--min-np", "1", "-H", "localhost:2", "no-such-command-here"],
        env={"TMPDIR": str(tmp_path)},
    )
    assert job.finish(60) == (127 if durable else 1), job.output
    errors = [line for line in job.stderr if re.match(r"(\S+ \S+Z )?elasticrun: ", line)]
    assert any("no-such-command-here" in line for line in errors), job.output
    assert "cooldown" not in job.output
    assert "Traceback" not in job.output
    assert not processes_naming("no-such-command-here")
