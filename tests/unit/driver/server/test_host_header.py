"""The Host header (issue 26, item 8): a page on another site that points its own name at the
driver (DNS rebinding) must read nothing, so every route answers only to the names the driver
is reached by. Real sockets on loopback against the real server, a real job, and the rules."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from elastic.driver.cli.main import parse_settings
from elastic.driver.errors import UsageError
from elastic.driver.server.app import HttpServer, create_app
from elastic.driver.server.host_check import AllowedHosts
from tests.support.running_job import RunningJob
from tests.unit.driver.server.test_http_api import AUTH, make_services


async def scrape() -> bytes:
    return b"elasticrun_up 1\n"


@contextlib.contextmanager
def serving(host: str = "127.0.0.1", allowed_hosts: tuple[str, ...] = ()) -> Iterator[int]:
    """The driver's HTTP server bound to `host`, in its own event loop thread; yields its port."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    services = make_services()
    services.metrics = scrape

    async def start() -> HttpServer:
        server = HttpServer(create_app(services), host, allowed_hosts=allowed_hosts)
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield server.port
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def ask(port: int, path: str, host: str, address: str = "127.0.0.1", **kw) -> httpx.Response:
    """GET `path` from the server at `address`:`port`, naming `host` in the Host header."""
    url_host = f"[{address}]" if ":" in address else address
    headers = {"Host": host, **kw.pop("headers", {})}
    return httpx.get(f"http://{url_host}:{port}{path}", headers=headers, timeout=5, **kw)


def raw_answer(port: int, request: bytes, address: str = "127.0.0.1") -> bytes:
    """What the server answers to `request`, sent whole on a fresh connection, up to its
    close."""
    with socket.create_connection((address, port), timeout=5) as conn:
        conn.sendall(request)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_foreign_host_name_gets_421_on_every_route() -> None:
    with serving() as port:
        for path, headers in [
            ("/metrics", {}),
            ("/ui", {}),
            ("/ui/login", {}),
            ("/ui/assets/page.js", {}),
            ("/ui/api/status", AUTH),
            ("/v1/status", AUTH),
            ("/v1/status", {}),
        ]:
            for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io"):
                answer = ask(port, path, host, headers=headers)
                assert answer.status_code == 421, (path, host, answer.text)
                assert "j1" not in answer.text and "elasticrun_" not in answer.text
                assert "attacker.example" not in answer.text  # nothing of the peer echoed
                assert answer.json()["detail"].startswith("misdirected request")
                assert answer.headers["connection"] == "close"


def test_a_foreign_host_is_refused_before_its_body_is_read() -> None:
    with serving() as port:
        request = (
            b"POST /v1/kv/set HTTP/1.1\r\nHost: attacker.example\r\n"
            + f"Authorization: {AUTH['Authorization']}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n"
        )
        answer = raw_answer(port, request)  # no body sent: answered and closed all the same
        assert answer.startswith(b"HTTP/1.1 421 "), answer[:200]
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["detail"]


