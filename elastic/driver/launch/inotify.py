"""Linux inotify through libc (ctypes): one non-blocking descriptor that reports changes to the
files in watched folders, for an event loop's `add_reader`.

Only what following output files needs: watch a folder for files written, created or moved in,
read the queued events without blocking. `Inotify.open()` returns None where the kernel or
libc has no inotify (another OS, a seccomp filter), so callers fall back to polling.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
from dataclasses import dataclass

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000

FILE_CHANGES = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
"""A file in the folder grew, was written and closed, or appeared."""

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len; then `len` bytes of NUL-padded name
_READ_SIZE = 1 << 16


@dataclass(frozen=True)
class Event:
    wd: int
    """The watch it came from; -1 with `IN_Q_OVERFLOW` (events were lost)."""
    mask: int
    name: str
    """The file's name in the watched folder; empty for an event on the folder itself."""


class Inotify:
    """One inotify descriptor (non-blocking, close-on-exec). Not thread-safe."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self._fd = fd

    @classmethod
    def open(cls) -> Inotify | None:
        """A new descriptor, or None where inotify is not available (or its limit reached)."""
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            init = libc.inotify_init1
        except (OSError, AttributeError):
            return None
        init.argtypes = [ctypes.c_int]
        init.restype = ctypes.c_int
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.inotify_rm_watch.restype = ctypes.c_int
        fd = init(_IN_NONBLOCK | _IN_CLOEXEC)
        return cls(libc, fd) if fd >= 0 else None

    def fileno(self) -> int:
        return self._fd

    def watch_folder(self, folder: str, mask: int = FILE_CHANGES) -> int:
        """Watch the files in `folder`; return the watch id (the same one for a folder watched
        already). Raises `OSError`: ENOENT (no such folder), ENOTDIR, ENOSPC (the user's watch
        limit, fs.inotify.max_user_watches, is reached)."""
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), mask | IN_ONLYDIR)
        if wd < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno), folder)
        return wd

    def unwatch(self, wd: int) -> None:
        """Stop watch `wd` (an `IN_IGNORED` event follows); one gone already is no error."""
        self._libc.inotify_rm_watch(self._fd, wd)

    def read_events(self) -> list[Event]:
        """Every event queued now; empty when there is none (never blocks)."""
        events: list[Event] = []
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return events
            if not data:
                return events
            offset = 0
            while offset + _HEADER.size <= len(data):
                wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
                start = offset + _HEADER.size
                raw = data[start : start + length].split(b"\0", 1)[0]
                events.append(Event(wd, mask, os.fsdecode(raw)))
                offset = start + length

    def close(self) -> None:
        """Close the descriptor (every watch ends with it). Idempotent."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)
