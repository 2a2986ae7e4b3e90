"""What a heartbeat costs the driver: a beat frame on the heartbeat port against a message on
an open gRPC client stream (the path heartbeats took before).

    python -m bench run heartbeat_transport --workers 1000 --interval 1 --out FILE

One server process runs, in every mode, both of these on one event loop, each with a listener
that only counts:

* the real control service (`ControlServer`), and so its real heartbeat port (`BeatServer`,
  `elastic.protocol.beats`: a hello with the job token, then beat frames, checked and reported
  to the listener's `heartbeat` as the driver does);
* the peer: a grpc.aio server with the control service's options and token interceptor
  (its own `SERVER_OPTIONS` and `TokenCheck`) serving one client-streaming method itself (the
  `Heartbeats` RPC is gone from protos/control.proto): each message, raw bytes (round and
  commit as two big-endian int64, then the worker id), is reported to the listener through the
  control service's `refusal` as the removed handler did.

N simulated workers in `--client-processes` other processes (asyncio) each send a heartbeat
every `--interval` s, spread evenly over the interval, by one transport per trial:

* `beats`: one TCP connection to `beat_port` per worker, a `hello_frame` once, then one
  `beat_frame` per heartbeat (the driver's path now);
* `grpc-stream`: one grpc.aio channel per worker (the worker's channel options and its own
  subchannel pool, so its own connection), one stream on it, one message per heartbeat (the
  path before);
* `open`: the connections of `beats` opened and the hello sent, but no beats: the cost of
  holding N idle connections.

After `--settle` s, the server process' CPU time (all its threads) is read over `--seconds` s:
`server_cpu_pct` (of one core) and `us_per_heartbeat` (that CPU time over the heartbeats the
listener counted in the window). `ratio`: grpc-stream's `us_per_heartbeat` over beats'.
`client_errors`: connections or streams that failed or were refused (their heartbeats are
missing from the count). JSON to stdout or `--out`; a summary line per mode to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.support.child_processes import child_env, raise_open_files_limit
from bench.support.paths import ROOT
from bench.support.provenance import command_line, git_state

TOKEN = "heartbeat-transport-bench"
MODES = ("beats", "grpc-stream", "open")
HOST = "127.0.0.1"
# The peer's client-streaming method, served by a generic handler (no proto).
STREAM_METHOD = "/bench.HeartbeatTransport/Heartbeats"
_STREAM_BEAT = struct.Struct("!qq")  # a stream message: round, commit, then the worker id
ROUND, COMMIT = 1, 0  # what every simulated worker reports


class CountingListener:
    """A `WorkerListener` that knows every worker and counts heartbeats."""

    def __init__(self) -> None:
        self.heartbeats = 0

    def registered(self, worker_id: str, pid: int) -> bool:
        return True

    def heartbeat(self, worker_id: str, epoch: int, commit: int, *more: object) -> bool:
        self.heartbeats += 1
        return True

    def leave(self, worker_id: str, reason: str, commit: int) -> bool:
        return True

    def unreachable(self, worker_id: str, round: int, ranks: frozenset[int]) -> bool:
        return True

    def stream_opened(self, worker_id: str) -> asyncio.Queue[Any] | None:
        return asyncio.Queue()

    def stream_closed(self, worker_id: str, queue: asyncio.Queue[Any]) -> None:
        return None


async def start_stream_server(listener: CountingListener) -> tuple[Any, int]:
    """The peer: a grpc.aio server as the control service's (options, token check) with one
    client-streaming heartbeat method. Returns the started server and its port."""
    import grpc
    from grpc import aio

    from elastic.driver.control.refusals import refusal
    from elastic.driver.control.server import SERVER_OPTIONS, TokenCheck

    async def heartbeats(
        requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]
    ) -> bytes:
        """As the removed `Heartbeats` handler: headers at once, then each message reported
        until the worker half-closes or a message is refused."""
        await context.send_initial_metadata(())
        heartbeat = listener.heartbeat
        async for message in requests:
            round_, commit = _STREAM_BEAT.unpack_from(message)
            worker_id = message[_STREAM_BEAT.size :].decode()
            refused = refusal(worker_id, heartbeat, worker_id, round_, commit)
            if refused is not None:
                await context.abort(*refused)
        return b""

    service, _, method = STREAM_METHOD[1:].partition("/")
    handler = grpc.stream_unary_rpc_method_handler(heartbeats)  # raw bytes both ways
    server = aio.server(interceptors=[TokenCheck(TOKEN)], options=list(SERVER_OPTIONS))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )
    port = server.add_insecure_port(f"{HOST}:0")
    await server.start()
    return server, port


async def serve() -> None:
    """The server process: prints its ports (a JSON line), then answers each line on stdin
    with its CPU seconds and the heartbeats counted so far."""
    from elastic.driver.control.server import ControlServer

    raise_open_files_limit()
    listener = CountingListener()
    control = ControlServer(listener, TOKEN, HOST)
    await control.start()
    stream_server, stream_port = await start_stream_server(listener)
    ports = {"control": control.port, "beats": control.beat_port, "grpc-stream": stream_port}
    print(json.dumps(ports), flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime
        print(json.dumps({"cpu": cpu, "heartbeats": listener.heartbeats}), flush=True)
    await stream_server.stop(0)
    await control.stop(0)


async def beat_clients(
    port: int, ids: list[str], beating: bool, interval: float, end: float
) -> tuple[int, int]:
    """Workers `ids` on the heartbeat port: connect and say hello, then (`beating`) one beat
    each per `interval` until `end`. Returns (beats sent, connections failed or refused)."""
    from elastic.protocol.beats import beat_frame, hello_frame

    beat = beat_frame(ROUND, COMMIT)

    async def connect(worker_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.write(hello_frame(TOKEN, worker_id))
        return reader, writer

    opened = await asyncio.gather(*(connect(i) for i in ids), return_exceptions=True)
    start = time.monotonic()

    async def worker(index: int, writer: asyncio.StreamWriter) -> int:
        sent = 0
        next_beat = start + interval * index / len(ids)  # spread over the interval
        while beating and next_beat < end and not writer.is_closing():
            await asyncio.sleep(max(0.0, next_beat - time.monotonic()))
            writer.write(beat)
            sent += 1
            next_beat += interval
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        return sent

    async def healthy(reader: asyncio.StreamReader) -> bool:
        """Whether the driver kept quiet: it only ever writes a refusal, then closes."""
        with contextlib.suppress(OSError):
            try:
                await asyncio.wait_for(reader.read(1), 0.05)  # a refusal's first byte, or EOF
            except TimeoutError:
                return True
        return False

    live = [(i, pair) for i, pair in enumerate(opened) if not isinstance(pair, BaseException)]
    sent = await asyncio.gather(*(worker(i, writer) for i, (_, writer) in live))
    checks = await asyncio.gather(*(healthy(reader) for _, (reader, _) in live))
    for _, (_, writer) in live:
        writer.close()
    return sum(sent), len(ids) - len(live) + checks.count(False)


async def stream_clients(port: int, ids: list[str], interval: float, end: float) -> tuple[int, int]:
    """Workers `ids` each on its own grpc.aio channel, one message per `interval` on one
    client stream until `end`. Returns (messages sent, streams that failed)."""
    from grpc import aio

    from elastic.worker.driver_link.control_client import CHANNEL_OPTIONS

    metadata = (("authorization", f"Bearer {TOKEN}"),)
    options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    channels = [aio.insecure_channel(f"{HOST}:{port}", options=options) for _ in ids]
    errors = 0

    async def open_stream(channel: aio.Channel) -> Any:
        call = channel.stream_unary(STREAM_METHOD)(metadata=metadata)  # raw bytes both ways
        await call.wait_for_connection()
        return call

    calls = await asyncio.gather(*(open_stream(c) for c in channels), return_exceptions=True)
    start = time.monotonic()

    async def worker(index: int, call: Any) -> int:
        nonlocal errors
        message = _STREAM_BEAT.pack(ROUND, COMMIT) + ids[index].encode()
        sent = 0
        next_beat = start + interval * index / len(ids)  # spread over the interval
        while next_beat < end:
            await asyncio.sleep(max(0.0, next_beat - time.monotonic()))
            try:
                await call.write(message)
                sent += 1
            except (aio.AioRpcError, asyncio.InvalidStateError):  # lost: counted by absence
                errors += 1
                call.cancel()
                call = channels[index].stream_unary(STREAM_METHOD)(metadata=metadata)
            next_beat += interval
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        call.cancel()
        return sent

    live = [(i, call) for i, call in enumerate(calls) if not isinstance(call, BaseException)]
    errors += len(ids) - len(live)
    sent = await asyncio.gather(*(worker(i, call) for i, call in live))
    for channel in channels:
        await channel.close()
    return sum(sent), errors


async def clients(
    port: int, first: int, count: int, mode: str, interval: float, dur: float
) -> None:
    """`count` workers (ids from `first`) sending heartbeats by `mode` for `dur` seconds;
    prints {"sent", "errors"} as a JSON line when done."""
    raise_open_files_limit()
    ids = [f"w{first + i}" for i in range(count)]
    end = time.monotonic() + dur
    if mode == "grpc-stream":
        sent, errors = await stream_clients(port, ids, interval, end)
    else:
        sent, errors = await beat_clients(port, ids, mode == "beats", interval, end)
    print(json.dumps({"sent": sent, "errors": errors}), flush=True)


def trial(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """One transport: start the server and the clients, measure the window, stop them."""
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.heartbeat_transport", "--serve"],
        cwd=ROOT, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None
    stdin, stdout = server.stdin, server.stdout
    workers: list[subprocess.Popen[str]] = []
    try:
        port = json.loads(stdout.readline())["grpc-stream" if mode == "grpc-stream" else "beats"]
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
                stdout=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for i in range(args.client_processes)
        ]

        def sample() -> dict[str, Any]:
            stdin.write("\n")
            stdin.flush()
            return {**json.loads(stdout.readline()), "t": time.monotonic()}

        time.sleep(args.settle)
        before = sample()
        time.sleep(args.seconds)
        after = sample()
        reports = [json.loads(process.communicate(timeout=60)[0] or "{}") for process in workers]
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
                process.wait()
        stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    elapsed = after["t"] - before["t"]
    cpu = after["cpu"] - before["cpu"]
    beats = after["heartbeats"] - before["heartbeats"]
    workers_run = per_process * args.client_processes
    expected = 0.0 if mode == "open" else round(workers_run / args.interval, 1)
    return {
        "mode": mode,
        "workers": workers_run,
        "expected_heartbeats_per_s": expected,
        "heartbeats_per_s": round(beats / elapsed, 1),
        "server_cpu_pct": round(100 * cpu / elapsed, 2),
        "us_per_heartbeat": round(1e6 * cpu / beats, 1) if beats else None,
        "client_errors": sum(r.get("errors", per_process) for r in reports),
    }


def ratio(results: list[dict[str, Any]]) -> float | None:
    """grpc-stream's CPU a heartbeat over beats' (None unless both ran and counted some)."""
    cost = {r["mode"]: r["us_per_heartbeat"] for r in results}
    stream, beats = cost.get("grpc-stream"), cost.get("beats")
    return round(stream / beats, 2) if stream and beats else None


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with `argv` (this process' arguments when None)."""
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
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve())
        return
    if args.clients:
        port, first, count, mode, interval, dur = args.clients
        asyncio.run(clients(int(port), int(first), int(count), mode, float(interval), float(dur)))
        return
    if unknown := [mode for mode in args.modes if mode not in MODES]:
        parser.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    import grpc

    results = [trial(args, mode) for mode in args.modes]
    doc = {
        "benchmark": "heartbeat_transport",
        "command": command_line("heartbeat_transport", argv),
        "python": sys.version.split()[0],
        "grpcio": grpc.__version__,
        "cpus": os.cpu_count(),
        "git": git_state(),
        "interval_s": args.interval,
        "window_s": args.seconds,
        "results": results,
        "ratio": ratio(results),
    }
    text = json.dumps(doc, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    for r in results:
        print(
            f"{r['mode']:>11}: {r['heartbeats_per_s']} heartbeats/s, server CPU "
            f"{r['server_cpu_pct']} %, {r['us_per_heartbeat']} us a heartbeat, "
            f"{r['client_errors']} client errors",
            file=sys.stderr,
        )
    if doc["ratio"] is not None:
        print(f"      ratio: grpc-stream / beats = {doc['ratio']}", file=sys.stderr)


if __name__ == "__main__":
    main()
