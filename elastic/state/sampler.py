"""ElasticSampler: this rank's share of the samples of the epoch not yet processed.

Sharding. Every rank computes the same epoch order (a permutation seeded by `seed + epoch`
when shuffling) and drops the indices recorded as processed: the rest, `remaining_indices`
(m of them), is padded to `total_size = num_replicas * num_samples` with
`num_samples = ceil(m / num_replicas)` by repeating its first indices (cyclically when
m < num_replicas), and rank r of n gets `padded[r::n]`. As in Horovod, every rank's shard
has the same length, so any loop over it (a plain `DataLoader(dataset, sampler=sampler,
batch_size=B)`) takes the same number of steps, of the same sizes, on every rank, and no
rank waits in a collective that another rank never issues.

Padding. The `total_size - m` repeats (fewer than `num_replicas`) fill the last row of the
padded order, so a shard holds at most one, as its last sample; `padding_mask(batch_idx,
batch_size)` tells which samples of a batch are repeats. A repeated sample is trained twice
in that epoch (once where it first comes, once as a repeat in the epoch's last step), which
is harmless for training; code that counts samples (metrics, evaluation) leaves the repeats
out with the mask.

Accounting. The processed indices are a set (a boolean per sample), so a sample counts at
most once however often it is recorded: `processed_num` is the number of distinct samples
of the epoch recorded as processed, repeats never add to it. `record_batch(batch_idx,
batch_size)` marks batch `batch_idx` of the current iteration as processed on *every* rank's
shard: ranks run in lockstep and the sharding is deterministic, so each rank knows what the
others processed without communicating, and a commit keeps the work of a rank that dies
later. A repeat's first place is in the first row, that is in batch 0 of the same
iteration, so marking it again adds nothing. `record_indices()` marks only the indices
given; other ranks learn of them at the next `TorchState.sync()` (or membership change).

What holds, with `record_batch` called after each step and `TorchState` committing: a
sample is marked only after a step in which some rank trained on it; after a shrink, grow or
rollback only the unmarked samples are sharded again; so in the training that survives
(what commits keep), every sample of the epoch is trained on at least once, exactly once in a
place that `padding_mask` calls real, and is counted in `processed_num` exactly once. Per
epoch, fewer than `num_replicas` samples are trained on a second time, as repeats in its
last step. A loop that skips batches or records them with another batch size breaks this.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any

import torch

from elastic.worker import context
from elastic.worker.training import step_boundary

__all__ = ["ElasticSampler", "merge_sampler_states"]


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Partition a dataset of constant size among the ranks; re-partition after each reset.

    Use it inside a `TorchState` (which saves, restores and merges its state), call
    `record_batch` after each processed batch and `set_epoch` at the end of each epoch (not
    the beginning: that would forget what a partly done epoch has processed).

    `reset()` reads rank and size from the active worker context; without one (before
    `init()`), it keeps the last rank and size it used (`rank`, `num_replicas`: rank 0 of 1
    at first). `remaining_indices`, `num_samples`, `total_size` and the shard are those of
    the last `reset()`; `processed_indices` and `processed_num` follow every record.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.rank = 0
        self.num_replicas = 1
        self._length = len(dataset)
        self._processed = torch.zeros(self._length, dtype=torch.bool)
        # The padded order of the last reset: `_real` remaining indices, then the repeats;
        # `_stride` and `_offset` are the size and rank it was sharded for.
        self._padded = torch.empty(0, dtype=torch.int64)
        self._real = 0
        self._stride = 1
        self._offset = 0
        self._shard: list[int] = []
        # Indices recorded by `record_indices` since the last merge across ranks: only this
        # rank knows them, so the next sync must merge (`TorchState` clears it when it does).
        self.unshared = False
        self.reset()

    @property
    def processed_indices(self) -> set[int]:
        """The indices of this epoch known (to this rank) to have been processed."""
        return set(self._processed.nonzero().flatten().tolist())

    @property
    def processed_num(self) -> int:
        """How many distinct samples of this epoch are known to have been processed (padding
        repeats do not add to it)."""
        return int(self._processed.sum())

    @property
    def remaining_indices(self) -> list[int]:
        """All ranks' not-yet-processed indices in epoch order, unpadded, as of the last
        `reset()`."""
        return self._padded[: self._real].tolist()

    @property
    def num_samples(self) -> int:
        """The length of every rank's shard: `ceil(len(remaining_indices) / num_replicas)`."""
        return len(self._shard)

    @property
    def total_size(self) -> int:
        """The length of the padded order: `num_samples * num_replicas`."""
        return len(self._padded)

    @property
    def indices(self) -> list[int]:
        """This rank's shard (padding repeat included), as `__iter__` yields it."""
        return list(self._shard)

    def _epoch_order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self._length, dtype=torch.int64)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self._length, generator=generator)

    def reset(self) -> None:
        """Re-shard the not-yet-processed indices for the current rank and size, padded so
        that every rank gets `num_samples` of them.

        Batch numbers passed to `record_batch` count from the first batch after this call.
        """
        if context.is_initialized():
            ctx = context.current("ElasticSampler.reset")
            self.rank, self.num_replicas = ctx.rank, ctx.size
        order = self._epoch_order()
        remaining = order[~self._processed[order]]
        real, replicas = len(remaining), self.num_replicas
        total = -(-real // replicas) * replicas
        if total > real:  # then real > 0: repeat from the start, cyclically if need be
            remaining = remaining.repeat(-(-total // real))[:total]
        self._padded, self._real = remaining, real
        self._stride, self._offset = replicas, self.rank
        self._shard = self._padded[self.rank :: replicas].tolist()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`: forget the processed indices and reshuffle (deterministically,
        the same order on every rank for the same seed and epoch)."""
        self.epoch = int(epoch)
        self._processed.zero_()
        self.reset()

    def _positions(self, batch_idx: int, batch_size: int) -> slice:
        if batch_idx < 0 or batch_size <= 0:
            raise ValueError(f"batch {batch_idx} of size {batch_size}: invalid batch")
        start = min(batch_idx * batch_size, len(self._shard))
        return slice(start, min(start + batch_size, len(self._shard)))

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's batch `batch_idx` (0 = the first since the last `reset()`) of
        `batch_size` samples: the dataset indices it holds, padding repeat included."""
        return self._shard[self._positions(batch_idx, batch_size)]

    def padding_mask(self, batch_idx: int, batch_size: int) -> torch.Tensor:
        """A bool tensor as long as `get_indices(batch_idx, batch_size)`: True where the
        sample is a padding repeat (trained again only to even out the shards)."""
        span = self._positions(batch_idx, batch_size)
        places = torch.arange(span.start, span.stop) * self._stride + self._offset
        return places >= self._real

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record that every rank has processed its batch `batch_idx` (0 = the first batch
        since the last `reset()`) of `batch_size` samples (the per-rank batch size, the same
        on all ranks). A batch cut short by the end of the shards is recorded as it is; a
        padding repeat is a sample marked already, so it is not counted twice."""
        if batch_idx < 0 or batch_size <= 0:
            raise ValueError(f"record_batch({batch_idx}, {batch_size}): invalid batch")
        span = batch_size * self._stride
        self._processed[self._padded[batch_idx * span : (batch_idx + 1) * span]] = True
        context.process_wide().progress.counted(batch_size)
        step_boundary.boundary()

    def record_indices(self, indices: Iterable[int] | torch.Tensor) -> None:
        """Record that these dataset indices have been processed (known to other ranks after
        the next sync). Raises `IndexError` for an index outside the dataset."""
        self._mark(indices)
        self.unshared = True
        step_boundary.boundary()

    def _mark(self, indices: Iterable[int] | torch.Tensor) -> None:
        values = _index_tensor(indices)
        if values.numel() and (int(values.min()) < 0 or int(values.max()) >= self._length):
            raise IndexError(f"record_indices: an index is outside [0, {self._length})")
        self._processed[values] = True

    def state_dict(self) -> dict[str, Any]:
        """`{"epoch": int, "processed_indices": sorted int64 tensor}` (a new tensor)."""
        return {"epoch": self.epoch, "processed_indices": self._processed.nonzero().flatten()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a `state_dict()` (the indices may be any iterable of ints), then `reset()`."""
        indices = state_dict["processed_indices"]
        self.epoch = int(state_dict["epoch"])
        self._processed.zero_()
        self._mark(indices)
        self.reset()

    def __iter__(self) -> Iterator[int]:
        """This rank's shard as computed by the last `reset()` (recording does not shrink it)."""
        return iter(self._shard)

    def __len__(self) -> int:
        return len(self._shard)


def _index_tensor(indices: Iterable[int] | torch.Tensor) -> torch.Tensor:
    if isinstance(indices, torch.Tensor):
        return indices.to(torch.int64).reshape(-1)
    return torch.tensor(list(indices), dtype=torch.int64)


def merge_sampler_states(states: Sequence[dict[str, Any]], root: int) -> dict[str, Any]:
    """Combine the ranks' `ElasticSampler.state_dict()`s: `root`'s epoch, and the union of the
    processed indices of every state in that epoch (those of other epochs are stale)."""
    epoch = int(states[root]["epoch"])
    parts = [
        _index_tensor(state["processed_indices"])
        for state in states
        if int(state["epoch"]) == epoch
    ]
    return {"epoch": epoch, "processed_indices": torch.unique(torch.cat(parts))}
