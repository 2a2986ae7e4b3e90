"""A running job's `/v1/status`, asked as `elasticrun status` asks it: with the token of the
job file in the test's `XDG_RUNTIME_DIR`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx

from elastic.driver.job_file import find_job
from elastic.errors import ElasticError
from elastic.protocol.http import JobStatus


def asked(job_id: str, env: dict[str, str]) -> JobStatus:
    """`/v1/status` of job `job_id`, whose job file is under `env["XDG_RUNTIME_DIR"]`."""
    job = find_job(job_id, Path(env["XDG_RUNTIME_DIR"]) / "elasticrun")
    answer = httpx.get(
        f"{job.urls.api}/v1/status", headers={"Authorization": f"Bearer {job.token}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return JobStatus.model_validate_json(answer.content)


def until(
    job_id: str,
    env: dict[str, str],
    holds: Callable[[JobStatus], bool],
    what: str,
    timeout: float = 120.0,
) -> JobStatus:
    """The first status of job `job_id` for which `holds` is true, asked every 0.2 s; raises
    AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = asked(job_id, env)
        except (httpx.HTTPError, AssertionError, OSError, ElasticError):
            status = None  # a driver starting, or one between its job file and its port
        if status is not None and holds(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"waited in vain for {what}; the last status: {status}")
        time.sleep(0.2)
