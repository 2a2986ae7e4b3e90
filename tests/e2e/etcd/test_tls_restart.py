"""TLS across a driver restart (etcd backend) without storing a private key anywhere.

A restarted driver re-reads the user's `--tls-key` file, or makes a new self-signed
certificate and publishes it (public PEM) in its etcd address document, which carries an HMAC
under the job token; workers move to a published address and pin its certificate only when
that MAC verifies with their token.
Layers: the MAC itself (pure), the worker's locator and clients against a real etcd and real
TLS servers on loopback, and `elasticrun --tls` killed and restarted mid-training.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from elastic.driver.control.server import ControlServer
from elastic.driver.job_file import runtime_dir
from elastic.driver.server.app import HttpServer
from elastic.driver.server.tls import TlsIdentity
from elastic.protocol.etcd import (
    AddressNotAuthentic,
    DriverAddress,
    EtcdOptions,
    connect,
    parse_endpoints,
)
from elastic.worker.driver_link.control_client import ControlClient
from elastic.worker.driver_link.http_client import DriverClient, DriverError
from elastic.worker.driver_link.locator import DriverLocator
from elastic.worker.driver_link.membership_events import MembershipEvents
from tests.e2e.elastic.test_elastic import ONE_WORKER_FAILS, job_args, ranks_to_pids
from tests.support.etcd_server import EtcdServer, free_port
from tests.support.running_job import RunningJob
from tests.unit.driver.control.test_control import RecordingListener
from tests.unit.driver.server.test_tls import Loop

pytestmark = pytest.mark.timeout(180)

TOKEN = "restart-token-" + "x" * 32
HOST = "127.0.0.1"
JOB = "tlsjob"


@pytest.fixture(scope="module")
def old() -> TlsIdentity:
    """The certificate the workers were started with (the first driver's)."""
    return TlsIdentity.make_self_signed([HOST])


@pytest.fixture(scope="module")
def new() -> TlsIdentity:
    """The restarted driver's certificate."""
    return TlsIdentity.make_self_signed([HOST])


def published(
    identity: TlsIdentity, url: str, control: str = "", signer: str = TOKEN
) -> DriverAddress:
    """The address a driver publishes, signed with `signer` (the job token, or a forger's)."""
    return DriverAddress(
        driver_id="d2",
        url=url,
        control_address=control,
        host="here",
        pid=1,
        tls_cert=identity.cert_pem.decode(),
    ).signed(signer, JOB)


# --- the MAC ---------------------------------------------------------------------------------


def test_a_published_address_verifies_only_with_the_job_token(new: TlsIdentity) -> None:
    address = published(new, "https://127.0.0.1:1")
    assert address.verified(TOKEN, JOB).cert_pem == new.cert_pem
    for token in ("another-token", ""):
        with pytest.raises(AddressNotAuthentic, match="not signed with this job's token"):
            address.verified(token, JOB)
    with pytest.raises(AddressNotAuthentic):
        address.verified(TOKEN, "another-job")  # a MAC binds its job
    forged = published(new, "https://127.0.0.1:1", signer="guess")
    unsigned = address.model_copy(update={"mac": None})
    for document in (forged, unsigned):
        with pytest.raises(AddressNotAuthentic):
            document.verified(TOKEN, JOB)
    plain = DriverAddress(driver_id="d", url="http://h:1", control_address="h:2", host="h", pid=1)
    assert plain.signed(TOKEN, JOB).verified(TOKEN, JOB).cert_pem is None


def test_the_mac_covers_every_field(old: TlsIdentity, new: TlsIdentity) -> None:
    """Someone who can write etcd swaps the certificate, or moves the workers to a server of
    theirs (where they would send the token), keeping the driver's MAC: refused."""
    signed = published(new, "https://127.0.0.1:1", "127.0.0.1:2")
    for change in (
        {"tls_cert": old.cert_pem.decode()},
        {"url": "https://127.0.0.1:9"},
        {"control_address": "127.0.0.1:9"},
        {"tls_cert": None},
    ):
        with pytest.raises(AddressNotAuthentic):
            signed.model_copy(update=change).verified(TOKEN, JOB)


# --- the worker side, against a real etcd and real servers ------------------------------------


@pytest.fixture
def etcd_options(etcd: EtcdServer) -> EtcdOptions:
    return EtcdOptions(parse_endpoints(etcd.endpoint))


def put_driver(options: EtcdOptions, address: DriverAddress) -> None:
    client = connect(options)
    try:
        client.put(options.job_key(JOB, "driver"), address.model_dump_json())
    finally:
        client.close()


def locator_for(
    options: EtcdOptions, old: TlsIdentity, url: str, control: str = ""
) -> DriverLocator:
    return DriverLocator(url, control, options, JOB, token=TOKEN, tls_cert=old.cert_pem)


def test_the_locator_refuses_a_certificate_whose_mac_does_not_verify(
    etcd_options: EtcdOptions, old: TlsIdentity, new: TlsIdentity, caplog
) -> None:
    locator = locator_for(etcd_options, old, "https://127.0.0.1:1", "127.0.0.1:2")
    forged = published(new, "https://127.0.0.1:3", "127.0.0.1:4", signer="guess")
    put_driver(etcd_options, forged)
    try:
        locator.refresh()
        assert locator.tls_cert == old.cert_pem
        assert (locator.url, locator.control_address) == ("https://127.0.0.1:1", "127.0.0.1:2")
        assert "refusing the driver address found in etcd" in caplog.text
        put_driver(etcd_options, published(new, "https://127.0.0.1:3", "127.0.0.1:4"))
        time.sleep(0.3)  # LOOKUP_EVERY
        locator.refresh()
        assert locator.tls_cert == new.cert_pem
        assert (locator.url, locator.control_address) == ("https://127.0.0.1:3", "127.0.0.1:4")
    finally:
        locator.close()


class Echo(BaseModel):
    text: str


def echo_app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(body: Echo) -> Echo:
        return body

    return app


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


@pytest.fixture
def https_server(loop: Loop, new: TlsIdentity) -> Iterator[HttpServer]:
    server = HttpServer(echo_app(), HOST, tls=new)
    loop.run(server.start())
    yield server
    loop.run(server.stop())


def test_the_http_client_pins_a_restarted_drivers_verified_certificate(
    etcd_options: EtcdOptions, old: TlsIdentity, new: TlsIdentity, https_server: HttpServer
) -> None:
    gone = f"https://{HOST}:{free_port()}"  # the first driver, dead
    put_driver(etcd_options, published(new, https_server.url))
    locator = locator_for(etcd_options, old, gone)
    client = DriverClient(gone, TOKEN, retry_for=20, tls_cert=old.cert_pem, locator=locator)
    try:
        assert client.post("/echo", Echo(text="hi"), Echo).text == "hi"
    finally:
        client.close()
        locator.close()


def test_the_http_client_refuses_a_forged_certificate(
    etcd_options: EtcdOptions, old: TlsIdentity, new: TlsIdentity, https_server: HttpServer
) -> None:
    """Someone who can write etcd but lacks the token points the workers at a server of
    theirs: the workers neither pin its certificate nor move there."""
    gone = f"https://{HOST}:{free_port()}"
    put_driver(etcd_options, published(new, https_server.url, signer="x"))
    locator = locator_for(etcd_options, old, gone)
    client = DriverClient(gone, TOKEN, retry_for=1.5, tls_cert=old.cert_pem, locator=locator)
    try:
        with pytest.raises(DriverError, match=f"driver at {gone} unreachable"):
            client.post("/echo", Echo(text="hi"), Echo)
        assert locator.tls_cert == old.cert_pem
    finally:
        client.close()
        locator.close()


def test_the_control_client_pins_a_restarted_drivers_verified_certificate(
    etcd_options: EtcdOptions, old: TlsIdentity, new: TlsIdentity, loop: Loop
) -> None:
    listener = RecordingListener()
    server = ControlServer(listener, TOKEN, HOST, heartbeat_interval=0.5, tls=new)
    loop.run(server.start())
    gone = f"{HOST}:{free_port()}"
    put_driver(etcd_options, published(new, "https://unused", server.address))
    locator = locator_for(etcd_options, old, "https://unused", gone)
    client = ControlClient(
        gone,
        TOKEN,
        "w1",
        MembershipEvents(),
        on_evicted=lambda: None,
        retry_for=20,
        tls_cert=old.cert_pem,
        locator=locator,
    )
    try:
        client.start()
        assert client.address == server.address
        assert listener.of("registered", "w1")
    finally:
        client.close()
        locator.close()
        loop.run(server.stop(0))


# --- elasticrun --tls, killed and restarted ------------------------------------------------


def etcd_values(etcd: EtcdServer) -> dict[str, bytes]:
    client = connect(EtcdOptions(parse_endpoints(etcd.endpoint)))
    try:
        return {meta.key.decode(): value for value, meta in client.get_all()}
    finally:
        client.close()


def assert_no_private_key_in(etcd: EtcdServer) -> None:
    """Neither in a current key nor anywhere in etcd's files (its write-ahead log keeps
    every value ever written)."""
    for key, value in etcd_values(etcd).items():
        assert b"PRIVATE KEY" not in value, key
    files = [f for f in etcd.data_dir.rglob("*") if f.is_file()]
    assert any(f.suffix == ".wal" for f in files), files
    for file in files:
        assert b"PRIVATE KEY" not in file.read_bytes(), file


def job_file_token(job_id: str) -> str:
    """The token in this host's job file of `job_id` (etcd holds none)."""
    return json.loads((runtime_dir() / f"{job_id}.json").read_bytes())["token"]


def driver_document(etcd: EtcdServer, job_id: str) -> DriverAddress:
    key = EtcdOptions(parse_endpoints(etcd.endpoint)).job_key(job_id, "driver")
    return DriverAddress.model_validate_json(etcd_values(etcd)[key])


def user_files(tmp_path: Path) -> list[str]:
    """--tls-cert/--tls-key files of the user's (made here with a self-signed identity)."""
    identity = TlsIdentity.make_self_signed([HOST, "localhost"])
    cert, key = tmp_path / "driver.crt", tmp_path / "driver.key"
    cert.write_bytes(identity.cert_pem)
    key.write_bytes(identity.key_pem)
    key.chmod(0o600)
    return ["--tls-cert", str(cert), "--tls-key", str(key)]


@pytest.mark.parametrize(
    "certificate", [pytest.param("self-signed", marks=pytest.mark.slow), "user-files"]
)
def test_a_tls_job_survives_a_driver_restart_with_no_key_in_etcd(
    elasticrun, etcd: EtcdServer, tmp_path: Path, certificate: str
) -> None:
    """The driver is SIGKILLed mid-training and a worker dies while it is away; the restarted
    driver serves TLS again (the survivor's heartbeats reach it over gRPC, its re-join over
    HTTPS) and the job ends 0. No "PRIVATE KEY" was ever written to etcd."""
    job_id = f"tls-{certificate}"
    tls = ["--tls"] if certificate == "self-signed" else user_files(tmp_path)
    args = [
        "--backend", "etcd", "--etcd-endpoints", etcd.endpoint, "--job-id", job_id,
        "-np", "2", "--min-np", "1", "-H", "localhost:2", *tls, *ONE_WORKER_FAILS,
        "--blacklist-cooldown-range", "300", "300",
        *job_args(tmp_path, "--step-delay", "0.1", epochs=3),
    ]  # fmt: skip
    env = {"TMPDIR": str(tmp_path)}
    first = elasticrun(args, env)
    pids = ranks_to_pids(first, 2)
    first.wait_for(r"step 4 ")
    before = driver_document(etcd, job_id)
    os.kill(first.process.pid, signal.SIGKILL)
    first.process.wait()
    os.kill(pids[1], signal.SIGKILL)

    second: RunningJob = elasticrun(args, env)
    second.wait_for(r"resuming job tls-")
    second.wait_for(r"round 2: 1 worker\(s\)", timeout=60)
    after = driver_document(etcd, job_id)
    token = job_file_token(job_id)
    assert f"/elasticrun/{job_id}/secret" not in etcd_values(etcd), "no token in etcd"
    assert after.verified(token, job_id).cert_pem is not None
    assert after.url.startswith("https://")
    if certificate == "self-signed":
        assert after.tls_cert != before.tls_cert, "a new certificate for the new driver"
    else:
        assert after.tls_cert == before.tls_cert, "the user's certificate, read again"
    assert second.finish(120) == 0, second.transcript()
    assert re.search(r"\[0\]<stdout>:done size 1", second.output), second.transcript()
    assert_no_private_key_in(etcd)
