"""The etcd backend with real processes: a driver that dies (SIGKILL) and is started again
takes its job up without restarting a worker; a second driver of a running job is refused;
an etcd crash mid-training loses nothing. etcd is a real server started by the `etcd`
fixture on loopback; workers write their output under the test's TMPDIR."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elastic.driver.job_file import runtime_dir
from elastic.protocol.http import JobStatus
from tests.e2e.elastic.test_elastic import (
    ONE_WORKER_FAILS,
    assert_exactly_once,
    job_args,
    ranks_to_pids,
)
from tests.support.etcd_server import EtcdServer, JobLock
from tests.support.processes import pids_alive
from tests.support.running_job import ELASTICRUN, RunningJob

pytestmark = pytest.mark.timeout(180)


def durable_args(etcd: EtcdServer, job_id: str, *rest: str) -> list[str]:
    return ["--backend", "etcd", "--etcd-endpoints", etcd.endpoint, "--job-id", job_id, *rest]


def wait_for_file_line(path: Path, pattern: str, timeout: float = 30.0) -> re.Match[str]:
    """The first line of `path` matching `pattern`, waiting for the file to grow."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                if match := regex.search(line):
                    return match
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r} in {path} within {timeout} s")


def kill_driver(job: RunningJob) -> None:
    os.kill(job.process.pid, signal.SIGKILL)
    job.process.wait()


def status(etcd: EtcdServer, job_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ELASTICRUN, "status", "--job-id", job_id, "--etcd-endpoints", etcd.endpoint, *extra],
        capture_output=True,
        text=True,
        timeout=30,
    )


def job_file_token(job_id: str) -> str:
    """The token in this host's job file of `job_id` (etcd holds none)."""
    return json.loads((runtime_dir() / f"{job_id}.json").read_bytes())["token"]


def test_a_restarted_driver_adopts_the_running_workers(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    env = {"TMPDIR": str(tmp_path)}
    hold = tmp_path / "go"
    args = durable_args(
        etcd, "restart1", "-np", "2", "--min-np", "1", "-H", "localhost:2",
        *job_args(tmp_path, "--step-delay", "0.1", "--hold-at-step", "40",
                  "--hold-file", str(hold), epochs=3),
    )  # fmt: skip
    first = elasticrun(args, env)
    pids = ranks_to_pids(first, 2)
    first.wait_for(r"step 4 ")
    kill_driver(first)
    # No driver now: the workers go on training (their output is in their files).
    log = tmp_path / "elasticrun-restart1" / "worker.1" / "stdout"
    last = max(int(n) for n in re.findall(r"step (\d+) ", log.read_text()))
    wait_for_file_line(log, rf"step {last + 3} ")

    second = elasticrun(args, env)
    second.wait_for(r"resuming job restart1 at round 1: 2 worker\(s\) to re-adopt")
    second.wait_for(r"holding for")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the new driver hears each worker's latest commit
        saved = status(etcd, "restart1", "--json", "--saved").stdout
        workers = json.loads(saved)["state"]["workers"]
        if all(w["commit"] >= 20 for w in workers):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"commits not saved: {workers}")
    assert {w["pid"] for w in workers} == set(pids.values())
    hold.touch()
    assert second.finish(120) == 0, second.transcript()
    started = {int(pid) for pid in re.findall(r"worker pid=(\d+)", second.output)}
    assert started <= set(pids.values()), "no worker was started again"
    assert "elasticrun: round 2" not in second.output, "no re-rendezvous was needed"
    assert assert_exactly_once(tmp_path, epochs=3)["size"] == 2
    assert re.search(r"\[\d\]<stdout>:done size 2", second.output), "output followed again"
    shown = status(etcd, "restart1")
    assert shown.returncode == 0 and "ended with exit code 0" in shown.stdout, shown


