"""The heartbeat protocol: length-prefixed frames on a plain TCP connection (TLS when the
driver serves TLS) to the port the driver announces on each event stream it accepts.

A worker connects, sends one HELLO (the job token and its worker id), then one BEAT (round,
commit count, newest durable commit it wrote, whether its durable copy is stale, and its
`Activity`: steps, samples, the ages of its round's first step and of its last commits, its
current collective) every heartbeat interval. The driver never answers a beat it takes; it answers
a beat or hello it refuses with one REFUSED frame (a status name, as gRPC's, and details) and
closes the connection: `NOT_FOUND` means the driver counts the worker out. Every frame is a
2-byte big-endian length, then a body whose first byte says its kind.

Heartbeats left gRPC because each message on a gRPC stream cost the driver about 0.17 ms of
CPU (grpc.aio's completion queue, a thread hop per message): 17 % of a core at 1,000 workers
beating once a second. A frame read by an asyncio protocol costs a tenth of that.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from elastic.errors import ElasticError

HELLO = ord("H")
BEAT = ord("B")
REFUSED = ord("R")

MAX_FRAME = 4096  # bytes in one body, at most: a hello is a token and an id
BEAT_PORT_KEY = "elastic-beat-port"  # the event stream's response header naming the port

_LENGTH = struct.Struct("!H")  # before a frame, and before each string in a frame
KIND_BYTES = 16  # a collective's kind is cut to this many bytes
# length, kind, round, commit, durable, stale, then the activity: steps, samples, first step
# age, commit age, durable age, collective number, blocked for, collective kind
_BEAT = struct.Struct(f"!HBqqq?qqdddqd{KIND_BYTES}s")
_BEAT_BODY_LENGTH = _BEAT.size - _LENGTH.size


@dataclass(frozen=True)
class Activity:
    """What a worker is doing, as its heartbeat says. Ages are seconds measured by the
    worker's own clock at the beat (so hosts' clocks need not agree); negative: none."""

    steps: int = 0  # optimizer steps this process has taken
    samples: int = 0  # samples its ElasticSampler recorded as processed
    first_step_age: float = -1.0  # since its first step in its current round
    commit_age: float = -1.0  # since its last commit
    durable_age: float = -1.0  # since its last durable commit was written
    seq: int = 0  # collectives it issued in its current round (the last one's number)
    kind: str = ""  # the last one's kind ("allreduce", "gradients", ...)
    blocked_for: float = -1.0  # how long it has waited in that collective; negative: not


class FrameError(ElasticError, ValueError):
    """Bytes that are no frame of this protocol: too long, an unknown kind, a cut field."""


def _frame(body: bytes) -> bytes:
    if len(body) > MAX_FRAME:
        raise FrameError(f"a frame of {len(body)} bytes is longer than {MAX_FRAME}")
    return _LENGTH.pack(len(body)) + body


def _strings(*values: str) -> bytes:
    out = bytearray()
    for value in values:
        data = value.encode()
        out += _LENGTH.pack(len(data)) + data
    return bytes(out)


def _read_strings(body: bytes, count: int) -> list[str]:
    values, offset = [], 1
    try:
        for _ in range(count):
            (length,) = _LENGTH.unpack_from(body, offset)
            offset += _LENGTH.size
            if offset + length > len(body):
                raise FrameError("a string runs past the end of its frame")
            values.append(body[offset : offset + length].decode())
            offset += length
    except (struct.error, UnicodeDecodeError) as err:
        raise FrameError(f"a malformed frame: {err}") from err
    return values


def hello_frame(token: str, worker_id: str) -> bytes:
    """The first frame of a connection: who beats, with the job's secret."""
    return _frame(bytes([HELLO]) + _strings(token, worker_id))


def beat_frame(
    round_: int,
    commit: int,
    durable: int = 0,
    stale: bool = False,
    activity: Activity = Activity(),
) -> bytes:
    """One heartbeat: the round the worker is in (0 before its first), its commit count, the
    newest commit it wrote durably (0: none), whether its last durable write failed, and
    what it is doing."""
    a = activity
    kind = a.kind.encode()[:KIND_BYTES]
    return _BEAT.pack(
        _BEAT_BODY_LENGTH, BEAT, round_, commit, durable, stale, a.steps, a.samples,
        a.first_step_age, a.commit_age, a.durable_age, a.seq, a.blocked_for, kind,
    )  # fmt: skip


def refused_frame(code: str, details: str) -> bytes:
    """The driver's answer to a frame it refuses, before it closes the connection."""
    return _frame(bytes([REFUSED]) + _strings(code, details[:1024]))


def parse_hello(body: bytes) -> tuple[str, str]:
    """(token, worker id) of a HELLO body."""
    token, worker_id = _read_strings(body, 2)
    return token, worker_id


def parse_beat(body: bytes) -> tuple[int, int, int, bool, Activity]:
    """(round, commit, durable, stale, activity) of a BEAT body."""
    if len(body) != _BEAT_BODY_LENGTH:
        raise FrameError(f"a beat of {len(body)} bytes, not {_BEAT_BODY_LENGTH}")
    fields = _BEAT.unpack(_LENGTH.pack(len(body)) + body)
    round_, commit, durable, stale = fields[2:6]
    steps, samples, first_step, commit_age, durable_age, seq, blocked, kind = fields[6:]
    try:
        name = kind.rstrip(b"\0").decode()
    except UnicodeDecodeError as err:
        raise FrameError(f"a beat's collective kind is not UTF-8: {err}") from err
    activity = Activity(steps, samples, first_step, commit_age, durable_age, seq, name, blocked)
    return round_, commit, durable, stale, activity


def parse_refused(body: bytes) -> tuple[str, str]:
    """(status name, details) of a REFUSED body."""
    code, details = _read_strings(body, 2)
    return code, details


def take_frames(buffer: bytearray) -> list[bytes]:
    """Remove every whole frame from the front of `buffer` and return their bodies (a frame
    cut short stays for the next read). Raises FrameError on a length over `MAX_FRAME` or an
    empty body."""
    bodies = []
    while len(buffer) >= _LENGTH.size:
        (length,) = _LENGTH.unpack_from(buffer)
        if length == 0 or length > MAX_FRAME:
            raise FrameError(f"a frame length of {length} bytes (1 to {MAX_FRAME} allowed)")
        end = _LENGTH.size + length
        if len(buffer) < end:
            break
        bodies.append(bytes(buffer[_LENGTH.size : end]))
        del buffer[:end]
    return bodies
