"""What a heartbeat costs the driver: a unary `Heartbeat` call against a message on an open
`Heartbeats` stream.

    python -m bench.heartbeat_transport --workers 1000 --interval 1 --out FILE

The real control service (`ControlServer`, its token check included) runs in a process of its
own with a listener that only counts; N simulated workers in `--client-processes` other
processes (grpc.aio, one channel and connection each, the worker's channel options) send a
heartbeat every `--interval` s, spread evenly over the interval, by one transport per trial:

* `unary`: one `Heartbeat` call per heartbeat (the old path);
* `stream`: one `Heartbeats` stream per worker, one message per heartbeat (the new path);
* `open`: the streams open and no message: the cost of holding N connections (keep-alive).

After `--settle` s, the server's CPU time over `--seconds` s: `server_cpu_pct` (of one core)
and `us_per_heartbeat` (CPU time divided by the heartbeats counted in the window). JSON to
stdout or `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

# ruff: noqa: E402 - after the path fix above
from bench.provenance import git_state
from bench.simulated import child_env, raise_open_files_limit

TOKEN = "heartbeat-transport-bench"
MODES = ("unary", "stream", "open")


class CountingListener:
    """A `WorkerListener` that knows every worker and counts heartbeats."""

    def __init__(self) -> None:
        self.heartbeats = 0

    def registered(self, worker_id: str, pid: int) -> bool:
        return True

    def heartbeat(self, worker_id: str, epoch: int, commit: int) -> bool:
        self.heartbeats += 1
        return True

    def leave(self, worker_id: str, reason: str, commit: int) -> bool:
        return True

    def stream_opened(self, worker_id: str) -> asyncio.Queue[Any] | None:
        return asyncio.Queue()

    def stream_closed(self, worker_id: str, queue: asyncio.Queue[Any]) -> None:
        return None


async def serve() -> None:
    """The server process: prints its port, then answers each line on stdin with its CPU
    seconds and the heartbeats counted so far."""
    from elastic.driver.control.server import ControlServer

    raise_open_files_limit()
    listener = CountingListener()
    server = ControlServer(listener, TOKEN, "127.0.0.1")
    await server.start()
    print(server.port, flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime
        print(json.dumps({"cpu": cpu, "heartbeats": listener.heartbeats}), flush=True)
    await server.stop(0)


async def clients(
    port: int, first: int, count: int, mode: str, interval: float, dur: float
) -> None:
    """`count` workers (ids from `first`) sending heartbeats by `mode` for `dur` seconds."""
    import grpc
    from grpc import aio

    from elastic.protocol import control_pb2 as pb
    from elastic.protocol import control_pb2_grpc as pb_grpc
    from elastic.worker.control import _CHANNEL_OPTIONS

    raise_open_files_limit()
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    end = time.monotonic() + dur

    async def worker(index: int) -> None:
        channel = aio.insecure_channel(
            f"127.0.0.1:{port}", options=[*_CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        )
        stub = pb_grpc.ControlStub(channel)
        request = pb.HeartbeatRequest(worker_id=f"w{first + index}", epoch=1)
        await asyncio.sleep(interval * index / count)  # spread over the interval
        call = stub.Heartbeats(metadata=metadata) if mode != "unary" else None
        while (left := end - time.monotonic()) > 0:
            try:
                if mode == "unary":
                    await stub.Heartbeat(request, metadata=metadata, timeout=5)
                elif call is not None and mode == "stream":
                    await call.write(request)
            except grpc.aio.AioRpcError:  # a heartbeat lost (counted by its absence)
                if call is not None:
                    call = stub.Heartbeats(metadata=metadata)
            await asyncio.sleep(min(interval, left))
        if call is not None:
            call.cancel()
        await channel.close()

    await asyncio.gather(*(worker(i) for i in range(count)))


def trial(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """One transport: start the server and the clients, measure the window, stop them."""
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.heartbeat_transport", "--serve"],
        cwd=ROOT, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None
    try:
        port = int(server.stdout.readline())
        per_process = args.workers // args.client_processes
        duration = args.settle + args.seconds + 2.0
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.heartbeat_transport",
                    "--clients",
                    str(port),
                    str(i * per_process),
                    str(per_process),
                    mode,
                    str(args.interval),
                    str(duration),
                ],
                cwd=ROOT,
                env=child_env(),
            )  # fmt: skip
            for i in range(args.client_processes)
        ]

        def sample() -> dict[str, Any]:
            server.stdin.write("\n")  # type: ignore[union-attr]
            server.stdin.flush()  # type: ignore[union-attr]
            return {**json.loads(server.stdout.readline()), "t": time.monotonic()}  # type: ignore[union-attr]

        time.sleep(args.settle)
        before = sample()
        time.sleep(args.seconds)
        after = sample()
        for process in workers:
            process.wait(60)
    finally:
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    elapsed = after["t"] - before["t"]
    cpu = after["cpu"] - before["cpu"]
    beats = after["heartbeats"] - before["heartbeats"]
    return {
        "mode": mode,
        "workers": per_process * args.client_processes,
        "heartbeats_per_s": round(beats / elapsed, 1),
        "server_cpu_pct": round(100 * cpu / elapsed, 1),
        "us_per_heartbeat": round(1e6 * cpu / beats) if beats else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between heartbeats")
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--out", metavar="FILE")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clients", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve())
        return
    if args.clients:
        port, first, count, mode, interval, dur = args.clients
        asyncio.run(clients(int(port), int(first), int(count), mode, float(interval), float(dur)))
        return
    import grpc

    results = [trial(args, mode) for mode in args.modes]
    doc = {
        "benchmark": "heartbeat_transport",
        "command": " ".join(["python -m bench.heartbeat_transport", *sys.argv[1:]]),
        "python": sys.version.split()[0],
        "grpcio": grpc.__version__,
        "cpus": os.cpu_count(),
        "git": git_state(),
        "interval_s": args.interval,
        "window_s": args.seconds,
        "results": results,
    }
    text = json.dumps(doc, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    for r in results:
        print(
            f"{r['mode']:>6}: {r['heartbeats_per_s']} heartbeats/s, server CPU "
            f"{r['server_cpu_pct']} %, {r['us_per_heartbeat']} us a heartbeat",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
