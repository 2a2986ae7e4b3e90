"""etcd holds nothing that lets a reader join a job or a writer run code through it, and
etcd's own access control (TLS client certificates, users and roles) is supported.

Layers: what a restarted driver checks (pure), the etcd client against a real etcd with TLS
and authentication, and `elasticrun` itself against a real etcd: the token is in none of its
keys or files, a driver restarted on a spec or a state someone changed refuses in one line
and runs nothing, a driver restarted without the token says how to give it, and a job on an
etcd with TLS and users survives a SIGKILLed driver.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from elastic.driver.cli.backend_flags import ETCD_PASSWORD_VARIABLE
from elastic.driver.cli.flag_sources import SECRET_VARIABLES, from_environment
from elastic.driver.cli.launcher_flags import build_parser
from elastic.driver.errors import UsageError
from elastic.driver.job_file import read_job_files, write_job_file
from elastic.driver.journal.backend import BackendError
from elastic.driver.journal.etcd import EtcdBackend
from elastic.driver.journal.job_token import (
    TOKEN_VARIABLE,
    GivenToken,
    TokenMissing,
    find_token,
    given_token,
)
from elastic.driver.journal.journal import sealed
from elastic.driver.journal.resume import SavedJobRefused, check_saved
from elastic.protocol.etcd import DriverAddress, connect
from elastic.protocol.etcd_trust import token_check
from elastic.worker.driver_link.locator import DriverLocator
from tests.e2e.elastic.test_elastic import (
    ONE_WORKER_FAILS,
    assert_exactly_once,
    job_args,
    ranks_to_pids,
)
from tests.support.etcd_server import EtcdServer, EtcdTls
from tests.support.prerequisites import Machine, missing_etcd
from tests.support.processes import pids_alive
from tests.support.running_job import ELASTICRUN, RunningJob

pytestmark = pytest.mark.timeout(180)

TOKEN = "t" * 43
JOB = "trusted"


def key_of(name: str) -> str:
    return f"/elasticrun/{JOB}/{name}"


# --- what a restarted driver checks (pure) ----------------------------------------------------


def saved_documents(token: str = TOKEN) -> dict[str, bytes]:
    """What a driver of job JOB saves, sealed as the journal seals it."""
    spec = b'{"settings": {"command": ["python", "train.py"]}}'
    documents = sealed({"spec": spec, "state": b'{"epoch": 3}'}, token, JOB)
    return {**documents, "token_check": token_check(token, JOB).encode()}


def refusal(documents: dict[str, bytes], token: str = TOKEN) -> str:
    with pytest.raises(SavedJobRefused) as refused:
        check_saved(documents, JOB, GivenToken(token, "$ELASTICRUN_TOKEN"), key_of)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_saved_job_verifies_with_its_token_only() -> None:
    documents = saved_documents()
    check_saved(documents, JOB, GivenToken(TOKEN, "x"), key_of)  # no exception
    assert b"t" * 43 not in b"".join(documents.values()), "the token is saved nowhere"
    message = refusal(documents, "u" * 43)
    assert message.startswith("the token from $ELASTICRUN_TOKEN is not job trusted's")
    assert key_of("token_check") in message and "--token-file FILE" in message


@pytest.mark.parametrize("name", ["spec", "state"])
def test_a_changed_document_or_a_missing_mac_is_refused(name: str) -> None:
    changed = saved_documents()
    changed[name] = changed[name].replace(b"train.py", b"evil.py").replace(b"3", b"4")
    unsigned = saved_documents()
    del unsigned[f"{name}_mac"]
    moved = saved_documents()
    other = "state" if name == "spec" else "spec"
    moved[name], moved[f"{name}_mac"] = moved[other], moved[f"{other}_mac"]  # a MAC binds its key
    for documents in (changed, unsigned, moved):
        message = refusal(documents)
        assert message.startswith(f"job trusted's {name} in etcd ({key_of(name)}) does not")
        assert "nothing was run" in message


def test_a_job_saved_by_an_older_version_is_refused() -> None:
    old = {"spec": b"{}", "state": b"{}", "secret": json.dumps({"token": TOKEN}).encode()}
    message = refusal(old)
    assert "saved by an older elasticrun" in message and key_of("secret") in message
    del old["secret"]
    assert "has no /elasticrun/trusted/token_check" in refusal(old)


# --- where a token comes from -----------------------------------------------------------------


def test_a_token_comes_from_the_file_the_variable_the_job_file_or_the_terminal(
    tmp_path: Path,
) -> None:
    file = tmp_path / "token"
    file.write_text(TOKEN + "\n")
    assert given_token(str(file), {"ELASTICRUN_TOKEN": "v" * 40}).token == TOKEN
    job_file = tmp_path / "copied.json"
    job_file.write_text(json.dumps({"job_id": JOB, "token": "j" * 43}))
    assert given_token(str(job_file), {}).token == "j" * 43
    assert given_token(None, {"ELASTICRUN_TOKEN": "v" * 40}).source == "$ELASTICRUN_TOKEN"
    assert given_token(None, {}) is None
    for bad, why in (("short", "too easy to guess"), ("a b" * 20, "visible ASCII")):
        with pytest.raises(UsageError, match=why):
            given_token(None, {"ELASTICRUN_TOKEN": bad})
    with pytest.raises(UsageError, match="cannot read it"):
        given_token(str(tmp_path / "missing"), {})

    runtime = tmp_path / "run"
    runtime.mkdir()
    assert find_token(JOB, None, "x", folder=runtime, ask=lambda _: "typed" * 8).source == (
        "the terminal"
    )
    (runtime / f"{JOB}.json").write_text(json.dumps({"job_id": JOB, "token": "f" * 43}))
    found = find_token(JOB, None, "x", folder=runtime, ask=lambda _: None)
    assert (found.token, found.source) == ("f" * 43, f"the job file {runtime}/{JOB}.json")
    assert "f" * 43 not in repr(found)
    with pytest.raises(TokenMissing) as missing:
        find_token("other", None, "to take it up", folder=runtime, ask=lambda _: None)
    assert str(missing.value).startswith(
        "job other's token is needed to take it up, and etcd does not hold it: give it with "
        "--token-file FILE or $ELASTICRUN_TOKEN"
    )


def test_the_secret_variables_name_no_flag_and_are_not_warned_about() -> None:
    parser = build_parser()
    environ = {"ELASTICRUN_TOKEN": TOKEN, "ELASTICRUN_ETCD_PASSWORD": "pw", "ELASTICRUN_NP": "2"}
    found, unknown = from_environment(parser, environ)
    assert (found.values, unknown) == ({"np": 2}, [])
    assert {TOKEN_VARIABLE, ETCD_PASSWORD_VARIABLE} == SECRET_VARIABLES


def test_an_etcd_jobs_file_outlives_its_dead_driver_for_the_next_one(tmp_path: Path) -> None:
    """`elasticrun status` run while no driver runs an etcd job leaves its job file (the token
    a restarted driver reads); a memory job's file is removed as before."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    for job_id, durable in (("kept", True), ("gone", False)):
        path = write_job_file(job_id, "k" * 43, "http://h:1", folder=tmp_path, durable=durable)
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "pid": dead.pid}))
    running, problems = read_job_files(tmp_path)
    assert running == [] and (tmp_path / "kept.json").exists()
    assert not (tmp_path / "gone.json").exists()
    assert problems[0] == (
        f"job gone's driver (pid {dead.pid}) is gone; removed {tmp_path / 'gone.json'}"
    )
    assert problems[1].startswith(f"job kept's driver (pid {dead.pid}) is gone; run the same")
    found = find_token("kept", None, "to take it up", folder=tmp_path, ask=lambda _: None)
    assert found.token == "k" * 43


