"""The worker's retry schedule (pure: seeded random sources, no sleeping)."""

from __future__ import annotations

import random

import pytest

from elastic.worker.driver_link.retries import Backoff, bounded_retries, jittered

CEILINGS = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]


def test_jittered_keeps_the_upper_half() -> None:
    rng = random.Random(7)
    draws = [jittered(1.0, rng) for _ in range(1000)]
    assert all(0.5 <= d <= 1.0 for d in draws)
    assert min(draws) < 0.55 and max(draws) > 0.95  # the whole half is used


def test_stream_backoff_doubles_to_its_cap_and_resets() -> None:
    backoff = Backoff(rng=random.Random(1))
    waits = [backoff.next() for _ in CEILINGS]
    for wait, ceiling in zip(waits, CEILINGS, strict=True):
        assert ceiling / 2 <= wait <= ceiling
    backoff.reset()
    assert backoff.next() <= CEILINGS[0]


def test_workers_that_fail_together_do_not_retry_together() -> None:
    """A thousand workers losing the driver at once: their fifth waits spread over
    [0.4, 0.8] s instead of all falling on 0.8 s."""
    fifth = []
    for seed in range(1000):
        backoff = Backoff(rng=random.Random(seed))
        fifth.append([backoff.next() for _ in range(5)][-1])
    assert max(fifth) - min(fifth) > 0.3
    assert len({round(w, 3) for w in fifth}) > 200


def test_bad_backoff_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        Backoff(first=0.0)
    with pytest.raises(ValueError):
        Backoff(first=3.0, cap=2.0)


def test_bounded_retries_wait_jittered_and_give_up_on_other_errors() -> None:
    slept: list[float] = []
    retrying = bounded_retries(
        60.0, lambda err: isinstance(err, ConnectionError), rng=random.Random(3)
    ).copy(sleep=slept.append)
    failures = iter([ConnectionError()] * 6)

    def attempt() -> str:
        if (failure := next(failures, None)) is not None:
            raise failure
        return "answer"

    assert retrying(attempt) == "answer"
    assert len(slept) == 6
    for wait, ceiling in zip(slept, CEILINGS, strict=False):
        assert ceiling / 2 <= wait <= ceiling

    with pytest.raises(KeyError):  # not retryable: raised at once
        bounded_retries(60.0, lambda err: isinstance(err, ConnectionError))(lambda: {}["missing"])


def test_bounded_retries_go_at_once_to_a_driver_that_moved() -> None:
    slept: list[float] = []
    retrying = bounded_retries(60.0, lambda err: True, moved=lambda: True).copy(sleep=slept.append)
    failures = iter([OSError()] * 3)

    def attempt() -> None:
        if (failure := next(failures, None)) is not None:
            raise failure

    retrying(attempt)
    assert slept == [0.0, 0.0, 0.0]
