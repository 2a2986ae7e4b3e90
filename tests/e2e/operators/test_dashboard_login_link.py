"""Where the page's one-time login link appears: on the launcher's terminal and from
`elasticrun status --login`, never in a captured log nor in the log tail of `/v1/status` (there
a link is a live credential that others read: a Slurm or CI log, anyone with the status). Real
launchers, their output on a pipe (as a batch system captures it) or on a pseudo-terminal, in
both log formats."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from elastic.driver.logs import LogTail, terminal_handlers
from elastic.protocol.http import JobStatus
from tests.support import job_status
from tests.support.processes import processes_naming
from tests.support.running_job import ELASTICRUN, RunningJob
from tests.support.scripts import write_script

LINK = re.compile(r"https?://\S+/ui/login\?code=[\w-]+")
HINT = re.compile(r"dashboard: no login link .*`elasticrun status --login --job-id ([\w.-]+)`")
SECRET_META = re.compile(r'<meta name="elasticrun-page-secret" content="([\w-]+)">')
SLEEPER = "import time\ntime.sleep(300)\n"  # a worker that needs no torch: the test is the page
FORMATS = ["text", "json"]


@pytest.fixture
def runtime(tmp_path: Path) -> dict[str, str]:
    """A runtime folder of the test's own, for the job's file and the commands."""
    folder = tmp_path / "run"
    folder.mkdir()
    return {"XDG_RUNTIME_DIR": str(folder)}


def command(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ELASTICRUN, *args], env={**os.environ, **env}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def launcher_args(log_format: str, tmp_path: Path) -> list[str]:
    worker = write_script(tmp_path, "sleeper.py", SLEEPER)
    return ["--log-format", log_format, "-np", "1", "--min-np", "1", "--start-timeout", "300",
            sys.executable, str(worker)]  # fmt: skip


def job_id_of(line: str) -> str:
    """The job id in the launcher's job line (`job ID: ...`), in either format."""
    found = re.search(r"job ([\w.-]+): `elasticrun status --job-id", line)
    assert found is not None, line
    return found.group(1)


def status_of(job_id: str, runtime: dict[str, str]) -> JobStatus:
    """`/v1/status` of the running job, asked with its token as an operator's tool does."""
    return job_status.asked(job_id, runtime)


def enter(link: str) -> None:
    """Open `link` as a browser would and read the job with the session it opens."""
    with httpx.Client(timeout=10) as browser:
        entered = browser.get(link)
        assert entered.status_code == 200, entered.text
        secret = SECRET_META.search(entered.text)
        assert secret is not None, entered.text
        page = link.split("/ui/login")[0]
        status = browser.get(f"{page}/ui/api/status", headers={"X-Elasticrun-Page": secret[1]})
        assert status.status_code == 200, status.text
        assert browser.get(link).status_code == 401  # once


def assert_no_link(lines: list[str], where: str) -> None:
    leaked = [line for line in lines if "/ui/login?code=" in line]
    assert not leaked, f"a login link in {where}: {leaked}"


@pytest.mark.parametrize("log_format", FORMATS)
def test_a_captured_launcher_prints_how_to_get_a_link_never_a_link(
    elasticrun: Callable[..., RunningJob], tmp_path: Path, runtime: dict[str, str], log_format: str
) -> None:
    job = elasticrun(launcher_args(log_format, tmp_path), env=runtime)
    hint = job.wait_for(HINT.pattern, 60, stream="stderr")
    job_id = hint.group(1)
    said = [line for line in job.stderr if "dashboard" in line]
    assert said == [hint.string], job.transcript()  # one line, and it is the hint
    if log_format == "json":
        assert json.loads(hint.string)["event"] == "dashboard"

    login = command(["status", "--login", "--job-id", job_id], runtime)
    assert login.returncode == 0, login.stderr
    link = LINK.search(login.stdout)
    assert link is not None, login.stdout
    enter(link.group(0))
    tail = status_of(job_id, runtime).log_tail
    assert any(HINT.search(line) for line in tail), tail
    assert_no_link(tail, "the log tail of /v1/status")

    stopped = command(["stop", "--job-id", job_id], runtime)
    assert stopped.returncode == 0, stopped.stderr
    assert job.finish(60) == 0, job.transcript()
    assert_no_link(job.lines, "the launcher's captured output")


