"""The rank variables a script reads from its environment (`ELASTIC_*` and horovodrun's
`HOROVOD_*`), with real jobs: before `hvd.init()`, after it and after every re-form they
say what `hvd.rank()`, `hvd.size()`, ... say; a worker that joins a running job gets them
in `hvd.init()`, not from the driver's own environment.

Every job runs tests/support/workers/env_job.py, which prints `env PHASE {json}` lines.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.e2e.elastic.test_elastic import ONE_WORKER_FAILS, discovery_args, write_hosts
from tests.support.paths import WORKERS
from tests.support.running_job import RunningJob

JOB = WORKERS / "env_job.py"
NAMES = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")
# A driver started with rank variables of its own (from inside another job, say): they
# must reach no worker.
STALE = {"ELASTIC_RANK": "99", "HOROVOD_RANK": "99", "HOROVOD_SIZE": "99"}

pytestmark = pytest.mark.timeout(150)


def reports(job: RunningJob, phase: str) -> list[dict]:
    """Every `env PHASE` report of the job, in the order printed."""
    marker = f"<stdout>:env {phase} "
    return [json.loads(line.split(marker, 1)[1]) for line in job.lines if marker in line]


def assert_current(report: dict, hostname: str) -> None:
    """The report's environment holds exactly what hvd says, under both names."""
    environ, said = report["environ"], report["hvd"]
    expected = {f"{prefix}_{name}": str(said[name]) for prefix in ("ELASTIC", "HOROVOD")
                for name in NAMES}  # fmt: skip
    expected |= {"ELASTIC_HOSTNAME": hostname, "HOROVOD_HOSTNAME": hostname}
    assert environ == expected, report


def by_pid(items: list[dict]) -> dict[int, dict]:
    return {item["pid"]: item for item in items}


def test_a_joiner_gets_its_rank_in_init_and_incumbents_theirs_after_the_re_form(
    elasticrun, tmp_path: Path
) -> None:
    hosts, go = tmp_path / "hosts", tmp_path / "go"
    write_hosts(hosts, "localhost:2\n")
    job = elasticrun(
        ["--min-np", "1", "--max-np", "3", *discovery_args(), sys.executable, str(JOB),
         "--steps", "30", "--hold-at-step", "5", "--hold-file", str(go)],
        env={"ELASTIC_HOSTS_FILE": str(hosts), **STALE},
    )  # fmt: skip
    job.wait_for(r"step 5 size 2 rank 1")
    write_hosts(hosts, "localhost:2\n127.0.0.1:1\n")
    job.wait_for(r"elasticrun: round 2: 3 worker\(s\) on localhost:2, 127.0.0.1:1", timeout=60)
    go.touch()  # the joiner waits at the rendezvous: let the incumbents reach their commit
    assert job.finish(90) == 0, job.output

    started, initialized = by_pid(reports(job, "start")), by_pid(reports(job, "init"))
    reset = by_pid(reports(job, "reset"))
    assert len(started) == len(initialized) == 3, job.output
    joiner = next(pid for pid, r in initialized.items() if r["hvd"]["SIZE"] == 3)
    incumbents = set(initialized) - {joiner}
    # Before init, the first workers find round 1's values; the joiner only its host.
    for pid in incumbents:
        assert_current(started[pid] | {"hvd": initialized[pid]["hvd"]}, "localhost")
    assert started[joiner]["environ"] == {
        "ELASTIC_HOSTNAME": "127.0.0.1",
        "HOROVOD_HOSTNAME": "127.0.0.1",
    }
    # After init and after the re-form, every worker finds the round it is in.
    for pid, report in initialized.items():
        assert_current(report, "127.0.0.1" if pid == joiner else "localhost")
    assert set(reset) == incumbents, job.output
    for report in reset.values():
        assert report["hvd"]["SIZE"] == 3
        assert_current(report, "localhost")
    assert initialized[joiner]["hvd"]["RANK"] == 2


def test_survivors_find_their_new_ranks_in_the_environment_after_a_worker_dies(
    elasticrun, tmp_path: Path
) -> None:
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", "localhost:3", *ONE_WORKER_FAILS,
         "--blacklist-cooldown-range", "300", "300", sys.executable, str(JOB), "--steps", "40"],
        env=STALE,
    )  # fmt: skip
    job.wait_for(r"step 5 size 3")
    initialized = by_pid(reports(job, "init"))
    assert len(initialized) == 3, job.output
    first = next(pid for pid, r in initialized.items() if r["hvd"]["RANK"] == 0)
    os.kill(first, signal.SIGKILL)
    job.wait_for(r"elasticrun: round 2: 2 worker\(s\)", timeout=30)
    assert job.finish(90) == 0, job.output

    started = by_pid(reports(job, "start"))
    for pid, report in initialized.items():
        assert_current(report, "localhost")
        assert_current(started[pid] | {"hvd": report["hvd"]}, "localhost")
    reset = by_pid(reports(job, "reset"))
    assert set(reset) == set(initialized) - {first}, job.output
    for pid, report in reset.items():
        assert_current(report, "localhost")
        assert report["hvd"]["SIZE"] == 2
        assert report["hvd"]["RANK"] == initialized[pid]["hvd"]["RANK"] - 1  # closed up
