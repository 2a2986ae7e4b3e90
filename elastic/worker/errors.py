"""The two exceptions that drive the elastic run loop (`hvd.elastic.run`).

Both derive from `ElasticError` and, as Horovod's do, from `RuntimeError`, so that code
catching `RuntimeError` around a training step keeps working; the run loop catches them by
their own types.
"""

from __future__ import annotations

from elastic.errors import ElasticError


class WorkerLostError(ElasticError, RuntimeError):
    """A collective failed because a peer died or the epoch was declared broken.

    The run loop reacts by restoring the last commit (`state.restore()`), re-joining the
    rendezvous, and syncing state from the rank that holds the newest commit. Horovod calls
    this `HorovodInternalError`.
    """


class HostsUpdatedInterrupt(ElasticError, RuntimeError):
    """The job's membership changes: raised by `State.commit()` on every rank at the same step.

    Nothing was lost, so the run loop does not restore; it re-joins the rendezvous and, unless
    `skip_sync` is true, syncs state. `skip_sync` is true when no worker joins (only removals
    or a leave), so every member of the next epoch already holds the same, newest commit.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        self.skip_sync = bool(skip_sync)
        super().__init__(
            "the job's hosts changed: re-forming"
            + (" (no new workers: state sync skipped)" if self.skip_sync else "")
        )

    def __reduce__(self) -> tuple[type[HostsUpdatedInterrupt], tuple[bool]]:
        return (type(self), (self.skip_sync,))
