"""Checking, before a collective moves any data, that every rank called it the same way.

Each rank describes its call in one fixed-size row of integers (`Call.row`: which
collective, op, dtype, shape, root rank, name, whether the call may be deferred, the named
calls this rank deferred, and a problem with its own arguments found before the call, such
as alltoall splits that cannot work); the rows are allgathered over the group, one small
round trip, and every rank reads all of them (`decide`). When they disagree, or a rank's
arguments cannot work, every rank raises the same `CollectiveArgumentError`, built from the
gathered rows alone, so the message is identical everywhere and no rank goes on. Without
the check, a mismatched call fails in the backend, hangs until the collective timeout, or
silently mixes data.

Horovod keys collectives by name rather than by order: a named asynchronous call may come
while another rank is busy with something else. Such a call is deferred instead of failing
(the rows say so on every rank), and starts when the other ranks call the same name
(`negotiation.py` carries the decisions out).

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
from elastic.worker.collectives.handles import wait
from elastic.worker.collectives.process_sets import Scope
from elastic.worker.errors import CollectiveArgumentError
from elastic.worker.torch_versions import all_gather_single

__all__ = [
    "Call",
    "Decision",
    "Kind",
    "Problem",
    "check_root",
    "collective_checks",
    "decide",
    "exchange",
    "name_code",
    "problem_text",
    "raise_disagreement",
    "scalar_problem",
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
    WAIT = 12  # synchronize() of a deferred call: waits for the others to call its name


class Problem(enum.IntEnum):
    """What is wrong with one rank's own arguments, found before the call (Horovod refuses
    these calls when they are made, with a `ValueError`)."""

    NONE = 0
    SCALAR = 1  # a tensor without dimensions where dimension 0 is split or gathered
    NOT_DIVISIBLE = 2  # alltoall without splits: dimension 0 not a multiple of the ranks
    SPLITS_LENGTH = 3  # alltoall: not one split per rank (DETAIL: how many)
    SPLITS_TYPE = 4  # alltoall: splits not integers (DETAIL: the dtype's code)
    SPLITS_SHAPE = 5  # alltoall: splits not one-dimensional
    SPLITS_NEGATIVE = 6  # alltoall: a negative split
    SPLITS_SUM = 7  # alltoall: splits sum to more than dimension 0 (DETAIL: the sum)


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

# The row's columns. DEFER: the call may be deferred (a named asynchronous call); PEND0-2:
# names of this rank's oldest deferred calls in the group; LOCAL, DETAIL: a `Problem`.
(KIND, OP, DTYPE, NDIM, DIM0, DIM1, DIM2, DIM3, REST, ROOT, NAME, DEFER, TENSORS, NUMEL,
 DEVICE, JOINED, PEND0, PEND1, PEND2, LOCAL, DETAIL, WIDTH) = range(22)  # fmt: skip
PENDING = (PEND0, PEND1, PEND2)


def _crc(text: str) -> int:
    """A hash that is the same in every process (Python's `hash` of a str is not)."""
    return zlib.crc32(text.encode())


def scalar_problem(tensors: Sequence[torch.Tensor]) -> Problem:
    """SCALAR where a tensor has no dimension 0 to split or gather, else NONE."""
    return Problem.SCALAR if any(t.dim() == 0 for t in tensors) else Problem.NONE


def name_code(name: str | None) -> int:
    """A name as a row holds it: 0 for none."""
    return 0 if name is None else 1 + _crc(name)


def dtype_code(dtype: torch.dtype) -> int:
    """A dtype as a row holds it."""
    return _dtype_code(dtype)


def _dtype_code(dtype: torch.dtype) -> int:
    return DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES) + _crc(str(dtype)) % 1000


def _dtype_name(code: int) -> str:
    return str(DTYPES[code]).removeprefix("torch.") if 0 <= code < len(DTYPES) else "other"


@dataclass(frozen=True)
class Call:
    """One rank's call of a collective, as the other ranks must see it.

    `tensors` are the (dtype, shape) of its tensors (one, or several for a grouped call;
    dimension 0 may differ between ranks for allgather and alltoall). `op` and `root` are -1
    where they do not apply; `root` is a job rank. `deferrable`: a named asynchronous call,
    which waits for the others rather than failing when they call something else. `cuda`:
    the tensors are on a GPU (a joined rank's zeros must go the same way). `problem` and
    `detail`: what is wrong with this rank's own arguments (`Problem`).
    """

    kind: Kind
    tensors: Sequence[tuple[torch.dtype, torch.Size]]
    op: int = -1
    root: int = -1
    name: str | None = None
    deferrable: bool = False
    cuda: bool = False
    problem: Problem = Problem.NONE
    detail: int = 0

    def row(self, pending: Sequence[int] = ()) -> list[int]:
        """The row; `pending`: name codes of this rank's deferred calls (three at most)."""
        row = [0] * WIDTH
        row[KIND], row[OP], row[ROOT], row[DEFER] = self.kind, self.op, self.root, self.deferrable
        row[NAME] = name_code(self.name)
        row[LOCAL], row[DETAIL] = self.problem, self.detail
        for column, code in zip(PENDING, pending, strict=False):
            row[column] = code
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
    context.current("a collective").in_flight.exchanges += 1
    return rows_out.view(scope.size, WIDTH).tolist()


