"""`elasticrun status`, `drain`, `undrain` and `stop` against real jobs, and the pure parts
under them: finding the job file, and the status text."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from elastic.driver.cli.status_text import render
from elastic.driver.errors import LaunchError
from elastic.driver.job_file import (
    JobIdTaken,
    SeveralJobs,
    claim_job_id,
    find_job,
    read_job_files,
    write_job_file,
)
from elastic.protocol.http import (
    CollectiveStatus,
    HostStatus,
    JobStatus,
    RoundRecord,
    StalledRank,
    StallReport,
    StandbyStatus,
    WorkerStatus,
)
from tests.support.paths import REPOSITORY as ROOT
from tests.support.paths import WORKERS
from tests.support.running_job import ELASTICRUN, RunningJob

JOB = WORKERS / "elastic_job.py"
HOSTS_FILE_SCRIPT = ROOT / "discovery_scripts" / "hosts_file.sh"
STEP = re.compile(r"\[(\d+)\]<stdout>:step (\d+) epoch \d+ size (\d+) rank \d+")


def command(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ELASTICRUN, *args], env={**os.environ, **env}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


# --- the job file ---------------------------------------------------------------------------


def test_the_job_file_is_private_and_found_by_id_or_alone(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "elasticrun"
    (tmp_path / "run").mkdir()
    path = write_job_file("j1", "s3cret", "http://127.0.0.1:1234", folder=folder)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    found = find_job(None, folder)
    assert (found.job_id, found.token, found.urls.metrics) == (
        "j1", "s3cret", "http://127.0.0.1:1234/metrics",
    )  # fmt: skip
    write_job_file("j2", "other", "http://127.0.0.1:1235", folder=folder)
    with pytest.raises(SeveralJobs, match=r"2 jobs run \(j1, j2\): name one with --job-id"):
        find_job(None, folder)
    assert find_job("j2", folder).token == "other"
    with pytest.raises(LaunchError, match="no running job j3"):
        find_job("j3", folder)


def test_a_job_file_whose_driver_is_gone_is_removed_and_said(tmp_path: Path) -> None:
    folder = tmp_path / "elasticrun"
    path = write_job_file("old", "t", "http://127.0.0.1:1", folder=folder)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "pid": dead.pid}))
    running, problems = read_job_files(folder)
    assert running == []
    assert problems == [f"job old's driver (pid {dead.pid}) is gone; removed {path}"]
    assert not path.exists()


def test_a_job_id_is_held_by_one_live_process_and_freed_by_its_death(tmp_path: Path) -> None:
    claim = claim_job_id("held", '{"pid": 1}', tmp_path)
    with pytest.raises(JobIdTaken, match='"pid": 1'):
        claim_job_id("held", "{}", tmp_path)
    claim.release()
    claim_job_id("held", "{}", tmp_path).release()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from pathlib import Path\n"
         "from elastic.driver.job_file import claim_job_id\n"
         f"claim_job_id('held', 'child', Path({str(tmp_path)!r}))\n"
         "print('held', flush=True)\n"
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(JobIdTaken, match="child"):
        claim_job_id("held", "{}", tmp_path)
    holder.kill()  # SIGKILL: no release ran, the kernel drops the lock
    holder.wait()
    claim_job_id("held", "{}", tmp_path).release()
    assert not (tmp_path / "held.lock").exists()


def test_a_runtime_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elasticrun").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LaunchError, match="symbolic link"):
        write_job_file("j", "t", "http://127.0.0.1:1", folder=tmp_path / "elasticrun")


# --- the status text ------------------------------------------------------------------------


def test_the_status_text_shows_workers_the_stall_and_recoveries() -> None:
    status = JobStatus(
        job_id="j", round=2, size=2,
        hosts=[HostStatus(hostname="a", slots=2),
               HostStatus(hostname="b", slots=1, state="cooldown", until=130.0)],
        workers=[
            WorkerStatus(worker_id="a[0]#1", rank=0, hostname="a", local_rank=0, state="member",
                         step_rate=4.25, commit_age=1.5, heartbeat_age=0.25,
                         collective=CollectiveStatus(seq=7, kind="allreduce", blocked_for=65)),
            WorkerStatus(worker_id="b[0]#2", rank=None, hostname="b", local_rank=None,
                         state="failed", exit_code=-9),
        ],
        rounds=[RoundRecord(number=2, formed_at=0, size=2, cause="failure", reason="r died",
                            noticed_to_formed=0.07, formed_to_first_step=0.08)],
        stall=StallReport(round=2, collective=CollectiveStatus(seq=7, kind="allreduce"),
                          waiting=[0], missing=[StalledRank(rank=1, hostname="a", doing="x")],
                          seconds=65, line="stall in round 2: ..."),
    )  # fmt: skip
    text = render(status, now=100.0)
    assert "job j: round 2, 2 worker(s) in it" in text
    assert "hosts: a (2 slots, active), b (1 slot, cooldown for 30 s)" in text
    assert re.search(r"0 +a +member +4\.25 +1\.5 s +0\.2 s +allreduce #7, waiting 65\.0 s", text)
    assert re.search(r"- +b +failed \(exit -9\)", text)
    assert "STALL: stall in round 2: ..." in text
    assert "failure (failure to round 0.07 s, round to first step 0.08 s): r died" in text


def test_the_status_text_counts_every_ended_worker_and_says_how_many_it_lists() -> None:
    ended = [
        WorkerStatus(worker_id=f"a[0]#{n}", rank=None, hostname="a", local_rank=None,
                     state="failed", exit_code=137, end_cause="signal SIGKILL")
        for n in range(2, 4)
    ]  # fmt: skip
    status = JobStatus(
        job_id="j", round=9, size=1, hosts=[HostStatus(hostname="a", slots=1)],
        workers=[WorkerStatus(worker_id="a[0]#4", rank=0, hostname="a", local_rank=0,
                              state="member"), *ended],
        ended_total=9, ended_by_state={"failed": 8, "stopped": 1},
        ended_by_cause={"signal SIGKILL": 7, "hung": 1, "stopped": 1},
    )  # fmt: skip
    text = render(status, now=100.0)
    assert re.search(r"- +a +failed \(signal SIGKILL\)", text)
    assert "ended workers: 9 (7 signal SIGKILL, 1 hung, 1 stopped); the newest 2 listed" in text


def test_the_status_text_names_the_standbys_and_counts_those_taken() -> None:
    status = JobStatus(
        job_id="j", round=3, size=1, hosts=[HostStatus(hostname="a", slots=1)], workers=[],
        standbys=[StandbyStatus(standby_id="a#standby.4", hostname="a", pid=9, ready=True),
                  StandbyStatus(standby_id="b#standby.5", hostname="b", pid=None, ready=False)],
        standbys_taken=2,
    )  # fmt: skip
    assert "standbys: a (ready), b (starting); 2 taken so far" in render(status, now=0.0)
    without = render(JobStatus(job_id="j", size=1, hosts=[], workers=[]), now=0.0)
    assert "standbys" not in without, "a job without standbys says nothing of them"


# --- real jobs ------------------------------------------------------------------------------


@pytest.fixture
def runtime(tmp_path: Path) -> dict[str, str]:
    """A runtime folder of the test's own, for the job's file and the commands."""
    folder = tmp_path / "run"
    folder.mkdir()
    return {"XDG_RUNTIME_DIR": str(folder)}


def test_status_of_a_memory_job_from_another_process(
    elasticrun: Callable[..., RunningJob], tmp_path: Path, runtime: dict[str, str]
) -> None:
    job = elasticrun(
        ["-np", "2", "--min-np", "2", "--heartbeat-interval", "0.5", sys.executable, str(JOB),
         "--out", str(tmp_path), "--epochs", "100", "--step-delay", "0.05"],
        env=runtime,
    )  # fmt: skip
    job.wait_for(r"step 3 epoch", 90)
    files = list((tmp_path / "run" / "elasticrun").glob("*.json"))
    assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    token = json.loads(files[0].read_text())["token"]
    text = command(["status"], runtime)
    assert text.returncode == 0, text.stderr
    assert re.search(r"^job \w+: round 1, 2 worker\(s\) in it$", text.stdout, re.M)
    assert re.search(r"^  0 +localhost +member ", text.stdout, re.M), text.stdout
    assert re.search(r"^  1 +localhost +member ", text.stdout, re.M), text.stdout
    as_json = command(["status", "--json"], runtime)
    status = JobStatus.model_validate_json(as_json.stdout)
    assert status.urls is not None and status.urls.metrics.endswith("/metrics")
    assert sorted(w.rank for w in status.workers) == [0, 1]
    login = command(["status", "--login"], runtime)
    said = r"(http://\S+/ui/login\?code=\S+) \(a one-time login link, for 10 minutes\)\n"
    link = re.fullmatch(said, login.stdout)
    assert link is not None, login
    first, again = (httpx.get(link.group(1), timeout=10) for _ in range(2))
    assert first.status_code == 200 and first.cookies  # the link opens a page session...
    assert not again.cookies  # ...once
    assert token not in text.stdout + as_json.stdout + login.stdout
    job.stop()
    assert token not in job.output


def test_a_second_job_with_a_running_jobs_id_is_refused_and_the_first_keeps_its_handle(
    elasticrun: Callable[..., RunningJob], tmp_path: Path, runtime: dict[str, str]
) -> None:
    """With the memory backend too, one job id takes one driver on a host: a second
    `elasticrun --job-id X` while X runs says so in one line and exits 1, launching nothing;
    X's job file stays, so `status`, `drain` and `stop --job-id X` still reach X."""
    args = ["--job-id", "same", "-np", "1", "--min-np", "1", sys.executable, str(JOB),
            "--out", str(tmp_path), "--epochs", "100", "--step-delay", "0.05"]  # fmt: skip
    first = elasticrun(args, env=runtime)
    first.wait_for(r"step 3 epoch", 90)
    second = subprocess.run(
        [*ELASTICRUN, *args[:-6], sys.executable, "-c", "open('launched', 'w')"],
        env={**os.environ, **runtime}, cwd=tmp_path, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert second.returncode == 1, second
    said = [line for line in second.stderr.splitlines() if "already run by" in line]
    assert len(said) == 1, second.stderr
    assert re.search(r"job same is already run by the driver with pid \d+ on host ", said[0])
    assert not (tmp_path / "launched").exists()
    status = command(["status", "--job-id", "same"], runtime)
    assert status.returncode == 0, status.stderr
    assert re.search(r"^job same: round 1, 1 worker\(s\) in it$", status.stdout, re.M)
    assert command(["stop", "--job-id", "same"], runtime).returncode == 0
    first.finish(60)
    again = subprocess.run(  # the id is free once its job has ended
        [*ELASTICRUN, "--job-id", "same", "-np", "1", sys.executable, "-c", "pass"],
        env={**os.environ, **runtime}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr


def test_drain_lets_a_host_go_at_a_step_undrain_brings_it_back_stop_ends_the_job(
    elasticrun: Callable[..., RunningJob], tmp_path: Path, runtime: dict[str, str]
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    job = elasticrun(
        ["-np", "2", "--min-np", "1", "--host-discovery-script", str(HOSTS_FILE_SCRIPT),
         "--heartbeat-interval", "0.5", sys.executable, str(JOB), "--out", str(tmp_path),
         "--epochs", "100", "--step-delay", "0.05", "--commit-every", "1000"],
        env={**runtime, "ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    job.wait_for(r"step 5 epoch", 90)
    unknown = command(["drain", "nosuchhost"], runtime)
    assert unknown.returncode == 1
    assert unknown.stderr.strip().splitlines() == [
        "elasticrun drain: error: job "
        + unknown.stderr.split("job ")[1].split()[0]
        + " has no host 'nosuchhost' (it has: localhost, 127.0.0.1)"
    ]
    drained = command(["drain", "127.0.0.1"], runtime)
    assert drained.returncode == 0, drained.stderr
    assert "host 127.0.0.1 is drained: its workers leave at their next step" in drained.stdout
    job.wait_for(r"round 2: 1 worker\(s\) on localhost:1", 60)
    job.wait_for(r"step \d+ epoch \d+ size 1 rank 0", 60)
    drained_at = len(job.lines)
    status = JobStatus.model_validate_json(command(["status", "--json"], runtime).stdout)
    assert {h.hostname: h.state for h in status.hosts} == {
        "localhost": "active", "127.0.0.1": "drained",
    }  # fmt: skip
    assert status.rounds[-1].cause == "drain"
    # Commits only every 1,000 steps: a rollback would show as a step number going back.
    steps = [(int(m[2]), int(m[3])) for line in job.lines if (m := STEP.search(line))]
    before = max(step for step, size in steps if size == 2)
    after = min(step for step, size in steps if size == 1)
    assert after == before + 1, steps
    # A drained host gets no new worker, however long it is offered (discovery polls it
    # every second): 30 more steps at size 1 (over 1.5 s) and no launch there.
    job.wait_for(rf"step {after + 30} epoch \d+ size 1 rank 0", 60)
    assert not any("launched" in line and "127.0.0.1" in line for line in job.lines[drained_at:])
    back = command(["undrain", "127.0.0.1"], runtime)
    assert back.returncode == 0 and "undrained" in back.stdout
    job.wait_for(r"round 3: 2 worker\(s\) on localhost:1, 127.0.0.1:1", 90)
    stopped = command(["stop"], runtime)
    assert stopped.returncode == 0, stopped.stderr
    assert job.finish(60) == 0
    job.wait_for(r"stopped by `elasticrun stop`", 1)
    assert command(["status"], runtime).returncode == 1  # gone with its job file


@pytest.mark.e2e
def test_commands_without_a_job_say_so_in_one_line(runtime: dict[str, str]) -> None:
    for args in (["status"], ["stop"], ["drain", "a"]):
        done = command(args, runtime)
        assert done.returncode == 1
        assert len(done.stderr.strip().splitlines()) == 1
        assert "no running job in" in done.stderr
    assert command(["drain"], runtime).returncode == 2  # HOST missing: a usage error


def test_a_job_command_does_not_load_the_driver(runtime: dict[str, str]) -> None:
    """`elasticrun status` (drain, undrain, stop) imports neither the driver nor its HTTP
    server: they are most of `elasticrun`'s start-up time (1.6 s of imports against 0.8 s here)."""
    check = (
        "import sys\n"
        "from elastic.driver.cli import main\n"
        "main(['status'])\n"
        "print(sorted(m for m in sys.modules if m in ('elastic.driver.job', 'fastapi', 'uvicorn')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], env={**os.environ, **runtime}, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert "no running job in" in done.stderr, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
