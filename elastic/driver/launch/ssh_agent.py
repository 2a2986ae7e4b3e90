"""Runs on a remote host, started by the driver through ssh, and owns one worker there.

Protocol on standard input (nothing secret is ever on a command line):
  line 1: JSON `{"env": {...}, "grace": seconds}`: the worker's environment, token included,
          and `"detach": {"job_id": ID, "serial": N, "slot": S}` for a worker that outlives the
          driver;
  then `TERM` (SIGTERM the worker's process group) or `KILL` (SIGKILL it), one per line;
  end of input (the driver or its ssh connection went away): SIGTERM, then SIGKILL after grace
  (a detached worker goes on: see `ssh_relay.py`).
The agent exits with the worker's exit code (128+N when signal N ended it). A detached
worker's output comes framed on the agent's stdout (see `relay_frames.py`).

Usage (by the driver only):
  python -m elastic.driver.launch.ssh_agent -- COMMAND...
  python -m elastic.driver.launch.ssh_agent --attach JOB_ID SERIAL --offsets OUT,ERR
      [--keeper PID] [--strays-upto N --adopted SERIAL,...]
    relay a detached worker again, from those offsets of its stdout and stderr files
    (input: `TERM` and `KILL` lines only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading

from elastic.driver.launch import ssh_relay


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def _kill_if_running(process: subprocess.Popen[bytes]) -> None:
    if process.returncode is None:
        _signal_group(process, signal.SIGKILL)


def _stop(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the worker's group; SIGKILL it if the worker still runs `grace` seconds later.

    Never waits: it also runs in signal handlers, where waiting for the worker would stall
    until the grace period ends (the main thread holds the wait lock while it is interrupted).
    """
    _signal_group(process, signal.SIGTERM)
    timer = threading.Timer(grace, _kill_if_running, args=(process,))
    timer.daemon = True
    timer.start()


def _follow_driver(process: subprocess.Popen[bytes], grace: float) -> None:
    for line in sys.stdin:
        command = line.strip()
        if command == "TERM":
            _signal_group(process, signal.SIGTERM)
        elif command == "KILL":
            _signal_group(process, signal.SIGKILL)
    _stop(process, grace)


def _attach(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m elastic.driver.launch.ssh_agent")
    parser.add_argument("--attach", nargs=2, metavar=("JOB_ID", "SERIAL"), required=True)
    parser.add_argument("--offsets", required=True, metavar="OUT,ERR")
    parser.add_argument("--keeper", type=int, metavar="PID")
    parser.add_argument("--strays-upto", type=int, default=0, metavar="N")
    parser.add_argument("--adopted", default="", metavar="SERIAL,...")
    args = parser.parse_args(argv)
    job_id, serial = args.attach[0], int(args.attach[1])
    out, err = (int(offset) for offset in args.offsets.split(","))
    adopted = frozenset(int(number) for number in args.adopted.split(",") if number)
    return ssh_relay.attach(
        job_id, serial, {"stdout": out, "stderr": err}, args.keeper, args.strays_upto, adopted
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["--attach"]:
        return _attach(argv)
    if len(argv) < 2 or argv[0] != "--":
        print("usage: python -m elastic.driver.launch.ssh_agent -- COMMAND...", file=sys.stderr)
        return 2
    header = json.loads(sys.stdin.readline() or "{}")
    env = dict(os.environ)
    env.update(header.get("env", {}))
    grace = float(header.get("grace", 5.0))
    if (detach := header.get("detach")) is not None:
        slot = None if detach.get("slot") is None else int(detach["slot"])
        return ssh_relay.launch(argv[1:], env, detach["job_id"], int(detach["serial"]), slot)
    try:
        process = subprocess.Popen(
            argv[1:], env=env, stdin=subprocess.DEVNULL, start_new_session=True
        )
    except OSError as err:
        print(f"elasticrun: cannot start {argv[1]!r}: {err.strerror}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: _stop(process, grace))
    threading.Thread(target=_follow_driver, args=(process, grace), daemon=True).start()
    code = process.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