# --- the etcd client against etcd with TLS and users -------------------------------------------

USER, PASSWORD, ROOT_PASSWORD = "job", "job-password-Zq8", "root-password-Xw3"


def secured_etcd(tmp_path: Path, **server: Any) -> Iterator[EtcdServer]:
    if reason := missing_etcd(Machine.here()):
        pytest.skip(reason)
    etcd = EtcdServer(tmp_path / "etcd-data", tls=EtcdTls.make(tmp_path / "etcd-tls"), **server)
    etcd.start()
    try:
        etcd.enable_auth(ROOT_PASSWORD, USER, PASSWORD, "/elasticrun/")
        yield etcd
    finally:
        etcd.stop()


@pytest.fixture
def secure_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """etcd with TLS (client certificates required) and authentication on; user `job` may
    read and write `/elasticrun/`. Logins left idle for 1 s are forgotten."""
    yield from secured_etcd(tmp_path, auth_token_ttl=1)


@pytest.mark.e2e
def test_etcd_refuses_a_client_without_the_certificate_or_the_password(
    secure_etcd: EtcdServer,
) -> None:
    allowed = connect(secure_etcd.options(user=USER, password=PASSWORD))
    try:
        allowed.put("/elasticrun/x/state", "{}")
        with pytest.raises(grpc.RpcError) as outside:
            allowed.put("/other", "v")  # the role covers /elasticrun/ only
        assert outside.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        allowed.close()
    with pytest.raises(grpc.RpcError) as anonymous:
        connect(secure_etcd.options()).get("/elasticrun/x/state")  # a certificate, no user
    assert anonymous.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(Exception, match="connection failed|UNAVAILABLE"):
        connect(secure_etcd.options(cert=None, key=None, user=USER, password=PASSWORD))


