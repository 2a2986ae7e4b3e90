"""Ending a worker process at once, with its output flushed."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flush the log handlers and the standard streams, then `os._exit(code)`.

    No atexit handler, `finally` block or C++ destructor runs: for a worker the driver counts
    out already, and for one holding an abandoned process group whose collective may still be
    blocked (destroying that group at interpreter exit aborts the process, exit 134).
    """
    for handler in logging.getLogger().handlers:
        handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream must not stop the exit
            stream.flush()
    os._exit(code)
