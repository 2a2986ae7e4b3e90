"""Preemption notices from a host's own check (`--preemption-check`): the shipped AWS and GCP
checks against a fake metadata server on loopback (the clouds' addresses are never asked),
the check runner's bounds, and a real job whose host is noticed.

The metadata server is a stand-in: the clouds' services cannot run here. It speaks the parts
of their protocols the checks use (IMDSv2's token, GCP's Metadata-Flavor header).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from elastic.worker.preemption import PreemptionWatch
from tests.support.leaving import assert_left_at_a_step_and_got_no_successor
from tests.support.paths import DISCOVERY_SCRIPTS, WORKERS

SCRIPTS = DISCOVERY_SCRIPTS
AWS_CHECK = SCRIPTS / "aws_spot_check.py"
GCP_CHECK = SCRIPTS / "gcp_preemption_check.py"
TOKEN = "imds-token-1"


class FakeMetadata(ThreadingHTTPServer):
    """AWS's IMDSv2 and GCP's metadata server, the few paths the checks read."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.aws_action: dict[str, str] | None = None  # None: no reclaim scheduled
        self.gcp_preempted = False
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeMetadata

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _answer(self, code: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:  # noqa: N802
        self.server.requests.append(f"PUT {self.path}")
        if (
            self.path == "/latest/api/token"
            and self.headers["X-aws-ec2-metadata-token-ttl-seconds"]
        ):
            self._answer(200, TOKEN)
        else:
            self._answer(400)

    def do_GET(self) -> None:  # noqa: N802
        self.server.requests.append(f"GET {self.path}")
        if self.path == "/latest/meta-data/spot/instance-action":
            if self.headers["X-aws-ec2-metadata-token"] != TOKEN:
                self._answer(401)
            elif self.server.aws_action is None:
                self._answer(404)
            else:
                self._answer(200, json.dumps(self.server.aws_action))
        elif self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers["Metadata-Flavor"] != "Google":
                self._answer(403)
            else:
                self._answer(200, "TRUE" if self.server.gcp_preempted else "FALSE")
        else:
            self._answer(404)


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    server = FakeMetadata()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def run_check(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=20
    )


def test_the_aws_check_prints_the_reclaim_time_once_one_is_scheduled(metadata) -> None:
    env = {"ELASTIC_AWS_METADATA_URL": metadata.url}
    quiet = run_check(AWS_CHECK, env)
    assert (quiet.returncode, quiet.stdout) == (0, "")
    metadata.aws_action = {"action": "terminate", "time": "2026-11-24T08:22:00Z"}
    noticed = run_check(AWS_CHECK, env)
    assert (noticed.returncode, noticed.stdout.strip()) == (0, "2026-11-24T08:22:00Z")
    assert metadata.requests[-2:] == [
        "PUT /latest/api/token",  # IMDSv2: a session token first
        "GET /latest/meta-data/spot/instance-action",
    ]


def test_the_gcp_check_prints_a_time_30_s_ahead_once_preempted(metadata) -> None:
    env = {"ELASTIC_GCP_METADATA_URL": metadata.url}
    assert run_check(GCP_CHECK, env).stdout == ""
    metadata.gcp_preempted = True
    printed = float(run_check(GCP_CHECK, env).stdout)
    assert 25 < printed - time.time() <= 31


@pytest.mark.parametrize("script", [AWS_CHECK, GCP_CHECK], ids=["aws", "gcp"])
def test_a_metadata_service_out_of_reach_is_one_line_and_code_1(script: Path) -> None:
    with socket_closed() as url:
        env = {"ELASTIC_AWS_METADATA_URL": url, "ELASTIC_GCP_METADATA_URL": url}
        done = run_check(script, env)
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and url in done.stderr


class socket_closed:  # noqa: N801 - a context manager read as a phrase
    """A loopback URL whose port nobody listens on."""

    def __enter__(self) -> str:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return f"http://127.0.0.1:{probe.getsockname()[1]}"

    def __exit__(self, *args: object) -> None:
        pass


# --- the runner ------------------------------------------------------------------------------


def watch(command: str, interval: float = 0.5) -> PreemptionWatch:
    return PreemptionWatch(command, interval, lambda at: None, threading.Event())


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("echo 1795500000", 1795500000.0),
        ("echo 2026-11-24T08:00:00Z", 1795507200.0),
        ("true", None),
    ],
)
def test_a_check_that_prints_a_time_gives_it(command: str, expected: float | None) -> None:
    assert watch(command).check() == expected


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("echo tomorrow", "printed no time: 'tomorrow' is neither Unix seconds"),
        ("echo oops >&2; exit 3", "exited with code 3: oops"),
        ("sleep 30 & sleep 30", "did not finish within 0.5 s; killed"),
        ("/no/such/command", "exited with code 127"),
    ],
    ids=["garbage", "failing", "hanging", "missing"],
)
def test_a_broken_check_is_said_once_and_ignored(
    command: str, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    checker = watch(command)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="elastic"):
        assert checker.check() is None
        assert checker.check() is None
    assert time.monotonic() - started < 5, "a hanging check is killed at its bound"
    lines = [r.message for r in caplog.records if "preemption check" in r.message]
    assert len(lines) == 1 and said in lines[0], lines