@dataclass(frozen=True)
class Decision:
    """What the gathered rows of one exchange call for, the same on every rank.

    Exactly one holds: `launch`, the name code of a deferred call that every rank now makes
    or has deferred (all start it together, then each goes on with its own call); `problem`,
    the message every rank raises; `defer`, the calls differ only because some are named
    asynchronous calls (those wait, the others exchange again); or none: the call runs.
    """

    launch: int = 0
    problem: str | None = None
    defer: bool = False


_PROCEED = Decision()


def decide(rows: list[list[int]], members: Sequence[int]) -> Decision:
    """The `Decision` that `rows` (one per member, in order) call for: computed from the rows
    alone, so every rank (a joined one too) decides the same."""
    active = [row for row in rows if row[KIND] != Kind.JOINED]
    steps = any(row[KIND] == Kind.STEP for row in active)
    if not steps and any(row[PEND0] for row in rows):
        for code in sorted({row[c] for row in active for c in PENDING if row[c]}):
            if all(code in (row[PEND0], row[PEND1], row[PEND2], row[NAME]) for row in active):
                return Decision(launch=code)
    problem = _disagreement(rows, members)
    if problem is None:
        return _PROCEED
    if (
        not steps
        and any(row[DEFER] for row in active)
        and not any(row[LOCAL] for row in active)
        and len({(row[KIND], row[NAME]) for row in active}) > 1
    ):
        return Decision(defer=True)
    return Decision(problem=problem)


def raise_disagreement(rows: list[list[int]], members: Sequence[int]) -> None:
    """Raise the `CollectiveArgumentError` that `rows` call for, if any: computed from the
    rows alone, so every rank raises the same."""
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


def problem_text(call: Call, size: int) -> str:
    """What is wrong with `call`'s own arguments, in a group of `size` ranks."""
    return _local_problem(call.row(), size)


def _local_problem(row: list[int], size: int) -> str:
    """What is wrong with the arguments this row describes (`Problem`)."""
    problem, detail, dim0 = row[LOCAL], row[DETAIL], row[DIM0]
    if problem == Problem.SCALAR:
        return "needs tensors with at least one dimension"
    if problem == Problem.NOT_DIVISIBLE:
        return (
            f"splits not given, and dimension 0 ({dim0}) is not a multiple of the number of "
            f"ranks ({size})"
        )
    if problem == Problem.SPLITS_LENGTH:
        return f"splits has {detail} entries, not one per rank ({size})"
    if problem == Problem.SPLITS_TYPE:
        return f"splits must hold integers, not {_dtype_name(detail)}"
    if problem == Problem.SPLITS_SHAPE:
        return "splits must be one-dimensional"
    if problem == Problem.SPLITS_NEGATIVE:
        return "splits has a negative entry"
    if problem == Problem.SPLITS_SUM:
        return f"splits sum to {detail}, more than dimension 0 ({dim0})"
    return f"invalid arguments ({problem})"


_DIFFERENT = "the ranks called different collectives"
_KIND_NAMES = {kind: kind.name.lower() for kind in Kind}
_KIND_NAMES[Kind.WAIT] = "synchronize (of a call the others have not made)"
_OP_NAMES = {-1: "none", 0: "Average", 1: "Sum", 2: "Adasum", 3: "Min", 4: "Max", 5: "Product"}


def _disagreement(all_rows: list[list[int]], members: Sequence[int]) -> str | None:
    """What is wrong with the calls in `all_rows` (the same text on every rank), or None."""
    rows = [row for row in all_rows if row[KIND] != Kind.JOINED]
    joined = [members[i] for i, row in enumerate(all_rows) if row[KIND] == Kind.JOINED]
    if not rows:
        return None

    def differs(*columns: int) -> bool:
        return any([row[c] for c in columns] != [rows[0][c] for c in columns] for row in rows)

    def by_rank(show, only=lambda row: True) -> str:
        return _by_rank(all_rows, show, skip=lambda r: r[KIND] == Kind.JOINED or not only(r))

    local = [row for row in rows if row[LOCAL]]
    if local:
        kind = local[0][KIND]
        return f"hvd.{_KIND_NAMES.get(kind, kind)}: " + by_rank(
            lambda r: _local_problem(r, len(all_rows)), only=lambda r: r[LOCAL] != 0
        )
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
    if kind == Kind.WAIT:
        return "hvd.synchronize: the ranks wait for named calls that the other ranks have not made"
    if differs(NAME):
        return f"{what}: the ranks gave the call different names"
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
