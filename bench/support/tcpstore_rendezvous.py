"""The reference a driver's rendezvous is held against: N clients meeting at torch's TCPStore.

    python -m bench.support.tcpstore_rendezvous --sizes 1000,4000,10000

torchrun's c10d rendezvous keeps its state in a `torch.distributed.TCPStore` served by one
agent (libuv backend, the default since torch 2.4). Here the least such a rendezvous does:
every one of N clients adds 1 to a counter key and waits on a barrier key, which the client
whose `add` returns N sets. The server is its own process (`TCPStore(..., is_master=True,
use_libuv=True)`); the N clients are threads (one `TCPStore` client connection each) spread
over `--processes` processes, none of them the server's. Measured, from CLOCK_MONOTONIC
stamps comparable across processes:

* `connect_s`: "connect" sent to every client process (torch already imported) to the last of
  the N clients connected (the `TCPStore(is_master=False)` constructor returned);
* `rendezvous_s`: "go" sent to the last client returning from `wait` on the barrier;
* `total_s`: the two together (a rendezvous from scratch: connect, count in, wait);
* `server_cpu_s`: the server process' CPU time over the connect and rendezvous phases.

torchrun's real rendezvous does more than this (each agent compare-and-sets a state blob that
names every participant, several times per round), so these times are a lower bound on what
it pays.

Reverse DNS: each TCPStore client formats its socket's address with `getnameinfo` (for its
log lines) whether it logs or not. The address is the IPv4-mapped `::ffff:127.0.0.1`, which
this machine's /etc/hosts does not list, so each connection asks the DNS server, which
answers slowly under load: 100 concurrent connections took 10 s instead of milliseconds.
Where `unshare --mount` works (root), the TCPStore processes therefore run in a private mount
namespace whose /etc/hosts also names `::ffff:127.0.0.1` and `::1` (the machine's file is not
touched); `hosts_file` in the result says which way it ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.support.child_processes import child_env, raise_open_files_limit
from bench.support.machine_load import process_cpu_seconds
from bench.support.paths import ROOT

COUNTER_KEY = "rdzv/count"
BARRIER_KEY = "rdzv/barrier"
STORE_TIMEOUT = timedelta(seconds=300)
THREAD_STACK_BYTES = 512 * 1024  # thousands of client threads a process
HOSTS = "127.0.0.1 localhost\n::ffff:127.0.0.1 localhost\n::1 localhost\n"


def say(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


def serve() -> None:
    """The server process: print the port, serve until stdin closes."""
    raise_open_files_limit()
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False,
        timeout=STORE_TIMEOUT,
    )  # fmt: skip
    say({"ev": "serving", "port": store.port})
    sys.stdin.read()


def clients(port: int, count: int, total: int) -> None:
    """A client process: `count` client threads of a rendezvous of `total`; "connect" and
    "go" come on stdin, the times go to stdout."""
    raise_open_files_limit()
    import torch.distributed as dist

    threading.stack_size(THREAD_STACK_BYTES)
    say({"ev": "loaded"})
    sys.stdin.readline()  # "connect"
    lock = threading.Lock()
    connected = 0
    all_connected, go = threading.Event(), threading.Event()
    done = [0.0] * count
    errors: list[str] = []

    def client(index: int) -> None:
        nonlocal connected
        try:
            store = dist.TCPStore(
                "127.0.0.1", port, is_master=False, use_libuv=True, timeout=STORE_TIMEOUT
            )
        except Exception as err:
            store = None
            errors.append(repr(err)[:200])
        with lock:
            connected += 1
            if connected == count:
                all_connected.set()
        if store is None:
            return
        go.wait()
        if store.add(COUNTER_KEY, 1) == total:
            store.set(BARRIER_KEY, "1")
        store.wait([BARRIER_KEY])
        done[index] = time.monotonic()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    all_connected.wait()
    say({"ev": "connected", "t": time.monotonic(), "errors": errors[:3], "failed": len(errors)})
    sys.stdin.readline()  # "go"
    go.set()
    for thread in threads:
        thread.join()
    say({"ev": "done", "t": max(done), "failed": len(errors)})


def private_hosts_prefix(folder: str) -> list[str]:
    """A command prefix that runs a command with /etc/hosts replaced by `HOSTS` in a private
    mount namespace, or [] where `unshare --mount` does not work here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    hosts = Path(folder, "hosts")
    hosts.write_text(HOSTS)
    prefix = [unshare, "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"']
    check = subprocess.run(
        [*prefix, str(hosts), "grep", "-q", "::ffff:127.0.0.1", "/etc/hosts"],
        capture_output=True,
    )
    return [*prefix, str(hosts)] if check.returncode == 0 else []


async def _spawn(prefix: list[str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *prefix, sys.executable, "-m", "bench.support.tcpstore_rendezvous", *args,
        cwd=ROOT, env=child_env(),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _next(process: asyncio.subprocess.Process, event: str, timeout: float) -> dict:
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), timeout)
    if not line:
        raise RuntimeError(f"a TCPStore process exited before {event!r}")
    doc = json.loads(line)
    if doc["ev"] != event:
        raise RuntimeError(f"expected {event!r} from a TCPStore process, got {doc}")
    return doc


async def _phase(
    started: list[asyncio.subprocess.Process], command: bytes, event: str, timeout: float
) -> tuple[float, list[dict]]:
    """Send `command` to every client process: when it was sent, and their answers."""
    sent = time.monotonic()
    for process in started:
        assert process.stdin is not None
        process.stdin.write(command)
    return sent, [await _next(p, event, timeout) for p in started]


async def tcpstore_rendezvous(n: int, processes: int, timeout: float = 300.0) -> dict[str, Any]:
    """One rendezvous of `n` clients in `processes` client processes against a fresh server."""
    record: dict[str, Any] = {"n": n, "client_processes": processes, "ok": False}
    folder = tempfile.mkdtemp(prefix="tcpstore-rendezvous-")
    prefix = private_hosts_prefix(folder)
    record["hosts_file"] = "private, names ::ffff:127.0.0.1" if prefix else "the machine's"
    server = await _spawn(prefix, "--serve")
    started: list[asyncio.subprocess.Process] = []
    try:
        port = (await _next(server, "serving", 60))["port"]
        counts = [n // processes + (i < n % processes) for i in range(processes)]
        for count in counts:
            started.append(await _spawn(prefix, "--clients", str(port), str(count), str(n)))
        for process in started:
            await _next(process, "loaded", 60)
        cpu0 = process_cpu_seconds(server.pid) or 0.0
        t_connect, connected = await _phase(started, b"connect\n", "connected", timeout)
        record["connect_s"] = round(max(d["t"] for d in connected) - t_connect, 4)
        record["failed_connections"] = sum(d["failed"] for d in connected)
        if record["failed_connections"]:
            record["errors"] = [e for d in connected for e in d["errors"]][:3]
        t_go, finished = await _phase(started, b"go\n", "done", timeout)
        record["rendezvous_s"] = round(max(d["t"] for d in finished) - t_go, 4)
        record["total_s"] = round(record["connect_s"] + record["rendezvous_s"], 4)
        record["server_cpu_s"] = round((process_cpu_seconds(server.pid) or 0.0) - cpu0, 3)
        record["ok"] = not record["failed_connections"]
    except Exception as err:
        record["error"] = f"{type(err).__name__}: {err}"
    finally:
        for process in [*started, server]:
            if process.returncode is None:
                process.kill()  # their threads may wait on a barrier that never comes
            await process.wait()
        shutil.rmtree(folder, ignore_errors=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 4000, 10000]
    )
    parser.add_argument("--processes", type=int, default=4, help="client processes")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clients", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
    elif args.clients:
        clients(*args.clients)
    else:
        raise_open_files_limit()
        results = [asyncio.run(tcpstore_rendezvous(n, args.processes)) for n in args.sizes]
        print(json.dumps({"benchmark": "tcpstore_rendezvous", "results": results}, indent=2))


if __name__ == "__main__":
    main()
