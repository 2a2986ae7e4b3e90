"""Runs beside one local worker of a job whose state outlives the driver (`--backend etcd`).

Usage (by the driver only): python -m elastic.driver.launch.keeper DIR -- COMMAND...

The driver starts the keeper as the leader of a new session. The keeper starts the worker in
its own process group, appending the worker's stdout and stderr to DIR/stdout and DIR/stderr
(files of this user, mode 0600, opened without following links: a planted link or another
user's file makes the keeper exit 126 and write nothing), waits for it, writes its exit code
to DIR/exit (128+N when signal N ended it) and exits with that code. Signals sent to the
group reach the worker; the keeper ignores SIGTERM, SIGINT and SIGHUP so that it outlives the
worker and records its end. Nothing ties either process to the driver: a driver that dies
leaves them running, and a restarted one re-adopts the worker from DIR and the keeper's pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from elastic.driver.errors import LaunchError
from elastic.driver.launch.private_files import open_private

EXIT_FILE = "exit"


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m elastic.driver.launch.keeper DIR -- COMMAND...", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: the worker gets defaults
    try:
        code = _run_worker(folder, argv[2:])
    except LaunchError as error:  # a planted link or another user's file: write nothing
        print(f"elasticrun keeper: {error}", file=sys.stderr)
        return 126
    partial = str(folder / f"{EXIT_FILE}.tmp")
    with contextlib.suppress(LaunchError):
        fd = open_private(partial, os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "w") as file:
            file.write(str(code))
        os.replace(partial, folder / EXIT_FILE)  # replaces a link, never writes through it
    return code


def _run_worker(folder: Path, command: list[str]) -> int:
    """Run `command` with its output appended to the folder's files; its exit code.
    Raises `LaunchError` (nothing started) when an output file is not this user's own."""
    out = open_private(str(folder / "stdout"))
    try:
        err = open_private(str(folder / "stderr"))
    except BaseException:
        os.close(out)
        raise
    try:
        try:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        except OSError as error:
            os.write(err, f"elasticrun: cannot start {command[0]!r}: {error.strerror}\n".encode())
            return 127
        returned = process.wait()
        return 128 - returned if returned < 0 else returned
    finally:
        os.close(out)
        os.close(err)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