@pytest.mark.e2e
def test_the_backend_says_what_etcd_refused_at_once(secure_etcd: EtcdServer) -> None:
    async def scenario() -> None:
        for options, expected in (
            (secure_etcd.options(user=USER, password="wrong"), "wrong user name or password"),
            (secure_etcd.options(), "etcd denied the user named by the client certificate"),
            (
                secure_etcd.options(user=USER, password=PASSWORD, prefix="/other"),
                "etcd denied user 'job' access to the keys under /other/",
            ),
        ):
            backend = EtcdBackend(options, retry_for=30.0)
            started = time.monotonic()
            with pytest.raises(BackendError, match=expected):
                await backend.read("j")
            assert time.monotonic() - started < 10, "a refusal is not retried as an outage"
            await backend.close()

    asyncio.run(scenario())


@pytest.mark.e2e
def test_a_login_etcd_forgot_is_made_again(secure_etcd: EtcdServer) -> None:
    """Idle past etcd's --auth-token-ttl (1 s here), a client's login is gone: the driver's
    backend and a worker's locator log in again instead of failing for good."""
    options = secure_etcd.options(user=USER, password=PASSWORD)

    async def backend_reads() -> None:
        backend = EtcdBackend(options, retry_for=10.0)
        await backend.read(JOB)
        time.sleep(2.5)  # idle: nothing else runs on this loop
        assert await backend.read(JOB) == {}
        await backend.close()

    asyncio.run(backend_reads())

    locator = DriverLocator("http://gone:1", "gone:2", options, JOB, token=TOKEN)
    locator.refresh()  # logs in; nothing published yet
    time.sleep(2.5)
    client = connect(options)  # logs in now
    try:
        address = DriverAddress(driver_id="d", url="http://127.0.0.1:7", host="h", pid=1,
                                control_address="127.0.0.1:8")  # fmt: skip
        client.put(key_of("driver"), address.signed(TOKEN, JOB).model_dump_json())
        deadline = time.monotonic() + 10
        while locator.url != address.url and time.monotonic() < deadline:
            time.sleep(0.3)
            locator.refresh()
        assert (locator.url, locator.control_address) == (address.url, "127.0.0.1:8")
    finally:
        client.close()
        locator.close()


