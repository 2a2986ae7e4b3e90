"""Warm standbys with real processes: a SIGKILLed worker's replacement runs in the standby
that waited on its host (its pid), a new standby takes the used one's place, the script runs
there as `python` would run it (argv, `__main__`, its folder on `sys.path`, its exit code
and traceback), no standby outlives the job, and a driver SIGKILLed and started again (etcd)
stops the standbys of the driver before it and hands a slot to one of its own."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from elastic.protocol.http import JobStatus
from tests.e2e.elastic.test_elastic import (
    ONE_WORKER_FAILS,
    assert_exactly_once,
    job_args,
    ranks_to_pids,
)
from tests.e2e.etcd.test_driver_restart import durable_args, kill_driver
from tests.support.etcd_server import EtcdServer
from tests.support.job_status import until
from tests.support.processes import pids_alive, standby_processes
from tests.support.scripts import write_script

pytestmark = pytest.mark.timeout(240)

NO_COOLDOWN = ("--blacklist-cooldown-range", "0", "0")
STANDBY = ("--standby", "1")  # off by default


def runtime_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "run").mkdir(exist_ok=True)
    return {"TMPDIR": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")}


def ready_standby(job_id: str, env: dict[str, str], other_than: int | None = None) -> int:
    """The pid of a standby of `job_id` that is ready, and not `other_than`."""

    def holds(status: JobStatus) -> bool:
        return any(s.ready and s.pid not in (None, other_than) for s in status.standbys)

    status = until(job_id, env, holds, "a ready standby")
    return next(s.pid for s in status.standbys if s.ready and s.pid not in (None, other_than))


def standby_pids(job_id: str) -> set[int]:
    """Standby processes of job `job_id`."""
    return standby_processes(f"ELASTIC_JOB_ID={job_id}\0")


def test_a_killed_worker_s_replacement_runs_in_the_standby_and_a_new_one_waits(
    elasticrun, tmp_path: Path
) -> None:
    env = runtime_env(tmp_path)
    job = elasticrun(
        ["--job-id", "standby1", *STANDBY, "-np", "2", "--min-np", "2", "-H", "localhost:2",
         *ONE_WORKER_FAILS, *NO_COOLDOWN,
         *job_args(tmp_path, "--samples", "1600", "--step-delay", "0.05", epochs=2)],
        env,
    )  # fmt: skip
    pids = ranks_to_pids(job, 2)
    standby = ready_standby("standby1", env)
    assert standby not in pids.values(), "a standby is no member"

    os.kill(pids[1], signal.SIGKILL)
    job.wait_for(rf"worker pid={standby} ", 30)  # the replacement is the standby's process
    job.wait_for(r"round 2: 2 worker\(s\)", 30)
    again = ready_standby("standby1", env, other_than=standby)
    status = until("standby1", env, lambda s: s.standbys_taken == 1, "one standby taken")
    assert [s.pid for s in status.standbys] == [again], (
        "one standby per host, the used one replaced"
    )

    assert job.finish(120) == 0, job.transcript()
    assert assert_exactly_once(tmp_path)["size"] == 2
    assert pids_alive([again]) == [] and standby_pids("standby1") == set(), "none outlives the job"


SCRIPT = """
import os, sys, time
import torch
import elastic.torch as hvd

print(f"ran name={__name__} argv={sys.argv} path0={sys.path[0]} pid={os.getpid()} "
      f"standby={os.environ.get('ELASTIC_STANDBY_ID')}", flush=True)
