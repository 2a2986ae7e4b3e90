"""Waiting for torch.distributed work, and the `Handle` of an asynchronous collective.

`wait` is the only place a worker waits on torch.distributed: it turns a lost peer or a
broken round into `WorkerLostError` and a collective past its timeout into `RuntimeError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from elastic.worker.context import WorkerContext, current, process_wide
from elastic.worker.errors import WorkerLostError

__all__ = ["Handle", "Pending", "complete", "poll", "synchronize", "wait"]

# A launched operation: the torch.distributed works to wait for, then the post-processing
# (averaging, unpadding, decompression, copying back) that produces the result.
Pending = tuple[list[dist.Work], Callable[[], Any]]

_WAIT_SLICE = timedelta(milliseconds=10)


def wait(work: dist.Work) -> None:
    """Block until `work` completes.

    Waits in short slices (no latency is added: a slice returns as soon as the work is done)
    and, between slices, checks whether the driver declared this round broken, because a Gloo
    collective blocked on a hung peer cannot be interrupted any other way; once it has blocked
    for a while, the peers are probed (`PeerWatch`): a partition the driver does not see is
    reported to it, and it breaks the round. Raises `WorkerLostError` when the collective
    fails (a peer died or closed its connections) or the round is broken, and `RuntimeError`
    with torch's message when the collective timeout passes.
    """
    ctx = current("a collective")
    progress = process_wide().progress
    progress.blocked()
    try:
        _wait(ctx, work)
    finally:
        progress.unblocked()


def _wait(ctx: WorkerContext, work: dist.Work) -> None:
    started = time.monotonic()
    deadline = started + ctx.timeout
    on_gpu = ctx.device.type == "cuda"
    while True:
        try:
            if on_gpu:
                # NCCL's wait() only makes the current CUDA stream wait: a collective stuck on
                # a dead peer would block the next CUDA call instead. Poll its completion.
                if _completed_within(work, _WAIT_SLICE.total_seconds()):
                    work.wait()
                    return
            else:
                work.wait(timeout=_WAIT_SLICE)
                return
        except RuntimeError as err:
            if "timed out" not in str(err).lower():
                first = str(err).splitlines()[0].split(". ")[0][:200]
                raise WorkerLostError(f"a collective of round {ctx.round} failed: {first}") from err
        reason = ctx.events.broken(ctx.round)
        if reason is not None:
            raise WorkerLostError(f"round {ctx.round} is broken: {reason}")
        if ctx.peers is not None and ctx.store is not None:
            ctx.peers.blocked(ctx.store, ctx.round, ctx.rank, ctx.size, started)
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"a collective did not complete within {ctx.timeout:g} s (--collective-timeout)"
            )


def _completed_within(work: dist.Work, seconds: float) -> bool:
    """Whether `work` completes within `seconds`, polling without blocking on it (a failed
    work raises its error from `is_completed` or the `wait` that follows)."""
    until = time.monotonic() + seconds
    pause = 0.00005
    while not work.is_completed():
        if time.monotonic() >= until:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.001)
    return True


def complete(pending: Pending) -> Any:
    """Wait for every work of `pending`, then return its post-processing's result."""
    works, finish = pending
    for work in works:
        wait(work)
    return finish()


