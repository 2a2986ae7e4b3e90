"""What the policy reads: a read-only view of the job, gathered by the conductor per decision."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

from elastic.driver.policy.phase import Phase
from elastic.driver.settings import ElasticSettings
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol.http import SlotInfo


@dataclass(frozen=True)
class FleetLoss:
    """How every worker of the job was lost: at the job's newest commit `commit`, its failed
    workers ending as `exits` says (distinct words, sorted), `progress` commits after the
    previous such loss (or the job's start): the step they reached. `times`: how many losses
    in a row were `alike`."""

    commit: int
    exits: tuple[str, ...]
    progress: int
    times: int = 1

    def alike(self, other: FleetLoss) -> bool:
        """The same exits at the same step, give or take the one commit that the workers'
        last heartbeats may not have carried (the driver learns commits from them)."""
        return self.exits == other.exits and abs(self.progress - other.progress) <= 1


@dataclass(frozen=True)
class JobView:
    """What the policy may read. Workers are the driver's records: read, never written."""

    phase: Phase
    elastic: ElasticSettings | None  # None: a static job
    workers: Mapping[str, Worker]  # every worker launched, by id, in launch order
    members: Sequence[str]  # the current round's members, in rank order
    waiting: Set[str]  # ids waiting at the rendezvous for the next round
    resets: int  # rounds formed after the first
    short_since: float | None  # when the job fell short of --min-np (SHORT phase)
    newest_commit: int  # the newest commit count any worker reported
    fleet_loss: FleetLoss | None  # how every worker was last lost, if it ever was
    round: int = 0  # the newest round's number
    slots: Mapping[str, SlotInfo] = field(default_factory=dict)  # its members' places
    command: Sequence[str] = ()  # what each worker runs
    round_wanted: bool = False  # a next round is asked for and not formed yet
    failures_reported: Set[int] = frozenset()  # rounds a member said failed, unseen here
    checkpoint_dir: str = ""  # where workers write durable commits (--checkpoint-dir)

    def where(self, worker: Worker) -> str:
        """ "rank R on host H" for a member of the newest round, else "worker ID on host H"."""
        slot = self.slots.get(worker.worker_id)
        name = f"rank {slot.rank}" if slot is not None else f"worker {worker.worker_id}"
        return f"{name} on host {worker.hostname}"

    def alive_besides(self, *gone: Worker) -> bool:
        """Whether any started worker other than those `gone` is alive."""
        return any(
            w.state.alive and w.process is not None
            for w in self.workers.values()
            if all(w is not other for other in gone)
        )

    def launching(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.state is WorkerState.LAUNCHING]

    def ready_joiners(self) -> list[Worker]:
        """Launched workers, not yet members, that wait at the rendezvous."""
        return [w for w in self.launching() if w.worker_id in self.waiting]

    def staying_members(self) -> int:
        return sum(1 for w in self.members if self.workers[w].state is WorkerState.MEMBER)
