"""Hostile clients of a running driver's ports, for `bench/abuse.py` and
`tests/e2e/elastic/test_abuse.py`.

Each long-running client runs in a process of its own (`Hostile` starts one), so that the
measuring process is not starved by it, and ends by itself after `--seconds` (or at SIGTERM),
printing one JSON line that says what it did:

    python -m bench.support.abuse_probes flood --host 127.0.0.1 --port P --seconds 60
    python -m bench.support.abuse_probes silent --host 127.0.0.1 --port P --count 2000 \
        --seconds 60
    python -m bench.support.abuse_probes slow-bodies --host 127.0.0.1 --port P --count 500 \
        --seconds 60

* `flood`: one connection at a time sends 64 KiB buffers of junk heartbeat frames as fast as
  the kernel takes them (a blocking `sendall` in a loop: Python's cost per 64 KiB is far below
  the driver's cost to read it); a connection the driver closes is reopened at once.
* `silent`: holds `--count` connections that never send a byte; those the driver closes are
  reopened once a second. Whatever the driver sends is read and dropped.
* `slow-bodies`: holds `--count` unauthenticated `POST /ui/login` requests whose head is whole
  and whose body (`Content-Length` 200) comes one byte per connection every `--every` seconds;
  those the driver closes or answers are reopened once a second.

The clients connect from loopback addresses other than the workers' 127.0.0.1: 127.0.0.2 and
up, `--sources` of them in turn, as hostile peers on other machines would (a driver that counts
connections per peer sees `--sources` peers). The one-shot probes (`oversized_frame`,
`cut_frame`, `slow_body`, `grpc_garbage`, `foreign_host`) each open one connection and say what
the driver did with it. `driver_ports` finds a running driver's three ports from /proc.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.support.paths import ROOT

JUNK_FRAME = struct.pack("!H", 4096) + b"J" * 4096  # a whole frame of an unknown kind
FLOOD_BUFFER = JUNK_FRAME * 16  # 64 KiB and a little
BODY_LENGTH = 200  # the slow bodies' Content-Length: a login form's size, never completed
TOP_UP_EVERY = 1.0  # seconds between two reopenings of what the driver closed
ONE_SHOT_SOURCE = "127.0.0.250"  # the one-shot probes' address: apart from the clients'
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def source_address(k: int) -> str:
    """The `k`-th hostile source address (k = 0, 1, ...): 127.0.0.2, 127.0.0.3, ..."""
    return f"127.0.{(k + 2) // 256}.{(k + 2) % 256}"


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; return the new one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# --- where the driver listens ---------------------------------------------------------------


@dataclass(frozen=True)
class DriverPorts:
    """A driver's address and its three ports: the HTTP API, gRPC control, heartbeats."""

    host: str
    http: int
    grpc: int
    beats: int


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process `pid` listens on (IPv4 and IPv6), from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[9]) in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rpartition(":")[2], 16))
    return sorted(ports)


def identify_port(host: str, port: int, timeout: float = 5.0) -> str | None:
    """ "grpc" or "beats" by what the port answers to an HTTP/2 client preface: gRPC its
    SETTINGS frame, the heartbeat port a REFUSED frame (the preface is no frame); else None."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(HTTP2_PREFACE)
            data = b""
            with contextlib.suppress(OSError):
                while len(data) < 9 and (chunk := conn.recv(64)):
                    data += chunk
    except OSError:
        return None
    if len(data) >= 3 and data[2] == ord("R"):
        return "beats"
    if len(data) >= 9 and data[3] == 0x04:  # an HTTP/2 frame of type SETTINGS
        return "grpc"
    return None


def driver_ports(pid: int, api_url: str) -> DriverPorts:
    """The ports of the driver `pid` whose HTTP API is at `api_url`. Raises RuntimeError when
    its gRPC or heartbeat port cannot be told apart."""
    url = urlsplit(api_url)
    assert url.hostname is not None and url.port is not None
    found: dict[str, int] = {}
    for port in listening_ports(pid):
        if port != url.port and (kind := identify_port(url.hostname, port)) is not None:
            found[kind] = port
    if set(found) != {"grpc", "beats"}:
        raise RuntimeError(f"driver {pid}: found {found} among {listening_ports(pid)}")
    return DriverPorts(url.hostname, url.port, found["grpc"], found["beats"])


# --- the long-running clients (each in its own process) ---------------------------------------


class Until:
    """A deadline that SIGTERM brings forward to now."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        signal.signal(signal.SIGTERM, lambda *_: self.stop())

    def stop(self) -> None:
        self.end = time.monotonic()

    def left(self) -> float:
        return self.end - time.monotonic()


