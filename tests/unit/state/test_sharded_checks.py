"""The checks ShardedState makes before it commits: the host memory its commits need, and
what a model must look like (the DTensor cases run in real process groups:
tests/e2e/process_groups/test_sharded_state.py)."""

from __future__ import annotations

import torch

from elastic.state.sharded.checks import (
    available_memory,
    memory_problem,
    readable,
    sharding_problem,
)
from elastic.state.sharded.placement import check_replicas

MIB = 1 << 20


def test_commits_that_fit_the_host_are_no_problem() -> None:
    # 2 x (1 + 1) x 10 MiB = 40 MiB per rank, 4 ranks on the host: 160 MiB
    assert memory_problem(10 * MIB, 0, 1, 4, "h", lambda: 160 * MIB) is None


def test_commits_too_large_for_the_host_name_the_need_and_what_to_change() -> None:
    problem = memory_problem(10 * MIB, 0, 1, 4, "host-a", lambda: 159 * MIB)
    assert problem == (
        "ShardedState(replicas=1): commits need about 40.00 MiB of host memory per rank at "
        "their peak (2 x (1 + replicas) x this rank's 10.00 MiB share of the state), and host "
        "host-a has 159.00 MiB for its 4 worker(s): lower replicas, shard over more ranks, or "
        "give the commits more host memory (ShardedState's host_memory)"
    )


def test_what_a_rank_holds_already_counts_as_available() -> None:
    assert memory_problem(10 * MIB, 20 * MIB, 1, 1, "h", lambda: 20 * MIB) is None
    assert memory_problem(10 * MIB, 19 * MIB, 1, 1, "h", lambda: 20 * MIB) is not None


def test_more_replicas_need_more_memory() -> None:
    assert memory_problem(MIB, 0, 0, 1, "h", lambda: 2 * MIB) is None
    assert memory_problem(MIB, 0, 1, 1, "h", lambda: 2 * MIB) is not None


def test_an_unknown_amount_of_memory_is_not_checked() -> None:
    assert memory_problem(1 << 40, 0, 3, 8, "h", lambda: None) is None


def test_available_memory_reads_the_kernel_s_figure(tmp_path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  100 kB\nMemAvailable:   2048 kB\n")
    assert available_memory(str(meminfo)) == 2048 * 1024
    assert (available_memory() or 1) > 0


def test_sizes_read_in_binary_units() -> None:
    assert [readable(n) for n in (0, 1023, 1024, 3 * MIB // 2, 5 << 30)] == [
        "0 bytes", "1023 bytes", "1.00 KiB", "1.50 MiB", "5.00 GiB",
    ]  # fmt: skip


def test_a_model_that_is_not_sharded_is_named_with_how_to_shard_it() -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    problem = sharding_problem(model, optimizer, mesh=None)  # type: ignore[arg-type]
    assert problem == (
        "ShardedState: parameter 'weight' is not sharded: build(mesh) must apply "
        "fully_shard(module, mesh=mesh) to the model (its blocks, then its root)"
    )


def test_build_must_return_a_model_and_an_optimizer() -> None:
    problem = sharding_problem(torch.nn.Linear(2, 2), "adam", mesh=None)  # type: ignore[arg-type]
    assert problem is not None
    assert problem.startswith("build(mesh) returned (Linear, str): it must return")


def test_replicas_need_that_many_other_hosts() -> None:
    check_replicas(["a", "a", "b"], 1)
    check_replicas(["a"], 0)
    try:
        check_replicas(["a", "a", "b", "b"], 2)
    except ValueError as err:
        assert str(err) == (
            "ShardedState(replicas=2) keeps each shard on 2 other host(s), but the job has 2 "
            "host(s) (a, b): run on at least 3 hosts or lower replicas"
        )
    else:
        raise AssertionError("replicas=2 on 2 hosts was accepted")
