"""Horovod's own elastic scenarios, run as its integration tests run them, under elasticrun.

Each job runs tests/support/workers/horovod_elastic_job.py (a worker like Horovod's
`elastic_torch_main.py`, with elasticrun's import) with Horovod's flags, discovery schedules
and exit schedules: the discovery script reads how many epochs rank 0 has logged and prints
that epoch's hosts, as Horovod's test template does. What is asserted is what Horovod's
`test/integration/elastic_common.py` asserts on the lines rank 0 logs at each epoch's end.
`localhost` and `127.0.0.1` are two hosts of the job.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.support.paths import WORKERS
from tests.support.running_job import RunningJob

WORKER = WORKERS / "horovod_elastic_job.py"

pytestmark = pytest.mark.timeout(240)

Schedule = list[tuple[int | None, list[str]]]
# Horovod's script gives the driver 3 s (--discovery-wait) to announce a host change. Its
# driver does so when discovery finds the change, and its workers then wait at the next
# commit for the new ones to start; elasticrun announces it once the new workers are ready
# (a cold start: torch's import), so that the others train meanwhile. On this shared test
# machine that takes longer than 3 s: the wait is longer, nothing else differs.
JOINERS_WAIT = ("--discovery-wait", "60")


def discovery_script(directory: Path, logfile: Path, schedule: Schedule) -> Path:
    """A script that prints the hosts of the epoch rank 0 is in (the lines of `logfile`):
    the entry for that epoch, else the last one (Horovod's template, as a shell `case`)."""
    lines = [
        "#!/bin/sh",
        f"epoch=$(cat {logfile} 2>/dev/null | wc -l | tr -d '[:space:]')",
        'case "$epoch" in',
    ]
    for epoch, hosts in schedule:
        pattern = "*" if epoch is None else str(epoch)
        lines.append(f"  {pattern}) printf '%s\\n' {' '.join(hosts)} ;;")
    lines.append("esac")
    script = directory / "discover.sh"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script


def run_scenario(
    elasticrun,
    tmp_path: Path,
    *,
    schedule: Schedule | None = None,
    hosts: str | None = None,
    exits: dict[str, list[int]] | None = None,
    exit_mode: str = "exception",
    np: int = 2,
    min_np: int = 2,
    max_np: int = 4,
    flags: tuple[str, ...] = (),
    worker_flags: tuple[str, ...] = (),
    timeout: float = 200.0,
) -> tuple[RunningJob, int, list[dict]]:
    """Run one scenario as Horovod's `_run` does: `-H hosts` or a discovery script made from
    `schedule`; return the job, its exit code and rank 0's epoch lines."""
    logfile = tmp_path / "epochs.log"
    args = ["-np", str(np), "--min-np", str(min_np)]
    if hosts is not None:
        args += ["-H", hosts]
    else:
        assert schedule is not None
        script = discovery_script(tmp_path, logfile, schedule)
        args += ["--host-discovery-script", str(script), "--max-np", str(max_np),
                 "--discovery-interval", "0.1"]  # fmt: skip
    args += [*flags, sys.executable, str(WORKER), "--logfile", str(logfile), *worker_flags]
    if schedule is not None:
        args += ["--discovery-schedule", json.dumps(schedule)]
    if exits:
        args += ["--exit-schedule", json.dumps(exits), "--exit-mode", exit_mode]
    job = elasticrun(args)
    code = job.finish(timeout)
    lines = logfile.read_text().splitlines() if logfile.exists() else []
    return job, code, [json.loads(line) for line in lines]


def picked(results: list[dict], *keys: str) -> list[tuple]:
    return [tuple(line[key] for key in keys) for line in results]


@pytest.mark.parametrize("slots", [2, pytest.param(1, marks=pytest.mark.slow)])
def test_hosts_added_and_removed(elasticrun, tmp_path: Path, slots: int) -> None:
    """Horovod's `test_hosts_added_and_removed`: rank 0 waits for each host change by polling
    `state._host_messages.empty()`; the job grows onto 127.0.0.1, then moves there."""
    schedule: Schedule = [
        (0, [f"localhost:{slots}"]),
        (1, [f"localhost:{slots}", f"127.0.0.1:{slots}"]),
        (None, [f"127.0.0.1:{slots}"]),
    ]
    job, code, results = run_scenario(
        elasticrun, tmp_path, schedule=schedule, np=slots, min_np=slots, max_np=2 * slots,
        worker_flags=JOINERS_WAIT,
    )  # fmt: skip
    assert code == 0, job.output
    assert "_host_messages" not in job.output, job.output
    assert picked(results, "start_rank", "size", "hostname") == [
        (0, slots, "localhost"),
        (0, 2 * slots, "localhost"),
        (slots, slots, "127.0.0.1"),
    ], job.output
    # Horovod counts 3 rendezvous, one per host change. elasticrun forms one more where a
    # joiner is slower than the others by 3 s (a loaded machine): those ready are admitted
    # without it, and it joins a round later, which the launcher's line says.
    late = len(re.findall(r"worker\(s\) joined, [1-9]\d* still starting", job.output))
    rounds = re.search(r"ended with exit code 0 after .*: (\d+) round\(s\)", job.output)
    assert rounds is not None and int(rounds.group(1)) == 3 + late, job.output
    assert results[2]["rendezvous"] == 3 + late, job.output


@pytest.mark.parametrize("exit_mode", [pytest.param("exception", marks=pytest.mark.slow), "kill"])
@pytest.mark.parametrize(
    "discovery",
    [True, pytest.param(False, marks=pytest.mark.slow)],
    ids=["discovery", "fixed-hosts"],
)
def test_a_failed_rank_takes_its_host_out(
    elasticrun, tmp_path: Path, exit_mode: str, discovery: bool
) -> None:
    """Horovod's `test_single_rank_failure` and `test_fault_tolerance_without_scaling`: rank 0
    fails at epoch 1; its host leaves with it, and the other host's two workers go on."""
    hosts = ["localhost:2", "127.0.0.1:2"]
    job, code, results = run_scenario(
        elasticrun,
        tmp_path,
        schedule=[(None, hosts)] if discovery else None,
        hosts=None if discovery else ",".join(hosts),
        exits={str((1, 0)): [0]},
        exit_mode=exit_mode,
    )
    assert code == 0, job.output
    assert picked(results, "start_rank", "size", "rendezvous") == [
        (0, 4, 1),
        (2, 2, 2),
        (2, 2, 2),
    ], job.output


def test_every_rank_failing_ends_the_job_with_their_error(elasticrun, tmp_path: Path) -> None:
    """Horovod's `test_all_ranks_failure`: every rank raises at epoch 1. The job ends with
    the workers' exit code and one line saying why, instead of starting them again."""
    job, code, results = run_scenario(
        elasticrun,
        tmp_path,
        schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
        exits={str((1, 0)): [0, 1, 2, 3]},
        timeout=120,  # it ends within seconds of the failures; a loop never does
    )
    assert code == 1, job.output
    assert len(results) == 1, "no new workers were started from the initial state"
    assert job.output.count("scheduled failure at epoch 1 batch 0") >= 4, job.output
    assert "every worker of the job exited with an error" in job.output, job.output
    assert "starting new workers on the offered hosts" not in job.output


@pytest.mark.slow
def test_every_rank_killed_at_the_same_step_each_time_ends_after_three_losses(
    elasticrun, tmp_path: Path
) -> None:
    """Every rank is SIGKILLed at epoch 1 (a preemption looks the same, so new workers are
    started), by every fleet at the same step: the third such loss ends the job."""
    job, code, results = run_scenario(
        elasticrun,
        tmp_path,
        schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
        exits={str((1, 0)): [0, 1, 2, 3]},
        exit_mode="kill",
        flags=("--blacklist-cooldown-range", "1", "1"),
        # The driver learns commits from heartbeats: a pause before the epoch's last commit
        # lets every fleet's last heartbeat tell the same step.
        worker_flags=("--epoch-wait", "2"),
    )
    assert code != 0, job.output
    assert job.output.count("starting new workers on the offered hosts") == 2, job.output
    assert "was lost the same way 3 times in a row (killed by signal SIGKILL" in job.output
    assert len(results) == 3, "three fleets trained epoch 0"


@pytest.mark.slow
def test_every_host_failing_ends_the_job(elasticrun, tmp_path: Path) -> None:
    """Horovod's `test_all_hosts_blacklisted`: ranks 0 and 2 (one on each host) raise at
    epoch 1; both hosts are out, and the job ends with their error."""
    job, code, results = run_scenario(
        elasticrun,
        tmp_path,
        schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
        exits={str((1, 0)): [0, 2]},
        timeout=120,
    )
    assert code == 1, job.output
    assert len(results) == 1, job.output
    assert "starting new workers on the offered hosts" not in job.output


@pytest.mark.slow
def test_the_reset_limit(elasticrun, tmp_path: Path) -> None:
    """Horovod's `test_reset_limit`: hosts added then removed cost two re-forms; with
    `--reset-limit 1` the job fails at the second, saying so; with 2 it completes."""
    schedule: Schedule = [
        (0, ["localhost:2"]),
        (1, ["localhost:2", "127.0.0.1:2"]),
        (None, ["127.0.0.1:2"]),
    ]
    job, code, _ = run_scenario(
        elasticrun, tmp_path, schedule=schedule, flags=("--reset-limit", "1"),
        worker_flags=JOINERS_WAIT,
    )  # fmt: skip
    assert code == 1, job.output
    assert "reset limit reached: 1 re-rendezvous (--reset-limit)" in job.output

    (tmp_path / "epochs.log").unlink()
    job, code, results = run_scenario(
        elasticrun, tmp_path, schedule=schedule, flags=("--reset-limit", "2"),
        worker_flags=JOINERS_WAIT,
    )  # fmt: skip
    assert code == 0, job.output
    assert len(results) == 3, job.output


def test_a_host_that_failed_twice_cools_down_longer(elasticrun, tmp_path: Path) -> None:
    """Horovod's `test_resurrecting_blacklisted_hosts_exponential_backoff`: start rank 3
    raises at epoch 1 and again (if it is back) at epoch 3, cooldown 1-2 s, 5 epochs of
    0.25 s waits: its host is out, rank 0 trains on at size 2 and the job completes."""
    job, code, results = run_scenario(
        elasticrun,
        tmp_path,
        schedule=[(None, ["localhost:2", "127.0.0.1:2"])],
        exits={str((1, 0)): [3], str((3, 0)): [3]},
        flags=("--blacklist-cooldown-range", "1", "2"),
        worker_flags=("--epoch-wait", "0.25", "--epochs", "5"),
    )
    assert code == 0, job.output
    assert len(results) == 5, job.output
    assert picked(results, "start_rank", "size", "rendezvous")[:2] == [(0, 4, 1), (0, 2, 2)]
