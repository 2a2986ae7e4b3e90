"""An operator's view of real jobs: a Prometheus scrape of a running job before and after a
worker is killed, and stall reports naming the ranks that keep a round waiting."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.paths import WORKERS
from tests.support.running_job import RunningJob

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """One scrape of `url`/metrics, as Prometheus does it (no token)."""
    answer = httpx.get(f"{url}/metrics", timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def scrape_until(url: str, holds: Callable[[Samples], bool], timeout: float = 60.0) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        if holds(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"no scrape within {timeout:g} s held; the last:\n{samples}")
        time.sleep(0.5)


def per_rank(samples: Samples, name: str) -> dict[str, float]:
    return {dict(labels)["rank"]: v for (n, labels), v in samples.items() if n == name}


def test_a_scrape_shows_the_running_job_and_counts_a_failure_with_its_recovery(
    elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    job = elasticrun(
        ["-np", "3", "--min-np", "2", "--max-np", "3", "--heartbeat-interval", "0.5",
         "--failure-scope", "worker",
         sys.executable, str(WORKERS / "elastic_job.py"), "--out", str(tmp_path),
         "--epochs", "200", "--step-delay", "0.05"]
    )  # fmt: skip
    url = job.wait_for(r"driver=(\S+)", 60).group(1)
    assert httpx.get(f"{url}/v1/status", timeout=10).status_code == 401  # the API needs it

    def training(samples: Samples) -> bool:
        rates = per_rank(samples, "elasticrun_steps_per_second")
        return len(rates) == 3 and all(rate > 0 for rate in rates.values())

    before = scrape_until(url, training)
    assert before[("elasticrun_round", ())] == 1
    assert before[("elasticrun_workers", (("state", "member"),))] == 3
    assert before[("elasticrun_hosts", (("state", "active"),))] == 1
    assert set(per_rank(before, "elasticrun_heartbeat_age_seconds")) == {"0", "1", "2"}
    assert all(age < 5 for age in per_rank(before, "elasticrun_commit_age_seconds").values())

    victim = int(job.wait_for(r"joined rank=2 size=3 pid=(\d+)", 60).group(1))
    os.kill(victim, signal.SIGKILL)

    def recovered(samples: Samples) -> bool:
        first_step = ("elasticrun_recovery_seconds_count", (("leg", "noticed_to_first_step"),))
        return samples.get(first_step, 0) == 1 and samples[("elasticrun_size", ())] == 2

    after = scrape_until(url, recovered)
    assert after[("elasticrun_reforms_total", (("cause", "failure"),))] == 1
    assert after[("elasticrun_round", ())] == 2
    assert after[("elasticrun_workers", (("state", "failed"),))] == 1
    formed = after[("elasticrun_recovery_seconds_sum", (("leg", "noticed_to_formed"),))]
    whole = after[("elasticrun_recovery_seconds_sum", (("leg", "noticed_to_first_step"),))]
    assert 0 < formed <= whole < 30
    assert set(per_rank(after, "elasticrun_steps_total")) == {"0", "1"}  # live workers only
    assert ("elasticrun_event_loop_lag_seconds", ()) in after
    job.stop()


def test_a_stall_is_named_and_past_the_timeout_its_ranks_behind_have_failed(
    elasticrun: Callable[..., RunningJob],
) -> None:
    job = elasticrun(
        ["-np", "4", "--min-np", "2", "--heartbeat-interval", "0.5", "--stall-warning", "2",
         "--stall-timeout", "6", "--failure-scope", "worker",
         sys.executable, str(WORKERS / "stall_job.py")]
    )  # fmt: skip
    line = job.wait_for(r"stall in round 1: .*", 120).group(0)
    number = re.search(r"in allreduce #(\d+) for", line)
    assert number is not None, line
    assert re.search(r"ranks 0, 3 waited \d+ s in allreduce #\d+ for ", line), line
    assert "rank 1 on host localhost (not in a collective, last step 3)" in line
    assert f"rank 2 on host localhost (in allgather #{number.group(1)})" in line
    job.wait_for(r"rank 1 on host localhost kept its round waiting past --stall-timeout", 30)
    job.wait_for(r"rank 2 on host localhost kept its round waiting past --stall-timeout", 30)
    assert job.finish(120) == 0, job.transcript()
    assert len(re.findall(r"done rank=\d size=2", job.output)) == 2
    assert len(re.findall(r"stall in round", job.output)) == 1  # said once, not every look
