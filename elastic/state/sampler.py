"""ElasticSampler: this rank's share of the samples of the epoch not yet processed.

Sharding. Every rank computes the same epoch order (a permutation seeded by `seed + epoch`
when shuffling), drops the indices recorded as processed, and takes every `size`-th of the
rest starting at its rank: rank r of n gets `remaining[r::n]`. Nothing is padded: shards
differ in length by at most one sample, so that every sample of the epoch is processed
exactly once overall, also across shrinks and grows (Horovod pads with repeated samples).
A consequence: at an epoch's end, a DataLoader over this sampler may give some ranks one
batch more than others. Every rank must issue the same collectives, so a training loop
with `DistributedOptimizer` must let the ranks without a last batch take part in that step
(for example with an empty batch and zero loss) or stop the epoch one step earlier on all
ranks (those samples are then not processed in this epoch).

Accounting. `record_batch(batch_idx, batch_size)` marks batch `batch_idx` of the current
iteration as processed on *every* rank's shard: ranks run in lockstep and the sharding is
deterministic, so each rank knows what the others processed without communicating, and a
commit keeps the work of a rank that dies later. `record_indices()` marks only the indices
given; other ranks learn of them at the next `TorchState.sync()` (or membership change).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any

import torch

from elastic.worker import context

__all__ = ["ElasticSampler", "merge_sampler_states"]


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Partition a dataset of constant size among the ranks; re-partition after each reset.

    Use it inside a `TorchState` (which saves, restores and merges its state), call
    `record_batch` after each processed batch and `set_epoch` at the end of each epoch (not
    the beginning: that would forget what a partly done epoch has processed).

    `reset()` reads rank and size from the active worker context; without one (before
    `init()`), it keeps the last rank and size it used, rank 0 of 1 at first.
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
        self._remaining = torch.empty(0, dtype=torch.int64)
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
    def remaining_indices(self) -> list[int]:
        """All ranks' not-yet-processed indices in epoch order, as of the last `reset()`."""
        return self._remaining.tolist()

    @property
    def num_samples(self) -> int:
        """The length of this rank's shard."""
        return len(self._shard)

    def _epoch_order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self._length, dtype=torch.int64)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self._length, generator=generator)

    def reset(self) -> None:
        """Re-shard the not-yet-processed indices for the current rank and size.

        Batch numbers passed to `record_batch` count from the first batch after this call.
        """
        if context.is_initialized():
            ctx = context.current("ElasticSampler.reset")
            self.rank, self.num_replicas = ctx.rank, ctx.size
        order = self._epoch_order()
        self._remaining = order[~self._processed[order]]
        self._shard = self._remaining[self.rank :: self.num_replicas].tolist()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`: forget the processed indices and reshuffle (deterministically,
        the same order on every rank for the same seed and epoch)."""
        self.epoch = int(epoch)
        self._processed.zero_()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record that every rank has processed its batch `batch_idx` (0 = the first batch
        since the last `reset()`) of `batch_size` samples (the per-rank batch size, the same
        on all ranks). A batch cut short by the end of a shard is recorded as it is."""
        if batch_idx < 0 or batch_size <= 0:
            raise ValueError(f"record_batch({batch_idx}, {batch_size}): invalid batch")
        span = batch_size * self.num_replicas
        self._processed[self._remaining[batch_idx * span : (batch_idx + 1) * span]] = True

    def record_indices(self, indices: Iterable[int] | torch.Tensor) -> None:
        """Record that these dataset indices have been processed (known to other ranks after
        the next sync). Raises `IndexError` for an index outside the dataset."""
        self._mark(indices)
        self.unshared = True

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
