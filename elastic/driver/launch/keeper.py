"""Runs beside one local worker of a job whose state outlives the driver (`--backend etcd`).

Usage (by the driver only): python -m elastic.driver.launch.keeper DIR -- COMMAND...

The driver starts the keeper as the leader of a new session. The keeper starts the worker in
its own process group, appending the worker's stdout and stderr to DIR/stdout and DIR/stderr,
waits for it, writes its exit code to DIR/exit (128+N when signal N ended it) and exits with
that code. Signals sent to the group reach the worker; the keeper ignores SIGTERM, SIGINT and
SIGHUP so that it outlives the worker and records its end. Nothing ties either process to the
driver: a driver that dies leaves them running, and a restarted one re-adopts the worker from
DIR and the keeper's pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

EXIT_FILE = "exit"


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m elastic.driver.launch.keeper DIR -- COMMAND...", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: the worker gets defaults
    with open(folder / "stdout", "ab") as out, open(folder / "stderr", "ab") as err:
        try:
            process = subprocess.Popen(argv[2:], stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        except OSError as error:
            err.write(f"elasticrun: cannot start {argv[2]!r}: {error.strerror}\n".encode())
            code = 127
        else:
            returned = process.wait()
            code = 128 - returned if returned < 0 else returned
    partial = folder / f"{EXIT_FILE}.tmp"
    partial.write_text(str(code))
    os.replace(partial, folder / EXIT_FILE)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