@pytest.mark.e2e
def test_a_password_works_without_tls_too(tmp_path: Path) -> None:
    """etcd with users but no TLS (a loopback etcd): the login travels as call metadata."""
    if reason := missing_etcd(Machine.here()):
        pytest.skip(reason)
    etcd = EtcdServer(tmp_path / "etcd-data")
    etcd.start()
    try:
        etcd.enable_auth(ROOT_PASSWORD, USER, PASSWORD, "/elasticrun/")

        async def scenario() -> None:
            backend = EtcdBackend(etcd.options(user=USER, password=PASSWORD), retry_for=5.0)
            await backend.claim(JOB, "{}", lambda _: True, lambda: None)
            await backend.save({"state": b"{}"})
            assert (await backend.read(JOB))["state"] == b"{}"
            await backend.release()
            await backend.close()

        asyncio.run(scenario())
    finally:
        etcd.stop()


# --- elasticrun against a real etcd -----------------------------------------------------------


def etcd_client(etcd: EtcdServer) -> Any:
    return connect(etcd.options())


def etcd_values(etcd: EtcdServer) -> dict[str, bytes]:
    client = etcd_client(etcd)
    try:
        return {meta.key.decode(): value for value, meta in client.get_all()}
    finally:
        client.close()


def token_forms(token: str) -> list[bytes]:
    """The token as written, and the bytes behind it in hex and base64 (both alphabets)."""
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    return [
        token.encode(),
        raw,
        raw.hex().encode(),
        raw.hex().upper().encode(),
        base64.b64encode(raw).rstrip(b"="),
        base64.urlsafe_b64encode(raw).rstrip(b"="),
        base64.b64encode(token.encode()).rstrip(b"="),
    ]


def job_file_token(runtime: Path, job_id: str) -> str:
    return json.loads((runtime / "elasticrun" / f"{job_id}.json").read_bytes())["token"]


def durable_job(
    elasticrun: Callable[..., RunningJob],
    reach: list[str],
    job_id: str,
    tmp_path: Path,
    runtime: Path,
    *extra: str,
    env: dict[str, str] | None = None,
) -> RunningJob:
    runtime.mkdir(exist_ok=True)
    args = ["--backend", "etcd", *reach, "--job-id", job_id, "--start-timeout", "120", *extra]
    environ = {"TMPDIR": str(tmp_path), "XDG_RUNTIME_DIR": str(runtime), **(env or {})}
    return elasticrun(args, environ)


