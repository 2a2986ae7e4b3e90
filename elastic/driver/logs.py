"""The launcher's lines: for people, with a timestamp; for machines, one JSON object a line.

Two formats (`--log-format`):

* `text`: `2026-11-24 17:50:01.123Z elasticrun: round 2: ...` (UTC); workers' output keeps
  Horovod's `[rank]<stdout>:line`, untouched, since users' tooling parses it.
* `json`: one object a line with the keys `time` (ISO 8601, UTC, milliseconds), `level`,
  `round` (the job's round when the line was written; null before the first), `rank`, `host`
  (null unless the line is about one worker), `event` and `message`. A worker's output line
  has the event "output" and one more key, `stream` ("stdout" or "stderr").

A log call names what happened with `extra=tags(event, rank=..., host=...)`; a line without
an event is "log". `LogTail` keeps the newest lines, in the text form, for `/v1/status`.

A line only the person at the launcher's terminal may read (the page's login link, a live
credential) is handed to `terminal_handlers` alone: never to `LogTail`, a file or a pipe.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from typing import Any

LOG_FORMATS = ("text", "json")
TAIL_LINES = 200  # lines `LogTail` keeps by default

_TEXT_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z )?elasticrun: ")

RoundNow = Callable[[], int | None]  # the job's current round; None before the first
RankNow = Callable[[], int | None]  # a worker's rank now (or the last it had); None if none


def no_round() -> int | None:
    """The round of lines written while there is no job yet (parsing the flags)."""
    return None


def utc_time(created: float, separator: str = "T") -> str:
    """`created` (Unix seconds) as `2026-11-24T17:50:01.123Z`: UTC, to the millisecond."""
    seconds = int(created)
    millis = min(999, int((created - seconds) * 1000))
    day_and_time = time.strftime(f"%Y-%m-%d{separator}%H:%M:%S", time.gmtime(seconds))
    return f"{day_and_time}.{millis:03d}Z"


def launcher_line(line: str) -> str | None:
    """`elasticrun: message` when `line` (as printed, without its newline) is one of the
    launcher's own lines, in either format, its timestamp left out; None for a worker's."""
    if match := _TEXT_LINE.match(line):
        return line[len(match.group(1) or "") :]
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or "stream" in record or "message" not in record:
        return None
    return f"elasticrun: {record['message']}"


def tags(event: str, *, rank: int | None = None, host: str | None = None) -> dict[str, Any]:
    """The `extra=` of a log call: the `event` it reports ("round": a round formed, "failure",
    "leave", "join", "launch", "stall", "end"; "log" is the default) and, when the line is
    about one worker, that worker's `rank` (None when it has none) and `host`."""
    return {"event": event, "rank": rank, "host": host}


class TextFormatter(logging.Formatter):
    """A line for people: `2026-11-24 17:50:01.123Z elasticrun: message`, its time in UTC,
    with the traceback (if the record has one) on the lines below, as `logging` puts it."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s elasticrun: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return utc_time(record.created, separator=" ")


class JsonFormatter(logging.Formatter):
    """A line for machines: one JSON object (see the module's docstring), the round read from
    `round_now` as the line is written. A traceback is part of `message`."""

    def __init__(self, round_now: RoundNow) -> None:
        super().__init__()
        self._round_now = round_now

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return json.dumps(
            {
                "time": utc_time(record.created),
                "level": record.levelname.lower(),
                "round": self._round_now(),
                "rank": getattr(record, "rank", None),
                "host": getattr(record, "host", None),
                "event": getattr(record, "event", "log"),
                "message": message,
            }
        )


def launcher_formatter(log_format: str, round_now: RoundNow = no_round) -> logging.Formatter:
    """The formatter of the launcher's own lines in `log_format` ("text" or "json")."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    return JsonFormatter(round_now) if log_format == "json" else TextFormatter()


class WorkerLines:
    """How a worker's output line appears on the launcher's console, in `log_format`: as text,
    Horovod's `[rank]<stream>:line`, the bytes untouched; as json, one object a line (event
    "output", with `stream`), the line decoded as UTF-8 (bad bytes replaced) without its
    newline. `round_now` gives the job's round as each line is shown."""

    def __init__(self, log_format: str = "text", round_now: RoundNow = no_round) -> None:
        if log_format not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}")
        self.log_format = log_format
        self._round_now = round_now

    def shaper(self, stream: str, rank: RankNow, host: str, name: str) -> Callable[[bytes], bytes]:
        """A function from one output line (ending in a newline) of the worker on `host` to
        what the console shows for it; `rank()` is the worker's rank as the line comes (text:
        its `name` when it never had one)."""
        if self.log_format == "text":
            tag = f"<{stream}>:".encode()

            def tagged(line: bytes) -> bytes:
                number = rank()
                label = name if number is None else str(number)
                return b"[" + label.encode() + b"]" + tag + line

            return tagged

        def as_json(line: bytes) -> bytes:
            record = {
                "time": utc_time(time.time()),
                "level": "info",
                "round": self._round_now(),
                "rank": rank(),
                "host": host,
                "event": "output",
                "stream": stream,
                "message": line.decode(errors="replace").removesuffix("\n"),
            }
            return json.dumps(record).encode() + b"\n"

        return as_json


def terminal_handlers(logger: logging.Logger, level: int) -> list[logging.Handler]:
    """The handlers a record of `level` from `logger` would reach (its own, then its
    ancestors' while they propagate, as `Logger.callHandlers` walks them) that write to a
    terminal: stream handlers whose stream `isatty()`. Empty when the launcher's output goes
    to a file or a pipe (a batch system's log, CI), or when `logger` drops `level`."""
    if not logger.isEnabledFor(level):
        return []
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found += [h for h in current.handlers if level >= h.level and _writes_to_terminal(h)]
        current = current.parent if current.propagate else None
    return found


def _writes_to_terminal(handler: logging.Handler) -> bool:
    """Whether `handler` writes to a terminal now (a file handler not yet opened: no)."""
    stream = handler.stream if isinstance(handler, logging.StreamHandler) else None
    try:
        return stream is not None and bool(stream.isatty())
    except (ValueError, OSError):  # a closed stream
        return False


class LogTail(logging.Handler):
    """Keeps the newest `size` lines it is given, in the text form (timestamped), in
    `lines`, oldest first; older lines are dropped. Never blocks and never writes anywhere."""

    def __init__(self, size: int = TAIL_LINES, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.lines: deque[str] = deque(maxlen=size)
        self.setFormatter(TextFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # noqa: BLE001 - a bad record must not break the caller's logging
            self.handleError(record)


class HeldLines(logging.Handler):
    """Holds back the lines `logger` passes on to its ancestors' handlers (the console's is
    the root logger's) from the moment it is made until `show()`, which passes them on as
    those handlers are then: in the format chosen meanwhile (the flags' own warnings wait
    for --log-format). Showing twice is harmless."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self._logger = logger
        self._propagate = logger.propagate
        self._held = True
        logger.addHandler(self)
        logger.propagate = False

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def show(self) -> None:
        if not self._held:
            return
        self._held = False
        self._logger.removeHandler(self)
        self._logger.propagate = self._propagate
        for record in self.records:
            self._logger.handle(record)
