"""The ssh agent's detached modes, on a worker's host (see `ssh_agent.py`): start a worker that
outlives the ssh session, or attach to one again, and relay its output files to the driver.

Launch (`launch`): the worker's folder, `worker.<serial>` under `default_log_root(job_id)`
(this host's $TMPDIR), is prepared as for a local detached worker (`prepare_log_dir`: 0700,
this user's, no links), and a keeper (`keeper.py`) starts the worker in a new session, with
/dev/null as input and the folder's files as output: nothing ties it to the ssh session.

Attach (`attach`): the same folder, named by the job id and serial again. Its keeper is the
pid given if that still keeps the folder, else it is looked up among this user's processes.
First, the job's keepers on this host numbered up to `strays_upto` and not `adopted` are
SIGKILLed with their workers: an earlier driver launched them after its last save, so no
record names them and nothing else would ever stop them.

Both then send a header, relay both output files from the offsets given (0 at launch) as
frames (`relay_frames.py`) as they grow, and once the keeper has ended send the rest of the
output and its exit code, and exit with it. A keeper already gone gives its recorded code,
or `UNKNOWN_EXIT` where none was recorded (it was SIGKILLed, the host rebooted).

Standard input carries `TERM` and `KILL` lines: SIGTERM or SIGKILL to the keeper's process
group, as for a local detached worker. The end of input (the driver or its connection went
away), SIGTERM, SIGHUP or SIGINT to the agent, or a relay write that fails end the relay, not
the worker: the agent exits `RELAY_LOST` without an `exit` frame. After a `KILL` line it
first waits up to `KILL_WAIT` s for the keeper to end, to report how.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from elastic.driver.errors import LaunchError
from elastic.driver.launch.detached import (
    AdoptedProcess,
    default_log_root,
    keeper_command,
    keepers_under,
    kill_keeper,
    prepare_log_dir,
    runs_keeper_of,
)
from elastic.driver.launch.follower import OutputFollower
from elastic.driver.launch.private_files import open_private
from elastic.driver.launch.relay_frames import EXIT, HEADER, STREAMS, FrameWriter

RELAY_LOST = 255  # the agent's exit code when it stops relaying a worker that goes on
KILL_WAIT = 1.0  # seconds to wait for a keeper's end after KILL, before the agent exits
SLOT_FILE = "slot"  # in a worker's folder: its slot on this host


class _StartedKeeper:
    """The keeper this agent started, its child. (Not seen as an `AdoptedProcess`: that one
    checks the pid's command line, which is still empty just after the start.)"""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self._child = child

    async def wait(self) -> int:
        """Its exit code: the worker's, or 128+N when signal N ended the keeper itself."""
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(self._child.pid)
        ended = loop.create_future()
        loop.add_reader(pidfd, lambda: ended.done() or ended.set_result(None))
        try:
            await ended
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        returned = self._child.wait()  # it has ended: no wait
        return 128 - returned if returned < 0 else returned

    def terminate(self) -> None:
        self._send(signal.SIGTERM)

    def kill(self) -> None:
        self._send(signal.SIGKILL)

    def _send(self, sig: int) -> None:
        if self._child.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._child.pid, sig)


class _FramedStream:
    """One output file's relay (a `LineSink`): each piece the follower reads goes out as a
    frame, as it is (no newline added)."""

    def __init__(self, frames: FrameWriter, stream: str) -> None:
        self._frames = frames
        self._stream = stream

    def write_line(self, line: bytes) -> None:
        self._frames.write(self._stream, line)

    def close(self) -> None:
        pass


