"""Carrying out what the ranks' call descriptions decide, before a collective moves data.

Every direct collective enters here: `checked` for a call that completes before it returns,
`started` for an asynchronous one (it returns a `Handle`). Both

* refuse, on this rank alone and before anything is sent, a name that a call still in
  flight on this rank holds (Horovod refuses it the same way: the call never happens on any
  rank, so the ranks stay in step); the error is a `CollectiveArgumentError`, which is a
  `ValueError` as Horovod's is;
* exchange the call's description with the other ranks (`checks.py`) and act on the
  rows' `Decision`, the same on every rank: raise the same `CollectiveArgumentError`
  everywhere (mismatched calls, or arguments of one rank that cannot work, such as alltoall
  splits), so that no rank goes on; run the call; or, where the calls differ only because
  some are named asynchronous calls, *defer* those (the other ranks exchange again with the
  deferring ranks' next call).

A deferred call starts as soon as every rank either makes it or has deferred it: on the
ranks that deferred it, from inside whatever collective they are in at that moment, which
then goes on. `synchronize()` of a deferred call waits for the other ranks to call its
name; if they wait for something else, every rank raises instead of hanging. With the
cross-rank check off (`set_collective_checks(False)`) nothing is exchanged: calls run in
the order they are made, and errors are raised only where they are found.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from elastic.worker.collectives.checks import (
    Call,
    Kind,
    Problem,
    collective_checks,
    decide,
    exchange,
    name_code,
    problem_text,
    raise_disagreement,
)
from elastic.worker.collectives.handles import Handle, Pending
from elastic.worker.collectives.process_sets import ProcessSet, Scope, scope
from elastic.worker.context import WorkerContext, current, process_wide
from elastic.worker.errors import CollectiveArgumentError, WorkerLostError

__all__ = ["Start", "checked", "launch_deferred", "pending_codes", "started", "wait_deferred"]

Rows = list[list[int]]
# Launches a call once the ranks agreed: its scope and the agreed rows (None when the check
# is off) -> the pending operation.
Start = Callable[[Scope, Rows | None], Pending]

_ANNOUNCED = 3  # deferred calls a row names (checks.PENDING)


def checked(
    ctx: WorkerContext,
    process_set: ProcessSet,
    kind: Kind,
    what: str,
    tensors: Sequence[torch.Tensor],
    *,
    op: int = -1,
    root: int = -1,
    name: str | None = None,
    problem: Problem = Problem.NONE,
    detail: int = 0,
) -> tuple[Scope, Rows | None]:
    """The call's scope once every rank agreed to run it, and every rank's row (None when
    the check is off). Raises `CollectiveArgumentError` as the module says; `WorkerLostError`
    when a peer is lost meanwhile."""
    where, call = _prepare(ctx, process_set, kind, what, tensors, op, root, name, problem, detail)
    if call is None:
        return where, None
    rows = _negotiate(ctx, where, call)
    assert rows is not None  # a call that is not deferrable is never deferred
    return where, rows


def started(
    ctx: WorkerContext,
    process_set: ProcessSet,
    kind: Kind,
    what: str,
    tensors: Sequence[torch.Tensor],
    start: Start,
    *,
    op: int = -1,
    root: int = -1,
    name: str | None = None,
    problem: Problem = Problem.NONE,
    detail: int = 0,
) -> Handle:
    """Agree on an asynchronous call and `start` it, or defer it (a named call the others
    do not make now); its `Handle` either way. Raises as `checked` does."""
    where, call = _prepare(
        ctx, process_set, kind, what, tensors, op, root, name, problem, detail, asynchronous=True
    )
    if call is None:
        return Handle(start(where, None), name, ctx)
    rows = _negotiate(ctx, where, call)
    if rows is None:
        return Handle(
            None, name, ctx, start=start, call=call, scope=where, await_start=wait_deferred
        )
    return Handle(start(where, rows), name, ctx)


def _prepare(
    ctx: WorkerContext,
    process_set: ProcessSet,
    kind: Kind,
    what: str,
    tensors: Sequence[torch.Tensor],
    op: int,
    root: int,
    name: str | None,
    problem: Problem,
    detail: int,
    asynchronous: bool = False,
) -> tuple[Scope, Call | None]:
    """The scope and the call's description (None with the check off), after the checks
    this rank makes alone."""
    where = scope(ctx, process_set, what)
    process_wide().progress.issued(kind.name.lower())
    if name is not None and name in ctx.in_flight:
        raise CollectiveArgumentError(
            f"{what}: a collective named {name!r} is already in flight on this rank; "
            "synchronize it first or use another name"
        )
    call = Call(
        kind=kind,
        tensors=[(t.dtype, t.shape) for t in tensors],
        op=op,
        root=root,
        name=name,
        deferrable=asynchronous and name is not None,
        cuda=any(t.is_cuda for t in tensors),
        problem=problem,
        detail=detail,
    )
    if not collective_checks():
        if problem:  # found here only: the other ranks cannot hear of it
            raise CollectiveArgumentError(f"{what}: {problem_text(call, where.size)}")
        return where, None
    return where, call


def pending_codes(ctx: WorkerContext, where: Scope) -> list[int]:
    """Name codes of this rank's oldest deferred calls in `where`'s group."""
    codes = []
    for handle in ctx.in_flight.deferred:
        if handle._scope.group is where.group:
            codes.append(name_code(handle._name))
            if len(codes) == _ANNOUNCED:
                break
    return codes


def _negotiate(ctx: WorkerContext, where: Scope, call: Call) -> Rows | None:
    """Exchange `call` until the ranks' rows decide: the rows to run it with, or None when
    it is deferred. Starts deferred calls of this rank when the rows say so."""
    while True:
        rows = exchange(where, call.row(pending_codes(ctx, where)))
        decision = decide(rows, where.members)
        if decision.launch:
            if decision.launch == name_code(call.name):
                return _agreed(where, call)  # the others start it now too
            launch_deferred(ctx, where, decision.launch)
            continue  # then this rank's own call, again
        if decision.problem is not None:
            raise CollectiveArgumentError(decision.problem)
        if decision.defer:
            if call.deferrable:
                return None
            continue  # another rank deferred its call: exchange again with its next one
        return rows


def _agreed(where: Scope, call: Call) -> Rows:
    """The exchange every rank makes before a deferred call starts: its description alone
    (nothing deferred, nothing deferrable), checked as any call is."""
    plain = Call(
        kind=call.kind,
        tensors=call.tensors,
        op=call.op,
        root=call.root,
        name=call.name,
        cuda=call.cuda,
    )
    rows = exchange(where, plain.row())
    raise_disagreement(rows, where.members)
    return rows


def launch_deferred(ctx: WorkerContext, where: Scope, code: int) -> bool:
    """Start this rank's deferred call named by `code` in `where`'s group, as the rows of
    an exchange decided; False when this rank has none (it is inside `hvd.join()`, or the
    call is its own current one). If the calls do not match after all, the deferred call
    fails (its `synchronize()` raises the same error as the other ranks')."""
    for handle in ctx.in_flight.deferred:
        if handle._scope.group is where.group and name_code(handle._name) == code:
            break
    else:
        return False
    try:
        rows = _agreed(where, handle._call)
    except CollectiveArgumentError as err:
        handle._fail(err)
        return True
    handle._launch(rows)
    return True


def wait_deferred(handle: Handle) -> None:
    """Wait until the other ranks call `handle`'s name and it starts (`Handle._complete`).

    Raises `CollectiveArgumentError` on every rank when the ranks wait for different calls,
    or call something else; `WorkerLostError` when the round it was made in has ended.
    """
    ctx = current("hvd.synchronize")
    if handle._ctx is not ctx:
        raise WorkerLostError("the round this asynchronous call was made in has ended")
    wait = Call(kind=Kind.WAIT, tensors=[], name=handle._name)
    where = handle._scope
    while handle.deferred:
        try:
            rows = exchange(where, wait.row(pending_codes(ctx, where)))
            decision = decide(rows, where.members)
            if decision.problem is not None:
                raise CollectiveArgumentError(decision.problem)
        except CollectiveArgumentError as err:
            handle._fail(err)
            raise
        if decision.launch:
            launch_deferred(ctx, where, decision.launch)
    if handle._error is not None:
        raise handle._error
