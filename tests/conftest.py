"""Shared fixtures: run `elasticrun` as a user does and watch what it prints; a real etcd; a
silent port. The hooks skip `slow` tests unless asked, and fail a test CI must run but skipped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from tests.support.etcd_server import EtcdServer
from tests.support.prerequisites import (
    NEED_EVERYTHING,
    Machine,
    is_missing_prerequisite,
    missing_etcd,
)
from tests.support.processes import processes_naming, processes_working_in
from tests.support.running_job import RunningJob


@pytest.fixture
def elasticrun(tmp_path: Path) -> Iterator[Callable[..., RunningJob]]:
    """Start `elasticrun` jobs in `tmp_path`. At the end, every one still running is killed
    with its process group, and so is every process whose command line names a file in
    `tmp_path` (workers, ssh clients and remote agents, should a test leave any) or works
    in it (the workers of a script named by a path elsewhere, which start where the job did)."""
    started: list[RunningJob] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> RunningJob:
        job = RunningJob(args, tmp_path, env)
        started.append(job)
        return job

    yield start
    for job in started:
        job.stop()
    for pid in {*processes_naming(str(tmp_path)), *processes_working_in(str(tmp_path))}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A real etcd server on free loopback ports, with its data in `tmp_path`; stopped (by
    PID) at the end. Skipped, with one line saying why, where this machine has no etcd."""
    if reason := missing_etcd(Machine.here()):
        pytest.skip(reason)
    server = EtcdServer(tmp_path / "etcd-data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on 127.0.0.3 that accepts TCP connections and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.3", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


E2E_FOLDERS = frozenset({"e2e", "multihost", "gpu"})
"""Folders of tests/ whose every test runs real processes."""
REAL_PROCESS_FIXTURES = frozenset({"elasticrun", "etcd", "sshd", "bed", "bed_job", "browser"})
"""Fixtures that start real processes (a job, etcd, sshd, a bed's hosts, a browser): a test
that takes one is an `e2e` test wherever it is."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The markers (listed in pyproject.toml) that follow from where a test is and what it
    takes, added before `-m` selects: `e2e` for every test under tests/e2e, tests/multihost
    and tests/gpu and for one that takes a real-process fixture, `gpu` under tests/gpu,
    `root` beside `multihost`, `browser` and `ssh` for the fixtures of those names. Then
    tests marked `slow` (the full soaks) are skipped unless ELASTIC_SLOW_TESTS=1."""
    tests = Path(__file__).parent
    for item in items:
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        fixtures = set(getattr(item, "fixturenames", ()))
        if folder in E2E_FOLDERS or fixtures & REAL_PROCESS_FIXTURES:
            item.add_marker(pytest.mark.e2e)
        if folder == "gpu":
            item.add_marker(pytest.mark.gpu)
        if item.get_closest_marker("multihost"):
            item.add_marker(pytest.mark.root)
        for fixture, marker in (("browser", pytest.mark.browser), ("sshd", pytest.mark.ssh)):
            if fixture in fixtures:
                item.add_marker(marker)
    if os.environ.get("ELASTIC_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set ELASTIC_SLOW_TESTS=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """With ELASTIC_TESTS_NEED_EVERYTHING=1 (`.ci/run`), a test skipped because this machine
    lacks what CI installs (tests/support/prerequisites.py) fails, so CI cannot skip it
    unnoticed."""
    report: pytest.TestReport = yield
    if report.skipped and os.environ.get(NEED_EVERYTHING) == "1":
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        if is_missing_prerequisite(reason):
            report.outcome = "failed"
            report.longrepr = f"{reason} ({NEED_EVERYTHING}=1: this machine must run it)"
    return report