def kill_a_worker_while_the_driver_is_away(
    elasticrun, etcd: EtcdServer, tmp_path: Path, job_id: str, host: str, *reach: str
) -> None:
    """Rank 1 of a 2-worker job on `host` (`reach`: the flags that reach it) is SIGKILLed
    while no driver runs: the restarted driver learns how it ended and re-forms without it,
    and the job ends exactly once."""
    env = {"TMPDIR": str(tmp_path)}
    args = durable_args(
        etcd, job_id, "-np", "2", "--min-np", "1", "-H", f"{host}:2", *reach,
        *ONE_WORKER_FAILS, "--blacklist-cooldown-range", "300", "300",
        *job_args(tmp_path, "--step-delay", "0.1", epochs=3),
    )  # fmt: skip
    first = elasticrun(args, env)
    pids = ranks_to_pids(first, 2)
    first.wait_for(r"step 4 ")
    kill_driver(first)
    os.kill(pids[1], signal.SIGKILL)

    second = elasticrun(args, env)
    second.wait_for(rf"rank 1 on host {re.escape(host)} was killed by signal SIGKILL", 30)
    second.wait_for(r"round 2: 1 worker\(s\)", timeout=60)
    assert second.finish(120) == 0, second.transcript()
    assert pids_alive([pids[0]]) == [], "the survivor finished the job"
    assert assert_exactly_once(tmp_path, epochs=3)["size"] == 1


