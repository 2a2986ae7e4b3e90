"""The end of a job overlapping a slow exit: a worker whose interpreter takes longer than
three heartbeat intervals to exit (garbage collection, thread joins, a slow `atexit` handler)
has finished, and the job ends with exit 0 and no extra round.

Real processes on two local host names (`localhost`, `127.0.0.1`). Each job re-forms once
(the worker on 127.0.0.1 is SIGKILLed; its host stays in cooldown), then the two survivors
finish and take 5 heartbeat intervals to exit.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.e2e.elastic.test_elastic import assert_exactly_once, job_args, ranks_to_pids
from tests.support.running_job import RunningJob
from tests.support.scripts import write_script

pytestmark = pytest.mark.timeout(180)

ROUND = re.compile(r"elasticrun: round (\d+): ")


def rounds_after_done(job: RunningJob) -> list[str]:
    """The round lines the driver logged after the first worker finished training."""
    done = next(i for i, line in enumerate(job.lines) if "<stdout>:done size" in line)
    return [line for line in job.lines[done:] if ROUND.search(line)]


@pytest.mark.parametrize(
    ("interval", "shutdown"),
    [
        pytest.param(1.0, True, marks=pytest.mark.slow),
        pytest.param(1.0, False, marks=pytest.mark.slow),
        (0.2, True),
        pytest.param(0.2, False, marks=pytest.mark.slow),
    ],
    ids=["1s-shutdown", "1s-no-shutdown", "0.2s-shutdown", "0.2s-no-shutdown"],
)
def test_workers_that_exit_slowly_after_a_re_form_finish_the_job(
    elasticrun, tmp_path: Path, interval: float, shutdown: bool
) -> None:
    extra = ["--exit-delay", str(5 * interval)] + ([] if shutdown else ["--no-shutdown"])
    job = elasticrun(
        ["-np", "3", "--min-np", "1", "-H", "localhost:2,127.0.0.1:1",
         "--heartbeat-interval", str(interval), "--blacklist-cooldown-range", "300", "300",
         *job_args(tmp_path, *extra)]
    )  # fmt: skip
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"step 4 ")
    os.kill(pids[2], signal.SIGKILL)  # ranks 0 and 1 are on localhost, rank 2 on 127.0.0.1
    job.wait_for(r"round 2: 2 worker\(s\) on localhost:2", timeout=60)
    assert job.finish(120) == 0, job.output
    assert "missed 3 heartbeats" not in job.output, job.output
    assert rounds_after_done(job) == [], job.output
    assert assert_exactly_once(tmp_path)["size"] == 2


EARLY_EXIT = """
import sys, time
import elastic.torch as hvd
hvd.init()
print(f"rank {hvd.rank()} joined", flush=True)
if hvd.rank() == 1:
    sys.exit(0)  # its part is done; rank 0 goes on without any collective
time.sleep(5 * float(sys.argv[1]))
print("rank 0 done", flush=True)
"""


@pytest.mark.parametrize("elastic", [False, True], ids=["static", "elastic"])
def test_a_worker_that_exits_0_while_another_works_is_no_failure(
    elasticrun, tmp_path: Path, elastic: bool
) -> None:
    script = write_script(tmp_path, "early_exit.py", EARLY_EXIT)
    flags = ["--min-np", "1"] if elastic else []
    job = elasticrun(
        ["-np", "2", *flags, "-H", "localhost:1,127.0.0.1:1", "--heartbeat-interval", "0.2",
         sys.executable, str(script), "0.2"]
    )  # fmt: skip
    assert job.finish(60) == 0, job.output
    assert "rank 0 done" in job.output
    assert not re.search(r"failed|missed|cooldown|elasticrun: round 2", job.output), job.output
