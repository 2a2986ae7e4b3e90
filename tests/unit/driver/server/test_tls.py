"""TLS between driver and workers on real loopback sockets: the driver's HTTPS server and TLS
control service against the worker's pinned clients, and loading the user's certificate."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import socket
import ssl
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastapi import FastAPI, Request

from elastic.driver.control.server import ControlServer
from elastic.driver.errors import UsageError
from elastic.driver.server.app import HttpServer
from elastic.driver.server.tls import TlsIdentity
from elastic.protocol import control_pb2 as pb
from elastic.protocol import control_pb2_grpc as pb_grpc
from elastic.protocol.beats import beat_frame, hello_frame
from elastic.worker.driver_link import transport
from elastic.worker.driver_link.control_client import ControlClient
from elastic.worker.driver_link.membership_events import MembershipEvents
from elastic.worker.driver_link.transport import control_channel, http_client
from tests.support.loop_thread import Loop
from tests.unit.driver.control.test_control import RecordingListener

TOKEN = "s3cret-tls-token"
TIMEOUT = httpx.Timeout(5.0)
HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def identity() -> TlsIdentity:
    return TlsIdentity.make_self_signed([HOST, "localhost"])


@pytest.fixture(scope="module")
def stranger() -> TlsIdentity:
    """Another self-signed identity for the same host: not the one the driver presents."""
    return TlsIdentity.make_self_signed([HOST])


@pytest.fixture(scope="module")
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


def echo_app() -> FastAPI:
    app = FastAPI()

    @app.get("/whoami")
    async def whoami(request: Request) -> dict[str, str]:
        return {"authorization": request.headers.get("authorization", "")}

    return app


@pytest.fixture(scope="module")
def https_server(loop: Loop, identity: TlsIdentity) -> Iterator[HttpServer]:
    server = HttpServer(echo_app(), HOST, tls=identity)
    loop.run(server.start())
    yield server
    loop.run(server.stop())


@pytest.fixture(scope="module")
def control_server(loop: Loop, identity: TlsIdentity) -> Iterator[ControlServer]:
    server = ControlServer(RecordingListener(), TOKEN, HOST, heartbeat_interval=0.5, tls=identity)
    loop.run(server.start())
    yield server
    loop.run(server.stop(0))


# --- HTTP ---


def test_https_with_the_pinned_certificate_works(
    https_server: HttpServer, identity: TlsIdentity
) -> None:
    assert https_server.url == f"https://{HOST}:{https_server.port}"
    with http_client(https_server.url, TOKEN, identity.cert_pem, TIMEOUT) as client:
        answer = client.get("/whoami")
    assert answer.status_code == 200
    assert answer.json() == {"authorization": f"Bearer {TOKEN}"}


def test_a_client_pinning_another_certificate_is_refused(
    https_server: HttpServer, stranger: TlsIdentity
) -> None:
    with (
        http_client(https_server.url, TOKEN, stranger.cert_pem, TIMEOUT) as client,
        pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        client.get("/whoami")


def test_system_cas_do_not_vouch_for_the_driver(https_server: HttpServer) -> None:
    """Without a pin an https URL is checked against the system CAs, which refuse it."""
    with (
        http_client(https_server.url, TOKEN, None, TIMEOUT) as client,
        pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        client.get("/whoami")


def test_plain_http_to_the_tls_port_fails(https_server: HttpServer) -> None:
    plain = f"http://{HOST}:{https_server.port}"
    with http_client(plain, TOKEN, None, TIMEOUT) as client, pytest.raises(httpx.TransportError):
        client.get("/whoami")


def test_the_pinned_certificate_must_name_the_host_dialled(loop: Loop) -> None:
    elsewhere = TlsIdentity.make_self_signed(["driver.example"])
    server = HttpServer(echo_app(), HOST, tls=elsewhere)
    loop.run(server.start())
    try:
        with (
            http_client(server.url, TOKEN, elsewhere.cert_pem, TIMEOUT) as client,
            pytest.raises(httpx.ConnectError, match="match|mismatch"),
        ):
            client.get("/whoami")
    finally:
        loop.run(server.stop())


def test_plain_http_server_without_tls(loop: Loop) -> None:
    server = HttpServer(echo_app(), HOST)
    loop.run(server.start())
    try:
        assert server.url.startswith("http://")
        with http_client(server.url, TOKEN, None, TIMEOUT) as client:
            assert client.get("/whoami").status_code == 200
    finally:
        loop.run(server.stop())


# --- gRPC ---


def register(channel: grpc.Channel, worker_id: str) -> pb.RegisterResponse:
    stub = pb_grpc.ControlStub(channel)
    return stub.Register(
        pb.RegisterRequest(worker_id=worker_id, pid=os.getpid()),
        metadata=(("authorization", f"Bearer {TOKEN}"),),
        timeout=5,
    )


def test_grpc_with_the_pinned_certificate_registers(
    control_server: ControlServer, identity: TlsIdentity
) -> None:
    with control_channel(control_server.address, identity.cert_pem, []) as channel:
        assert register(channel, "w1").heartbeat_interval == 0.5


def test_grpc_pinning_another_certificate_fails(
    control_server: ControlServer, stranger: TlsIdentity
) -> None:
    with (
        control_channel(control_server.address, stranger.cert_pem, []) as channel,
        pytest.raises(grpc.RpcError) as raised,
    ):
        register(channel, "w2")
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_grpc_insecure_channel_to_the_tls_port_fails(control_server: ControlServer) -> None:
    with (
        control_channel(control_server.address, None, []) as channel,
        pytest.raises(grpc.RpcError) as raised,
    ):
        register(channel, "w3")
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_worker_heartbeats_over_tls(loop: Loop, identity: TlsIdentity) -> None:
    """The ControlClient's heartbeats go to the heartbeat port over TLS with the pinned
    certificate and carry the token; a beat the driver refuses (NOT_FOUND) evicts the worker.
    A plain connection to that port is not served."""
    listener = RecordingListener()
    server = ControlServer(listener, TOKEN, HOST, heartbeat_interval=0.05, tls=identity)
    loop.run(server.start())
    evicted = threading.Event()
    client = ControlClient(
        server.address, TOKEN, "w1", MembershipEvents(),
        tls_cert=identity.cert_pem, on_evicted=evicted.set,
    )  # fmt: skip
    try:
        client.start()
        listener.wait_for("heartbeat", "w1", count=3)
        client.set_round(3)  # carried by the next messages of the same stream
        # Beats sent before it may still be on their way (the port is read 10 times a second,
        # a beat goes every 0.05 s): wait for the first that says 3, then two more.
        beats = lambda: listener.of("heartbeat", "w1")  # noqa: E731
        listener.wait_until(lambda: any(b[2] == 3 for b in beats()), "a beat of round 3")
        first = next(i for i, b in enumerate(beats()) if b[2] == 3)
        listener.wait_for("heartbeat", "w1", count=first + 3)
        assert [b[2] for b in beats()[first:]] == [3] * len(beats()[first:])
        listener.unknown.add("w1")
        assert evicted.wait(10)
        with socket.create_connection((HOST, server.beat_port), timeout=10) as plain:
            plain.sendall(hello_frame(TOKEN, "w2") + beat_frame(1, 0))
            with contextlib.suppress(ConnectionResetError):
                while plain.recv(4096):  # the TLS server answers an alert, then closes
                    pass
        assert listener.of("heartbeat", "w2") == []
    finally:
        client.close()
        loop.run(server.stop(0))


# --- a user's certificate issued by their own CA, pinned as it is ---


def issued_identity(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """A CA and a leaf for 127.0.0.1 it signed: (cert file with the chain, key file, leaf PEM)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "driver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    leaf_pem = leaf.public_bytes(serialization.Encoding.PEM)
    cert_file, key_file = tmp_path / "driver.crt", tmp_path / "driver.key"
    cert_file.write_bytes(leaf_pem + ca.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file, leaf_pem


def test_a_ca_issued_certificate_loads_and_its_leaf_alone_can_be_pinned(
    loop: Loop, tmp_path: Path
) -> None:
    cert_file, key_file, leaf_pem = issued_identity(tmp_path)
    loaded = TlsIdentity.load(cert_file, key_file)
    assert loaded.cert_pem.startswith(leaf_pem)
    assert b"PRIVATE KEY" not in repr(loaded).encode()
    http = HttpServer(echo_app(), HOST, tls=loaded)
    control = ControlServer(RecordingListener(), TOKEN, HOST, tls=loaded)
    loop.run(http.start())
    loop.run(control.start())
    try:
        with http_client(http.url, TOKEN, leaf_pem, TIMEOUT) as client:
            assert client.get("/whoami").status_code == 200
        with control_channel(control.address, leaf_pem, []) as channel:
            register(channel, "w1")
    finally:
        loop.run(http.stop())
        loop.run(control.stop(0))


# --- loading and making identities ---


def test_load_round_trips_a_written_identity(tmp_path: Path, identity: TlsIdentity) -> None:
    cert_file, key_file = tmp_path / "c.pem", tmp_path / "k.pem"
    cert_file.write_bytes(identity.cert_pem)
    key_file.write_bytes(identity.key_pem)
    assert TlsIdentity.load(cert_file, key_file) == identity


def test_load_errors_are_one_line_usage_errors(
    tmp_path: Path, identity: TlsIdentity, stranger: TlsIdentity
) -> None:
    cert_file, key_file = tmp_path / "c.pem", tmp_path / "k.pem"
    cert_file.write_bytes(identity.cert_pem)
    key_file.write_bytes(identity.key_pem)
    cases: list[tuple[Path, Path, str]] = [
        (tmp_path / "missing.pem", key_file, "--tls-cert .*missing.pem: no such file"),
        (cert_file, tmp_path / "missing.key", "--tls-key .*missing.key: no such file"),
        (tmp_path, key_file, "is a directory"),
        (key_file, key_file, "no PEM certificate"),
        (cert_file, cert_file, "no PEM private key"),
    ]
    other_key = tmp_path / "other.pem"
    other_key.write_bytes(stranger.key_pem)
    cases.append((cert_file, other_key, "does not belong to the certificate"))
    encrypted = tmp_path / "encrypted.pem"
    key = serialization.load_pem_private_key(identity.key_pem, None)
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        )
    )
    cases.append((cert_file, encrypted, "encrypted"))
    for cert, key_path, message in cases:
        with pytest.raises(UsageError, match=message) as raised:
            TlsIdentity.load(cert, key_path)
        assert "\n" not in str(raised.value)