def test_a_worker_killed_while_the_driver_is_away_is_handled_after_the_restart(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    kill_a_worker_while_the_driver_is_away(elasticrun, etcd, tmp_path, "restart2", "localhost")


def test_a_leaver_let_go_before_the_driver_died_is_told_so_by_the_next_driver(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    """The only worker gets SIGTERM with no slot free for a worker to take its state over, so
    the driver lets it go with its state; the driver dies before the leaver, held at a step,
    comes to the rendezvous. The restarted driver must turn its join away at once (the dead
    driver's word), not keep it waiting for the rejoin timeout while it holds the only slot;
    a new worker then takes the slot and the job ends."""
    env = {"TMPDIR": str(tmp_path)}
    hold = tmp_path / "go"
    args = durable_args(
        etcd, "letgo", "--min-np", "1", "--max-np", "1", "-H", "localhost:1",
        "--failure-scope", "worker", "--start-timeout", "60",
        *job_args(tmp_path, "--hold-at-step", "3", "--hold-file", str(hold), epochs=1),
    )  # fmt: skip
    first = elasticrun(args, env)
    leaver = ranks_to_pids(first, 1)[0]
    first.wait_for(r"holding for")
    os.kill(leaver, signal.SIGTERM)
    first.wait_for(r"leaves the job: SIGTERM; nobody can take its state over")
    deadline = time.monotonic() + 30
    while " leaving " not in status(etcd, "letgo", "--saved").stdout:  # the word is saved
        assert time.monotonic() < deadline, status(etcd, "letgo", "--saved").stdout
        time.sleep(0.1)
    kill_driver(first)

    second = elasticrun(args, env)
    second.wait_for(r"resuming job letgo")
    hold.touch()  # the leaver goes on to its commit, then to the rendezvous
    deadline = time.monotonic() + 20  # it waited 85 s (its rejoin timeout) before the fix
    while pids_alive([leaver]):
        assert time.monotonic() < deadline, f"the leaver still waits:\n{second.transcript()}"
        time.sleep(0.1)
    assert second.finish(120) == 0, second.transcript()
    assert "training state lost" in second.output  # its state left with it, as said


def test_a_worker_stopped_while_the_driver_is_away_is_found_hung_after_the_restart(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    """Rank 1 is SIGSTOPped while no driver runs, so it never reaches the restarted driver:
    once the re-adopted workers' grace is over it is found hung, the round re-forms without
    it and training goes on (rank 0 was blocked in a collective with it)."""
    env = {"TMPDIR": str(tmp_path)}
    args = durable_args(
        etcd, "stopped", "-np", "2", "--min-np", "1", "-H", "localhost:2",
        "--failure-scope", "worker", "--heartbeat-interval", "0.5",
        "--blacklist-cooldown-range", "300", "300",
        *job_args(tmp_path, "--step-delay", "0.1", epochs=3),
    )  # fmt: skip
    first = elasticrun(args, env)
    pids = ranks_to_pids(first, 2)
    first.wait_for(r"step 4 ")
    kill_driver(first)
    os.kill(pids[1], signal.SIGSTOP)
    try:
        second = elasticrun(args, env)
        second.wait_for(r"resuming job stopped")
        second.wait_for(r"rank 1 on host localhost missed 3 heartbeats", timeout=40)
        second.wait_for(r"round \d+: 1 worker\(s\)", timeout=30)
        assert second.finish(120) == 0, second.transcript()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[1], signal.SIGKILL)


def test_a_second_driver_of_a_running_job_is_refused(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    env = {"TMPDIR": str(tmp_path)}
    args = durable_args(
        etcd, "twice", "-np", "1", *job_args(tmp_path, "--hold-at-step", "2",
        "--hold-file", str(tmp_path / "go")),
    )  # fmt: skip
    first = elasticrun(args, env)
    first.wait_for(r"holding for")
    second = elasticrun(args, env)
    assert second.finish(30) == 1
    assert re.search(r"job twice is already run by the driver with pid \d+", second.output)
    (tmp_path / "go").touch()
    assert first.finish(60) == 0, first.transcript()


def test_a_driver_whose_lease_ended_takes_its_claim_back_and_carries_on(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    """The lease ends while the driver lives (revoked here; a driver paused past its TTL
    loses it the same way) and no other driver claims the job: it takes the claim back."""
    env = {"TMPDIR": str(tmp_path)}
    hold = tmp_path / "go"
    args = durable_args(
        etcd, "relock", "-np", "2", "--min-np", "1", "-H", "localhost:2",
        *job_args(tmp_path, "--hold-at-step", "6", "--hold-file", str(hold)),
    )  # fmt: skip
    job = elasticrun(args, env)
    job.wait_for(r"step 6 ")
    lock = JobLock(etcd, "relock")
    try:
        old = lock.end_lease()
        job.wait_for(r"no other driver held it: taken back", timeout=30)
        value, lease = lock.held()
        assert value is not None and lease not in (0, old)
    finally:
        lock.close()
    hold.touch()
    assert job.finish(120) == 0, job.transcript()
    assert "another driver took" not in job.output
    assert_exactly_once(tmp_path)


def test_a_driver_paused_past_its_lease_takes_its_claim_back_and_keeps_its_workers(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    """The driver stopped (SIGSTOP) for longer than its 10 s lease: its lease ends and it
    hears no heartbeat meanwhile. Resumed, it takes its claim back and does not take the
    silence it caused for hung workers."""
    env = {"TMPDIR": str(tmp_path)}
    hold = tmp_path / "go"
    args = durable_args(
        etcd, "paused", "-np", "2", "--min-np", "1", "-H", "localhost:2",
        *job_args(tmp_path, "--hold-at-step", "6", "--hold-file", str(hold)),
    )  # fmt: skip
    job = elasticrun(args, env)
    pids = ranks_to_pids(job, 2)
    job.wait_for(r"step 6 ")
    os.kill(job.process.pid, signal.SIGSTOP)
    try:
        time.sleep(14)
    finally:
        os.kill(job.process.pid, signal.SIGCONT)
    job.wait_for(r"no other driver held it: taken back", timeout=30)
    hold.touch()
    assert job.finish(120) == 0, job.transcript()
    assert "another driver took" not in job.output and "hung" not in job.output
    assert "elasticrun: epoch 2" not in job.output, "no worker was lost"
    assert assert_exactly_once(tmp_path)["size"] == 2
    assert pids_alive(list(pids.values())) == []


def test_a_driver_whose_claim_another_took_leaves_the_workers_to_it(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    """The lease ends and another driver's claim is in the lock before this driver looks:
    this one leaves, its workers train on, and a driver that takes the job up finishes it."""
    env = {"TMPDIR": str(tmp_path)}
    hold = tmp_path / "go"
    args = durable_args(
        etcd, "stolen", "-np", "2", "-H", "localhost:2",
        *job_args(tmp_path, "--hold-at-step", "6", "--hold-file", str(hold)),
    )  # fmt: skip
    first = elasticrun(args, env)
    pids = ranks_to_pids(first, 2)
    first.wait_for(r"step 6 ")
    ended = subprocess.Popen(["true"])  # a driver that has exited since: a later driver may
    ended.wait()  # take its claim over
    other = {"driver_id": "other", "host": socket.gethostname(), "pid": ended.pid, "since": 0}
    lock = JobLock(etcd, "stolen")
    try:
        lock.end_lease()
        lock.put(json.dumps(other))
    finally:
        lock.close()
    first.wait_for(r"another driver took job stolen over .*: leaving the workers to it", 30)
    assert first.finish(30) == 1, first.transcript()
    assert pids_alive(list(pids.values())) == list(pids.values()), "workers left running"

    second = elasticrun(args, env)
    second.wait_for(r"resuming job stolen at round 1: 2 worker\(s\) to re-adopt", timeout=30)
    hold.touch()
    assert second.finish(120) == 0, second.transcript()
    assert assert_exactly_once(tmp_path)["size"] == 2


def test_an_etcd_crash_mid_training_loses_nothing(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    env = {"TMPDIR": str(tmp_path)}
    hold = tmp_path / "go"
    args = durable_args(
        etcd, "outage", "-np", "2", "--min-np", "1", "-H", "localhost:2", *ONE_WORKER_FAILS,
        "--blacklist-cooldown-range", "300", "300", "--etcd-grace", "1",
        *job_args(tmp_path, "--step-delay", "0.05", "--hold-at-step", "30",
                  "--hold-file", str(hold), epochs=3),
    )  # fmt: skip
    job = elasticrun(args, env)
    pids = ranks_to_pids(job, 2)
    job.wait_for(r"step 4 ")
    etcd.stop()  # SIGKILL
    # A failure during the outage: the driver handles it from memory.
    os.kill(pids[1], signal.SIGKILL)
    job.wait_for(r"round 2: 1 worker\(s\)", timeout=30)
    job.wait_for(r"job state not saved, retrying", timeout=30)
    job.wait_for(r"unreachable for \d+ s \(grace 1 s", timeout=30)
    etcd.start()
    job.wait_for(r"reachable again after \d+ s; job state saved", timeout=30)
    shown = status(etcd, "outage", "--json", "--saved")
    saved = json.loads(shown.stdout)
    assert saved["state"]["round"] == 2, "the change made during the outage was saved"
    assert "secret" not in saved and "token" not in shown.stdout
    hold.touch()
    assert job.finish(120) == 0, job.transcript()
    assert assert_exactly_once(tmp_path, epochs=3)["size"] == 1


def test_the_token_is_on_no_command_line(elasticrun, etcd: EtcdServer, tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path)}
    hold = tmp_path / "go"
    args = durable_args(
        etcd, "secret1", "-np", "2",
        *job_args(tmp_path, "--hold-at-step", "2", "--hold-file", str(hold)),
    )  # fmt: skip
    job = elasticrun(args, env)
    job.wait_for(r"holding for")
    token = job_file_token("secret1").encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                assert token not in (entry / "cmdline").read_bytes(), entry
            except OSError:
                continue
    status_text = status(etcd, "secret1", "--json").stdout  # the running driver's answer
    assert JobStatus.model_validate_json(status_text).size == 2
    assert token.decode() not in status_text and "holding" not in status_text
    hold.touch()
    assert job.finish(60) == 0
    assert token.decode() not in job.output


def test_bad_backend_flags_are_usage_errors(tmp_path: Path) -> None:
    cases = {
        ("--backend", "etcd"): "--backend etcd needs --etcd-endpoints",
        ("--etcd-endpoints", "127.0.0.1:2379"): "--etcd-endpoints needs --backend etcd",
        ("--backend", "etcd", "--etcd-endpoints", "nohost"): "is not host:port",
        ("--job-id", "a/b"): "--job-id 'a/b'",
        ("--backend", "etcd", "--etcd-endpoints", "127.0.0.1:1", "--etcd-user", "u"): (
            "--etcd-user needs its password: --etcd-password-file FILE or $ELASTICRUN_ETCD_PASSWORD"
        ),
        ("--backend", "etcd", "--etcd-endpoints", "127.0.0.1:1", "--etcd-password-file", "f"): (
            "--etcd-password-file needs --etcd-user"
        ),
    }
    for flags, message in cases.items():
        done = subprocess.run(
            [*ELASTICRUN, *flags, "-np", "1", sys.executable, "-c", "pass"],
            capture_output=True,
            text=True,
            env={
                k: v
                for k, v in os.environ.items()
                if k not in ("ELASTIC_ETCD_PASSWORD", "ELASTICRUN_ETCD_PASSWORD")
            },
            timeout=30,
        )
        assert done.returncode == 2 and message in done.stderr, (flags, done.stderr)


def test_an_unreachable_etcd_stops_the_start_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [*ELASTICRUN, "--backend", "etcd", "--etcd-endpoints", "127.0.0.1:1", "-np", "1",
         sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "cannot reach the state backend: etcd at 127.0.0.1:1 unreachable" in done.stderr
