"""DDP models under `elasticrun`, with real processes: a worker is SIGKILLed, its slot is
refilled by a joiner, and the job trains to the end with every sample counted exactly once
per epoch and the same parameters, bit for bit, on every rank.

The job is tests/support/workers/elastic_job.py with `--ddp elastic` (its sample counts, with
`hvd.elastic.DistributedDataParallel` and a torch optimizer); `--ddp torch`, torch's own DDP,
shows what the wrapper is for. The DDP example runs in
tests/e2e/launcher/test_examples.py. Tests wait on lines the job prints, never on sleeps.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.e2e.elastic.test_elastic import (
    ONE_WORKER_FAILS,
    assert_exactly_once,
    job_args,
    ranks_to_pids,
    sizes_after,
)

pytestmark = pytest.mark.timeout(180)


def test_a_ddp_job_survives_a_kill_and_a_joiner_and_ends_the_same_on_every_rank(
    elasticrun, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    job = elasticrun(
        ["-np", "3", "--min-np", "2", "-H", "localhost:3", *ONE_WORKER_FAILS,
         "--blacklist-cooldown-range", "1", "1",  # the killed worker's slot comes back
         *job_args(tmp_path, "--ddp", "elastic", "--save-params",
                   "--hold-at-step", "14", "--hold-file", str(go))]
    )  # fmt: skip
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"step 4 ")
    os.kill(pids[1], signal.SIGKILL)
    job.wait_for(r"elasticrun: round 2: 2 worker\(s\)", timeout=30)
    job.wait_for(r"step \d+ epoch \d+ size 2", timeout=30)
    job.wait_for(r"round 3: 3 worker\(s\) on localhost:3", timeout=60)  # a joiner
    go.touch()
    assert job.finish(120) == 0, job.output
    assert "rank 1 on host localhost was killed by signal SIGKILL" in job.output
    assert sizes_after(job, "round 3: 3 worker") == {3}
    assert_exactly_once(tmp_path)
    finals = sorted(tmp_path.glob("params-*.json"))
    assert [p.name for p in finals] == ["params-0.json", "params-1.json", "params-2.json"]
    assert len({p.read_text() for p in finals}) == 1, "the same parameters on every rank"


def test_torch_s_own_ddp_ends_the_job_at_the_first_reform(elasticrun, tmp_path: Path) -> None:
    """What the wrapper is for: the same job with torch's DDP. The survivors re-form (an
    allreduce of the runtime noticed the death), but their DDP is still bound to round 1's
    group, whose rank 1 is gone: its backward raises a plain RuntimeError and ends them."""
    job = elasticrun(
        ["-np", "3", "--min-np", "2", "-H", "localhost:3", *ONE_WORKER_FAILS,
         *job_args(tmp_path, "--ddp", "torch")]
    )  # fmt: skip
    pids = ranks_to_pids(job, 3)
    job.wait_for(r"step 4 ")
    os.kill(pids[1], signal.SIGKILL)
    assert job.finish(120) != 0, job.output
    after = job.output.split("elasticrun: round 2: 2 worker(s)", 1)[1]
    assert re.search(r"RuntimeError: .*Connection (closed|reset) by peer", after), job.output
    assert not (tmp_path / "result.json").exists()