def test_the_drivers_own_names_pass_and_a_request_without_host_too() -> None:
    """HTTP/1.0 has no Host header; a browser always sends one (see docs/security.md)."""
    hostname = socket.gethostname()
    with serving() as port:
        for host in (
            f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LocalHost", "localhost.",
            f"{hostname}:{port}", hostname.upper(), socket.getfqdn(), f"[::1]:{port}",
        ):  # fmt: skip
            answer = ask(port, "/v1/status", host, headers=AUTH)
            assert answer.status_code == 200, (host, answer.text)
            assert ask(port, "/metrics", host).status_code == 200, host
            assert ask(port, "/ui", host).status_code == 200, host
            assert ask(port, "/metrics", f"x{hostname}").status_code == 421  # and no other
        answer = raw_answer(port, b"GET /metrics HTTP/1.0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        answer = raw_answer(port, b"GET /metrics HTTP/1.0\r\nHost: attacker.example\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 421 "), answer[:200]


def ipv6_loopback() -> bool:
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        return True
    return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_literals_with_a_port_pass() -> None:
    with serving("::1") as port:
        for host in (f"[::1]:{port}", "[::1]", "[0:0:0:0:0:0:0:1]", "localhost"):
            answer = ask(port, "/v1/status", host, address="::1", headers=AUTH)
            assert answer.status_code == 200, (host, answer.text)
        for host in ("[::2]", "[::1", "::1", "[::1]:x", "[::1]:99999"):
            assert ask(port, "/metrics", host, address="::1").status_code in (400, 421), host


def test_allowed_hosts_add_names_and_a_star_lets_every_name_pass() -> None:
    with serving(allowed_hosts=("proxy.example", "other.example:8443")) as port:
        assert ask(port, "/metrics", "proxy.example").status_code == 200
        assert ask(port, "/metrics", "Proxy.Example:443").status_code == 200
        assert ask(port, "/metrics", "other.example:8443").status_code == 200
        assert ask(port, "/metrics", "other.example").status_code == 421  # its port only
        assert ask(port, "/metrics", "attacker.example").status_code == 421
        assert ask(port, "/metrics", f"127.0.0.1:{port}").status_code == 200
    with serving(allowed_hosts=("*",)) as port:
        assert ask(port, "/metrics", "attacker.example").status_code == 200


COMMAND = ["python", "train.py"]


def test_the_allowed_hosts_flag_takes_a_list_and_refuses_what_is_not_a_host() -> None:
    flags = ["--allowed-hosts", "proxy.example, [fd00::1]:8443,*", "-np", "1", *COMMAND]
    settings = parse_settings(flags, {})
    assert settings.allowed_hosts == ("proxy.example", "[fd00::1]:8443", "*")
    from_env = parse_settings(["-np", "1", *COMMAND], {"ELASTICRUN_ALLOWED_HOSTS": "a.example"})
    assert from_env.allowed_hosts == ("a.example",)
    assert parse_settings(["-np", "1", *COMMAND], {}).allowed_hosts == ()
    for bad in ("http://proxy.example", "a b", "proxy.example:http", "[fd00::1", "a/b", ","):
        with pytest.raises(UsageError, match="--allowed-hosts"):
            parse_settings(["--allowed-hosts", bad, "-np", "1", *COMMAND], {})


@pytest.mark.parametrize(
    ("bound", "host", "allowed"),
    [
        ("127.0.0.1", "127.0.0.1:5000", True),
        ("127.0.0.1", "localhost", True),
        ("127.0.0.1", "ip6-localhost", True),
        ("127.0.0.1", "127.0.0.2", False),  # loopback, but another name than the bound one
        ("127.0.0.1", "attacker.example", False),
        ("127.0.0.1", "", False),
        ("127.0.0.1", "127.0.0.1:", False),
        ("127.0.0.1", "127.0.0.1:0x50", False),
        ("10.1.2.3", "10.1.2.3:5000", True),
        ("10.1.2.3", "localhost", False),  # not bound to loopback: loopback cannot reach it
        ("10.1.2.3", "myhost.example", True),  # the machine's own name (given below)
        ("10.1.2.3", "MYHOST", True),
        ("fd00::7", "[fd00:0::7]:80", True),
        ("fd00::7", "fd00::7", False),  # an IPv6 literal needs its brackets
        ("::1", "[::1]", True),
        ("::1", "localhost", True),
    ],
)
def test_which_names_a_driver_answers_to(bound: str, host: str, allowed: bool) -> None:
    hosts = AllowedHosts.for_server(bound, machine_names={"myhost", "myhost.example"})
    assert hosts.allows(host.encode()) is allowed


def test_the_address_a_connection_reached_passes_when_bound_to_every_address() -> None:
    hosts = AllowedHosts.for_server("0.0.0.0", machine_names=set())
    assert hosts.allows(b"10.9.8.7:80", local_address="10.9.8.7")
    assert not hosts.allows(b"10.9.8.6", local_address="10.9.8.7")


WORKER = textwrap.dedent(
    """
    import os, urllib.request
    import elastic.torch as hvd

    hvd.init()
    url = os.environ["ELASTIC_DRIVER_URL"] + "/metrics"
    for host in ("proxy.example", "attacker.example"):
        request = urllib.request.Request(url, headers={"Host": host})
        try:
            code = urllib.request.urlopen(request, timeout=10).status
        except urllib.error.HTTPError as err:
            code = err.code
        print(f"rank {hvd.rank()} host {host} status {code}", flush=True)
    hvd.allreduce(__import__("torch").ones(1))
    """
)


def test_a_job_runs_and_its_driver_answers_its_allowed_hosts_only(
    elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    job = elasticrun(["-np", "2", "--allowed-hosts", "proxy.example", sys.executable, str(script)])
    assert job.finish(120) == 0, job.transcript()
    for rank in (0, 1):
        assert f"rank {rank} host proxy.example status 200" in job.output, job.transcript()
        assert f"rank {rank} host attacker.example status 421" in job.output, job.transcript()