def test_load_an_unreadable_file(tmp_path: Path, identity: TlsIdentity) -> None:
    cert_file = tmp_path / "c.pem"
    cert_file.write_bytes(identity.cert_pem)
    with pytest.raises(UsageError, match="--tls-key .*cannot read it: Not a directory"):
        TlsIdentity.load(cert_file, cert_file / "k.pem")


def test_self_signed_names_every_host() -> None:
    made = TlsIdentity.make_self_signed(["127.0.0.1", "[::1]", "node-3.cluster", "127.0.0.1"])
    cert = x509.load_pem_x509_certificate(made.cert_pem)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    assert names.get_values_for_type(x509.DNSName) == ["node-3.cluster"]
    assert "key_pem" not in repr(made)
    assert len(made.fingerprint()) == 64


def test_strict_x509_checks_accept_the_self_signed_certificate(
    https_server: HttpServer, identity: TlsIdentity
) -> None:
    """Python 3.13 makes VERIFY_X509_STRICT a default; the made certificate passes it."""
    context = transport.pinned_ssl_context(identity.cert_pem)
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    with (
        socket.create_connection((HOST, https_server.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=HOST) as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


@pytest.mark.parametrize("hosts", [[], [""], ["0.0.0.0"], ["::"]])
def test_self_signed_refuses_hosts_no_client_dials(hosts: list[str]) -> None:
    with pytest.raises(ValueError):
        TlsIdentity.make_self_signed(hosts)


def test_the_key_leaves_no_file_without_memfd(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, identity: TlsIdentity
) -> None:
    """Where memfd is missing the PEMs go to a private temporary directory, removed at once."""
    monkeypatch.delattr(os, "memfd_create")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    context = identity.server_ssl_context()
    assert isinstance(context, ssl.SSLContext)
    assert list(tmp_path.iterdir()) == []


def test_a_job_with_tls_trains_over_https_and_pinned_grpc(elasticrun, tmp_path: Path) -> None:
    """`elasticrun --tls` end to end: workers reach the driver over HTTPS and TLS gRPC, the
    certificate they pin is in their environment, and the collectives give the right sum."""
    script = tmp_path / "tls_job.py"
    script.write_text(
        "import os, torch\n"
        "import elastic.torch as hvd\n"
        "hvd.init()\n"
        "t = torch.ones(2) * (hvd.rank() + 1)\n"
        "hvd.allreduce_(t, op=hvd.Sum)\n"
        "pem = os.environ['ELASTIC_TLS_CERT']\n"
        "print('sum', t.tolist(), os.environ['ELASTIC_DRIVER_URL'].split(':')[0],\n"
        "      pem.startswith('-----BEGIN CERTIFICATE-----'), flush=True)\n"
        "hvd.shutdown()\n"
    )
    job = elasticrun(["-np", "2", "--tls", sys.executable, str(script)])
    assert job.finish(90) == 0, job.transcript()
    assert job.output.count("sum [3.0, 3.0] https True") == 2
