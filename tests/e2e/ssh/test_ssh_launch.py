"""`elasticrun` with a host reached through a real sshd (tests/support/sshd.py) on 127.0.0.2.

Real processes only: the launcher as a user runs it, workers that print what the test waits
for, faults injected by signals and by hosts that do not answer.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.processes import processes_naming
from tests.support.running_job import RunningJob
from tests.support.scripts import write_script

if TYPE_CHECKING:
    from tests.support.sshd import SshServer

pytest_plugins = ["tests.support.sshd"]
pytestmark = [pytest.mark.ssh, pytest.mark.timeout(60)]

REMOTE = "127.0.0.2"  # routes to loopback, no interface's address: reached through ssh

ALLREDUCE_WORKER = """\
import json
import os

import torch
import torch.distributed as dist

import elastic.torch as hvd


def ancestors():
    chain, pid = [], os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as stat_file:
            stat = stat_file.read()
        chain.append([pid, stat[stat.index("(") + 1 : stat.rindex(")")]])
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return chain


hvd.init()
total = torch.tensor([hvd.rank() + 1.0])
dist.all_reduce(total)
result = {
    "rank": hvd.rank(),
    "size": hvd.size(),
    "hostname": os.environ["ELASTIC_HOSTNAME"],
    "sum": int(total.item()),
    "ssh_connection": os.environ.get("SSH_CONNECTION"),
    "ancestors": ancestors(),
}
print("result " + json.dumps(result), flush=True)
hvd.shutdown()
"""

# Ignores SIGTERM, prints its pid, sleeps: only SIGKILL ends it.
STUBBORN_WORKER = """\
import os
import signal
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"ready pid={os.getpid()}", flush=True)
time.sleep(120)
"""

# Prints its pid, then sleeps; the rank named in argv[1] exits 3 instead.
SLEEP_WORKER = """\
import os
import sys
import time

rank = os.environ["ELASTIC_RANK"]
print(f"ready rank={rank} pid={os.getpid()}", flush=True)
if sys.argv[1:] == [rank]:
    sys.exit(3)
