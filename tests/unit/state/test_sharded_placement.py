"""Where replicas go: other hosts, balanced, deterministic; and the errors for too few hosts."""

from __future__ import annotations

import pytest

from elastic.state.sharded.errors import ShardedStateError
from elastic.state.sharded.placement import check_replicas, place_replicas


def test_one_replica_on_two_even_hosts_pairs_the_ranks_across() -> None:
    placement = place_replicas(["a", "a", "b", "b"], 1)
    assert placement.holders == ((2,), (3,), (0,), (1,))
    assert placement.across_hosts
    assert placement.backed_up_by(0) == [2]


def test_uneven_hosts_put_the_big_host_s_replicas_on_the_small_one() -> None:
    placement = place_replicas(["a", "a", "a", "b"], 1)
    assert placement.holders == ((3,), (3,), (3,), (0,))
    assert placement.backed_up_by(3) == [0, 1, 2]


@pytest.mark.parametrize(
    "hosts",
    [list("aabbcc"), list("abbccc"), list("aaabbc"), list("abcabc"), list("aaaabbbcc")],
    ids=lambda h: "".join(h),
)
def test_two_replicas_go_to_two_other_hosts_each(hosts: list[str]) -> None:
    placement = place_replicas(hosts, 2)
    loads = [len(placement.backed_up_by(rank)) for rank in range(len(hosts))]
    for rank, held in enumerate(placement.holders):
        assert len(held) == 2
        assert len({hosts[rank], *(hosts[q] for q in held)}) == 3, (rank, held)
    assert sum(loads) == 2 * len(hosts)
    if len({hosts.count(host) for host in hosts}) == 1:
        assert set(loads) == {2}, "even hosts: every rank holds as many replicas"
    assert placement.across_hosts
    assert place_replicas(hosts, 2) == placement, "every rank computes the same placement"


def test_one_host_keeps_replicas_on_its_other_ranks_and_says_so() -> None:
    placement = place_replicas(["a", "a", "a"], 1)
    assert placement.holders == ((1,), (2,), (0,))
    assert not placement.across_hosts


def test_no_replicas_or_one_rank_places_nothing() -> None:
    assert place_replicas(["a", "b"], 0).holders == ((), ())
    assert place_replicas(["a"], 1).holders == ((),)


@pytest.mark.parametrize(
    ("hosts", "replicas", "message"),
    [
        (["a", "a"], 1, r"replicas=1\) keeps each shard on 1 other host\(s\), but the job has 1 "
                        r"host\(s\) \(a\): run on at least 2 hosts or lower replicas"),
        (["a", "b", "a"], 2, r"the job has 2 host\(s\) \(a, b\): run on at least 3 hosts"),
        (["a", "b"], -1, r"replicas must be 0 or more"),
    ],
)  # fmt: skip
def test_too_few_hosts_for_the_replicas_is_one_line(
    hosts: list[str], replicas: int, message: str
) -> None:
    with pytest.raises(ShardedStateError, match=message) as caught:
        check_replicas(hosts, replicas)
    assert "\n" not in str(caught.value)


def test_enough_hosts_pass() -> None:
    check_replicas(["a", "b"], 1)
    check_replicas(["a"], 0)
