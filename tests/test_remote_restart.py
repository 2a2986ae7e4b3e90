"""Remote (ssh) workers of a job whose state outlives the driver (`--backend etcd`): they run
detached on their host and outlive their ssh agent; an agent attached again relays the rest.

Real processes only: the ssh agent run as the driver runs it, faults injected by signals.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from elastic.driver.launch.relay_frames import frame_line
from tests.conftest import pids_alive, write_script

pytestmark = pytest.mark.timeout(60)

AGENT = [sys.executable, "-m", "elastic.driver.launch.ssh_agent"]

# Prints numbered lines on both streams, waits for the file named in argv[1], prints more,
# exits with argv[2].
COUNTING_WORKER = """\
import os
import sys
import time

print(f"pid {os.getpid()}", flush=True)
for n in range(5):
    print(f"line {n}", flush=True)
print("warning 0", file=sys.stderr, flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
for n in range(5, 10):
    print(f"line {n}", flush=True)
print("warning 1", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def keepers() -> Iterator[list[int]]:
    """Keeper pids a test started (through an agent): their process groups are SIGKILLed at
    the end, should one still run."""
    started: list[int] = []
    yield started
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def agent(tmp_path: Path, *args: str, stdin: int = subprocess.PIPE) -> subprocess.Popen[bytes]:
    """The ssh agent with this test's folder as its $TMPDIR."""
    return subprocess.Popen(
        [*AGENT, *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )


def launch_agent(tmp_path: Path, job_id: str, serial: int, *command: str) -> subprocess.Popen:
    started = agent(tmp_path, "--", *command)
    assert started.stdin is not None
    detach = {"job_id": job_id, "serial": serial}
    started.stdin.write((json.dumps({"env": {}, "grace": 1, "detach": detach}) + "\n").encode())
    started.stdin.flush()
    return started


def next_frame(stream: IO[bytes] | None) -> tuple[str, bytes] | None:
    assert stream is not None
    line = stream.readline()
    if not line:
        return None
    found = frame_line(line)
    assert found is not None, line
    return found[0], stream.read(found[1])


def relay_until(
    stream: IO[bytes] | None, received: dict[str, bytes], last: bytes | None = None
) -> int | None:
    """Collect output frames into `received` until one ends with `last`, or to the end; the
    exit frame's code, if one came."""
    while (frame := next_frame(stream)) is not None:
        kind, data = frame
        if kind == "exit":
            return int(data)
        received[kind] = received.get(kind, b"") + data
        if last is not None and data.endswith(last):
            return None
    return None


def test_a_detached_worker_outlives_its_agent_and_an_attach_relays_the_rest_once(
    tmp_path: Path, keepers: list[int]
) -> None:
    go = tmp_path / "go"
    worker = write_script(tmp_path, "worker.py", COUNTING_WORKER)
    launched = launch_agent(tmp_path, "unit", 4, sys.executable, str(worker), str(go), "3")
    kind, data = next_frame(launched.stdout) or ("", b"")
    header = json.loads(data)
    keepers.append(header["keeper"])
    folder = tmp_path / "elasticrun-unit" / "worker.4"
    assert kind == "header" and header["folder"] == str(folder) and header["running"]
    assert os.stat(folder).st_mode & 0o777 == 0o700
    received: dict[str, bytes] = {}
    assert relay_until(launched.stdout, received, b"line 4\n") is None
    pid = int(received["stdout"].split()[1])

    assert launched.stdin is not None
    launched.stdin.close()  # the driver went away: the relay ends, the worker goes on
    assert relay_until(launched.stdout, received) is None, "no exit frame"
    assert launched.wait(10) == 255
    assert pids_alive([header["keeper"], pid]) == [header["keeper"], pid]

    offsets = ",".join(str(len(received.get(s, b""))) for s in ("stdout", "stderr"))
    attached = agent(tmp_path, "--attach", "unit", "4", "--offsets", offsets,
                     "--keeper", str(header["keeper"]))  # fmt: skip
    kind, data = next_frame(attached.stdout) or ("", b"")
    assert kind == "header" and json.loads(data)["running"]
    go.touch()
    assert relay_until(attached.stdout, received) == 3
    assert attached.wait(10) == 3
    for stream in ("stdout", "stderr"):
        assert received.get(stream, b"") == (folder / stream).read_bytes(), stream
    assert received["stdout"].decode().splitlines()[-1] == "line 9"
    assert (folder / "exit").read_text() == "3"


def test_an_attach_to_a_keeper_already_gone_sends_the_rest_and_the_recorded_exit(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "elasticrun-gone" / "worker.7"
    folder.mkdir(parents=True, mode=0o700)
    (folder / "stdout").write_bytes(b"a\nb\nc")
    (folder / "stderr").write_bytes(b"")
    (folder / "exit").write_text("5")
    cases = [("7", "5"), ("7", None), ("8", None)]  # recorded; not recorded; no folder at all
    for serial, recorded in cases:
        if recorded is None:
            with contextlib.suppress(FileNotFoundError):
                (folder / "exit").unlink()
        attached = agent(tmp_path, "--attach", "gone", serial, "--offsets", "2,0",
                         "--keeper", "1", stdin=subprocess.DEVNULL)  # fmt: skip
        kind, data = next_frame(attached.stdout) or ("", b"")
        assert kind == "header" and json.loads(data)["running"] is False
        assert json.loads(data)["keeper"] is None, "pid 1 keeps no folder"
        received: dict[str, bytes] = {}
        code = relay_until(attached.stdout, received)
        assert code == (int(recorded) if recorded else 255) == attached.wait(10)
        assert received == ({"stdout": b"b\nc"} if serial == "7" else {}), serial


@pytest.mark.parametrize("line", ["TERM", "KILL"])
def test_term_and_kill_lines_signal_the_keepers_group(
    line: str, tmp_path: Path, keepers: list[int]
) -> None:
    worker = write_script(tmp_path, "worker.py", COUNTING_WORKER)
    launched = launch_agent(tmp_path, "signals", 1, sys.executable, str(worker), "never", "0")
    keepers.append(json.loads((next_frame(launched.stdout) or ("", b"{}"))[1])["keeper"])
    relay_until(launched.stdout, {}, b"line 4\n")
    assert launched.stdin is not None
    launched.stdin.write(f"{line}\n".encode())
    if line == "KILL":
        launched.stdin.close()  # then the end of input, as `kill()` does: the exit still comes
    else:
        launched.stdin.flush()
    code = 128 + (signal.SIGTERM if line == "TERM" else signal.SIGKILL)
    assert relay_until(launched.stdout, {}) == code
    assert launched.wait(10) == code


def test_an_attach_stops_the_jobs_stray_keepers_and_names_them(
    tmp_path: Path, keepers: list[int]
) -> None:
    worker = write_script(tmp_path, "worker.py", COUNTING_WORKER)
    found = {}
    for serial in (3, 5, 11):  # 3 is adopted; 5 is a stray; 11 is the new driver's
        launched = launch_agent(tmp_path, "strays", serial, sys.executable, str(worker), "x", "0")
        found[serial] = json.loads((next_frame(launched.stdout) or ("", b"{}"))[1])["keeper"]
        keepers.append(found[serial])
        assert launched.stdin is not None
        launched.stdin.close()
        assert launched.wait(10) == 255
    attached = agent(tmp_path, "--attach", "strays", "3", "--offsets", "0,0",
                     "--strays-upto", "10", "--adopted", "3")  # fmt: skip
    header = json.loads((next_frame(attached.stdout) or ("", b"{}"))[1])
    assert header["running"] and header["keeper"] == found[3]
    assert header["stopped"] == [str(tmp_path / "elasticrun-strays" / "worker.5")]
    assert pids_alive(list(found.values())) == [found[3], found[11]]
    assert attached.stdin is not None
    attached.stdin.write(b"KILL\n")
    attached.stdin.close()
    assert relay_until(attached.stdout, {}) == 255, "SIGKILLed with its keeper: no record"