class Handle:
    """An asynchronous collective in flight: pass it to `synchronize()` or `poll()`, or call it
    (`handle()` is `synchronize(handle)`, as Horovod's `sparse_allreduce_async` handles are
    called).

    It keeps the tensors of the operation alive until the operation is finished. A named
    operation's name stays taken (see `in_flight.py`) until it is synchronized. A *deferred*
    operation (a named call the other ranks did not make at the same moment, see
    `negotiation.py`) starts when they call the same name; until then `poll()` says False and
    `synchronize()` waits for them.
    """

    __slots__ = (
        "_works", "_finish", "_result", "_done", "_name", "_ctx", "_start", "_call", "_scope",
        "_await_start", "_error", "_parts", "__weakref__",
    )  # fmt: skip

    def __init__(
        self,
        pending: Pending | None,
        name: str | None = None,
        ctx: WorkerContext | None = None,
        *,
        start: Callable[[Any, Any], Pending] | None = None,
        call: Any = None,
        scope: Any = None,
        await_start: Callable[[Handle], None] | None = None,
        parts: tuple[Handle, ...] = (),
    ) -> None:
        """`pending`: the launched operation; or None with `start(scope, rows)` that launches
        it later, `call` (its `checks.Call`), `scope`, and `await_start(handle)` that waits
        until the other ranks start it (`negotiation.wait_deferred`): a deferred operation.
        `parts`: operations whose results `pending`'s post-processing waits for (it is
        complete when they are)."""
        self._works, self._finish = pending if pending is not None else ([], _no_result)
        self._result: Any = None
        self._done = False
        self._error: BaseException | None = None
        self._name, self._ctx = name, ctx
        self._start, self._call, self._scope = start, call, scope
        self._await_start = await_start
        self._parts = parts
        if name is not None and ctx is not None:
            ctx.in_flight.hold(name, self, deferred=pending is None)

    @property
    def deferred(self) -> bool:
        """True while the operation waits for the other ranks to call it."""
        return self._start is not None

    def _launch(self, rows: Any) -> None:
        """Start the deferred operation now (every rank of its scope starts it together)."""
        start, self._start = self._start, None
        assert start is not None
        if self._ctx is not None:
            self._ctx.in_flight.started(self._name, self)
        try:
            self._works, self._finish = start(self._scope, rows)
        except BaseException as err:
            self._fail(err)
            raise

    def _fail(self, err: BaseException) -> None:
        """The operation cannot run: `synchronize()` raises `err`."""
        self._start, self._error = None, err
        if self._ctx is not None:
            self._ctx.in_flight.release(self._name, self)

    def _is_completed(self) -> bool:
        if self._done or self._error is not None:
            return True
        if self.deferred or not all(part._is_completed() for part in self._parts):
            return False
        return all(work.is_completed() for work in self._works)

    def _complete(self) -> Any:
        if self._error is not None:
            raise self._error
        if not self._done:
            try:
                if self.deferred:
                    assert self._await_start is not None, "a deferred handle says how to wait"
                    self._await_start(self)
                self._result = complete((self._works, self._finish))
            finally:
                if self._ctx is not None and not self.deferred:
                    self._ctx.in_flight.release(self._name, self)
            self._done = True
            self._works = []
            self._finish = _no_result
        return self._result

    def __call__(self) -> Any:
        return synchronize(self)


def _no_result() -> None:
    return None


def synchronize(handle: Handle) -> Any:
    """Wait for `handle`'s operation and return its result.

    Args:
        handle: what an asynchronous collective returned.

    Returns:
        The operation's result, as its function says (the same object on later calls).

    Raises:
        WorkerLostError: a peer of the call died or stopped answering, or the driver declared
            the round broken (it does when any member of the job is lost), before the call
            completed. The round is broken from then on: its collectives are not to be used
            again; `hvd.elastic.run` restores the last commit and re-joins the next round.
        CollectiveArgumentError: a deferred operation (a named call the other ranks had not
            made) that the other ranks called differently, or they wait for other calls (raised
            on every rank).
        RuntimeError: the call did not complete within `--collective-timeout`.
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    current("hvd.synchronize")
    return handle._complete()


def poll(handle: Handle) -> bool:
    """Whether `handle`'s operation has finished, successfully or not; never blocks.

    Args:
        handle: what an asynchronous collective returned.

    Returns:
        True once `synchronize(handle)` would return or raise at once.

    Raises:
        NotInitializedError: before `hvd.init()` or after `hvd.shutdown()`.
    """
    current("hvd.poll")
    return handle._is_completed()
