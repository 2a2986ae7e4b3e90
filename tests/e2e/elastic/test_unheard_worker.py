"""A worker stopped between its registration and its first heartbeat, with real processes.

The driver does not judge a registered worker hung before any of its heartbeats reached it
(they may wait in a loaded driver's backlog), but only for up to the start timeout after it
registered: this worker, given a slot and then SIGSTOPped, is found hung after that bound and
3 heartbeat intervals, and the job re-forms without it. Before the bound it was excused
forever: its round waited for it forever (the sharded fault soak, seed 398986, stalled so).
The joiner's heartbeats are kept from the driver by the job's `--unheard-on` (no test can
load a driver so that one connection waits in its backlog); everything else is real.
"""

from __future__ import annotations

import contextlib
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
    write_hosts,
)
from tests.support.processes import pids_alive

pytestmark = pytest.mark.timeout(150)

START = 15  # --start-timeout: how long a registered worker's first heartbeat is awaited


def test_a_joiner_stopped_before_its_first_heartbeat_is_found_hung(
    elasticrun, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts"
    write_hosts(hosts, "localhost:2\n")
    go = tmp_path / "go"
    job = elasticrun(
        ["--min-np", "1", *discovery_args(), "--heartbeat-interval", "0.5",
         "--start-timeout", str(START), *ONE_WORKER_FAILS,
         "--blacklist-cooldown-range", "300", "300",
         *job_args(tmp_path, "--hold-at-step", "8", "--hold-file", str(go),
                   "--unheard-on", "127.0.0.1")],
        env={"ELASTIC_HOSTS_FILE": str(hosts)},
    )  # fmt: skip
    job.wait_for(r"holding for")
    write_hosts(hosts, "localhost:2\n127.0.0.1:1\n")
    job.wait_for(r"launched 1 worker\(s\) on 127\.0\.0\.1:1", timeout=30)
    launched = time.monotonic()
    joiner = int(job.wait_for(r"\[127\.0\.0\.1\[0\]#\d+\]<stdout>:worker pid=(\d+)").group(1))
    try:
        job.wait_for(r"elasticrun: round 2: 3 worker\(s\)", timeout=60)
        os.kill(joiner, signal.SIGSTOP)  # a member now, none of its heartbeats heard
        stopped = time.monotonic()
        go.touch()  # the incumbents go on, into the new round's group with the stopped joiner
        hung = job.wait_for(r"rank (\d) on host 127\.0\.0\.1 missed 3 heartbeats", START + 45)
        found = time.monotonic()
        job.wait_for(r"elasticrun: round \d+: 2 worker\(s\) on localhost:2", timeout=30)
        assert job.finish(90) == 0, job.transcript()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(joiner, signal.SIGKILL)
    print(
        f"rank {hung.group(1)} judged hung {found - stopped:.1f} s after its SIGSTOP, "
        f"{found - launched:.1f} s after its launch (start timeout {START} s)"
    )
    assert not pids_alive([joiner]), "the hung joiner is killed"
    assert re.search(r"step \d+ epoch \d+ size 2", job.output.split(hung.group(0), 1)[1])
    assert_exactly_once(tmp_path)
