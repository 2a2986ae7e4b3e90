"""Churn does not accumulate in a real job: one worker SIGKILLed again and again (no
cooldown, --failure-scope worker) leaves `elasticrun status --json` listing the live workers
and at most --worker-history ended ones, with every death counted by cause; the same after
the driver itself is SIGKILLed and started again on etcd. 15 kills (three times the history
kept) in the default suite, 40 with ELASTIC_SLOW_TESTS=1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from elastic.protocol.http import JobStatus
from tests.e2e.elastic.test_elastic import job_args
from tests.e2e.etcd.test_driver_restart import durable_args, kill_driver
from tests.support import job_status
from tests.support.etcd_server import EtcdServer
from tests.support.running_job import ELASTICRUN, RunningJob

pytestmark = pytest.mark.timeout(900)

KILLS = 40 if os.environ.get("ELASTIC_SLOW_TESTS") == "1" else 15  # 15: 3x the history
HISTORY = 5
JOB_ID = "churn"
LIVE = ("launching", "member", "leaving")


def command(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [*ELASTICRUN, *args], env={**os.environ, **env}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def asked(env: dict[str, str]) -> JobStatus:
    return job_status.asked(JOB_ID, env)


def until(env: dict[str, str], holds: Callable[[JobStatus], bool], what: str) -> JobStatus:
    return job_status.until(JOB_ID, env, holds, what)


def settled(status: JobStatus) -> bool:
    """Both slots' workers are members of the round, none of it dead."""
    members = [w for w in status.workers if w.state == "member" and w.pid is not None]
    return status.size == 2 and len(members) == 2


def check(status: JobStatus) -> None:
    ended = [w for w in status.workers if w.state not in LIVE]
    assert len(ended) <= HISTORY, [w.worker_id for w in ended]
    assert [w.state for w in status.workers if w.state in LIVE] == ["member", "member"]
    assert status.ended_total == KILLS
    assert status.ended_by_cause == {"signal SIGKILL": KILLS}
    assert status.ended_by_state == {"failed": KILLS}
    assert all(w.end_cause == "signal SIGKILL" for w in ended)


def test_a_worker_killed_again_and_again_leaves_a_bounded_status_before_and_after_a_restart(
    elasticrun: Callable[..., RunningJob], etcd: EtcdServer, tmp_path: Path
) -> None:
    (tmp_path / "run").mkdir()
    env = {"TMPDIR": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    args = durable_args(
        etcd, JOB_ID, "-np", "2", "--min-np", "1", "--max-np", "2", "-H", "localhost:2",
        "--failure-scope", "worker", "--blacklist-cooldown-range", "0", "0",
        "--heartbeat-interval", "0.5", "--worker-history", str(HISTORY),
        *job_args(tmp_path, "--step-delay", "0.05", epochs=100_000),
    )  # fmt: skip
    first = elasticrun(args, env)
    until(env, settled, "round 1 with both workers")
    survivor = next(w for w in asked(env).workers if w.rank == 0)

    for killed in range(KILLS):  # the worker of slot 1, each time it has started
        status = until(
            env,
            lambda s, n=killed: (
                s.ended_total == n
                and any(
                    w.worker_id.startswith("localhost[1]") and w.state in LIVE and w.pid
                    for w in s.workers
                )
            ),  # fmt: skip
            f"a worker on slot 1 to kill ({killed} killed)",
        )
        (victim,) = [w for w in status.workers
                     if w.worker_id.startswith("localhost[1]") and w.state in LIVE]  # fmt: skip
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)

    until(env, lambda s: s.ended_total == KILLS and settled(s), "the last replacement a member")
    shown = JobStatus.model_validate_json(command(["status", "--json", "--job-id", JOB_ID], env))
    check(shown)
    assert any(w.pid == survivor.pid and w.rank == 0 for w in shown.workers)
    live_pids = {w.pid for w in shown.workers if w.state in LIVE}
    deadline = time.monotonic() + 30
    while True:  # what etcd holds: the same records, the others counted (saved soon after)
        saved = json.loads(
            command(
                [
                    "status",
                    "--saved",
                    "--json",
                    "--job-id",
                    JOB_ID,
                    "--etcd-endpoints",
                    etcd.endpoint,
                ],
                env,
            )  # fmt: skip
        )["state"]
        listed = [w for w in saved["workers"] if w["state"] == "failed"]
        if sum(saved["ended_by_cause"].values()) + len(listed) == KILLS:
            break
        assert time.monotonic() < deadline, saved
        time.sleep(0.5)
    assert len(saved["workers"]) <= 2 + HISTORY

    kill_driver(first)
    second = elasticrun(args, env)
    second.wait_for(rf"resuming job {JOB_ID} at round \d+: 2 worker\(s\) to re-adopt", 60)
    again = until(
        env,
        lambda s: (
            settled(s) and all(w.heartbeat_age is not None for w in s.workers if w.state in LIVE)
        ),  # fmt: skip
        "the restarted driver to hear both workers",
    )
    check(again)
    assert {w.pid for w in again.workers if w.state in LIVE} == live_pids, "none restarted"
    command(["stop", "--job-id", JOB_ID], env)
    assert second.finish(120) == 0, second.transcript()
