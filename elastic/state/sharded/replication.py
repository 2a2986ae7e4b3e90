"""Copying each commit to the ranks that keep its replicas, while training goes on.

Each round forms a Gloo group of its own for this (`dist.new_group`, by every rank at the
round's start), so the copies never queue behind the training's collectives. A thread of
its own sends this rank's block (one flat buffer) to its holders (`Placement.holders`) and
receives the blocks of the ranks it backs up, with collectives only (one
`all_to_all_single` per replica), then waits, in one small allreduce over the same group,
until every rank has received all it keeps: from then on the commit is held whole on
other hosts, and the commit before it is dropped (`Slots.keep_only`). Received blocks are
views into the buffer they arrived in: no copy.

The training thread waits for a replication only when it takes the next commit (or leaves
the round at a membership change): a step never waits for it otherwise.

When a peer dies meanwhile, the thread's transfer fails (or the driver declares the round
broken) and `wait()` raises `WorkerLostError`; what arrived whole before is kept. `stop()`
abandons a replication at once (the round is over).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from elastic.errors import ElasticError
from elastic.state.sharded.placement import Placement
from elastic.state.sharded.slots import Block, Slot, Slots
from elastic.worker.errors import WorkerLostError

__all__ = ["Replicator"]

_SLICE = timedelta(milliseconds=50)


class _Stopped(ElasticError):
    """The replication was abandoned (`Replicator.stop`)."""


class Replicator:
    """Replicates one round's commits, one at a time, over `group` (all of the round's ranks).

    `broken()` says why the round is broken (None while it is not); a transfer that lasts
    `timeout` seconds fails.
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        rank: int,
        placement: Placement,
        broken: Callable[[], str | None],
        timeout: float,
    ) -> None:
        self._group, self._rank, self._placement = group, rank, placement
        self._broken, self._timeout = broken, timeout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._commit = 0

    def start(self, slots: Slots, slot: Slot) -> None:
        """Replicate `slot` (this rank's block of it is in `slots`) in the background, after
        the replication in flight, if any, is over (`wait`)."""
        self.wait()
        self._commit = slot.id.commit
        self._thread = threading.Thread(
            target=self._run, args=(slots, slot), name="elastic-replication", daemon=True
        )
        self._thread.start()

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Block until the replication in flight is over. Raises `WorkerLostError` when it
        failed (a peer died, the round broke), RuntimeError when it timed out."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if isinstance(error, WorkerLostError | RuntimeError):
            raise WorkerLostError(f"replicating commit {self._commit} failed: {error}") from error
        if error is not None:
            raise error

    def stop(self) -> None:
        """Abandon the replication in flight (its round is over); returns within a moment."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * _SLICE.total_seconds() + 1)
            self._thread = None
        self._error = None

    def _run(self, slots: Slots, slot: Slot) -> None:
        try:
            self._replicate(slots, slot)
        except _Stopped:
            pass
        except BaseException as err:  # reported by wait() on the training thread
            self._error = err

    def _replicate(self, slots: Slots, slot: Slot) -> None:
        """Collectives only: Gloo's point-to-point waits close the group's connections when
        a wait slice times out, its collectives' do not. One all-gather of every rank's
        block length, then one `all_to_all_single` per replica (the j-th: every rank sends
        its block to its j-th holder), then an all-reduce as the barrier."""
        own = slot.blocks[self._rank]
        world = len(self._placement.holders)
        sizes = torch.tensor([own.nbytes(), len(own.plain)], dtype=torch.int64)
        gathered = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
        self._wait(dist.all_gather(gathered, sizes, group=self._group, async_op=True))
        lengths = [int(t[0]) for t in gathered]
        plains = [int(t[1]) for t in gathered]
        replicas = max((len(h) for h in self._placement.holders), default=0)
        for j in range(replicas):
            holder = self._holder(self._rank, j)
            senders = [k for k in range(world) if self._holder(k, j) == self._rank]
            send = [lengths[self._rank] if q == holder else 0 for q in range(world)]
            receive = [lengths[k] if k in senders else 0 for k in range(world)]
            incoming = torch.empty(sum(receive), dtype=torch.uint8)
            outgoing = own.flat if holder is not None else own.flat[:0]
            work = dist.all_to_all_single(
                incoming, outgoing, receive, send, group=self._group, async_op=True
            )
            self._wait(work)
            offset = 0
            for sender in senders:
                specs = [
                    (meta.local_shape(slot.world, sender), meta.dtype)
                    for meta in slot.manifest.tensors
                ]
                flat = incoming[offset : offset + lengths[sender]]
                slots.add_replica(slot.id, sender, Block.unpack(flat, specs, plains[sender]))
                offset += lengths[sender]
        # Every rank has all it keeps of this commit once every rank is past this point.
        self._wait(dist.all_reduce(torch.zeros(1), group=self._group, async_op=True))
        slots.keep_only([slot.id])

    def _holder(self, rank: int, j: int) -> int | None:
        held = self._placement.holders[rank]
        return held[j] if j < len(held) else None

    def _wait(self, work: dist.Work) -> None:
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                work.wait(timeout=_SLICE)
                return
            except RuntimeError as err:
                if "timed out" not in str(err).lower():
                    raise WorkerLostError(str(err).splitlines()[0][:200]) from err
            if self._stop.is_set():
                raise _Stopped
            if (reason := self._broken()) is not None:
                raise WorkerLostError(f"the round is broken: {reason}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"a transfer took over {self._timeout:g} s")