def _connect(host: str, port: int, source: str, timeout: float | None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((source, 0))
        sock.settimeout(timeout)
        sock.connect((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def flood(host: str, port: int, seconds: float, source: str) -> dict[str, Any]:
    """Send junk heartbeat frames as fast as the driver takes them, reopening at once."""
    until = Until(seconds)
    sent = connections = closed = refused = 0
    started = time.monotonic()
    while until.left() > 0:
        try:
            sock = _connect(host, port, source, 1.0)
        except OSError:
            refused += 1
            time.sleep(0.01)
            continue
        connections += 1
        sock.settimeout(0.5)  # a driver that stops reading: look at the deadline meanwhile
        with sock:
            while until.left() > 0:
                try:
                    sent += sock.send(FLOOD_BUFFER)
                except TimeoutError:
                    continue
                except OSError:
                    closed += 1
                    break
    elapsed = time.monotonic() - started
    return {
        "kind": "flood",
        "port": port,
        "bytes_sent": sent,
        "mib_per_s": round(sent / elapsed / 2**20, 1),
        "connections": connections,
        "closed_by_driver": closed,
        "connect_failures": refused,
    }


class _Held:
    """Connections a client keeps open (`want` of them), reopened once a second when closed."""

    def __init__(self, host: str, port: int, want: int, sources: int) -> None:
        self.host, self.port, self.want, self.sources = host, port, want, sources
        self.selector = selectors.DefaultSelector()
        self.opened = self.closed = self.failures = self.most_open = 0
        self.answers: Counter[str] = Counter()

    def top_up(self, on_open: Callable[[socket.socket], None] | None = None) -> None:
        while len(self.selector.get_map()) < self.want:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.bind((source_address(self.opened % self.sources), 0))
                if sock.connect_ex((self.host, self.port)) not in (0, 115):  # 115: EINPROGRESS
                    raise OSError("refused")
            except OSError:
                sock.close()
                self.failures += 1
                return  # out of ports or descriptors: try again at the next top-up
            self.opened += 1
            self.selector.register(sock, selectors.EVENT_READ, {"sent": 0})
            if on_open is not None:
                on_open(sock)
        self.most_open = max(self.most_open, len(self.selector.get_map()))

    def read_ready(self, timeout: float) -> None:
        """Read what the driver sent; close what it closed (counting answers by status)."""
        for key, _ in self.selector.select(timeout):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data.startswith(b"HTTP/1."):
                self.answers[data.split(b" ", 2)[1].decode(errors="replace")] += 1
            if not data:
                self.selector.unregister(sock)
                sock.close()
                self.closed += 1

    def close_all(self) -> int:
        still = len(self.selector.get_map())
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.selector.close()
        return still

    def summary(self, kind: str) -> dict[str, Any]:
        return {
            "kind": kind,
            "port": self.port,
            "opened": self.opened,
            "closed_by_driver": self.closed,
            "most_open_at_once": self.most_open,
            "open_failures": self.failures,
            **({"answers": dict(self.answers)} if self.answers else {}),
        }


def silent(host: str, port: int, count: int, seconds: float, sources: int) -> dict[str, Any]:
    """Hold `count` connections that never send anything."""
    until, held = Until(seconds), _Held(host, port, count, sources)
    next_top_up = 0.0
    while until.left() > 0:
        if time.monotonic() >= next_top_up:
            held.top_up()
            next_top_up = time.monotonic() + TOP_UP_EVERY
        held.read_ready(min(0.2, max(0.0, until.left())))
    return {**held.summary("silent"), "open_at_end": held.close_all()}


def slow_bodies(
    host: str, port: int, count: int, seconds: float, sources: int, every: float
) -> dict[str, Any]:
    """Hold `count` login requests whose bodies trickle in a byte per `every` seconds each."""
    head = (
        f"POST /ui/login HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {BODY_LENGTH}\r\n\r\n"
    ).encode()
    body = b"token=" + b"a" * (BODY_LENGTH - 6)
    pending: dict[socket.socket, bytes] = {}  # what is still to send on a just-opened one

    def opened(sock: socket.socket) -> None:
        pending[sock] = head

    until, held = Until(seconds), _Held(host, port, count, sources)
    trickled = 0
    next_top_up = next_byte = 0.0
    while until.left() > 0:
        now = time.monotonic()
        if now >= next_top_up:
            held.top_up(opened)
            next_top_up = now + TOP_UP_EVERY
        if now >= next_byte:  # one byte on every connection, heads first where not yet sent
            for key in list(held.selector.get_map().values()):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                with contextlib.suppress(OSError):
                    if sock in pending:
                        pending[sock] = pending[sock][sock.send(pending[sock]) :]
                        if not pending[sock]:
                            del pending[sock]
                    elif key.data["sent"] < len(body):
                        sent = sock.send(body[key.data["sent"] : key.data["sent"] + 1])
                        key.data["sent"] += sent
                        trickled += sent
            next_byte = now + every
        held.read_ready(min(0.2, max(0.0, until.left())))
        for sock in [s for s in pending if s.fileno() < 0]:
            del pending[sock]
    return {**held.summary("slow-bodies"), "body_bytes_sent": trickled,
            "open_at_end": held.close_all()}  # fmt: skip


class Hostile:
    """One hostile client (`kind`: flood, silent, slow-bodies) in a process of its own, in a
    new session; `result` waits for its JSON line, `kill` ends it by PID."""

    def __init__(self, kind: str, args: list[str]) -> None:
        self.kind = kind
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.support.abuse_probes", kind, *args],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def result(self, timeout: float) -> dict[str, Any]:
        """Its summary once it ended (SIGTERM, then SIGKILL, if it has not within `timeout`
        seconds); `{"kind", "error"}` when it printed none."""
        try:
            out, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                out, err = self.process.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
                out, err = self.process.communicate()
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            return json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            return {"kind": self.kind, "error": f"exit {self.process.returncode}: {tail}"}

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)


def start_abuse(
    ports: DriverPorts, seconds: float, silent_count: int, slow_count: int, sources: int
) -> list[Hostile]:
    """The issue's abuse, for `seconds`: one flood of the heartbeat port, `silent_count` silent
    connections on each port, `slow_count` slow login bodies; each client in its process."""
    common = ["--host", ports.host, "--seconds", str(seconds)]
    many = [*common, "--sources", str(sources)]
    hostiles = [Hostile("flood", [*common, "--port", str(ports.beats)])]
    for port in (ports.http, ports.grpc, ports.beats):
        hostiles.append(
            Hostile("silent", [*many, "--port", str(port), "--count", str(silent_count)])
        )
    if slow_count:
        hostiles.append(Hostile("slow-bodies", [*many, "--port", str(ports.http),
                                                "--count", str(slow_count)]))  # fmt: skip
    return hostiles


# --- one-shot probes ------------------------------------------------------------------------


def seconds_until_closed(sock: socket.socket, timeout: float) -> float | None:
    """Seconds until the peer closed `sock` (what it sent meanwhile is dropped); None if it
    was still open after `timeout`."""
    start = time.monotonic()
    sock.settimeout(0.1)
    while (elapsed := time.monotonic() - start) < timeout:
        try:
            if sock.recv(65536) == b"":
                return elapsed
        except TimeoutError:
            continue
        except OSError:
            return elapsed
    return None


def oversized_frame(host: str, port: int, timeout: float = 5.0) -> float | None:
    """A heartbeat frame claiming 65,535 bytes: seconds until the driver closed it (None: not
    within `timeout`)."""
    with _connect(host, port, ONE_SHOT_SOURCE, timeout) as sock:
        sock.sendall(struct.pack("!H", 0xFFFF) + b"H" * 1000)
        return seconds_until_closed(sock, timeout)


def cut_frame(host: str, port: int, timeout: float) -> float | None:
    """A heartbeat frame cut short (10 of its 4,096 bytes), then silence: seconds until the
    driver closed it (None: not within `timeout`)."""
    with _connect(host, port, ONE_SHOT_SOURCE, timeout) as sock:
        sock.sendall(struct.pack("!H", 4096) + b"H" * 10)
        return seconds_until_closed(sock, timeout)


def slow_body(host: str, port: int, timeout: float, every: float = 1.0) -> float | None:
    """`POST /ui/login` without a token, its head whole and its body one byte every `every`
    seconds: seconds until the driver closed the connection (None: not within `timeout`)."""
    head = (
        f"POST /ui/login HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {BODY_LENGTH}\r\n\r\n"
    ).encode()
    start = time.monotonic()
    with _connect(host, port, ONE_SHOT_SOURCE, timeout) as sock:
        sock.sendall(head)
        while (left := timeout - (time.monotonic() - start)) > 0:
            if seconds_until_closed(sock, min(every, left)) is not None:
                return time.monotonic() - start
            try:
                sock.send(b"a")
            except OSError:
                return time.monotonic() - start
    return None


def grpc_garbage(host: str, port: int, timeout: float = 5.0) -> float | None:
    """64 KiB of junk where gRPC expects its HTTP/2 preface: seconds until closed."""
    with _connect(host, port, ONE_SHOT_SOURCE, timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(os.urandom(65536))
        return seconds_until_closed(sock, timeout)


def foreign_host(host: str, port: int, path: str = "/metrics") -> tuple[int, bytes]:
    """(status, body) of `GET path` naming `attacker.example` in its Host header, as a page
    of another site that pointed its name at the driver (DNS rebinding) would ask."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": "attacker.example"})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["flood", "silent", "slow-bodies"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--sources", type=int, default=1, help="source addresses to spread over")
    parser.add_argument("--every", type=float, default=1.0, help="slow-bodies: s between bytes")
    args = parser.parse_args()
    raise_open_file_limit()
    if args.kind == "flood":
        result = flood(args.host, args.port, args.seconds, source_address(0))
    elif args.kind == "silent":
        result = silent(args.host, args.port, args.count, args.seconds, args.sources)
    else:
        result = slow_bodies(
            args.host, args.port, args.count, args.seconds, args.sources, args.every
        )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
