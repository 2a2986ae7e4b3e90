"""Detached workers' output, copied from their files by one `OutputFollower` for the driver.

A detached worker writes its stdout and stderr to files that outlive the driver (see
`detached.py`); the driver shows them as they grow. One follower owns every followed file:
no task and no open descriptor per file, so 1,000 quiet workers cost the event loop next to
nothing.

How it wakes:
* inotify (Linux): one descriptor, registered with `loop.add_reader`, watches each followed
  file's folder; a change wakes the follower, which reads only the files named.
* polling (no inotify, or a folder that cannot be watched: missing, the watch limit reached):
  one timer `stat`s every such file, every `POLL` s after a change, slowing to `POLL_IDLE` s
  while all stay quiet, and reads only those that grew.
* a writer's end comes with no file event: every `ENDED_EVERY` s the same timer asks each
  file's `ended()`, and drains and closes the files whose writer ended. `poke()` asks at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from elastic.driver.launch.inotify import IN_IGNORED, IN_Q_OVERFLOW, Inotify
from elastic.driver.launch.output import CHUNK, LineSink, write_lines

log = logging.getLogger(__name__)

POLL = 0.05  # seconds between looks at polled files after one changed...
POLL_IDLE = 0.5  # ...growing to this while they all stay quiet
ENDED_EVERY = 0.5  # seconds between checks of which files' writers ended
READ_BUDGET = 16  # chunks read from one file in one turn; the rest in a later turn
FILES_PER_TURN = 128  # files read in one turn of the loop; the rest in the next turns


@dataclass(eq=False)
class _Followed:
    """One followed file and where its copy stands."""

    path: str
    sink: LineSink
    position: int  # the next byte to read
    ended: Callable[[], bool]
    at: Callable[[int], None]
    done: asyncio.Future[None]
    pending: bytes = b""  # read, not yet shown: a partial line
    wd: int | None = None  # the inotify watch of its folder; None while it is polled
    missing_folder: bool = False  # its folder could not be watched because it did not exist
    folder: str = field(init=False)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.folder, self.name = os.path.split(os.path.abspath(self.path))


class OutputFollower:
    """Copies growing files to sinks (the driver's: `OutputSink`s), line by line, for one
    event loop.

    Per file: it may not exist yet (it is waited for); it is read from a given offset;
    complete lines go to the sink (a line longer than 64 KiB in pieces), a partial one is
    held until its newline; `at(offset)` is told, after each read, up to which byte the sink
    has been given the file; once `ended()` holds, the file is read to its end, a partial
    last line is shown and the sink is closed. Writers' lines are shown within `POLL_IDLE`
    s polled, at once with inotify; an end within `ENDED_EVERY` s (at once after `poke`).
    """

    def __init__(
        self,
        *,
        inotify: bool = True,
        poll: float = POLL,
        poll_idle: float = POLL_IDLE,
        ended_every: float = ENDED_EVERY,
    ) -> None:
        """`inotify=False` polls every file (the fallback where inotify is missing)."""
        self._use_inotify = inotify
        self._poll = poll
        self._poll_idle = poll_idle
        self._ended_every = ended_every
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inotify: Inotify | None = None
        self._files: dict[_Followed, None] = {}  # in the order they were added
        self._named: dict[tuple[int, str], list[_Followed]] = {}  # (watch, file name) -> files
        self._watch_users: dict[int, int] = {}  # watch -> how many followed files use it
        self._timer: asyncio.TimerHandle | None = None
        self._interval = poll
        self._next_ended_check = 0.0
        self._again: dict[_Followed, None] = {}  # files to read in the next turns of the loop
        self._again_handle: asyncio.Handle | None = None

    @property
    def mode(self) -> str:
        """How it wakes: "inotify" or "polling"; "idle" before the first `add`."""
        if self._loop is None:
            return "idle"
        return "inotify" if self._inotify is not None else "polling"

    def add(
        self,
        path: str,
        sink: LineSink,
        offset: int,
        ended: Callable[[], bool],
        at: Callable[[int], None],
    ) -> asyncio.Future[None]:
        """Follow `path` from byte `offset` into `sink` until `ended()` holds and the file is
        drained (or, if it never appeared, until `ended()` holds).

        The future returned completes then, after `sink.close()`. Cancelling it stops the
        following and closes the sink (a held partial line is dropped). An error reading the
        file or writing the sink ends this file's following only: the sink is closed and the
        future holds the error. Must be called from the loop's thread, always the same loop.
        """
        loop = self._start()
        entry = _Followed(path, sink, offset, ended, at, loop.create_future())
        entry.done.add_done_callback(lambda _done, entry=entry: self._forget(entry))
        self._files[entry] = None
        self._watch(entry)
        if entry.wd is None:
            self._interval = self._poll  # a new file often has output soon
        self._soon(entry)  # what it holds already (watched first: no change is missed)
        self._arm(self._interval if entry.wd is None else self._ended_every)
        return entry.done

    def poke(self) -> None:
        """Ask every followed file's `ended()` now instead of at the next check (call it when
        a writer is known to have ended), and poll the polled files now."""
        if self._loop is not None and self._files:
            self._next_ended_check = 0.0
            self._arm(0.0)

    async def close(self) -> None:
        """Stop following every file (their futures are cancelled, sinks closed) and release
        the timer and the inotify descriptor. Idempotent; `add` may start again later."""
        for entry in list(self._files):
            self._drop(entry)
            entry.sink.close()
            entry.done.cancel()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._again_handle is not None:
            self._again_handle.cancel()
            self._again_handle = None
        if self._inotify is not None and self._loop is not None:
            self._loop.remove_reader(self._inotify.fileno())
            self._inotify.close()
        self._inotify = None
        self._loop = None

    # --- waking --------------------------------------------------------------------------

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._inotify = Inotify.open() if self._use_inotify else None
            if self._inotify is not None:
                loop.add_reader(self._inotify.fileno(), self._on_events)
            log.debug("following output files by %s", self.mode)
        elif self._loop is not loop:
            raise RuntimeError("an OutputFollower serves one event loop")
        return loop

    def _watch(self, entry: _Followed) -> None:
        """Watch `entry`'s folder; on failure it stays polled."""
        if self._inotify is None:
            return
        try:
            wd = self._inotify.watch_folder(entry.folder)
        except OSError as err:
            entry.missing_folder = err.errno == errno.ENOENT
            if not entry.missing_folder:
                log.debug("polling %s: cannot watch its folder: %s", entry.path, err)
            return
        entry.wd, entry.missing_folder = wd, False
        self._watch_users[wd] = self._watch_users.get(wd, 0) + 1
        self._named.setdefault((wd, entry.name), []).append(entry)

    def _unwatch(self, entry: _Followed) -> None:
        wd, entry.wd = entry.wd, None
        if wd is None:
            return
        named = self._named.get((wd, entry.name), [])
        if entry in named:
            named.remove(entry)
        if not named:
            self._named.pop((wd, entry.name), None)
        users = self._watch_users.get(wd, 0) - 1
        if users > 0:
            self._watch_users[wd] = users
            return
        self._watch_users.pop(wd, None)
        if self._inotify is not None:
            self._inotify.unwatch(wd)

    def _on_events(self) -> None:
        assert self._inotify is not None
        changed: dict[_Followed, None] = {}
        for event in self._inotify.read_events():
            if event.mask & IN_Q_OVERFLOW:  # events were lost: look at every file
                changed.update(self._files)
            elif event.mask & IN_IGNORED:  # the folder went away: poll its files
                self._watch_users.pop(event.wd, None)
                for entry in self._files:
                    if entry.wd == event.wd:
                        self._named.pop((event.wd, entry.name), None)
                        entry.wd = None
                        self._arm(self._poll)
            else:
                changed.update(dict.fromkeys(self._named.get((event.wd, event.name), ())))
        for entry in changed:
            self._soon(entry)

    def _arm(self, delay: float) -> None:
        """Make the timer fire within `delay` s (it may fire sooner)."""
        if self._loop is None or not self._files:
            return
        when = self._loop.time() + delay
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        self._timer = None
        polled = [entry for entry in self._files if entry.wd is None]
        grew = False
        for entry in polled:
            if entry.missing_folder and self._inotify is not None:
                self._watch(entry)  # its folder may exist by now
                if entry.wd is not None:
                    self._soon(entry)
                    continue
            try:
                size = os.stat(entry.path).st_size
            except OSError:
                continue  # not there yet
            if size > entry.position:
                grew = True
                self._soon(entry)
        now = self._loop.time()
        if now >= self._next_ended_check:
            self._next_ended_check = now + self._ended_every
            for entry in list(self._files):
                if not entry.done.done() and entry.ended():
                    self._soon(entry)
        self._interval = self._poll if grew else min(self._interval * 2, self._poll_idle)
        self._arm(self._interval if any(e.wd is None for e in self._files) else self._ended_every)

    def _soon(self, entry: _Followed) -> None:
        self._again[entry] = None
        if self._again_handle is None and self._loop is not None:
            self._again_handle = self._loop.call_soon(self._serve_again)

    def _serve_again(self) -> None:
        """Read up to `FILES_PER_TURN` of the files waiting, so that other callbacks run
        between batches; the rest in the next turn."""
        self._again_handle = None
        entries = list(itertools.islice(self._again, FILES_PER_TURN))
        for entry in entries:
            del self._again[entry]
        if self._again and self._loop is not None:
            self._again_handle = self._loop.call_soon(self._serve_again)
        for entry in entries:
            self._serve(entry)

    # --- copying -------------------------------------------------------------------------

    def _serve(self, entry: _Followed) -> None:
        """Copy what is new in `entry`'s file; finish it when its writer ended and it is
        drained."""
        if entry.done.done():
            return
        try:
            finished = entry.ended()  # asked before reading: nothing written before is missed
            if self._read(entry):
                self._soon(entry)  # more than one turn's worth: the rest in the next turn
                return
            if finished:
                if entry.pending:
                    entry.sink.write_line(entry.pending)
                self._drop(entry)
                entry.sink.close()
                entry.done.set_result(None)
        except Exception as err:  # this file's following ends; the others go on
            self._drop(entry)
            with contextlib.suppress(Exception):
                entry.sink.close()
            entry.done.set_exception(err)

    def _read(self, entry: _Followed) -> bool:
        """Copy up to `READ_BUDGET` chunks; True when the file may hold more."""
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return False  # not there yet
        try:
            for _ in range(READ_BUDGET):
                chunk = os.pread(fd, CHUNK, entry.position)
                if not chunk:
                    return False
                entry.position += len(chunk)
                entry.pending = write_lines(entry.sink, entry.pending + chunk)
                entry.at(entry.position - len(entry.pending))
            return True
        finally:
            os.close(fd)

    def _drop(self, entry: _Followed) -> None:
        """Forget `entry` (its sink and future are the caller's to settle)."""
        self._files.pop(entry, None)
        self._again.pop(entry, None)
        self._unwatch(entry)
        if not self._files and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _forget(self, entry: _Followed) -> None:
        """The future is done: if the caller cancelled it, stop following and close."""
        if entry in self._files:
            self._drop(entry)
            entry.sink.close()
