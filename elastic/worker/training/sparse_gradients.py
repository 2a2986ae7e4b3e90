"""Sparse gradients in `DistributedOptimizer`, reduced as Horovod reduces them.

A parameter whose gradient is sparse (from an `nn.Embedding(sparse=True)`, say) is not
summed in its bucket's flat buffer. With `sparse_as_dense=False` (the default) every rank's
indices and values are allgathered, and the gradient becomes the sparse tensor that holds
them all (duplicates add up when it is coalesced; Average divides the values by the number
of ranks). With `sparse_as_dense=True` it is reduced densely in its bucket and turned back
into a sparse tensor, so that optimizers such as `SparseAdam` get what they expect.

Which parameters went sparse is agreed at no extra collective: the step's last bucket
carries one more element, the number of sparse gradients on each rank, summed by the
step's own allreduce (`SparseWord`). Only when that sum is not zero do the ranks exchange a
table (per parameter: its sparse dimensions and entries on each rank) and then the
gradients, in parameter order; a rank whose gradient for such a parameter is missing takes
part with no entries. Ranks that disagree about a parameter's sparse dimensions raise the
same `CollectiveArgumentError`.
"""

from __future__ import annotations

import torch

from elastic.worker.collectives.handles import wait
from elastic.worker.collectives.process_sets import Scope
from elastic.worker.collectives.row_gather import gather_rows
from elastic.worker.errors import CollectiveArgumentError
from elastic.worker.torch_versions import all_gather_single

__all__ = ["SparseGradients", "SparseWord"]


class SparseWord:
    """The summed count of sparse gradients, read from the last bucket's allreduce. On a GPU
    the element is copied to pinned memory as soon as the allreduce is done, and waited for
    only when the step's gradients have all been written back."""

    def __init__(self) -> None:
        self._value = 0.0
        self._host: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None

    def read(self, reduced: torch.Tensor) -> None:
        if reduced.device.type != "cuda":
            self._value, self._copied = float(reduced.item()), None
            return
        if self._host is None or self._host.dtype != reduced.dtype:
            self._host = torch.empty(1, dtype=reduced.dtype, pin_memory=True)
        self._host.copy_(reduced.reshape(1), non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()

    def take(self) -> bool:
        """Whether any rank had a sparse gradient in the step just reduced; forgets it."""
        if self._copied is not None:
            assert self._host is not None
            self._copied.synchronize()
            self._value, self._copied = float(self._host.item()), None
        value, self._value = self._value, 0.0
        return value > 0


class SparseGradients:
    """This rank's sparse gradients of one step, and their reduction over the ranks."""

    def __init__(self, params: list[torch.nn.Parameter], average: bool) -> None:
        self.params = params
        self.average = average
        self.local: dict[int, torch.Tensor] = {}  # parameter index -> its coalesced gradient

    def take(self, index: int, grad: torch.Tensor) -> None:
        """Keep parameter `index`'s sparse gradient of this step (its bucket sends zeros)."""
        self.local[index] = grad.coalesce()

    def count(self) -> int:
        return len(self.local)

    def reset(self) -> None:
        self.local.clear()

    @torch.no_grad()
    def reduce(self, where: Scope) -> None:
        """Allgather the sparse gradients of every parameter that is sparse on some rank and
        make them its gradient (`where`: every rank of the job). Raises
        `CollectiveArgumentError` (on every rank) when the ranks' gradients of a parameter
        have different sparse dimensions; `WorkerLostError` when a peer is lost."""
        table = self._table(where)
        try:
            for index, param in enumerate(self.params):
                sparse_dims = {row[index][0] for row in table} - {0}
                if not sparse_dims:
                    continue
                if len(sparse_dims) > 1:
                    raise CollectiveArgumentError(
                        "DistributedOptimizer: the ranks' sparse gradients of a parameter of "
                        f"shape {list(param.shape)} differ in sparse dimensions "
                        f"({sorted(sparse_dims)})"
                    )
                entries = [row[index][1] for row in table]
                param.grad = self._gathered(where, index, sparse_dims.pop(), entries)
        finally:
            self.reset()

    def _table(self, where: Scope) -> list[list[list[int]]]:
        """Every rank's [sparse dimensions, entries] per parameter (zeros where dense)."""
        mine = torch.zeros(len(self.params), 2, dtype=torch.int64)
        for index, grad in self.local.items():
            mine[index, 0], mine[index, 1] = grad.sparse_dim(), grad._nnz()
        out = torch.empty(where.size * mine.numel(), dtype=torch.int64)
        wait(all_gather_single(out, mine.reshape(-1), group=where.group, async_op=True))
        return out.view(where.size, len(self.params), 2).tolist()

    def _gathered(
        self, where: Scope, index: int, sparse_dim: int, entries: list[int]
    ) -> torch.Tensor:
        param = self.params[index]
        local = self.local.get(index)
        if local is None:
            indices = torch.empty(0, sparse_dim, dtype=torch.int64, device=param.device)
            values = param.new_empty((0, *param.shape[sparse_dim:]))
        else:
            indices = local.indices().t().contiguous()
            values = local.values().contiguous()
        all_indices = gather_rows(where, indices, entries)
        all_values = gather_rows(where, values, entries)
        if self.average:
            all_values = all_values / where.size
        result = torch.sparse_coo_tensor(all_indices.t(), all_values, param.shape)
        dense = param.grad
        if dense is not None and not dense.is_sparse and bool(dense.any()):
            result = result + dense.to_sparse(sparse_dim)  # a rank's dense gradient of it
        return result
