"""Remote (ssh) workers of a job whose state outlives the driver (`--backend etcd`): they run
detached on their host and outlive a killed driver; a restarted one re-adopts them through ssh.

Real processes only: `elasticrun` as a user runs it, a real sshd on 127.0.0.2
(tests/support/sshd.py, whose logins have a $TMPDIR of their own, as another host's would), a real
etcd, the ssh agent run as the driver runs it, faults injected by signals and by hosts that do not
answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

import pytest

from elastic.driver.launch.launcher import Adoption, HostFolder, WorkerSpec
from elastic.driver.launch.relay_frames import frame_line
from elastic.driver.launch.ssh import SshLauncher, SshOptions
from elastic.driver.launch.ssh_detached import HEADER_GRACE
from tests.e2e.elastic.test_elastic import assert_exactly_once, job_args, ranks_to_pids
from tests.e2e.etcd.test_driver_restart import (
    durable_args,
    job_file_token,
    kill_a_worker_while_the_driver_is_away,
    kill_driver,
    status,
    wait_for_file_line,
)
from tests.support.etcd_server import EtcdServer
from tests.support.processes import pids_alive, processes_naming
from tests.support.running_job import RunningJob
from tests.support.scripts import write_script

if TYPE_CHECKING:
    from tests.support.sshd import SshServer

pytest_plugins = ["tests.support.sshd"]
pytestmark = [pytest.mark.ssh, pytest.mark.timeout(120)]

REMOTE = "127.0.0.2"  # routes to loopback, no interface's address: reached through ssh
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


def saved_workers(etcd: EtcdServer, job_id: str) -> list[dict]:
    return json.loads(status(etcd, job_id, "--json", "--saved").stdout)["state"]["workers"]


def shown(job: RunningJob, rank: int, stream: str = "stdout") -> list[str]:
    """The lines `job` showed of rank `rank`'s `stream`, without their tag."""
    tag = f"[{rank}]<{stream}>:"
    lines = job.stdout if stream == "stdout" else job.stderr
    return [line[len(tag) :] for line in lines if line.startswith(tag)]