time.sleep(120)
"""


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait (on pidfds, no polling) until the processes `pids` have exited; return those
    still running after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    running = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                running.append(pid)
        finally:
            os.close(fd)
    return running


def two_hosts(sshd: SshServer, *extra: str) -> list[str]:
    return ["-np", "2", "-H", f"localhost:1,{REMOTE}:1", *sshd.elasticrun_args(), *extra]


def test_allreduce_across_a_local_and_an_ssh_host(
    sshd: SshServer, elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    worker = write_script(tmp_path, "worker.py", ALLREDUCE_WORKER)
    job = elasticrun(two_hosts(sshd, "--start-timeout", "30", sys.executable, str(worker)))
    results = {}
    for rank in (0, 1):
        match = job.wait_for(rf"^\[{rank}\]<stdout>:result (.*)$", timeout=45, stream="stdout")
        results[rank] = json.loads(match.group(1))
    assert job.finish(timeout=15) == 0, job.transcript()

    for rank, hostname in ((0, "localhost"), (1, REMOTE)):
        assert results[rank]["rank"] == rank
        assert results[rank]["size"] == 2
        assert results[rank]["hostname"] == hostname
        assert results[rank]["sum"] == 3  # (0 + 1) + (1 + 1)
    local_parents = [pid for pid, _ in results[0]["ancestors"]]
    remote_parents = [pid for pid, _ in results[1]["ancestors"]]
    # Rank 0 is the launcher's own child; rank 1 runs under the ssh agent, in a session of
    # this test's sshd, and is no descendant of the launcher.
    assert local_parents[0] == job.process.pid
    assert sshd.pid not in local_parents
    assert sshd.pid in remote_parents
    assert job.process.pid not in remote_parents
    assert results[1]["ancestors"][1][1] == "sshd", results[1]["ancestors"]
    assert results[1]["ssh_connection"].endswith(f" {REMOTE} {sshd.port}")


def test_the_token_is_on_no_command_line(
    sshd: SshServer, elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    worker = write_script(tmp_path, "worker.py", SLEEP_WORKER)
    job = elasticrun(two_hosts(sshd, sys.executable, str(worker)))
    ready = [
        job.wait_for(rf"^\[{rank}\]<stdout>:ready .*pid=(\d+)", timeout=30, stream="stdout")
        for rank in (0, 1)
    ]
    pids = [int(match.group(1)) for match in ready]

    tokens = set()
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        tokens |= {
            entry.partition(b"=")[2] for entry in environ if entry.startswith(b"ELASTIC_TOKEN=")
        }
    assert len(tokens) == 1 and len(next(iter(tokens))) >= 16, tokens
    token = tokens.pop()

    job_argvs = list(processes_naming(str(worker)).values())
    assert any(argv[0] == "ssh" and REMOTE in argv for argv in job_argvs), job_argvs
    assert any("elastic.driver.launch.ssh_agent" in argv for argv in job_argvs), job_argvs
    leaks = list(processes_naming(token.decode()))
    assert leaks == [], f"the token is on the command line of processes {leaks}"


def test_sigterm_stops_local_and_remote_workers(
    sshd: SshServer, elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    worker = write_script(tmp_path, "worker.py", SLEEP_WORKER)
    job = elasticrun(two_hosts(sshd, "--stop-grace", "5", sys.executable, str(worker)))
    ready = [
        job.wait_for(rf"^\[{rank}\]<stdout>:ready .*pid=(\d+)", timeout=30, stream="stdout")
        for rank in (0, 1)
    ]
    workers = [int(match.group(1)) for match in ready]
    running = processes_naming(str(worker))
    # launcher, 2 workers, the ssh client and the remote agent
    assert set(workers) <= set(running) and len(running) >= 5, running

    signalled = time.monotonic()
    job.process.send_signal(signal.SIGTERM)
    assert job.finish(timeout=15) == 143, job.transcript()
    assert time.monotonic() - signalled < 10
    assert processes_naming(str(worker)) == {}
    assert [pid for pid in running if Path(f"/proc/{pid}").exists()] == []


def test_a_failing_remote_worker_fails_the_job(
    sshd: SshServer, elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    worker = write_script(tmp_path, "worker.py", SLEEP_WORKER)
    job = elasticrun(two_hosts(sshd, sys.executable, str(worker), "1"))
    assert job.finish(timeout=20) == 3, job.transcript()
    assert any(
        re.search(rf"rank 1 on host {re.escape(REMOTE)} exited with code 3", line)
        for line in job.stderr
    ), job.transcript()
    assert processes_naming(str(worker)) == {}


@pytest.mark.parametrize("case", ["refused", "wrong key", "silent"])
def test_an_unreachable_ssh_host_fails_with_one_line(
    case: str,
    sshd: SshServer,
    elasticrun: Callable[..., RunningJob],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    host, port, key = "127.0.0.3", sshd.port, sshd.identity_file  # nothing listens there
    start_timeout = 5
    if case == "wrong key":
        host, key = REMOTE, tmp_path / "stranger"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    elif case == "silent":
        port, start_timeout = request.getfixturevalue("silent_port"), 2
    worker = write_script(tmp_path, "worker.py", SLEEP_WORKER)
    job = elasticrun(
        [
            "-np", "2", "-H", f"localhost:1,{host}:1", "-p", str(port), "-i", str(key),
            "--start-timeout", str(start_timeout), sys.executable, str(worker),
        ]
    )  # fmt: skip
    assert job.finish(timeout=start_timeout + 10) == 1, job.transcript()
    assert time.monotonic() - job.started < start_timeout + 5
    errors = [line for line in job.stderr if line.strip()]
    assert len(errors) == 1, job.transcript()
    assert errors[0].startswith("elasticrun: error: ") and host in errors[0], errors
    assert job.stdout == []
    assert processes_naming(str(worker)) == {}


def test_a_killed_launcher_leaves_no_remote_worker(
    sshd: SshServer, elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    """SIGKILL gives the launcher no chance to stop anything: the ssh connection's end of
    input makes the agent SIGTERM its worker, then SIGKILL it after the grace period."""
    worker = write_script(tmp_path, "worker.py", STUBBORN_WORKER)
    job = elasticrun(
        ["-np", "1", "-H", f"{REMOTE}:1", *sshd.elasticrun_args(), "--stop-grace", "1",
         sys.executable, str(worker)]
    )  # fmt: skip
    pid = int(job.wait_for(r"^\[0\]<stdout>:ready pid=(\d+)", timeout=30, stream="stdout").group(1))
    remote = [p for p in processes_naming(str(worker)) if p != job.process.pid]
    assert pid in remote and len(remote) == 3, remote  # ssh client, agent, worker

    job.process.kill()
    job.process.wait(5)
    assert wait_gone(remote, timeout=10) == []
    assert processes_naming(str(worker)) == {}


def test_a_signalled_agent_stops_its_worker_at_once(
    sshd: SshServer, elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    """SIGTERM to the remote agent (an admin, a dying sshd) SIGTERMs the worker and returns
    its status right away, whatever the grace period."""
    worker = write_script(tmp_path, "worker.py", SLEEP_WORKER)
    job = elasticrun(
        ["-np", "1", "-H", f"{REMOTE}:1", *sshd.elasticrun_args(), "--stop-grace", "20",
         sys.executable, str(worker)]
    )  # fmt: skip
    job.wait_for(r"^\[0\]<stdout>:ready ", timeout=30, stream="stdout")
    agents = [
        pid
        for pid, argv in processes_naming(str(worker)).items()
        if "elastic.driver.launch.ssh_agent" in argv
    ]
    assert len(agents) == 1, agents

    signalled = time.monotonic()
    os.kill(agents[0], signal.SIGTERM)
    assert job.finish(timeout=15) == 143, job.transcript()
    assert time.monotonic() - signalled < 5
    assert any(
        f"rank 0 on host {REMOTE} was killed by signal SIGTERM" in line for line in job.stderr
    ), job.transcript()


def test_ssh_reads_any_host_name_as_the_destination_never_as_an_option(tmp_path: Path) -> None:
    """Defence behind the parser's refusal of names that start with `-`: the real ssh client,
    given the launcher's command for such a name, takes it as a host (here `-G` only prints
    the configuration it would use) and refuses it, so `-E<file>` writes no file."""
    from elastic.driver.launch.ssh import SshOptions, ssh_command

    if not Path("/usr/bin/ssh").exists():
        pytest.skip("needs the ssh client (apt-get install openssh-client)")
    planted = tmp_path / "ssh-wrote-this.log"
    command = ssh_command(SshOptions(connect_timeout=1), f"-E{planted}", "true")
    shown = subprocess.run(
        [command[0], "-G", *command[1:]], capture_output=True, text=True, timeout=10
    )
    assert not planted.exists()
    assert shown.returncode == 255
    assert "hostname contains invalid characters" in shown.stderr
