"""`elasticrun` as a user runs it: exit codes, signals, output, secrets and bad input."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import pids_alive, processes_naming
from tests.support.scripts import write_script

SLEEPER = """\
import os, sys, time
print(f"ready rank={os.environ['ELASTIC_RANK']} pid={os.getpid()}", flush=True)
time.sleep(600)
"""


def test_all_workers_exit_zero_and_output_is_tagged_by_rank(elasticrun, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "hello.py",
        "import os, sys\n"
        "r = os.environ['ELASTIC_RANK']\n"
        "print(f'hello from {r} of {os.environ[\"ELASTIC_SIZE\"]}')\n"
        "print(f'warning {r}', file=sys.stderr)\n",
    )
    job = elasticrun(["-np", "3", "--output-filename", "logs", sys.executable, str(script)])
    assert job.finish() == 0, job.output
    for rank in range(3):
        assert f"[{rank}]<stdout>:hello from {rank} of 3" in job.lines
        assert f"[{rank}]<stderr>:warning {rank}" in job.lines
        folder = tmp_path / "logs" / f"rank.{rank}"
        assert (folder / "stdout").read_text() == f"hello from {rank} of 3\n"
        assert (folder / "stderr").read_text() == f"warning {rank}\n"


def test_worker_environment_describes_its_slot(elasticrun, tmp_path: Path) -> None:
    names = ["HOSTNAME", "RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"]
    script = write_script(
        tmp_path,
        "env.py",
        "import os\n"
        f"names = {names!r}\n"
        "print('slot', *[os.environ['ELASTIC_' + n] for n in names],"
        " os.environ['PYTHONUNBUFFERED'], os.environ['ELASTIC_DRIVER_URL'].startswith('http://'))\n",
    )
    job = elasticrun(["-np", "3", "-H", "localhost:2,127.0.0.1:1", sys.executable, str(script)])
    assert job.finish() == 0, job.output
    assert "[0]<stdout>:slot localhost 0 3 0 2 0 2 1 True" in job.lines
    assert "[1]<stdout>:slot localhost 1 3 1 2 0 1 1 True" in job.lines
    assert "[2]<stdout>:slot 127.0.0.1 2 3 0 1 1 2 1 True" in job.lines


def test_a_failing_worker_stops_the_others_and_sets_the_exit_code(
    elasticrun, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path,
        "fail.py",
        "import os, sys, time\n"
        "print(f'pid={os.getpid()}', flush=True)\n"
        "if os.environ['ELASTIC_RANK'] == '1':\n"
        "    time.sleep(0.5); sys.exit(3)\n"
        "time.sleep(600)\n",
    )
    job = elasticrun(["-np", "3", sys.executable, str(script)])
    start = time.monotonic()
    code = job.finish(60)
    assert code == 3, job.output
    assert time.monotonic() - start < 30, "the others must be stopped, not waited for"
    assert "rank 1 on host localhost exited with code 3" in job.output
    pids = [int(line.rsplit("=", 1)[1]) for line in job.lines if "<stdout>:pid=" in line]
    assert len(pids) == 3 and not pids_alive(pids)


def test_a_worker_killed_by_a_signal_is_named(elasticrun, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "die.py",
        "import os, signal, time\n"
        "if os.environ['ELASTIC_RANK'] == '0':\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(600)\n",
    )
    job = elasticrun(["-np", "2", sys.executable, str(script)])
    assert job.finish(60) == 137
    assert "rank 0 on host localhost was killed by signal SIGKILL" in job.output


def test_an_exception_in_a_worker_shows_its_traceback(elasticrun, tmp_path: Path) -> None:
    script = write_script(tmp_path, "boom.py", "raise ValueError('bad learning rate')\n")
    job = elasticrun(["-np", "1", sys.executable, str(script)])
    assert job.finish(60) == 1
    assert "[0]<stderr>:ValueError: bad learning rate" in job.lines
    assert "[0]<stderr>:Traceback (most recent call last):" in job.lines


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_leaves_no_process(
    elasticrun, tmp_path: Path, signum: int
) -> None:
    script = write_script(tmp_path, "sleeper.py", SLEEPER)
    job = elasticrun(["-np", "2", "-H", "localhost:1,127.0.0.1:1", sys.executable, str(script)])
    pids = [int(job.wait_for(rf"<stdout>:ready rank={r} pid=(\d+)").group(1)) for r in (0, 1)]
    os.kill(job.process.pid, signum)
    assert job.finish(30) == 128 + signum
    assert not pids_alive(pids)
    assert not processes_naming(str(script))


def test_the_token_is_on_no_command_line(elasticrun, tmp_path: Path) -> None:
    script = write_script(tmp_path, "sleeper.py", SLEEPER)
    job = elasticrun(["-np", "2", sys.executable, str(script)])
    pid = int(job.wait_for(r"<stdout>:ready rank=0 pid=(\d+)").group(1))
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    token = next(v.split(b"=", 1)[1] for v in environ if v.startswith(b"ELASTIC_TOKEN="))
    assert len(token) >= 32
    leaks = list(processes_naming(token.decode()))
    assert leaks == []
    assert token.decode() not in job.output


def test_workers_that_never_join_fail_the_start_timeout(elasticrun, tmp_path: Path) -> None:
    script = write_script(tmp_path, "sleeper.py", SLEEPER)
    job = elasticrun(["-np", "2", "--start-timeout", "2", sys.executable, str(script)])
    assert job.finish(30) == 1
    said = "rank(s) [0, 1] on host(s) localhost did not join the rendezvous within 2 s"
    assert said in job.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-np", "2", "-H", "no-such-host.invalid:2", "true"],
            "unknown host 'no-such-host.invalid'",
        ),
        (["-np", "2", "-H", "a:two", "true"], "slot count in 'a:two' is not a number"),
        (["-np", "2", "-H", "a:1,,b:1", "true"], "malformed host list"),
        (["-np", "3", "-H", "localhost:2", "true"], "-np 3 is larger than the 2 slot(s)"),
        (["-np", "2"], "no command given"),
        (["true"], "-np is required (or give --min-np / --host-discovery-script)"),
        (["-np", "zero", "true"], "invalid int value: 'zero'"),
        (["-np", "0", "true"], "-np must be at least 1"),
        (["-np", "1", "--hostfile", "/nonexistent/hosts", "true"], "cannot read"),
        (["-np", "1", "--start-timeout", "-1", "true"], "--start-timeout must be positive"),
        (["-np", "1", "--network-interface", "nosuchif0", "true"], "'nosuchif0' has no IPv4"),
        (["-np", "1", "-H", "a", "--hostfile", "f", "true"], "not allowed with argument"),
        (["-np", "1", "-i", "/nonexistent/key", "true"], "--ssh-identity-file: no such file"),
    ],
)
def test_bad_input_gets_one_clear_line(elasticrun, args: list[str], message: str) -> None:
    job = elasticrun(args)
    code = job.finish(30)
    assert code in (1, 2)
    assert job.lines == [job.lines[0]] and job.lines[0].startswith("elasticrun: error: ")
    assert message in job.lines[0]


def test_a_command_that_cannot_start_is_reported(elasticrun) -> None:
    job = elasticrun(["-np", "1", "/nonexistent/program"])
    assert job.finish(30) == 1
    assert "elasticrun: error: cannot start '/nonexistent/program'" in job.output
    assert "Traceback" not in job.output


def test_console_script_is_installed() -> None:
    path = shutil.which("elasticrun")
    assert path is not None, "pip install should put `elasticrun` on PATH"
    answer = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
    assert answer.returncode == 0 and "--start-timeout" in answer.stdout


def test_a_job_outlives_its_start_timeout_once_everyone_joined(elasticrun, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "long.py",
        "import os, time\n"
        "import elastic.torch as hvd\n"
        "hvd.init()\n"
        "print(f'joined {hvd.rank()}', flush=True)\n"
        "time.sleep(float(os.environ['ELASTIC_START_TIMEOUT']) + 1)  # past it for sure\n"
        "print(f'done {hvd.rank()}', flush=True)\n",
    )
    job = elasticrun(["-np", "2", "--start-timeout", "10", sys.executable, str(script)])
    assert job.finish(60) == 0, job.output
    assert "[0]<stdout>:done 0" in job.lines and "[1]<stdout>:done 1" in job.lines


def test_workers_that_exit_without_joining_end_the_job_normally(elasticrun) -> None:
    job = elasticrun(["-np", "2", "--start-timeout", "2", "hostname"])
    assert job.finish(30) == 0, job.output
    assert len([line for line in job.lines if line.startswith("[")]) == 2
