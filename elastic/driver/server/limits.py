"""What one HTTP request may cost the driver: a bounded body, refused before it is parsed; and
what refusals cost its log: a line a minute at most, for each kind (`LimitLog`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The largest legitimate body is a compare_set with two 4 MiB values, base64 in JSON (~11.2 MiB),
# or a check/wait naming 1024 keys of 1024 characters each; 16 MiB covers both.
MAX_BODY_BYTES = 16 * 1024 * 1024
LOG_EVERY = 60.0  # seconds between two lines about one kind of refusal


class LimitLog:
    """Warnings about refused or closed connections, at most one line per kind of event every
    `every` seconds: the first event of a quiet spell is logged at once, the next ones are
    counted, and the first line after `every` seconds says how many were not logged. A flood
    costs the log a line a minute, never a line (or a traceback) per event."""

    def __init__(
        self,
        logger: logging.Logger,
        every: float = LOG_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._every = every
        self._clock = clock
        self._kinds: dict[str, tuple[float, int]] = {}  # kind: (last line's time, untold)

    def note(self, kind: str, message: str, *args: object) -> None:
        """One event of `kind` (a fixed name, not a peer's address); `message` (%-style with
        `args`) is logged if no line of this kind was in the last `every` seconds."""
        now = self._clock()
        last, untold = self._kinds.get(kind, (float("-inf"), 0))
        if now - last < self._every:
            self._kinds[kind] = (last, untold + 1)
            return
        self._kinds[kind] = (now, 0)
        if untold:
            message += f" ({untold} more since the last such line)"
        self._logger.warning(message, *args)


def refusal(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error answer (`{"detail": ...}`) that also closes the connection: the server then
    drops whatever the peer still sends instead of reading it to find the next request."""
    return JSONResponse(
        {"detail": detail}, status, headers={**(headers or {}), "Connection": "close"}
    )


def _declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, or None when it has none (chunked) or an unreadable one."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimit:
    """Pure ASGI middleware: a request whose body exceeds `max_bytes` gets 413 and is never
    parsed.

    A declared Content-Length over the limit is refused before a byte of the body is read; a
    body without one (chunked) is counted as it arrives and refused as soon as it passes the
    limit. A body within the limit is read whole here and handed to the app, which reads every
    body whole anyway (JSON). A peer that disconnects mid-body gets no answer.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # http.disconnect: nobody is left to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 413 (built only for a refused request: JSON and headers cost every request
        they are built for)."""
        answer = refusal(413, f"request body exceeds {self.max_bytes} bytes")
        await answer(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields the already-read body once, then defers to the server's (which
    then reports the disconnect that long-polling routes may watch for)."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
