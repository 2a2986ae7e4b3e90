"""The operator commands on a job run with `--backend etcd`, found through etcd (`--job-id`,
`--etcd-endpoints`) rather than a job file: the live status from the driver etcd names, a
stop that ends every worker, and what is left to say once the job has ended. etcd holds no
token: the operator gives it ($ELASTICRUN_TOKEN here, copied from the job file), and without
it the commands say how in one line."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from elastic.protocol.http import JobStatus
from tests.support.etcd_server import EtcdServer
from tests.support.paths import WORKERS
from tests.support.processes import pids_alive
from tests.support.running_job import ELASTICRUN

JOB = WORKERS / "elastic_job.py"


def command(
    args: list[str], runtime: Path, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`elasticrun ARGS` beside the job, with a runtime folder holding no job file, given
    `token` in $ELASTICRUN_TOKEN (no terminal to ask at)."""
    env = {k: v for k, v in os.environ.items() if k != "ELASTICRUN_TOKEN"}
    return subprocess.run(
        [*ELASTICRUN, *args],
        env={
            **env,
            "XDG_RUNTIME_DIR": str(runtime),
            **({"ELASTICRUN_TOKEN": token} if token else {}),
        },
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )


def typed_at_a_terminal(args: list[str], runtime: Path, typed: str) -> tuple[int, str, str]:
    """`elasticrun ARGS` with a terminal (a pty) as its controlling terminal and standard
    input, where `typed` and Enter are typed once it asks; its exit code, the terminal's text
    and its standard output."""
    master, slave = pty.openpty()

    def own_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    env = {k: v for k, v in os.environ.items() if k != "ELASTICRUN_TOKEN"}
    process = subprocess.Popen(
        [*ELASTICRUN, *args],
        env={**env, "XDG_RUNTIME_DIR": str(runtime)},
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=own_terminal,
    )
    os.close(slave)
    shown = b""
    while b"token" not in shown:  # the prompt
        shown += os.read(master, 1024)
    os.write(master, typed.encode() + b"\n")
    out, _ = process.communicate(timeout=30)
    os.close(master)
    return process.returncode, shown.decode(errors="replace"), out.decode()


@pytest.mark.timeout(120)
def test_an_etcd_job_is_shown_live_and_stopped_through_etcd(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    job_runtime, operator_runtime = tmp_path / "job-run", tmp_path / "operator-run"
    job_runtime.mkdir()
    operator_runtime.mkdir()  # no job file here: the commands must go through etcd
    job = elasticrun(
        ["--backend", "etcd", "--etcd-endpoints", etcd.endpoint, "--job-id", "ops1",
         "-np", "2", "--min-np", "1", "--stop-grace", "2",
         sys.executable, str(JOB), "--out", str(tmp_path), "--epochs", "200",
         "--step-delay", "0.05"],
        env={"XDG_RUNTIME_DIR": str(job_runtime), "TMPDIR": str(tmp_path)},  # its own logs
    )  # fmt: skip
    url = job.wait_for(r"driver=(\S+)").group(1)
    pids = [int(job.wait_for(rf"joined rank={r} size=2 pid=(\d+)").group(1)) for r in (0, 1)]
    job.wait_for(r"step 3 epoch")
    through_etcd = ["--job-id", "ops1", "--etcd-endpoints", etcd.endpoint]
    token = json.loads((job_runtime / "elasticrun" / "ops1.json").read_bytes())["token"]

    for asked in ("status", "stop"):
        untold = command([asked, *through_etcd], operator_runtime)
        assert untold.returncode == 1 and len(untold.stderr.splitlines()) == 1, untold.stderr
        assert "job ops1's token is needed to reach its driver" in untold.stderr
        assert "--token-file FILE or $ELASTICRUN_TOKEN" in untold.stderr
    wrong = command(["status", *through_etcd], operator_runtime, "w" * 43)
    assert wrong.returncode == 1, wrong.stderr
    assert "the token from $ELASTICRUN_TOKEN is not job ops1's" in wrong.stderr

    code, terminal, out = typed_at_a_terminal(["status", "--json", *through_etcd],
                                              operator_runtime, token)  # fmt: skip
    assert code == 0 and "job ops1's token (not echoed): " in terminal, terminal
    assert token not in terminal, "not echoed"
    assert JobStatus.model_validate_json(out).job_id == "ops1"

    shown = command(["status", "--json", *through_etcd], operator_runtime, token)
    assert shown.returncode == 0, shown.stderr
    status = JobStatus.model_validate_json(shown.stdout)  # the driver's answer, not etcd's
    assert status.urls is not None and status.urls.api == url
    assert sorted(w.pid for w in status.workers) == sorted(pids)
    unknown = command(["drain", "no-such-host", *through_etcd], operator_runtime, token)
    assert unknown.returncode == 1 and len(unknown.stderr.splitlines()) == 1, unknown.stderr
    assert "has no host 'no-such-host'" in unknown.stderr

    stopped = command(["stop", *through_etcd], operator_runtime, token)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("job ops1: ")
    assert job.finish(60) == 0, job.transcript()
    assert pids_alive(pids) == [], "every worker is gone"
    ended = command(["status", *through_etcd], operator_runtime)
    assert ended.returncode == 0, ended.stderr
    assert "ended with exit code 0: stopped by `elasticrun stop`" in ended.stdout, ended.stdout
    again = command(["stop", *through_etcd], operator_runtime, token)
    assert (again.returncode, again.stdout) == (1, "")
    assert again.stderr == "elasticrun stop: error: job ops1 has no running driver in etcd\n"
    saved = command(["status", "--json", *through_etcd], operator_runtime)
    assert "token" not in saved.stdout and "secret" not in json.loads(saved.stdout)
