"""A detached worker on another host as the driver sees it: through ssh sessions to its agent
(`ssh_relay.py` over there), one at a time.

The first session launched the worker, or attaches to one that an earlier driver launched.
A session that ends without the worker's exit (the connection broke, the agent was
signalled) is followed by an attach session that asks for the output from the bytes received
so far: nothing is lost or shown twice. An attach session that brings no header within the
connect timeout (plus `HEADER_GRACE`) ends the watching: the worker is lost, its exit
`UNKNOWN_EXIT`, and one log line names the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from elastic.driver.errors import LaunchError
from elastic.driver.launch.detached import UNKNOWN_EXIT
from elastic.driver.launch.launcher import OUTPUT_LIMIT, Located, WorkerProcess
from elastic.driver.launch.relay_frames import (
    EXIT,
    HEADER,
    STREAMS,
    FrameError,
    frame_line,
    read_frame,
)

log = logging.getLogger("elasticrun")

HEADER_GRACE = 5.0  # seconds for a login and the agent's start, past the connect timeout
REATTACH_PAUSE = 1.0  # seconds between a lost session and the next attach
KILL_CLIENT_AFTER = 2.0  # seconds from KILL to the ssh client's end (a vanished host)
NOISE_KEPT = 20  # lines a session printed outside its frames, kept to explain a failure

OpenAttach = Callable[[dict[str, int], int | None], Awaitable[asyncio.subprocess.Process]]
"""Opens an attach session from these offsets, to this keeper pid (if known)."""


@dataclass
class _Outcome:
    """How one session went."""

    header: dict | None = None
    code: int | None = None  # from the `exit` frame
    noise: list[str] = field(default_factory=list)  # what it printed outside its frames


class RemoteDetachedProcess(WorkerProcess):
    """A detached remote worker, whose output arrives on `stdout`/`stderr` as its files hold
    it, from the offsets given.

    `wait()` returns its exit code: as its keeper recorded it; 128+SIGKILL when `kill()` was
    called and no exit came (the host is gone); `UNKNOWN_EXIT` when it is lost (an attach
    session cannot reach its host). It never raises but `CancelledError`. `terminate()` and
    `kill()` reach its keeper's process group through the current session (or the next one);
    `kill()` also ends that session's ssh client `KILL_CLIENT_AFTER` s later, so a vanished
    host never holds the driver up.
    """

    detached = True

    def __init__(
        self,
        hostname: str,
        attach: OpenAttach,
        *,
        session: asyncio.subprocess.Process | None,
        offsets: Mapping[str, int],
        header_timeout: float,
        located: Located | None = None,
        keeper: int | None = None,
    ) -> None:
        """`session`: the launch session; None to attach first (a restarted driver's
        adoption). `located(keeper pid, folder)` is told where the worker runs over there."""
        self._hostname = hostname
        self._attach = attach
        self._session = session
        self._received = {stream: offsets.get(stream, 0) for stream in STREAMS}
        self._header_timeout = header_timeout
        self._located = located
        self._keeper = keeper
        self._terminated = False
        self._killed = False
        self._unwatched = False
        self._code: int | None = None
        self.stdout = asyncio.StreamReader(limit=OUTPUT_LIMIT)
        self.stderr = asyncio.StreamReader(limit=OUTPUT_LIMIT)
        self._readers = {"stdout": self.stdout, "stderr": self.stderr}
        self._done = asyncio.ensure_future(self._watch())

    @property
    def pid(self) -> int:
        return self._keeper or 0

    @property
    def signal(self) -> int | None:
        code = self._code
        return code - 128 if code is not None and 128 < code < 160 else None

    @property
    def ended_unwatched(self) -> bool:
        return self._unwatched

    async def wait(self) -> int:
        return await asyncio.shield(self._done)

    def terminate(self) -> None:
        if not self._done.done():
            self._terminated = True
            self._tell(b"TERM\n")

    def kill(self) -> None:
        if not self._done.done():
            self._killed = True
            self._tell(b"KILL\n", close=True)
            self._kill_client_later(self._session)

    # --- sessions ------------------------------------------------------------------------

    async def _watch(self) -> int:
        try:
            self._code = await self._sessions()
        except Exception as error:  # a bug here must not leave the worker unwatched for good
            log.error("watching the worker on host %s failed: %r", self._hostname, error)
            self._code = UNKNOWN_EXIT
        finally:
            for reader in self._readers.values():
                reader.feed_eof()
        return self._code

    async def _sessions(self) -> int:
        """One session after another until the worker's end is known; its exit code."""
        session, attaching, first = self._session, self._session is None, True
        while True:
            if session is None:
                try:
                    session = await self._attach(dict(self._received), self._keeper)
                except LaunchError as error:
                    return self._lost(str(error))
                self._session = session
                self._greet(session)
            timeout = self._header_timeout if attaching else None
            outcome = await self._serve(session, timeout, adopting=attaching and first)
            first = False
            if outcome.code is not None:
                return outcome.code
            if outcome.header is None:
                if attaching:
                    return self._lost(outcome.noise[-1] if outcome.noise else "no answer")
                for line in outcome.noise:
                    log.error("host %s: %s", self._hostname, line)
                returned = await session.wait()
                return 128 - returned if returned < 0 else returned
            if self._killed:
                return 128 + signal.SIGKILL
            log.warning(
                "lost the ssh session to the worker on host %s; attaching to it again",
                self._hostname,
            )
            await asyncio.sleep(REATTACH_PAUSE)
            if self._killed:
                return 128 + signal.SIGKILL
            session, attaching = None, True

    def _lost(self, why: str) -> int:
        log.error(
            "host %s cannot be reached through ssh (%s): its worker is lost", self._hostname, why
        )
        return UNKNOWN_EXIT

    async def _serve(
        self, session: asyncio.subprocess.Process, timeout: float | None, adopting: bool
    ) -> _Outcome:
        """Relay `session` until it ends; what it brought. `timeout` bounds the wait for its
        header (the ssh client is killed then)."""
        assert session.stdout is not None and session.stderr is not None
        outcome = _Outcome()
        noise = asyncio.ensure_future(self._read_noise(session.stderr, outcome))
        try:
            outcome.header = await asyncio.wait_for(
                self._read_header(session.stdout, outcome), timeout
            )
        except (TimeoutError, FrameError, ValueError):  # ValueError: a line over the limit
            self._kill_client(session)
        if outcome.header is not None:
            self._learn(outcome.header, adopting)
            try:
                outcome.code = await self._relay(session.stdout)
            except FrameError as error:
                log.warning("host %s: a broken relay: %s", self._hostname, error)
                self._kill_client(session)
        await session.wait()
        await noise
        return outcome

    async def _read_header(self, reader: asyncio.StreamReader, outcome: _Outcome) -> dict | None:
        """The header frame; lines before it (a login's chatter) are noise. None at the end
        of the stream. Raises `FrameError` when another frame comes first."""
        while line := await reader.readline():
            found = frame_line(line)
            if found is None:
                self._note(outcome, line)
                continue
            kind, length = found
            if kind != HEADER:
                raise FrameError(f"a {kind} frame before the header")
            try:
                header = json.loads(await reader.readexactly(length))
            except (asyncio.IncompleteReadError, ValueError):
                raise FrameError("a broken header") from None
            if not isinstance(header, dict):
                raise FrameError("a header that is no JSON object")
            return header
        return None

    async def _relay(self, reader: asyncio.StreamReader) -> int | None:
        """Feed the output frames to `stdout`/`stderr`; the `exit` frame's code, or None
        when the session ended without one."""
        while (frame := await read_frame(reader)) is not None:
            kind, data = frame
            if kind == EXIT:
                return int(data)
            if kind in self._readers:
                self._readers[kind].feed_data(data)
                self._received[kind] += len(data)
        return None

    async def _read_noise(self, reader: asyncio.StreamReader, outcome: _Outcome) -> None:
        """Lines on the session's stderr (ssh's errors, the agent's): kept, and logged once a
        header came (before it, they may explain a failure: the caller decides)."""
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # a line over the limit: skip it
                continue
            if not line:
                return
            if outcome.header is not None:
                log.warning("host %s: %s", self._hostname, line.decode(errors="replace").rstrip())
            else:
                self._note(outcome, line)

    @staticmethod
    def _note(outcome: _Outcome, line: bytes) -> None:
        outcome.noise = [
            *outcome.noise[-(NOISE_KEPT - 1) :],
            line.decode(errors="replace").rstrip(),
        ]

    def _learn(self, header: dict, adopting: bool) -> None:
        """Take the header in: the keeper and folder, strays the agent stopped, and (for a
        restarted driver's first look) whether the worker ended while no driver watched."""
        keeper, folder = header.get("keeper"), header.get("folder")
        if isinstance(keeper, int) and keeper > 0:
            self._keeper = keeper
            if self._located is not None and isinstance(folder, str):
                self._located(keeper, folder)
        if adopting and not header.get("running", True):
            self._unwatched = True
        for replaced in header.get("replaced", []):
            log.warning(
                "stopped %s on host %s: it still held the slot of the new worker (counted "
                "out while cut off from this driver)",
                os.path.basename(replaced),
                self._hostname,
            )
        for stray in header.get("stopped", []):
            log.warning(
                "stopped %s on host %s: the earlier driver launched it after its last save, "
                "or it was a standby (standbys end with their driver)",
                os.path.basename(stray),
                self._hostname,
            )

    # --- signals -------------------------------------------------------------------------

    def _tell(self, line: bytes, close: bool = False) -> None:
        """Write `line` to the current session's agent (a later session is told in
        `_greet`)."""
        session = self._session
        stdin = session.stdin if session is not None else None
        if stdin is None or stdin.is_closing():
            return
        with contextlib.suppress(OSError, RuntimeError):
            stdin.write(line)
            if close:
                stdin.close()

    def _greet(self, session: asyncio.subprocess.Process) -> None:
        """Tell a new session what earlier ones were told."""
        if self._killed:
            self._tell(b"KILL\n", close=True)
            self._kill_client_later(session)
        elif self._terminated:
            self._tell(b"TERM\n")

    def _kill_client_later(self, session: asyncio.subprocess.Process | None) -> None:
        if session is not None:
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to schedule on
                asyncio.get_running_loop().call_later(KILL_CLIENT_AFTER, self._kill_client, session)

    @staticmethod
    def _kill_client(session: asyncio.subprocess.Process) -> None:
        if session.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                session.kill()