class TerminalJob:
    """An `elasticrun` process whose stdout and stderr are one pseudo-terminal (a person's
    shell), its lines collected as they come."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        leader, follower = os.openpty()
        self.process = subprocess.Popen(
            [*ELASTICRUN, *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=follower,
            stderr=follower, env={**os.environ, **env}, start_new_session=True,
        )  # fmt: skip
        os.close(follower)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, args=(leader,), daemon=True).start()

    def _read(self, leader: int) -> None:
        with open(leader, "rb", buffering=0) as terminal, contextlib.suppress(OSError):
            for raw in io.BufferedReader(terminal):  # EIO once the last writer is gone
                with self._changed:
                    self.lines.append(raw.decode(errors="replace").rstrip("\r\n"))
                    self._changed.notify_all()

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 60) -> re.Match[str]:
        """The first line the terminal showed that matches `pattern`."""
        found: list[re.Match[str]] = []

        def seen() -> bool:
            found[:] = [m for line in self.lines if (m := pattern.search(line))][:1]
            return bool(found) or self.process.poll() is not None

        with self._changed:
            self._changed.wait_for(seen, timeout)
        assert found, f"no line matching {pattern.pattern!r} on the terminal:\n" + "\n".join(
            self.lines
        )
        return found[0]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def on_a_terminal(tmp_path: Path) -> Iterator[Callable[[list[str], dict[str, str]], TerminalJob]]:
    """Start `elasticrun` on a pseudo-terminal; at the end, kill what is left (by PID)."""
    started: list[TerminalJob] = []

    def start(args: list[str], env: dict[str, str]) -> TerminalJob:
        started.append(TerminalJob(args, tmp_path, env))
        return started[-1]

    yield start
    for job in started:
        job.stop()
    for pid in processes_naming(str(tmp_path)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("log_format", FORMATS)
def test_a_launcher_on_a_terminal_shows_the_link_there_and_nowhere_else(
    on_a_terminal: Callable[[list[str], dict[str, str]], TerminalJob],
    tmp_path: Path,
    runtime: dict[str, str],
    log_format: str,
) -> None:
    job = on_a_terminal(launcher_args(log_format, tmp_path), runtime)
    shown = job.wait_for(re.compile(r"dashboard: "))
    link = LINK.search(shown.string)
    assert link is not None, job.lines
    if log_format == "json":
        record = json.loads(shown.string)
        assert record["event"] == "dashboard" and record["level"] == "info"
        assert record["message"].endswith("(a one-time login link, for 10 minutes)")
    else:
        assert shown.string.endswith(f"elasticrun: dashboard: {link[0]} (a one-time login "
                                     "link, for 10 minutes)")  # fmt: skip
    job_id = job_id_of(job.wait_for(re.compile(r"job \S+: `elasticrun status")).string)
    tail = status_of(job_id, runtime).log_tail
    assert any(f"job {job_id}:" in line for line in tail), tail  # the tail has the lines...
    assert not [line for line in tail if "dashboard" in line], tail  # ...but not this one
    enter(link.group(0))
    stopped = command(["stop", "--job-id", job_id], runtime)
    assert stopped.returncode == 0, stopped.stderr
    assert job.process.wait(60) == 0, job.lines


def test_only_handlers_that_write_to_a_terminal_get_the_link(tmp_path: Path) -> None:
    leader, follower = os.openpty()
    with open(follower, "w") as terminal, open(os.devnull, "w") as file:
        root, child = logging.getLogger("link-test"), logging.getLogger("link-test.child")
        shown, piped, tail = logging.StreamHandler(terminal), logging.StreamHandler(file), LogTail()
        unopened = logging.FileHandler(tmp_path / "launcher.log", delay=True)  # no stream yet
        handlers = (shown, piped, tail, unopened)
        try:
            for handler in handlers:
                root.addHandler(handler)
            root.setLevel(logging.INFO)
            assert terminal_handlers(child, logging.INFO) == [shown]
            assert terminal_handlers(child, logging.DEBUG) == []  # not shown at all
            child.propagate = False
            assert terminal_handlers(child, logging.INFO) == []
        finally:
            for handler in handlers:
                root.removeHandler(handler)
            child.propagate = True
    os.close(leader)
