"""Checking, before a collective moves any data, that every rank called it the same way.

Each rank describes its call in one fixed-size row of integers (`Call.row`: which
collective, op, dtype, shape, root rank, name, and whether that name is already in flight
on this rank); the rows are allgathered over the group, one small round trip, and every
rank compares all of them. When they disagree, every rank raises the same
`CollectiveArgumentError`, built from the gathered rows alone, so the message is identical
everywhere. Without the check, a mismatched call fails in the backend, hangs until the
collective timeout, or silently mixes data.

The check is on by default for direct calls and off inside `DistributedOptimizer` (whose
calls are the same on every rank by construction). `set_collective_checks(False)` or
`ELASTIC_COLLECTIVE_CHECKS=0` turns it off for the process.
"""

from __future__ import annotations

import enum
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from elastic.worker import context
from elastic.worker.errors import CollectiveArgumentError
from elastic.worker.handles import wait
from elastic.worker.process_sets import Scope
from elastic.worker.torch_versions import all_gather_single

__all__ = [
    "Call",
    "Kind",
    "agree",
    "exchange",
    "raise_disagreement",
    "check_root",
    "collective_checks",
    "set_collective_checks",
]

CHECKS_VARIABLE = "ELASTIC_COLLECTIVE_CHECKS"


class Kind(enum.IntEnum):
    """Which collective a row describes."""

    ALLREDUCE = 1
    GROUPED_ALLREDUCE = 2
    ALLGATHER = 3
    GROUPED_ALLGATHER = 4
    BROADCAST = 5
    ALLTOALL = 6
    REDUCESCATTER = 7
    GROUPED_REDUCESCATTER = 8
    BARRIER = 9
    STEP = 10  # a DistributedOptimizer step: its buckets' allreduces follow
    JOINED = 11  # a rank inside hvd.join(): it takes part in the others' allreduces


# Collectives whose tensors' dimension 0 may differ between ranks.
_RAGGED = {Kind.ALLGATHER, Kind.GROUPED_ALLGATHER, Kind.ALLTOALL}

# Every dtype a row can name, in a fixed order (the code is the index).
DTYPES = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_SHOWN_DIMS = 4  # a row holds the first four dimensions; a hash stands for the rest

# The row's columns.
(KIND, OP, DTYPE, NDIM, DIM0, DIM1, DIM2, DIM3, REST, ROOT, NAME, BUSY, TENSORS, NUMEL,
 DEVICE, JOINED, WIDTH) = range(17)  # fmt: skip


def _crc(text: str) -> int:
    """A hash that is the same in every process (Python's `hash` of a str is not)."""
    return zlib.crc32(text.encode())


def _dtype_code(dtype: torch.dtype) -> int:
    return DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES) + _crc(str(dtype)) % 1000


def _dtype_name(code: int) -> str:
    return str(DTYPES[code]).removeprefix("torch.") if 0 <= code < len(DTYPES) else "other"


@dataclass(frozen=True)
class Call:
    """One rank's call of a collective, as the other ranks must see it.

    `tensors` are the (dtype, shape) of its tensors (one, or several for a grouped call;
    dimension 0 may differ between ranks for allgather and alltoall). `op` and `root` are -1
    where they do not apply; `root` is a job rank. `busy`: a call of the same name is in
    flight on this rank. `cuda`: the tensors are on a GPU (a joined rank's zeros must go the
    same way).
    """

    kind: Kind
    tensors: Sequence[tuple[torch.dtype, torch.Size]]
    op: int = -1
    root: int = -1
    name: str | None = None
    busy: bool = False
    cuda: bool = False

    def row(self) -> list[int]:
        row = [0] * WIDTH
        row[KIND], row[OP], row[ROOT], row[BUSY] = self.kind, self.op, self.root, self.busy
        row[NAME] = 0 if self.name is None else 1 + _crc(self.name)
        row[TENSORS] = len(self.tensors)
        row[NUMEL] = sum(shape.numel() for _, shape in self.tensors)
        row[DEVICE] = 1 if self.cuda else 0
        if len(self.tensors) == 1:
            dtype, shape = self.tensors[0]
            row[DTYPE], row[NDIM] = _dtype_code(dtype), len(shape)
            for i, dim in enumerate(shape[:_SHOWN_DIMS]):
                row[DIM0 + i] = dim
            row[REST] = _crc(repr(tuple(shape[_SHOWN_DIMS:])))
        else:
            ragged = self.kind in _RAGGED
            described = [(str(d), tuple(s[1:] if ragged else s)) for d, s in self.tensors]
            row[REST] = _crc(repr(described))
        return row


