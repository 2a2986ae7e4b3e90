"""What a detached remote worker's ssh agent sends the driver on its stdout: frames.

The worker's stdout and stderr travel on one pipe, exact to the byte (the driver counts the
bytes it has shown of each, so a restarted driver asks for the rest), between a header and
the worker's exit. Anything else the session prints (ssh's errors, the agent's own) comes on
its stderr, outside the worker's output.

A frame is one ASCII line `KIND LENGTH` and then LENGTH bytes. Kinds:
  header  first: JSON `{"keeper": pid or null, "folder": path, "running": bool,
          "stopped": [folders]}`: the keeper, the worker's folder on its host, whether the
          keeper still ran, the stray keepers the agent stopped;
  stdout, stderr  the next bytes of that output file;
  exit    last: the worker's exit code, in decimal (128+N when signal N ended it).
A session that ends without `exit` lost its relay (the driver went away, the connection
broke), not its worker.
"""

from __future__ import annotations

import asyncio
import os

from elastic.errors import ElasticError

HEADER = "header"
EXIT = "exit"
STREAMS = ("stdout", "stderr")
KINDS = frozenset((HEADER, EXIT, *STREAMS))
MAX_FRAME = 1 << 20  # bytes: the agent sends output lines of 128 KiB at most


class FrameError(ElasticError):
    """Bytes that are no frame where one was due: the relay is broken."""


def encode(kind: str, data: bytes) -> bytes:
    return f"{kind} {len(data)}\n".encode() + data


def frame_line(line: bytes) -> tuple[str, int] | None:
    """The kind and length a frame's first line gives; None if `line` is no frame line."""
    kind, _, length = line.rstrip(b"\n").decode("ascii", "replace").partition(" ")
    if kind not in KINDS or not length.isdigit() or int(length) > MAX_FRAME:
        return None
    return kind, int(length)


async def read_frame(reader: asyncio.StreamReader) -> tuple[str, bytes] | None:
    """The next frame; None at the end of the stream. Raises `FrameError` on a line that is
    no frame line or a truncated frame."""
    try:
        line = await reader.readline()
    except ValueError:  # a line over the reader's limit
        raise FrameError("a line too long for a frame") from None
    if not line:
        return None
    found = frame_line(line)
    if found is None:
        raise FrameError(f"not a frame: {line[:80]!r}")
    kind, length = found
    try:
        return kind, await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise FrameError(f"a {kind} frame cut short") from None


class FrameWriter:
    """Writes frames to a blocking file descriptor (the agent's stdout), each whole.

    Raises `OSError` (BrokenPipeError once the driver's end is gone)."""

    def __init__(self, fd: int = 1) -> None:
        self._fd = fd

    def write(self, kind: str, data: bytes) -> None:
        view = memoryview(encode(kind, data))
        while view:
            view = view[os.write(self._fd, view) :]
