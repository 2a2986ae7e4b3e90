"""Forming an epoch's process group after an earlier attempt failed, with real processes.

A survivor whose group creation failed (a peer never came, or a newer epoch formed) must still
form the next group with a fresh joiner: torch names each default group from a per-process
counter, so both must start from the same name (soak seed 1 stalled with names "1" and "0").
"""

from __future__ import annotations

import multiprocessing
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from elastic.worker.process_group import abandon_group, create_group

pytestmark = pytest.mark.timeout(120)

CPU = torch.device("cpu")


def _fresh_joiner(store_path: str, result: multiprocessing.Queue) -> None:
    store = dist.FileStore(store_path, 2)
    try:
        create_group(store, 1, 2, CPU, timedelta(seconds=20))
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        result.put(float(tensor.item()))
    except Exception as err:  # reported to the test, which fails with it
        result.put(repr(err))
    finally:
        abandon_group()


def test_a_group_forms_with_a_fresh_joiner_after_a_failed_attempt(tmp_path: Path) -> None:
    lonely = dist.FileStore(str(tmp_path / "epoch-1"), 2)
    with pytest.raises((RuntimeError, TimeoutError)):  # rank 1 never comes
        create_group(lonely, 0, 2, CPU, timedelta(seconds=1))
    assert not dist.is_initialized()

    context = multiprocessing.get_context("spawn")
    result: multiprocessing.Queue = context.Queue()
    joiner = context.Process(target=_fresh_joiner, args=(str(tmp_path / "epoch-2"), result))
    joiner.start()
    try:
        create_group(dist.FileStore(str(tmp_path / "epoch-2"), 2), 0, 2, CPU, timedelta(seconds=20))
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        assert tensor.item() == 2.0
        assert result.get(timeout=30) == 2.0
    finally:
        abandon_group()
        joiner.join(timeout=30)
        if joiner.is_alive():
            joiner.kill()