def collective_checks() -> bool:
    """Whether direct collectives check their arguments across ranks (default: yes)."""
    process = context.process_wide()
    if process.collective_checks is None:  # read the environment once
        value = os.environ.get(CHECKS_VARIABLE, "1").strip().lower()
        process.collective_checks = value not in ("0", "false", "no")
    return process.collective_checks


def set_collective_checks(enabled: bool) -> None:
    """Turn the cross-rank argument check of direct collectives on or off for this process
    (every rank must choose the same). Overrides `ELASTIC_COLLECTIVE_CHECKS`."""
    context.process_wide().collective_checks = bool(enabled)


def exchange(scope: Scope, row: list[int]) -> list[list[int]]:
    """Allgather one row per member of `scope`; the rows in the members' order. Raises
    `WorkerLostError` when a peer is lost meanwhile."""
    mine = torch.tensor(row, dtype=torch.int64)
    rows_out = torch.empty(scope.size * WIDTH, dtype=torch.int64)
    wait(all_gather_single(rows_out, mine, group=scope.group, async_op=True))
    return rows_out.view(scope.size, WIDTH).tolist()


def agree(scope: Scope, call: Call) -> list[list[int]]:
    """Exchange `call`'s row with every member of `scope` and return all rows in their order.

    Raises `CollectiveArgumentError`, with the same message on every rank, when the calls do
    not match (collective, op, dtype, shape, root, name), when a root rank is not a member,
    when a rank already has a call of the same name in flight, or when the call cannot run
    while a rank has joined (`join.py`); `WorkerLostError` when a peer is lost meanwhile.
    """
    rows = exchange(scope, call.row())
    raise_disagreement(rows, scope.members)
    return rows


def raise_disagreement(rows: list[list[int]], members: Sequence[int]) -> None:
    """Raise the `CollectiveArgumentError` that `rows` call for, if any: computed from the
    rows alone, so every rank (a joined one too) raises the same."""
    problem = _disagreement(rows, members)
    if problem:
        raise CollectiveArgumentError(problem)


# Calls that can run while a rank has joined: it contributes zeros (or nothing).
_WITH_JOINED = {Kind.ALLREDUCE, Kind.BARRIER, Kind.STEP}


def _by_rank(rows: list[list[int]], show, skip=lambda row: False) -> str:
    """'rank 0, 2: a; rank 1: b': each distinct value with the ranks that gave it."""
    groups: dict[str, list[int]] = {}
    for rank, row in enumerate(rows):
        if not skip(row):
            groups.setdefault(show(row), []).append(rank)
    return "; ".join(
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {value}"
        for value, ranks in groups.items()
    )


def _shape(row: list[int]) -> str:
    dims = [str(d) for d in row[DIM0 : DIM0 + min(row[NDIM], _SHOWN_DIMS)]]
    if row[NDIM] > _SHOWN_DIMS:
        dims.append("...")
    return "[" + ", ".join(dims) + "]"


def _trailing_shape(row: list[int]) -> str:
    return "[*" + _shape(row)[1:] if row[NDIM] else "[] (a scalar)"


_DIFFERENT = "the ranks called different collectives"
_KIND_NAMES = {kind: kind.name.lower() for kind in Kind}
_OP_NAMES = {-1: "none", 0: "Average", 1: "Sum", 2: "Adasum", 3: "Min", 4: "Max", 5: "Product"}


