"""Workers' output: tagged by rank on the launcher's stdout/stderr, optionally also to files.

It comes from the worker's pipes (`pump`) or, for a detached worker, from its files (see
`follower.py`).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import BinaryIO, Protocol

from elastic.driver.errors import LaunchError
from elastic.driver.launch.private_files import PRIVATE_DIR, PRIVATE_FILE, open_private, private_dir

CHUNK = 1 << 16  # bytes read at a time; a line longer than this is shown in pieces


def folder_mode(file_mode: int) -> int:
    """The mode of a folder holding files of `file_mode`: an x bit wherever there is an r
    bit (0600 -> 0700, 0640 -> 0750, 0644 -> 0755)."""
    return file_mode | (file_mode & 0o444) >> 2


class LineSink(Protocol):
    """Where one stream of a worker's output goes, a line at a time."""

    def write_line(self, line: bytes) -> None:
        """Show `line` (a newline is added where it has none)."""

    def close(self) -> None:
        """No more lines come."""


class OutputSink(LineSink):
    """Writes one worker's stream to the launcher's (stdout to stdout, stderr to stderr) as
    `shape(line)` makes it (Horovod's `[rank]<stdout>:line`, or a JSON object: see
    `elastic.driver.logs.WorkerLines`) and, with a directory, raw lines to
    `DIR/<name>/<stream>`.

    The file is private unless `mode` says otherwise: created (or re-opened) with `mode`
    (default 0600), in a folder `DIR/<name>` with the matching x bits (0700 for 0600, 0750
    for 0640), `DIR` itself created 0700 when missing. Neither is reached through a symbolic
    link. Raises `LaunchError` (one line) when the folder or the file is a link or another
    user's, or cannot be created.
    """

    def __init__(
        self,
        shape: Callable[[bytes], bytes],
        stream: str,
        directory: str | None,
        name: str,
        mode: int = PRIVATE_FILE,
    ) -> None:
        self._shape = shape
        self._console: BinaryIO = (sys.stdout if stream == "stdout" else sys.stderr).buffer
        self._file: BinaryIO | None = None
        if directory is not None:
            try:
                os.makedirs(directory, PRIVATE_DIR, exist_ok=True)
            except OSError as err:
                raise LaunchError(f"cannot create {directory}: {err.strerror}") from None
            folder = os.path.join(directory, name)
            private_dir(folder, folder_mode(mode))
            fd = open_private(os.path.join(folder, stream), mode=mode)
            self._file = os.fdopen(fd, "ab")

    def write_line(self, line: bytes) -> None:
        if not line.endswith(b"\n"):
            line += b"\n"
        self._console.write(self._shape(line))
        self._console.flush()
        if self._file is not None:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def write_lines(sink: LineSink, data: bytes) -> bytes:
    """Write the complete lines of `data` (and a partial one past 64 KiB); return the rest."""
    *lines, rest = data.split(b"\n")
    for line in lines:
        sink.write_line(line + b"\n")
    if len(rest) > CHUNK:
        sink.write_line(rest)
        rest = b""
    return rest


async def pump(
    reader: asyncio.StreamReader,
    sink: LineSink,
    offset: int = 0,
    at: Callable[[int], None] | None = None,
) -> None:
    """Copy `reader` to `sink` line by line until end of stream; very long lines are split.

    `at(position)` is told, after each read, up to which byte the sink has been given the
    stream, counted from `offset` (the stream's first byte is byte `offset` of the output).
    """
    pending = b""
    position = offset
    try:
        while chunk := await reader.read(CHUNK):
            position += len(chunk)
            pending = write_lines(sink, pending + chunk)
            if at is not None:
                at(position - len(pending))
        if pending:
            sink.write_line(pending)
            if at is not None:
                at(position)
    finally:
        sink.close()
