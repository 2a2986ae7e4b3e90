"""The driver's record of each worker process it launched (of ended ones, the newest: see
`elastic.driver.worker_history`)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from elastic.driver.launch.launcher import WorkerProcess
from elastic.driver.observe.progress import WorkerProgress


class WorkerState(enum.Enum):
    LAUNCHING = "launching"  # started, not yet a member of a formed round
    MEMBER = "member"  # in the current round
    LEAVING = "leaving"  # asked to leave (SIGTERM, removed host): goes at its next commit,
    # or, while `handing_over`, once another member holds its commit
    EXITED = "exited"  # ended with code 0
    FAILED = "failed"  # died, exited non-zero, or declared dead
    STOPPED = "stopped"  # stopped by the driver

    @property
    def alive(self) -> bool:
        return self in (WorkerState.LAUNCHING, WorkerState.MEMBER, WorkerState.LEAVING)


@dataclass
class Worker:
    """One launched worker process. `host_slot` is its slot index on its host."""

    worker_id: str
    hostname: str
    host_slot: int
    process: WorkerProcess | None  # None until started
    state: WorkerState = WorkerState.LAUNCHING
    exit_code: int | None = None
    registered: bool = False
    registered_at: float | None = None  # when it registered with THIS driver (None: it did
    # not; an adopted worker registered with an earlier one)
    exiting: bool = False  # said it is shutting down: its stream closing is not a death
    joined: bool = False  # has joined a round at the rendezvous
    pid: int | None = None  # as the worker reported it (remote workers too)
    launched_at: float = 0.0
    last_heartbeat: float = 0.0
    heard: bool = False  # a heartbeat of this process reached this driver (its stream is open)
    stream_closed_at: float | None = None
    launcher_pid: int | None = None  # the local process: the worker, its keeper or ssh client
    log_dir: str | None = None  # a detached worker's output and exit status
    offsets: dict[str, int] = field(default_factory=dict)  # output shown so far, per stream
    commit: int = 0  # the state commits it has made, as its last heartbeat or join said
    durable: int = 0  # the newest commit it wrote to --checkpoint-dir (its heartbeats say)
    durable_stale: bool = False  # its last durable write failed (its heartbeats say)
    handing_over: bool = False  # LEAVING, but the only holder of the newest commit: a member
    # until another member reports holding that commit
    leave_reason: str = ""  # why it leaves, while `handing_over`
    leave_cause: str = "leave"  # what for (a `policy.causes.Cause`), while `handing_over`
    waiting_since: float | None = None  # when it first waited at the rendezvous to join
    progress: WorkerProgress = field(default_factory=WorkerProgress)  # its heartbeats say
    end_cause: str = ""  # why it ended, once it has (`policy.end_causes`; "": not said)
    ended_at: float | None = None  # when its process's end was seen (the driver's clock)

    @property
    def serial(self) -> str:
        """The number the driver gave this worker (its id's last part)."""
        return self.worker_id.rpartition("#")[2]


async def stop_workers(workers: Iterable[Worker], grace: float) -> None:
    """SIGTERM every running worker, SIGKILL those still running `grace` seconds later, and
    wait (up to another `grace`) for them; live records become STOPPED."""
    running = [w for w in workers if w.process is not None and w.exit_code is None]
    if not running:
        return
    for worker in running:
        worker.process.terminate()
    waits = [asyncio.ensure_future(w.process.wait()) for w in running]
    _, late = await asyncio.wait(waits, timeout=grace)
    if late:
        for worker, task in zip(running, waits, strict=True):
            if task in late:
                worker.process.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*late), timeout=grace)
    for worker, task in zip(running, waits, strict=True):
        if task.done() and not task.cancelled():
            worker.exit_code = task.result()
        if worker.state.alive:
            worker.state = WorkerState.STOPPED
