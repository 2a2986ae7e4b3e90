"""`state._host_messages`: Horovod's queue of pending host updates, as Horovod scripts poll it.

Horovod's `State` keeps the driver's host-update notifications in a private `queue.Queue`
that `commit()` drains; Horovod's own elastic test script, which users copied, waits at an
epoch's end for the driver's word on a host change by polling `state._host_messages.empty()`.
Here a worker knows of a pending change from its membership events (the driver's word that a
newer round is formed, `MembershipEvents.pending_update`); `HostMessages` answers from them
with the queue's meaning, so such scripts run unchanged.
"""

from __future__ import annotations

from elastic.worker import context


class HostMessages:
    """A read-only view, shaped like Horovod's `queue.Queue`, of the host updates pending for
    this worker: not empty once the driver has announced a round newer than this worker's
    (hosts added or removed, this worker let go), until the worker moves to it (`commit()`
    raises `HostsUpdatedInterrupt` on every rank and the run loop re-joins), as Horovod's
    queue is drained by `commit()` and emptied by the reset. Empty while the worker runtime
    is not initialized. Local: no collective, no call to the driver; safe from any thread."""

    def empty(self) -> bool:
        """Whether no host update is pending for this worker."""
        try:
            ctx = context.current("state._host_messages")
        except context.NotInitializedError:
            return True
        return ctx.events.pending_update(ctx.round) is None

    def qsize(self) -> int:
        """1 when a host update is pending for this worker (all announced updates count as
        one: the worker moves to the newest round at once), else 0."""
        return 0 if self.empty() else 1

    def full(self) -> bool:
        """Never full: the queue is unbounded, as Horovod's is."""
        return False
