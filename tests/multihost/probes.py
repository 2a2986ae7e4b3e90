"""Small network programs the bed's tests run inside hosts (standard library only).

probes.py echo ADDRESS PORT          listen; print "ready"; echo every connection's bytes
probes.py connect ADDRESS PORT SECS  print "connected", or the error's class name
probes.py rtt ADDRESS PORT COUNT     COUNT one-byte request/replies to an echo server;
                                     print each round trip in ms, as JSON
probes.py udp ADDRESS PORT COUNT     send COUNT datagrams, one per 0.5 ms
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time


def echo(address: str, port: int) -> None:
    with socket.create_server((address, port)) as server:
        print("ready", flush=True)
        while True:
            conn, _ = server.accept()
            threading.Thread(target=_echo_each, args=(conn,), daemon=True).start()


def _echo_each(conn: socket.socket) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := conn.recv(65536):
            conn.sendall(data)


def connect(address: str, port: int, timeout: float) -> str:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return "connected"
    except OSError as err:
        return type(err).__name__


def round_trips(address: str, port: int, count: int) -> list[float]:
    times = []
    with socket.create_connection((address, port), timeout=10) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            started = time.perf_counter()
            conn.sendall(b"x")
            if conn.recv(1) != b"x":
                raise ConnectionError("the echo server went away")
            times.append((time.perf_counter() - started) * 1000.0)
    return times


def send_datagrams(address: str, port: int, count: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for index in range(count):
            sock.sendto(str(index).encode(), (address, port))
            time.sleep(0.0005)


def main(argv: list[str]) -> None:
    command, address, port = argv[0], argv[1], int(argv[2])
    if command == "echo":
        echo(address, port)
    elif command == "connect":
        print(connect(address, port, float(argv[3])), flush=True)
    elif command == "rtt":
        print(json.dumps(round_trips(address, port, int(argv[3]))), flush=True)
    elif command == "udp":
        send_datagrams(address, port, int(argv[3]))
    else:
        raise SystemExit(f"unknown probe {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