def test_the_token_is_in_no_key_and_no_file_of_etcd(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    runtime = tmp_path / "run"
    hold = tmp_path / "go"
    job = durable_job(
        elasticrun, ["--etcd-endpoints", etcd.endpoint], "notoken", tmp_path, runtime,
        "-np", "2", *job_args(tmp_path, "--hold-at-step", "3", "--hold-file", str(hold)),
    )  # fmt: skip
    job.wait_for(r"holding for")
    token = job_file_token(runtime, "notoken")
    values = etcd_values(etcd)
    files = [f.read_bytes() for f in etcd.data_dir.rglob("*") if f.is_file()]  # the WAL too
    for form in token_forms(token):
        for key, value in values.items():
            assert form not in value and form not in key.encode(), (key, form)
        assert not any(form in data for data in files), form
    assert {k.rsplit("/", 1)[1] for k in values} >= {"spec", "state", "driver", "token_check"}
    hold.touch()
    assert job.finish(60) == 0, job.transcript()


def tamper(etcd: EtcdServer, job_id: str, name: str, change: Callable[[dict], None]) -> None:
    """Rewrite document `name` of `job_id` in etcd as one who can write etcd (no token)."""
    client = etcd_client(etcd)
    try:
        key = f"/elasticrun/{job_id}/{name}"
        document = json.loads(client.get(key)[0])
        change(document)
        client.put(key, json.dumps(document))
    finally:
        client.close()


def kill_driver(job: RunningJob) -> None:
    os.kill(job.process.pid, signal.SIGKILL)
    job.process.wait()


def change_spec(marker: Path) -> Callable[[dict], None]:
    def change(spec: dict) -> None:
        spec["settings"]["command"] = ["sh", "-c", f"touch {marker}; sleep 60"]

    return change


def change_state(marker: Path) -> Callable[[dict], None]:
    def change(state: dict) -> None:  # a worker of theirs, whose output the driver would show
        forged = dict(state["workers"][0], worker_id="localhost[1]#99", log_dir=str(marker))
        state["workers"].append(forged)

    return change


@pytest.mark.parametrize("changed", ["spec", "state"])
def test_a_restarted_driver_refuses_what_someone_else_changed_and_runs_nothing(
    elasticrun, etcd: EtcdServer, tmp_path: Path, changed: str
) -> None:
    """Rank 1 dies while no driver runs, so a restarted driver would launch a replacement (no
    cooldown). Someone who can write etcd but has no token changed the command every worker
    runs (an earlier version ran it), or put a worker record of theirs in the state. The
    restarted driver refuses in one line naming the key: the marker command never runs, no
    worker is launched, the surviving worker is left alone."""
    runtime, marker = tmp_path / "run", tmp_path / "marker"
    reach = ["--etcd-endpoints", etcd.endpoint]
    job_id = f"tamper-{changed}"
    args = [
        "-np", "2", "--min-np", "1", "-H", "localhost:2", "--blacklist-cooldown-range", "0", "0",
        *job_args(tmp_path, "--hold-at-step", "3", "--hold-file", str(tmp_path / "go")),
    ]  # fmt: skip
    first = durable_job(elasticrun, reach, job_id, tmp_path, runtime, *args)
    pids = ranks_to_pids(first, 2)
    first.wait_for(r"holding for")
    kill_driver(first)
    os.kill(pids[1], signal.SIGKILL)
    tamper(etcd, job_id, changed, {"spec": change_spec, "state": change_state}[changed](marker))

    second = durable_job(elasticrun, reach, job_id, tmp_path, runtime, *args)
    assert second.finish(60) == 1, second.transcript()
    assert len(second.stderr) <= 2, second.transcript()  # "job ... (state in etcd)", the error
    error = second.stderr[-1]
    assert error.startswith(f"elasticrun: error: job {job_id}'s {changed} in etcd "), error
    assert f"(/elasticrun/{job_id}/{changed}) does not verify with the job's token" in error
    assert "someone other than its driver changed it, so nothing was run" in error
    assert not marker.exists(), "the changed command never ran"
    assert "worker pid=" not in second.output, "no worker was launched"
    assert pids_alive([pids[0]]) == [pids[0]], "the surviving worker was not touched"


def test_a_driver_restarted_without_the_token_says_how_to_give_it(
    elasticrun, etcd: EtcdServer, tmp_path: Path
) -> None:
    """The driver is restarted 'on another host': a runtime folder without the job file, no
    terminal. It refuses in one line; with the wrong token too; with --token-file (the job
    file copied over) it takes the job up and the job ends well."""
    runtime, elsewhere, hold = tmp_path / "run", tmp_path / "elsewhere", tmp_path / "go"
    reach = ["--etcd-endpoints", etcd.endpoint]
    args = [
        "-np", "2", "--min-np", "1", "-H", "localhost:2",
        *job_args(tmp_path, "--hold-at-step", "3", "--hold-file", str(hold)),
    ]  # fmt: skip
    first = durable_job(elasticrun, reach, "moved", tmp_path, runtime, *args)
    pids = ranks_to_pids(first, 2)
    first.wait_for(r"holding for")
    kill_driver(first)

    untold = durable_job(elasticrun, reach, "moved", tmp_path, elsewhere, *args)
    assert untold.finish(60) == 1, untold.transcript()
    error = untold.stderr[-1]
    assert error.startswith("elasticrun: error: job moved's token is needed to take it up"), (
        untold.transcript()
    )
    assert "--token-file FILE or $ELASTICRUN_TOKEN" in error
    wrong = durable_job(elasticrun, reach, "moved", tmp_path, elsewhere, *args,
                        env={"ELASTICRUN_TOKEN": "w" * 43})  # fmt: skip
    assert wrong.finish(60) == 1, wrong.transcript()
    assert "the token from $ELASTICRUN_TOKEN is not job moved's" in wrong.stderr[-1]

    copied = tmp_path / "token.json"
    copied.write_bytes((runtime / "elasticrun" / "moved.json").read_bytes())
    copied.chmod(0o600)
    second = durable_job(elasticrun, reach, "moved", tmp_path, elsewhere,
                         "--token-file", str(copied), *args)  # fmt: skip
    second.wait_for(r"resuming job moved at round 1: 2 worker\(s\) to re-adopt")
    hold.touch()
    assert second.finish(120) == 0, second.transcript()
    assert pids_alive(list(pids.values())) == []
    assert_exactly_once(tmp_path)


@pytest.fixture
def tls_auth_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """etcd with TLS and users, keeping etcd's default login lifetime."""
    yield from secured_etcd(tmp_path)


def test_a_job_on_etcd_with_tls_and_users_survives_a_driver_restart(
    elasticrun, tls_auth_etcd: EtcdServer, tmp_path: Path
) -> None:
    """The driver, the workers (which find the restarted driver in etcd) and the operator's
    `elasticrun status` reach etcd with a client certificate and a user whose password comes
    from a file, never a command line, a log line or a status answer."""
    etcd, runtime, hold = tls_auth_etcd, tmp_path / "run", tmp_path / "go"
    password_file = tmp_path / "etcd-password"
    password_file.write_text(PASSWORD + "\n")
    password_file.chmod(0o600)
    reach = [*etcd.flags(), "--etcd-user", USER, "--etcd-password-file", str(password_file)]
    args = [
        "-np", "2", "--min-np", "1", "-H", "localhost:2", *ONE_WORKER_FAILS,
        "--blacklist-cooldown-range", "300", "300",
        *job_args(tmp_path, "--step-delay", "0.1", "--hold-at-step", "40",
                  "--hold-file", str(hold), epochs=3),
    ]  # fmt: skip
    first = durable_job(elasticrun, reach, "secured", tmp_path, runtime, *args)
    pids = ranks_to_pids(first, 2)
    first.wait_for(r"step 4 ")
    kill_driver(first)
    os.kill(pids[1], signal.SIGKILL)  # the survivor must find the next driver through etcd

    second = durable_job(elasticrun, reach, "secured", tmp_path, runtime, *args)
    second.wait_for(r"resuming job secured at round 1")
    second.wait_for(r"round 2: 1 worker\(s\)", timeout=60)
    second.wait_for(r"holding for", timeout=60)
    status = subprocess.run(
        [*ELASTICRUN, "status", "--job-id", "secured", "--json", *reach],
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["size"] == 1
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                assert PASSWORD.encode() not in (entry / "cmdline").read_bytes(), entry
            except OSError:
                continue
    hold.touch()
    assert second.finish(120) == 0, second.transcript()
    for text in (first.output, second.output, status.stdout, status.stderr):
        assert PASSWORD not in text
    assert pids_alive([pids[0]]) == []
    assert assert_exactly_once(tmp_path, epochs=3)["size"] == 1
    refused = subprocess.run(
        [*ELASTICRUN, "status", "--job-id", "secured", "--saved", *etcd.flags()],
        env={k: v for k, v in os.environ.items() if "PASSWORD" not in k},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith("elasticrun status: error: etcd at ")
    assert "etcd denied the user named by the client certificate" in refused.stderr
