"""Cooldown arithmetic and `--blacklist-cooldown-range` checks: pure, no sleeps."""

from __future__ import annotations

import math
import random

import pytest

from elastic.driver.discovery.cooldown import JITTER, Cooldown, validate_cooldown_range
from elastic.driver.errors import UsageError


def cooldown(low: float = 10.0, high: float = 300.0, seed: int = 0) -> Cooldown:
    return Cooldown(low, high, random.Random(seed))


class FixedRandom(random.Random):
    """A Random whose `random()` always returns `value`: jitter at its edges."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_unknown_host_is_not_in_cooldown() -> None:
    c = cooldown()
    assert not c.in_cooldown("a", 0.0)
    assert c.until("a") is None
    assert c.failures("a") == 0


def test_first_failure_excludes_for_about_low() -> None:
    c = cooldown(low=10, high=300)
    until = c.record_failure("a", 100.0)
    assert 100 + 10 <= until <= 100 + 10 * (1 + JITTER)
    assert c.until("a") == until
    assert c.in_cooldown("a", 100.0)
    assert c.in_cooldown("a", until - 1e-9)
    assert not c.in_cooldown("a", until)
    assert not c.in_cooldown("b", 100.0)


@pytest.mark.parametrize("u", [0.0, 0.5, 0.999999])
def test_delays_double_per_failure_up_to_high(u: float) -> None:
    c = Cooldown(10, 300, FixedRandom(u))
    expected = []
    for k in range(8):
        base = min(300.0, 10 * 2**k)
        lo, hi = max(10.0, base * (1 - JITTER)), min(300.0, base * (1 + JITTER))
        expected.append(lo + u * (hi - lo))
    now = 0.0
    delays = []
    for _ in range(8):
        until = c.record_failure("a", now)
        delays.append(until - now)
        now = until  # fails again right when it comes back
    assert delays == pytest.approx(expected)
    assert delays[-1] <= 300
    assert c.failures("a") == 8


def test_jitter_stays_within_bounds_over_many_draws() -> None:
    c = cooldown(low=1, high=1000, seed=42)
    for n in range(1, 12):
        base = min(1000, 2 ** (n - 1))
        for _ in range(200):
            d = c.delay(n)
            assert max(1, base * (1 - JITTER)) <= d <= min(1000, base * (1 + JITTER))


def test_jitter_spreads_hosts_that_fail_together() -> None:
    c = cooldown(low=10, high=300, seed=3)
    ends = {c.record_failure(f"h{i}", 0.0) for i in range(20)}
    assert len(ends) == 20


def test_first_and_capped_delays_stay_in_range_without_piling_up_at_the_bounds() -> None:
    c = cooldown(low=10, high=60, seed=9)
    first = [c.delay(1) for _ in range(50)]
    capped = [c.delay(30) for _ in range(50)]
    assert all(10 <= d <= 12 for d in first) and len(set(first)) == 50
    assert all(48 <= d <= 60 for d in capped) and len(set(capped)) == 50


def test_capped_delays_are_still_jittered() -> None:
    c = cooldown(low=1, high=60, seed=5)
    delays = {c.delay(20) for _ in range(50)}
    assert len(delays) > 1
    assert all(60 * (1 - JITTER) <= d <= 60 for d in delays)


def test_deterministic_given_the_rng() -> None:
    def run(seed: int) -> list[float]:
        c = cooldown(seed=seed)
        return [c.record_failure(h, t) for t, h in [(0, "a"), (1, "b"), (50, "a"), (400, "a")]]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_failure_during_cooldown_is_not_counted_again() -> None:
    c = cooldown(low=10, high=300)
    first = c.record_failure("a", 0.0)
    for t in (0.0, 0.001, 1.0, first - 0.5):  # e.g. the other workers of the host
        assert c.record_failure("a", t) == first
    assert c.failures("a") == 1
    second = c.record_failure("a", first + 1)
    assert c.failures("a") == 2
    assert second - (first + 1) >= 20 * (1 - JITTER)


def test_hosts_are_independent() -> None:
    c = cooldown()
    for _ in range(3):
        c.record_failure("a", c.until("a") or 0.0)
    c.record_failure("b", 1000.0)
    assert c.failures("a") == 3 and c.failures("b") == 1
    assert c.until("b") <= 1000 + 10 * (1 + JITTER)


def test_record_success_decays_one_failure() -> None:
    c = Cooldown(10, 1000, FixedRandom(0.5))  # no jitter: factor 1
    now = 0.0
    for _ in range(3):
        now = c.record_failure("a", now)
    assert c.failures("a") == 3
    c.record_success("a")
    assert c.failures("a") == 2
    # The next failure is the 3rd again: 40 s, not the 80 s a 4th would get.
    assert c.record_failure("a", now) - now == pytest.approx(40)


def test_record_success_does_not_shorten_an_exclusion_or_go_below_zero() -> None:
    c = cooldown()
    until = c.record_failure("a", 0.0)
    for _ in range(3):
        c.record_success("a")
    assert c.failures("a") == 0
    assert c.in_cooldown("a", until - 1)
    assert c.until("a") == until
    c.record_success("never-failed")
    assert c.until("never-failed") is None
    # After full decay the next failure counts as the first.
    again = c.record_failure("a", until + 1)
    assert again - (until + 1) <= 10 * (1 + JITTER)
    assert c.failures("a") == 1


def test_zero_low_starts_doubling_from_one_second() -> None:
    c = Cooldown(0, 300, FixedRandom(0.5))
    assert [c.delay(n) for n in (1, 2, 3, 10)] == pytest.approx([1, 2, 4, 270])


def test_zero_range_disables_cooldown() -> None:
    c = cooldown(low=0, high=0)
    assert c.record_failure("a", 5.0) == 5.0
    assert not c.in_cooldown("a", 5.0)


def test_equal_bounds_give_a_fixed_delay() -> None:
    c = cooldown(low=30, high=30)
    assert {c.delay(n) for n in range(1, 6)} == {30.0}


def test_infinite_range_excludes_for_good() -> None:
    c = cooldown(low=math.inf, high=math.inf)
    assert c.record_failure("a", 0.0) == math.inf
    assert c.in_cooldown("a", 1e12)


def test_many_failures_do_not_overflow() -> None:
    c = cooldown(low=1, high=100)
    assert c.delay(5000) <= 100


@pytest.mark.parametrize(
    ("low", "high"), [(-1, 10), (5, 4), (math.nan, 10), (1, math.nan), (math.inf, math.inf)]
)
def test_constructor_and_validator_reject_bad_ranges(low: float, high: float) -> None:
    with pytest.raises(UsageError, match="--blacklist-cooldown-range"):
        validate_cooldown_range(low, high)
    if not (math.isinf(low) and math.isinf(high)):
        with pytest.raises(ValueError):
            Cooldown(low, high, random.Random(0))


def test_delay_needs_at_least_one_failure() -> None:
    with pytest.raises(ValueError):
        cooldown().delay(0)


@pytest.mark.parametrize(
    ("low", "high", "message"),
    [
        (-1, 10, "MIN must be 0 or more, got -1"),
        (10, 5, r"MAX \(5\) must not be less than MIN \(10\)"),
        (math.inf, 10, "inf is not a number of seconds"),
    ],
)
def test_validator_messages(low: float, high: float, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        validate_cooldown_range(low, high)


@pytest.mark.parametrize(("low", "high"), [(0, 0), (0, 10), (10, 10), (0.5, 3600)])
def test_validator_accepts_good_ranges(low: float, high: float) -> None:
    assert validate_cooldown_range(low, high) == (low, high)
    assert isinstance(validate_cooldown_range(int(low), int(high))[0], float)


def test_hosts_no_longer_offered_are_forgotten_once_their_exclusion_ended() -> None:
    """A spot fleet's hosts come and go under new names: what is kept stays bounded by the
    hosts offered, without cutting short an exclusion in progress or one for good."""
    c = cooldown(10.0, 10.0)
    for n in range(1000):
        c.record_failure(f"spot-{n}", now=float(n))
    c.record_failure("kept", now=0.0)
    forever = Cooldown(math.inf, math.inf, random.Random(0))
    forever.record_failure("gone", now=0.0)

    c.forget_gone({"kept"}, now=995.0)
    forever.forget_gone(set(), now=1e9)

    assert set(c.records()) == {"kept", *(f"spot-{n}" for n in range(986, 1000))}
    assert c.in_cooldown("spot-999", now=995.0)  # still excluded: kept until it ends
    assert c.failures("kept") == 1
    assert forever.in_cooldown("gone", now=1e9)