hvd.init()
serial = int(os.environ["ELASTIC_WORKER_ID"].rpartition("#")[2])
if serial > 2:  # the first replacement fails once
    try:
        os.close(os.open(sys.argv[1] + ".failed", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        pass
    else:
        raise ValueError(f"raised in worker {serial}")
state = hvd.elastic.ObjectState(step=0)

@hvd.elastic.run
def train(state):
    while not hvd.allreduce(torch.tensor(float(os.path.exists(sys.argv[1]))), op=hvd.Max):
        state.step += 1
        state.commit()
        time.sleep(0.05)

train(state)
"""


def test_a_script_runs_in_a_standby_as_python_runs_it_and_fails_as_it_would(
    elasticrun, tmp_path: Path
) -> None:
    folder = tmp_path / "scripts"
    folder.mkdir()
    script = write_script(folder, "train.py", SCRIPT)
    env = runtime_env(tmp_path)
    go = tmp_path / "go"
    job = elasticrun(
        ["--job-id", "standby2", *STANDBY, "-np", "2", "--min-np", "1", "-H", "localhost:2",
         *ONE_WORKER_FAILS, *NO_COOLDOWN, "python", str(script), str(go)],
        env,
    )  # fmt: skip
    job.wait_for(r"round 1: 2 worker\(s\)")
    standby = ready_standby("standby2", env)
    pid_of_rank_1 = int(job.wait_for(r"\[1\]<stdout>:ran .* pid=(\d+)").group(1))
    os.kill(pid_of_rank_1, signal.SIGKILL)
    # No cooldown on the host: its slot is refilled at once, by the standby.
    ran = job.wait_for(rf"ran name=(\S+) argv=(.*) path0=(\S+) pid={standby} standby=(\S+)", 30)
    assert ran.group(1) == "__main__"
    assert ran.group(2) == repr([str(script), str(go)])
    assert ran.group(3) == str(folder), "the script's folder first on sys.path"
    assert ran.group(4) == "None", "the worker's environment, not the standby's"
    job.wait_for(r"ValueError: raised in worker \d+", 30)  # its traceback, as python shows it
    shown = [line for line in job.stderr if "<stderr>:" in line and "line " in line]
    assert all("standby" not in line and "runpy" not in line for line in shown), shown
    job.wait_for(r"rank 1 on host localhost exited with code 1", 30)
    for line in [line for line in job.lines if "2 worker(s) on localhost:2" in line]:
        job.lines.remove(line)  # so that the wait below finds the next such round
    job.wait_for(r"round \d+: 2 worker\(s\)", 60)  # its slot refilled once more
    go.touch()
    assert job.finish(120) == 0, job.transcript()


def test_a_preload_that_cannot_import_turns_standbys_off_with_one_line(
    elasticrun, tmp_path: Path
) -> None:
    """The job holds at a step until the line is seen: three failed imports take as long as
    the machine takes, and the driver stops trying standbys only while the job runs."""
    env = runtime_env(tmp_path)
    go = tmp_path / "go"
    job = elasticrun(
        ["--job-id", "standby3", "-np", "1", "--min-np", "1", "-H", "localhost:1",
         *STANDBY, "--preload", "no_such_module_here",
         *job_args(tmp_path, "--samples", "480", "--step-delay", "0.05",
                   "--hold-at-step", "20", "--hold-file", str(go), epochs=1)],
        env,
    )  # fmt: skip
    line = job.wait_for(r"no more standbys on host localhost: 3 in a row failed", 150)
    go.touch()
    assert "No module named 'no_such_module_here'" in line.string
    assert job.finish(120) == 0, job.transcript()
    assert assert_exactly_once(tmp_path, epochs=1)["size"] == 1


def test_a_restarted_driver_stops_the_old_standbys_and_hands_a_slot_to_its_own(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    env = runtime_env(tmp_path)
    args = durable_args(
        etcd, "standby4", *STANDBY, "-np", "2", "--min-np", "2", "-H", "localhost:2",
        *ONE_WORKER_FAILS, *NO_COOLDOWN,
        *job_args(tmp_path, "--samples", "2400", "--step-delay", "0.05", epochs=2),
    )  # fmt: skip
    first = elasticrun(args, env)
    pids = ranks_to_pids(first, 2)
    ready_standby("standby4", env)  # (its keeper's pid: the job's processes are detached)
    old = standby_pids("standby4")
    assert len(old) == 1
    kill_driver(first)
    assert pids_alive(list(old)) == list(old), "the standby waits out a driver's restart"

    second = elasticrun(args, env)
    second.wait_for(r"resuming job standby4", 60)
    until("standby4", env, lambda s: any(x.ready for x in s.standbys), "a standby of its own")
    until("standby4", env, lambda s: not pids_alive(list(old)), "the old standby gone", 30)
    new = standby_pids("standby4")
    assert len(new) == 1 and not new & old
    os.kill(pids[1], signal.SIGKILL)
    second.wait_for(r"round 2: 2 worker\(s\)", 60)
    assert until("standby4", env, lambda s: s.standbys_taken == 1, "the new standby taken")
    assert second.finish(120) == 0, second.transcript()
    logs = (tmp_path / "elasticrun-standby4").glob("worker.*/stdout")
    (pid,) = new
    assert any(f"worker pid={pid} " in path.read_text() for path in logs), "ran in the standby"
    assert assert_exactly_once(tmp_path)["size"] == 2
    assert standby_pids("standby4") == set() and pids_alive([*old, *new]) == []
