"""ElasticSampler without processes: padded shards of equal length, and exact accounting over
plain DataLoader loops across shrinks, grows and rollbacks.

Ranks are simulated by one sampler per rank whose `rank` and `num_replicas` are set before
`reset()` (outside a worker, `reset()` keeps them); a "commit" is the merged state_dict of
all ranks, as `TorchState` makes it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from elastic.state import ElasticSampler
from elastic.state.sampler import merge_sampler_states

SIZES = range(1, 6)
LENGTHS = (1, 2, 3, 7, 12, 60, 61, 101)  # divisible by some sizes, not by others


def _ranks(
    length: int, size: int, state: dict[str, Any] | None = None, seed: int = 5
) -> list[ElasticSampler]:
    samplers = []
    for rank in range(size):
        sampler = ElasticSampler(range(length), seed=seed)
        sampler.rank, sampler.num_replicas = rank, size
        if state is None:
            sampler.reset()
        else:
            sampler.load_state_dict(state)  # ends with reset()
        samplers.append(sampler)
    return samplers


def _commit(samplers: list[ElasticSampler]) -> dict[str, Any]:
    return merge_sampler_states([s.state_dict() for s in samplers], root=0)


@pytest.mark.parametrize(("length", "size"), itertools.product(LENGTHS, SIZES))
def test_every_rank_gets_the_same_number_of_samples(length: int, size: int) -> None:
    samplers = _ranks(length, size)
    shards = [list(s) for s in samplers]
    per_rank = math.ceil(length / size)
    assert [len(shard) for shard in shards] == [per_rank] * size
    for s in samplers:
        assert (s.num_samples, s.total_size, len(s)) == (per_rank, per_rank * size, per_rank)
        assert sorted(s.remaining_indices) == list(range(length))
        assert s.indices == list(s) and s.processed_num == 0
    # every sample is in some shard; the extra places repeat the order's first samples
    placed = [i for row in itertools.zip_longest(*shards) for i in row]
    assert set(placed) == set(range(length)) and len(placed) == per_rank * size
    order = samplers[0].remaining_indices
    assert placed[length:] == (order * size)[: per_rank * size - length]
    masks = [s.padding_mask(0, per_rank) for s in samplers]
    assert sum(int(m.sum()) for m in masks) == per_rank * size - length
    assert not any(bool(m[:-1].any()) for m in masks), "a repeat is only a shard's last sample"


def test_horovod_attributes_and_batches() -> None:
    a, b = _ranks(10, 4)[0], _ranks(10, 4)[3]
    assert (a.num_replicas, a.rank, b.rank, a.num_samples, a.total_size) == (4, 0, 3, 3, 12)
    order = a.remaining_indices
    assert a.get_indices(0, 2) == [order[0], order[4]] and a.get_indices(1, 2) == [order[8]]
    assert b.get_indices(1, 2) == [order[1]]  # place 11 repeats place 1
    assert b.padding_mask(1, 2).tolist() == [True] and a.padding_mask(1, 2).tolist() == [False]
    assert a.get_indices(5, 2) == [] and a.padding_mask(5, 2).tolist() == []
    a.record_batch(1, 2)  # places 8..11: samples 8 and 9 of the order, then 0 and 1 again
    assert a.processed_indices == set(order[:2] + order[8:]) and a.processed_num == 4
    a.record_batch(0, 2)
    assert a.processed_num == 10 and a.processed_indices == set(range(10))
    a.reset()
    assert (list(a), a.num_samples, a.total_size, a.remaining_indices) == ([], 0, 0, [])
    for bad in ((-1, 2), (0, 0)):
        with pytest.raises(ValueError):
            a.get_indices(*bad)
        with pytest.raises(ValueError):
            a.record_batch(*bad)


def _train_steps(
    samplers: list[ElasticSampler], batch: int, counts: torch.Tensor, steps: int | None = None
) -> int:
    """Run plain DataLoader loops on every rank in lockstep (they must end together) for
    `steps` batches or to the end; count each trained sample that is not a padding repeat."""
    loaders = [DataLoader(range(len(counts)), sampler=s, batch_size=batch) for s in samplers]
    done = 0
    for batch_idx, batches in enumerate(zip(*loaders, strict=True)):
        if done == steps:
            break
        for sampler, indices in zip(samplers, batches, strict=True):
            real = indices[~sampler.padding_mask(batch_idx, batch)]
            counts[real] += 1
            sampler.record_batch(batch_idx, batch)
        done += 1
    return done


@pytest.mark.parametrize("length", [60, 61, 101])
@pytest.mark.parametrize("batch", [1, 3, 4])
def test_plain_loops_count_every_sample_once_across_shrink_grow_and_rollback(
    length: int, batch: int
) -> None:
    for epoch in range(2):
        counts = torch.zeros(length, dtype=torch.int64)
        start = {"epoch": epoch, "processed_indices": []}
        samplers = _ranks(length, 3, start)
        _train_steps(samplers, batch, counts, steps=2)
        committed = (_commit(samplers), counts.clone())
        _train_steps(samplers, batch, counts, steps=1)  # then a rank dies: rolled back
        state, counts = committed[0], committed[1].clone()
        samplers = _ranks(length, 2, state)  # shrink to the survivors
        assert samplers[0].processed_num == 2 * 3 * min(batch, math.ceil(length / 3))
        _train_steps(samplers, batch, counts, steps=2)
        samplers = _ranks(length, 5, _commit(samplers))  # grow, nothing rolled back
        _train_steps(samplers, batch, counts, steps=1)
        samplers = _ranks(length, 4, _commit(samplers))  # shrink again, then to the end
        assert len({len(s) for s in samplers}) == 1
        _train_steps(samplers, batch, counts)
        assert counts.tolist() == [1] * length, "every sample counted once in the epoch"
        for sampler in samplers:
            assert sampler.processed_num == length and sampler.processed_indices == set(
                range(length)
            )
            sampler.reset()
            assert len(sampler) == 0


def test_unmasked_repeats_are_few_and_only_in_the_last_step() -> None:
    length, size, batch = 61, 4, 5  # 16 per rank: 3 repeats in the 4th and last batch
    samplers = _ranks(length, size)
    trained = torch.zeros(length, dtype=torch.int64)
    last = math.ceil(samplers[0].num_samples / batch) - 1
    for batch_idx in range(last + 1):
        before = trained.clone()
        for sampler in samplers:
            trained[sampler.get_indices(batch_idx, batch)] += 1
            sampler.record_batch(batch_idx, batch)
        if batch_idx < last:
            assert int((trained - before).max()) == 1
    assert sorted(set(trained.tolist())) == [1, 2] and int((trained == 2).sum()) == 3
    assert samplers[0].processed_num == length