def test_the_watch_calls_back_once_with_the_time() -> None:
    got: list[float] = []
    done = threading.Event()

    def noticed(at: float) -> None:
        got.append(at)
        done.set()

    PreemptionWatch("echo 1795500000", 0.1, noticed, threading.Event()).start()
    assert done.wait(10)
    time.sleep(0.3)
    assert got == [1795500000.0]


def test_the_watch_stops_checking_once_its_worker_leaves(tmp_path: Path) -> None:
    """The stop event is the control client's `closed` (set by `hvd.shutdown()`)."""
    runs = tmp_path / "runs"
    stop = threading.Event()
    thread = PreemptionWatch(f"echo run >> {runs}", 0.05, lambda at: None, stop).start()
    deadline = time.monotonic() + 10
    while (not runs.exists() or len(runs.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    seen = runs.read_text()
    time.sleep(0.3)
    assert runs.read_text() == seen, "no check runs after the stop"


# --- a real job -----------------------------------------------------------------------------

JOB = WORKERS / "elastic_job.py"
HOSTS_FILE_SCRIPT = SCRIPTS / "hosts_file.sh"


@pytest.mark.timeout(120)
def test_a_host_s_check_makes_its_worker_leave_at_a_step_and_get_no_successor(
    elasticrun, tmp_path: Path, metadata: FakeMetadata
) -> None:
    """Two hosts on this machine; only 127.0.0.1 asks the (fake) AWS metadata service. Once
    a reclaim is scheduled, its worker leaves within a few steps (long before the epoch's
    commit at step 20), the job goes on at size 2, and nothing is launched there again."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n127.0.0.1:1\n")
    check = f'[ "$ELASTIC_HOSTNAME" != 127.0.0.1 ] || {sys.executable} {AWS_CHECK}'
    job = elasticrun(
        [
            "--min-np", "1", "--host-discovery-script", str(HOSTS_FILE_SCRIPT),
            "--discovery-interval", "0.2", "--preemption-check", check,
            "--preemption-check-interval", "0.3",
            sys.executable, str(JOB), "--out", str(tmp_path), "--epochs", "2",
            "--batch", "4", "--commit-every", "1000", "--step-delay", "0.15",
        ],
        env={"ELASTIC_HOSTS_FILE": str(hosts), "ELASTIC_AWS_METADATA_URL": metadata.url},
    )  # fmt: skip
    job.wait_for(r"step 4 epoch 0 size 3")
    metadata.aws_action = {"action": "terminate", "time": "2099-01-01T00:00:00Z"}
    assert_left_at_a_step_and_got_no_successor(job, "its preemption check", "127.0.0.1")
    result = json.loads((tmp_path / "result.json").read_text())
    assert set(result["counts"]) == {2.0} and result["size"] == 2