def launch(
    command: list[str], env: dict[str, str], job_id: str, serial: int, slot: int | None = None
) -> int:
    """Start `command` detached, as worker `serial` of job `job_id` on this host's `slot`,
    with environment `env`; relay it (see the module). Any other worker of the job still on
    that slot is SIGKILLed first: the driver launches on a slot it counts free, so that one
    was counted out while cut off from it. Exits 126 (one line on stderr, no frame) when its
    folder is not this user's own or the keeper cannot start."""
    root = default_log_root(job_id)
    try:
        folder = prepare_log_dir(root, serial)
        replaced = _stop_slot_holders(root, slot) if slot is not None else []
        if slot is not None:
            _write_private(os.path.join(folder, SLOT_FILE), str(slot))
    except LaunchError as error:
        print(f"elasticrun: {error}", file=sys.stderr)
        return 126
    try:
        child = subprocess.Popen(
            keeper_command(folder, command),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as error:
        print(f"elasticrun: cannot start the worker keeper: {error.strerror}", file=sys.stderr)
        return 126
    header = {
        "keeper": child.pid,
        "folder": folder,
        "running": True,
        "stopped": [],
        "replaced": replaced,
    }
    offsets = dict.fromkeys(STREAMS, 0)
    return asyncio.run(_relay(_StartedKeeper(child), folder, offsets, header))


def attach(
    job_id: str,
    serial: int,
    offsets: dict[str, int],
    keeper_pid: int | None,
    strays_upto: int = 0,
    adopted: frozenset[int] = frozenset(),
) -> int:
    """Relay worker `serial` of job `job_id` again, from `offsets` (see the module)."""
    root = default_log_root(job_id)
    folder = os.path.join(root, f"worker.{serial}")
    stopped = _stop_strays(root, strays_upto, adopted | {serial}) if strays_upto else []
    pid = keeper_pid if keeper_pid and runs_keeper_of(keeper_pid, folder) else None
    pid = pid or next((p for p, f in keepers_under(root).items() if f == folder), None)
    owned = _own_folder(folder)
    keeper = AdoptedProcess(pid, folder if owned else None)
    header = {
        "keeper": pid,
        "folder": folder,
        "running": not keeper.ended_unwatched,
        "stopped": stopped,
    }
    return asyncio.run(_relay(keeper, folder if owned else None, offsets, header))


def _own_folder(folder: str) -> bool:
    """Whether `folder` is a folder of this user (not a link): one whose files may be sent."""
    try:
        found = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid()


def _write_private(path: str, text: str) -> None:
    """Write `text` to `path`, a file of this user's with mode 0600 (never through a link)."""
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w") as file:
        file.write(text)


def _stop_slot_holders(root: str, slot: int) -> list[str]:
    """SIGKILL the keepers under `root` whose worker holds this host's `slot`; their
    folders."""
    stopped = []
    for pid, folder in keepers_under(root).items():
        try:
            held = int(Path(folder, SLOT_FILE).read_text())
        except (OSError, ValueError):
            continue
        if held == slot:
            kill_keeper(pid)
            stopped.append(folder)
    return sorted(stopped)


def _stop_strays(root: str, upto: int, keep: frozenset[int]) -> list[str]:
    """SIGKILL the keepers under `root` numbered up to `upto` and not in `keep`; their
    folders."""
    stopped = []
    for pid, folder in keepers_under(root).items():
        number = folder.rpartition("worker.")[2]
        if number.isdigit() and int(number) <= upto and int(number) not in keep:
            kill_keeper(pid)
            stopped.append(folder)
    return sorted(stopped)


async def _relay(
    keeper: AdoptedProcess | _StartedKeeper,
    folder: str | None,
    offsets: dict[str, int],
    header: dict,
) -> int:
    """Send `header`, then `folder`'s output files from `offsets` until `keeper` ends; its
    exit code, or `RELAY_LOST`."""
    loop = asyncio.get_running_loop()
    lost: asyncio.Future[None] = loop.create_future()

    def end_relay() -> None:
        if not lost.done():
            lost.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        loop.add_signal_handler(sig, end_relay)
    killing = threading.Event()
    threading.Thread(
        target=_follow_driver,
        args=(keeper, killing, lambda: loop.call_soon_threadsafe(end_relay)),
        daemon=True,
    ).start()
    frames = FrameWriter()
    try:
        frames.write(HEADER, json.dumps(header).encode())
    except OSError:
        return RELAY_LOST
    ended = False
    follower = OutputFollower()
    relays = []
    for stream in STREAMS if folder is not None else ():
        assert folder is not None
        relay = follower.add(
            os.path.join(folder, stream),
            _FramedStream(frames, stream),
            offsets.get(stream, 0),
            ended=lambda: ended,
            at=lambda _offset: None,
        )
        relay.add_done_callback(lambda done: done.cancelled() or done.exception() and end_relay())
        relays.append(relay)
    waiting = asyncio.ensure_future(keeper.wait())
    try:
        await asyncio.wait([waiting, lost], return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done() and killing.is_set():
            await asyncio.wait([waiting], timeout=KILL_WAIT)
        if not waiting.done():
            return RELAY_LOST
        code = waiting.result()
        ended = True
        follower.poke()
        if relays:
            await asyncio.wait(relays)
        if any(relay.cancelled() or relay.exception() for relay in relays):
            return RELAY_LOST
        try:
            frames.write(EXIT, str(code).encode())
        except OSError:
            return RELAY_LOST
        return code
    finally:
        waiting.cancel()
        await follower.close()


def _follow_driver(
    keeper: AdoptedProcess | _StartedKeeper, killing: threading.Event, on_end: Callable[[], None]
) -> None:
    """Act on the driver's lines (on a thread: a relay write that blocks must not hold a
    signal back); `on_end()` at the end of input."""
    for line in sys.stdin:
        command = line.strip()
        if command == "TERM":
            keeper.terminate()
        elif command == "KILL":
            killing.set()
            keeper.kill()
    on_end()
