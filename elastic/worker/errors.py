"""The two exceptions that drive the elastic run loop (`hvd.elastic.run`).

Both derive from `ElasticError` and, as Horovod's do, from `RuntimeError`, so that code
catching `RuntimeError` around a training step keeps working; the run loop catches them by
their own types.
"""

from __future__ import annotations

from elastic.errors import ElasticError


class WorkerLostError(ElasticError, RuntimeError):
    """A collective failed because a peer died or the round was declared broken.

    The run loop reacts by restoring the last commit (`state.restore()`), re-joining the
    rendezvous, and syncing state from the rank that holds the newest commit. Horovod calls
    this `HorovodInternalError`.
    """


class CollectiveArgumentError(ElasticError, RuntimeError, ValueError):
    """The ranks called a collective with arguments that cannot work together: different
    collectives, ops, dtypes or shapes, a root rank outside the job, alltoall splits that
    cannot work, a name already in flight.

    Raised on every rank of the call, with the same message, before any data moves (a name
    already in flight on a rank is refused on that rank alone: the call never happens). It
    is both a `RuntimeError` and a `ValueError`, the two types Horovod raises for these
    mistakes (mismatches at synchronize, refused arguments at the call). It is a usage
    error, not a lost peer: the run loop does not catch it (restoring and re-joining would
    only fail again), so it ends the worker like any other exception of the script.
    """


class HostsUpdatedInterrupt(ElasticError, RuntimeError):
    """The job's membership changes: raised by `State.commit()` on every rank at the same step,
    or (`at_step`) by `DistributedOptimizer.step()` on every rank at the same step, before that
    step changes anything, once the ranks agreed in the last step's gradient allreduce that the
    round ends (a member leaves, a worker joins, a host goes).

    Nothing was lost, so the run loop does not restore; it re-joins the rendezvous and, unless
    `skip_sync` is true, syncs state. `skip_sync` is true when no worker joins (only removals
    or a leave), so every member of the next round already holds the same state; at a step it
    is this rank's view, and a joiner's own sync brings the state to every rank regardless.
    """

    def __init__(self, skip_sync: bool = False, at_step: bool = False) -> None:
        self.skip_sync = bool(skip_sync)
        self.at_step = bool(at_step)
        super().__init__(
            (
                "the job's membership changes: re-forming at this step"
                if self.at_step
                else "the job's hosts changed: re-forming"
            )
            + (" (no new workers: state sync skipped)" if self.skip_sync else "")
        )

    def __reduce__(self) -> tuple[type[HostsUpdatedInterrupt], tuple[bool, bool]]:
        return (type(self), (self.skip_sync, self.at_step))