def _disagreement(all_rows: list[list[int]], members: Sequence[int]) -> str | None:
    """What is wrong with the calls in `all_rows` (the same text on every rank), or None."""
    rows = [row for row in all_rows if row[KIND] != Kind.JOINED]
    joined = [members[i] for i, row in enumerate(all_rows) if row[KIND] == Kind.JOINED]
    if not rows:
        return None

    def differs(*columns: int) -> bool:
        return any([row[c] for c in columns] != [rows[0][c] for c in columns] for row in rows)

    def by_rank(show) -> str:
        return _by_rank(all_rows, show, skip=lambda r: r[KIND] == Kind.JOINED)

    if differs(KIND):
        return (
            "hvd collectives: "
            + _DIFFERENT
            + " ("
            + by_rank(lambda r: _KIND_NAMES.get(r[KIND], str(r[KIND])))
            + ")"
        )
    kind = rows[0][KIND]
    what = f"hvd.{_KIND_NAMES.get(kind, kind)}"
    if joined and (kind not in _WITH_JOINED or rows[0][OP] not in (-1, 0, 1)):
        return (
            f"{what}: cannot run while rank{'s' if len(joined) > 1 else ''} "
            f"{', '.join(map(str, joined))} ha{'ve' if len(joined) > 1 else 's'} joined "
            "(hvd.join); only allreduce with Average or Sum, barrier and "
            "DistributedOptimizer steps can"
        )
    if differs(TENSORS):
        return (
            f"{what}: the ranks passed different numbers of tensors ("
            + by_rank(lambda r: str(r[TENSORS]))
            + ")"
        )
    if differs(OP):
        return (
            f"{what}: the ranks asked for different reduction ops ("
            + by_rank(lambda r: _OP_NAMES.get(r[OP], str(r[OP])))
            + ")"
        )
    if differs(DTYPE):
        return (
            f"{what}: the ranks' tensors differ in dtype ("
            + by_rank(lambda r: _dtype_name(r[DTYPE]))
            + ")"
        )
    if kind in _RAGGED:
        if differs(NDIM, DIM1, DIM2, DIM3, REST):
            return (
                f"{what}: the ranks' tensors differ in shape beyond dimension 0 ("
                + by_rank(_trailing_shape)
                + ")"
            )
    elif differs(NDIM, DIM0, DIM1, DIM2, DIM3, REST, NUMEL):
        if rows[0][TENSORS] > 1 or kind == Kind.STEP:
            return f"{what}: the ranks' lists of tensors differ in dtypes or shapes"
        return f"{what}: the ranks' tensors differ in shape (" + by_rank(_shape) + ")"
    if any(row[ROOT] != -1 and row[ROOT] not in members for row in rows):
        return f"{what}: root rank not among the ranks of the call ({_ranges(members)}): " + (
            by_rank(lambda r: str(r[ROOT]))
        )
    if differs(ROOT):
        return (
            f"{what}: the ranks named different root ranks ("
            + by_rank(lambda r: str(r[ROOT]))
            + ")"
        )
    if differs(NAME):
        return f"{what}: the ranks gave the call different names"
    busy = [members[i] for i, row in enumerate(all_rows) if row[BUSY]]
    if busy:
        return (
            f"{what}: a collective of the same name is already in flight on rank"
            f"{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy))}; "
            "synchronize it first or use another name"
        )
    return None


def _ranges(members: Sequence[int]) -> str:
    if list(members) == list(range(len(members))):
        return f"0-{len(members) - 1}" if len(members) > 1 else "0"
    return ", ".join(map(str, members))


def check_root(root_rank: int, scope: Scope, what: str) -> None:
    """Raise `CollectiveArgumentError` for a root that is not a member of `scope` (where the
    cross-rank check is off: every rank that passes the same root raises the same)."""
    if root_rank not in scope.members:
        raise CollectiveArgumentError(
            f"{what}: root rank not among the ranks of the call ({_ranges(scope.members)}): "
            f"{root_rank}"
        )
