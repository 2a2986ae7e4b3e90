"""Whether a worker's live training state stands at a step boundary.

After a peer dies, the survivors go on from their live state rather than from the last commit
(`TorchState`, `--rollback step`) when it is consistent: every optimizer step applied to it
has been booked too (the sampler's `record_batch`, the script's counters in the state). Each
optimizer step applied opens a window (`applied`) that the script's next move closes
(`boundary`): recording the batch, the next `DistributedOptimizer.step()` or DDP forward, a
commit. A peer lost inside the window (in a collective the script issues after the step and
before its booking, a metric's allreduce say) leaves this rank's state inconsistent: it takes
the agreed state from a survivor that is not, or, when none is, the job rolls back to its
last commit.

The flag lives in the process-wide context (the one writer is the training thread).
"""

from __future__ import annotations

from elastic.worker import context

__all__ = ["applied", "at_boundary", "boundary"]


def applied() -> None:
    """An optimizer step changed the parameters: its booking is still to come."""
    context.process_wide().step_pending = True


def boundary() -> None:
    """The script booked its last step (or begins the next): the live state is consistent."""
    context.process_wide().step_pending = False


def at_boundary() -> bool:
    """Whether every optimizer step applied to the live state has been booked."""
    return not context.process_wide().step_pending
