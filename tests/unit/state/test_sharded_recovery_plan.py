"""Which commit a re-formed round goes on from, who supplies each shard, and who sends which
rows to whom on a shrink and on a grow."""

from __future__ import annotations

from elastic.state.sharded.placement import place_replicas
from elastic.state.sharded.recovery_plan import Held, SlotId, choose, describe_loss
from elastic.state.sharded.rows import Piece, pieces

C5 = SlotId(5, 1)


def held_after_replication(hosts: list[str], slot: SlotId, replicas: int = 1) -> list[Held]:
    """What each rank of a round holds once `slot` is replicated: its own and its replicas."""
    placement = place_replicas(hosts, replicas)
    return [
        Held(slot, slot.commit, len(hosts), frozenset([rank, *placement.backed_up_by(rank)]), rank)
        for rank in range(len(hosts))
    ]


def test_a_shrink_takes_the_lost_rank_s_shard_from_its_replica() -> None:
    held = held_after_replication(["a", "a", "b", "b"], C5)  # 0<->2, 1<->3
    survivors = [[held[0]], [held[1]], [held[2]]]  # rank 3 was killed
    choice = choose(survivors)
    assert choice is not None
    assert (choice.slot, choice.world, choice.sources) == (C5, 4, (0, 1, 2, 1))
    assert choice.reason == (
        "commit 5 (taken by 4 rank(s) in round 1): shard(s) of 3 from rank 1 from replicas"
    )
    # a 7-row tensor, 2-2-2-1 over 4 ranks, becomes 3-3-1 over 3
    assert pieces(7, 4, 3, choice.sources) == [
        Piece(new_rank=0, start=0, stop=2, old_rank=0, source=0),
        Piece(new_rank=0, start=2, stop=3, old_rank=1, source=1),
        Piece(new_rank=1, start=3, stop=4, old_rank=1, source=1),
        Piece(new_rank=1, start=4, stop=6, old_rank=2, source=2),
        Piece(new_rank=2, start=6, stop=7, old_rank=3, source=1),
    ]


def test_a_whole_host_lost_is_covered_by_the_other_host_s_replicas() -> None:
    held = held_after_replication(["a", "a", "b", "b"], C5)
    choice = choose([[held[0]], [held[1]]])  # host b is gone
    assert choice is not None and choice.sources == (0, 1, 0, 1)


def test_a_grow_sends_the_joiner_rows_from_every_incumbent() -> None:
    slot = SlotId(9, 3)
    held = [Held(slot, 9, 2, frozenset({0}), 0), Held(slot, 9, 2, frozenset({1}), 1)]
    choice = choose([[held[0]], [held[1]], []])  # rank 2 joined and holds nothing
    assert choice is not None and choice.sources == (0, 1)
    assert choice.reason.endswith("every shard from the rank that took it")
    # 7 rows, 4-3 over 2 ranks, become 3-3-1 over 3
    assert pieces(7, 2, 3, choice.sources) == [
        Piece(new_rank=0, start=0, stop=3, old_rank=0, source=0),
        Piece(new_rank=1, start=3, stop=4, old_rank=0, source=0),
        Piece(new_rank=1, start=4, stop=6, old_rank=1, source=1),
        Piece(new_rank=2, start=6, stop=7, old_rank=1, source=1),
    ]


def test_the_newest_commit_held_whole_wins_over_a_newer_one_half_replicated() -> None:
    c6 = SlotId(6, 1)
    older = held_after_replication(["a", "b", "a", "b"], C5)
    # commit 6 was taken; rank 3's copy of it had not reached its holder when rank 3 died
    newer = [Held(c6, 6, 4, frozenset({r}), r) for r in range(3)]
    choice = choose([[older[r], newer[r]] for r in range(3)])
    assert choice is not None and choice.slot == C5


def test_a_replica_holder_supplies_when_the_taker_is_gone_the_least_loaded_first() -> None:
    slot = SlotId(2, 1)
    both = frozenset({2, 3})
    held = [[Held(slot, 2, 4, both | {0}, 0)], [Held(slot, 2, 4, both | {1}, 1)]]
    choice = choose(held)
    assert choice is not None and choice.sources == (0, 1, 0, 1)


def test_a_re_taken_commit_keeps_its_origin() -> None:
    slot = SlotId(7, 4)  # commit 5's values, re-taken under count 7 by round 4's two ranks
    choice = choose([[Held(slot, 5, 2, frozenset({0}), 0)], [Held(slot, 5, 2, frozenset({1}), 1)]])
    assert choice is not None and (choice.slot.commit, choice.origin) == (7, 5)


def test_nothing_held_whole_is_no_choice_and_the_loss_is_said_in_one_line() -> None:
    held = held_after_replication(["a", "a", "b", "b", "c", "c"], C5)
    survivors = [[held[0]], [held[1]]]  # hosts b and c lost, with replicas=1
    assert choose(survivors) is None
    assert describe_loss(survivors, 1) == (
        "commit 5 (round 1) is lost: no worker left holds the shards of rank(s) 2, 3 of its 6; "
        "more hosts were lost at once than replicas=1 covers"
    )
    assert choose([[], []]) is None
    assert describe_loss([[], []], 1) == "no worker of the new round holds any commit"
