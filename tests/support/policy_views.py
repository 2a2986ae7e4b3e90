"""Builders of the read-only `JobView`s and worker records the pure policies decide from."""

from __future__ import annotations

from types import SimpleNamespace

from elastic.driver.policy.actions import Decision
from elastic.driver.policy.phase import Phase
from elastic.driver.policy.view import JobView
from elastic.driver.rendezvous.assignment import plan_slots
from elastic.driver.settings import ElasticSettings
from elastic.driver.workers import Worker, WorkerState

# Stands for a started process: the policy asks whether there is one and which signal ended it.
STARTED = SimpleNamespace(signal=None)
NOW = 1000.0
ELASTIC = ElasticSettings(min_np=2, max_np=4, discovery_script=None, elastic_timeout=60.0)

M, L, LV, F, X, S = (
    WorkerState.MEMBER,
    WorkerState.LAUNCHING,
    WorkerState.LEAVING,
    WorkerState.FAILED,
    WorkerState.EXITED,
    WorkerState.STOPPED,
)


def worker(worker_id: str, state: WorkerState, host: str = "a", slot: int = 0, **fields) -> Worker:
    record = Worker(worker_id, host, slot, process=STARTED)  # type: ignore[arg-type]
    record.state = state
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def view(
    *workers: Worker,
    members: tuple[str, ...] = (),
    waiting: frozenset[str] = frozenset(),
    **fields,
) -> JobView:
    defaults = dict(
        phase=Phase.RUNNING,
        elastic=ELASTIC,
        workers={w.worker_id: w for w in workers},
        members=members,
        waiting=waiting,
        resets=0,
        short_since=None,
        newest_commit=0,
        fleet_loss=None,
        round=1,
        command=("train.py",),
    )
    defaults.update(fields)
    if "slots" not in defaults:
        hostnames = [defaults["workers"][w].hostname for w in members]  # type: ignore[index]
        defaults["slots"] = dict(zip(members, plan_slots(hostnames), strict=True))
    return JobView(**defaults)  # type: ignore[arg-type]


def kinds(decision: Decision) -> list[type]:
    return [type(action) for action in decision.actions]
