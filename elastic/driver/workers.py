"""The driver's record of every worker process it launched."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elastic.driver.launch.base import WorkerProcess


class WorkerState(enum.Enum):
    LAUNCHING = "launching"  # started, not yet a member of a formed epoch
    MEMBER = "member"  # in the current epoch
    LEAVING = "leaving"  # asked to leave (SIGTERM, removed host): goes at its next commit
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
    exiting: bool = False  # said it is shutting down: its stream closing is not a death
    joined: bool = False  # has joined an epoch at the rendezvous
    pid: int | None = None  # as the worker reported it (remote workers too)
    launched_at: float = 0.0
    last_heartbeat: float = 0.0
    stream_closed_at: float | None = None
