"""The worker's preemption check (`--preemption-check CMD`): the user's command, run every
interval, prints when this host goes (Unix seconds or ISO 8601 with a zone), or nothing.

`discovery_scripts/aws_spot_check.py` and `gcp_preemption_check.py` ask the clouds' metadata
servers. A check that fails, hangs (killed after `timeout`) or prints what is no time is
logged once per distinct trouble and otherwise ignored: a broken check must not end a job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable

from elastic.protocol.notice import parse_notice_time

log = logging.getLogger("elastic")

MAX_TIMEOUT = 10.0  # seconds a check may run, at most (and never longer than its interval)
_SHOWN = 200  # characters of a check's output or error shown in its log line


class PreemptionWatch:
    """Runs `command` (with `/bin/sh -c`, stdin closed, in its own session) every `interval`
    seconds from a daemon thread until `stop` is set or the check prints a time; then
    `on_notice(at)` is called once, `at` in Unix seconds."""

    def __init__(
        self,
        command: str,
        interval: float,
        on_notice: Callable[[float], None],
        stop: threading.Event,
    ) -> None:
        self.command = command
        self.interval = interval
        self.timeout = min(interval, MAX_TIMEOUT)
        self._on_notice = on_notice
        self._stop = stop
        self._said: str | None = None  # the last trouble logged

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="elastic-preemption-check", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        while not self._stop.is_set():
            at = self.check()
            if at is not None:
                self._on_notice(at)
                return
            self._stop.wait(self.interval)

    def check(self) -> float | None:
        """Run the check once: the time it printed, or None (nothing, or a trouble logged)."""
        try:
            process = subprocess.Popen(
                ["/bin/sh", "-c", self.command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as err:
            return self._trouble(f"could not run: {err}")
        try:
            stdout, stderr = process.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            # The whole session: a child of the shell may hold the pipes open.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            for pipe in (process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()
            return self._trouble(f"did not finish within {self.timeout:g} s; killed")
        if process.returncode != 0:
            last = (stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
            return self._trouble(f"exited with code {process.returncode}: {last[:_SHOWN]}")
        printed = stdout.decode(errors="replace").strip()
        if not printed:
            return None
        try:
            at = parse_notice_time(printed.splitlines()[0].strip())
        except ValueError as err:
            return self._trouble(f"printed no time: {err}")
        return at

    def _trouble(self, what: str) -> None:
        if what != self._said:
            self._said = what
            log.warning(
                "preemption check %r %s (ignored; it runs again in %g s)",
                self.command[:_SHOWN],
                what,
                self.interval,
            )