def wait_until_saved_offsets_cover_the_files(etcd: EtcdServer, job_id: str) -> list[dict]:
    """The saved worker records, once their offsets say every byte of their output files was
    shown (the workers hold: their files do not grow)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        workers = saved_workers(etcd, job_id)
        sizes = [
            {s: (Path(w["log_dir"]) / s).stat().st_size for s in ("stdout", "stderr")}
            for w in workers
            if w["log_dir"]
        ]
        shown = [{s: w["offsets"].get(s, 0) for s in ("stdout", "stderr")} for w in workers]
        if sizes == shown:
            return workers
        time.sleep(0.2)
    raise AssertionError(f"offsets not saved: {workers}")


@pytest.mark.slow  # tests/multihost/test_driver_restart.py runs the same on the bed in CI
def test_remote_workers_outlive_a_killed_driver_and_the_next_one_adopts_them(
    sshd: SshServer, elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    env = {"TMPDIR": str(tmp_path)}
    hold = tmp_path / "go"
    args = durable_args(
        etcd, "remote1", "-np", "2", "--min-np", "1", "-H", f"{REMOTE}:2",
        *sshd.elasticrun_args(),
        *job_args(tmp_path, "--samples", "960", "--step-delay", "0.05", "--hold-at-step", "10",
                  "--hold-file", str(hold)),
    )  # fmt: skip
    first = elasticrun(args, env)
    pids = ranks_to_pids(first, 2)
    for rank in (0, 1):
        first.wait_for(rf"^\[{rank}\]<stdout>:holding for", stream="stdout")
    workers = wait_until_saved_offsets_cover_the_files(etcd, "remote1")
    folders = {w["pid"]: Path(w["log_dir"]) for w in workers}
    # Under the remote login's $TMPDIR, not the driver's.
    assert {f.parent for f in folders.values()} == {sshd.tmpdir / "elasticrun-remote1"}
    keepers = [w["process_id"] for w in workers]
    token = job_file_token("remote1")
    assert processes_naming(token) == {}, "the token is on no command line"
    assert all(b"elastic.driver.launch.keeper" in Path(f"/proc/{p}/cmdline").read_bytes()
               for p in keepers), keepers  # fmt: skip

    kill_driver(first)
    first.finish(10)
    hold.touch()  # training goes on with no driver: the files grow
    for folder in folders.values():
        wait_for_file_line(folder / "stdout", r"^step 20 ")
    assert pids_alive([*pids.values(), *keepers]) == [*pids.values(), *keepers]

    second = elasticrun(args, env)
    second.wait_for(r"resuming job remote1 at round 1: 2 worker\(s\) to re-adopt")
    assert second.finish(120) == 0, second.transcript()
    assert "round 2" not in second.output and "worker pid=" not in second.output
    assert {w["pid"] for w in saved_workers(etcd, "remote1")} == set(pids.values())
    assert assert_exactly_once(tmp_path)["size"] == 2
    for pid, folder in folders.items():
        rank = next(r for r, p in pids.items() if p == pid)
        for stream in ("stdout", "stderr"):
            lines = (folder / stream).read_text().splitlines()
            assert shown(first, rank, stream) + shown(second, rank, stream) == lines, stream
        steps = [int(n) for n in re.findall(r"^step (\d+) ", (folder / "stdout").read_text(), re.M)]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) == 120
    assert pids_alive([*pids.values(), *keepers]) == []


def test_a_remote_worker_killed_while_the_driver_is_away_is_handled_after_the_restart(
    sshd: SshServer, elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    kill_a_worker_while_the_driver_is_away(
        elasticrun, etcd, tmp_path, "remote2", REMOTE, *sshd.elasticrun_args()
    )


# --- the agent, run as the driver runs it (no ssh: its stdin and stdout are pipes here) -----


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


def launch_agent(
    tmp_path: Path, job_id: str, serial: int, *command: str, slot: int | None = None
) -> subprocess.Popen:
    started = agent(tmp_path, "--", *command)
    assert started.stdin is not None
    detach = {"job_id": job_id, "serial": serial, "slot": slot}
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


def test_a_worker_launched_on_a_slot_stops_the_one_still_holding_it(
    tmp_path: Path, keepers: list[int]
) -> None:
    """A worker the driver counted out while its host was cut off lives on there, unaware;
    the next worker launched on its slot stops it first: never two workers on one slot."""
    worker = write_script(tmp_path, "worker.py", COUNTING_WORKER)
    found = {}
    for serial, slot in ((1, 0), (2, 1), (3, 0)):  # 3 takes slot 0 over from 1
        launched = launch_agent(
            tmp_path, "slots", serial, sys.executable, str(worker), "x", "0", slot=slot
        )
        header = json.loads((next_frame(launched.stdout) or ("", b"{}"))[1])
        found[serial] = header["keeper"]
        keepers.append(found[serial])
        expected = [str(tmp_path / "elasticrun-slots" / "worker.1")] if serial == 3 else []
        assert header["replaced"] == expected
        assert launched.stdin is not None
        launched.stdin.close()
        assert launched.wait(10) == 255
    deadline = time.monotonic() + 10
    while pids_alive(list(found.values())) != [found[2], found[3]]:
        assert time.monotonic() < deadline, pids_alive(list(found.values()))
        time.sleep(0.05)


# --- the driver's side: sessions through the real sshd --------------------------------------


def test_a_lost_ssh_session_is_followed_by_an_attach_that_repeats_and_loses_nothing(
    sshd: SshServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, keepers: list[int]
) -> None:
    go = tmp_path / "go"
    worker = write_script(tmp_path, "worker.py", COUNTING_WORKER)
    options = SshOptions(port=sshd.port, identity_file=str(sshd.identity_file))
    located: list[tuple[int, str]] = []
    spec = WorkerSpec(
        hostname=REMOTE, command=[sys.executable, str(worker), str(go), "0"], env={},
        cwd=str(tmp_path), host_folder=HostFolder("lost", 1),
        located=lambda pid, folder: located.append((pid, folder)),
    )  # fmt: skip

    async def run() -> tuple[int, bytes]:
        process = await SshLauncher(options, grace=1.0).launch(spec)
        shown = b""
        while not shown.endswith(b"line 4\n"):
            shown += await asyncio.wait_for(process.stdout.readline(), 30)
        keepers.append(process.pid)
        clients = [p for p, argv in processes_naming(str(worker)).items() if argv[0] == "ssh"]
        assert len(clients) == 1, clients
        os.kill(clients[0], signal.SIGKILL)  # the connection is gone
        await asyncio.sleep(0.5)
        go.touch()
        code = await asyncio.wait_for(process.wait(), 30)
        return code, shown + await process.stdout.read()

    with caplog.at_level(logging.WARNING, logger="elasticrun"):
        code, shown = asyncio.run(run())
    folder = sshd.tmpdir / "elasticrun-lost" / "worker.1"
    assert code == 0
    assert located[0][1] == str(folder)
    assert shown == (folder / "stdout").read_bytes()
    assert shown.decode().splitlines()[-1] == "line 9"
    assert any("attaching to it again" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("case", ["refused", "silent"])
def test_an_unreachable_host_at_adoption_loses_its_worker_in_bounded_time(
    case: str, sshd: SshServer, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    port = sshd.port if case == "refused" else request.getfixturevalue("silent_port")
    options = SshOptions(port=port, identity_file=str(sshd.identity_file), connect_timeout=1)
    adoption = Adoption(
        hostname="127.0.0.3", host_folder=HostFolder("gone", 1), pid=1234,
        log_dir="/tmp/elasticrun-gone/worker.1", offsets={"stdout": 10, "stderr": 0},
    )  # fmt: skip

    async def run() -> int:
        process = SshLauncher(options, grace=1.0).adopt(adoption)
        return await asyncio.wait_for(process.wait(), 20)

    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="elasticrun"):
        assert asyncio.run(run()) == 255
    assert time.monotonic() - started < 1 + HEADER_GRACE + 2
    lines = [r.getMessage() for r in caplog.records if r.name == "elasticrun"]
    assert len(lines) == 1 and "host 127.0.0.3" in lines[0], lines
