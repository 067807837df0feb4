"""Property tests of the pure GCRA and sliding-window references against plain models, and their bounds.

The models are written from the definitions, independently of ``backends.algorithms``: GCRA's virtual
scheduling with ``Fraction`` emission intervals, and the sliding log as a brute-force search over the list of
every permit ever handed over.
"""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.backends.algorithms import (
    gcra_available,
    gcra_bound,
    gcra_decide,
    gcra_quota,
    sliding_available,
    sliding_decide,
    sliding_initial,
    sliding_quota,
)
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig

SETTINGS = settings(max_examples=150, deadline=None)

limits = st.integers(min_value=1, max_value=12)
periods = st.integers(min_value=1, max_value=5_000)
# (time step, permits, timeout) per request; steps of 0 make simultaneous arrivals likely.
steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=3_000),
        st.integers(min_value=1, max_value=14),
        st.sampled_from([0, 0, 0, 1, 500, 4_000, -1]),
    ),
    max_size=60,
)


class GcraModel:
    """Virtual scheduling (ITU-T I.371) with an exact rational emission interval."""

    def __init__(self, limit: int, period: int, burst: int) -> None:
        self.e = Fraction(period, limit)
        self.tau = (burst - 1) * self.e
        self.burst = burst
        self.tat = Fraction(0)

    def take(self, now: int, permits: int, timeout: int) -> tuple[int, bool]:
        base = max(self.tat, Fraction(now))
        new_tat = base + permits * self.e
        # conforms at time u when u >= new_tat - e - tau, i.e. the last of the k cells is not too early
        conform_at = new_tat - self.e - self.tau
        wait = max(0, math.ceil(conform_at - now))
        granted = permits <= self.burst and timeout >= wait
        if granted:
            self.tat = new_tat
        return wait, granted


class SlidingModel:
    """Every permit ever handed over; a request waits for the earliest instant its window has room."""

    def __init__(self, limit: int, period: int) -> None:
        self.limit, self.period = limit, period
        self.handed: list[int] = []

    def fits(self, at: int, permits: int) -> bool:
        return sum(1 for t in self.handed if t > at - self.period) + permits <= self.limit

    def take(self, now: int, permits: int, timeout: int) -> tuple[int, bool]:
        if permits > self.limit:
            return self.period, False
        earliest = max([now, *self.handed[-1:]])
        candidates = sorted({earliest} | {t + self.period for t in self.handed if t + self.period > earliest})
        at = next(c for c in candidates if self.fits(c, permits))
        wait = at - now
        if timeout >= wait:
            self.handed.extend([at] * permits)
            return wait, True
        return wait, False


def max_in_window(times: list[int], window: int) -> int:
    """Most entries of the sorted ``times`` inside any half-open window ``[s, s + window)``."""
    best = 0
    j = 0
    for i, start in enumerate(times):
        j = max(j, i)
        while j < len(times) and times[j] < start + window:
            j += 1
        best = max(best, j - i)
    return best


@SETTINGS
@given(limits, periods, st.integers(min_value=1, max_value=15), steps)
def test_gcra_matches_virtual_scheduling(limit: int, period: int, burst: int, requests: list) -> None:
    model = GcraModel(limit, period, burst)
    tat, now = 0, 0
    for step, permits, timeout in requests:
        now += step
        expected = model.take(now, permits, timeout)
        tat, wait, granted = gcra_decide(tat, permits, timeout, now, period, limit, burst)
        assert (wait, granted) == expected
        assert tat == model.tat * limit  # one integer: the model's tat scaled by limit
        available = gcra_available(tat, now, period, limit, burst)
        assert available <= burst
        assert (available >= 1) == (gcra_decide(tat, 1, -1, now, period, limit, burst)[1] == 0)
        remaining, reset = gcra_quota(tat, now, period, limit, burst)
        assert remaining == available and reset >= 0
        if remaining < 1:
            assert reset == gcra_decide(tat, 1, -1, now, period, limit, burst)[1]


@SETTINGS
@given(limits, periods, steps)
def test_sliding_window_matches_the_log_model(limit: int, period: int, requests: list) -> None:
    model = SlidingModel(limit, period)
    times, now = sliding_initial(limit, period), 0
    for step, permits, timeout in requests:
        now += step
        expected = model.take(now, permits, timeout)
        times, wait, granted = sliding_decide(times, permits, timeout, now, period)
        assert (wait, granted) == expected
        assert list(times) == sorted(times) and len(times) == limit
        available = sliding_available(times, now, period)
        assert (available >= 1) == (sliding_decide(times, 1, -1, now, period)[1] == 0)
        remaining, reset = sliding_quota(times, now, period)
        assert remaining == available and reset >= 0


@SETTINGS
@given(limits, periods, st.integers(min_value=1, max_value=15), steps)
def test_gcra_never_exceeds_its_bound_in_any_window(limit: int, period: int, burst: int, requests: list) -> None:
    tat, now, handed = 0, 0, []
    for step, permits, timeout in requests:
        now += step
        tat, wait, granted = gcra_decide(tat, permits, timeout, now, period, limit, burst)
        if granted:
            handed.extend([now + wait] * permits)
    handed.sort()
    for window in (period, max(1, period // 3), 2 * period):
        assert max_in_window(handed, window) <= gcra_bound(window, period, limit, burst)
    assert max_in_window(handed, period) <= limit + burst - 1


@SETTINGS
@given(limits, periods, steps)
def test_sliding_window_never_exceeds_limit_in_any_window(limit: int, period: int, requests: list) -> None:
    times, now, handed = sliding_initial(limit, period), 0, []
    for step, permits, timeout in requests:
        now += step
        times, wait, granted = sliding_decide(times, permits, timeout, now, period)
        if granted:
            handed.extend([now + wait] * permits)
    assert handed == sorted(handed)
    assert max_in_window(handed, period) <= limit


def test_gcra_with_burst_one_is_exact_and_wait_matches_spacing() -> None:
    # 10/s, burst 1: one permit per 100 ms, never two in the same 100 ms, never more than 10 in any second.
    tat, wait, granted = gcra_decide(0, 1, 0, 5, 1_000_000_000, 10, 1)
    assert granted and wait == 0
    _, wait, granted = gcra_decide(tat, 1, 0, 6, 1_000_000_000, 10, 1)
    assert not granted and wait == 100_000_000 - 1
    assert gcra_bound(1_000_000_000, 1_000_000_000, 10, 1) == 10


def test_cycle_limiter_admits_twice_its_limit_across_a_boundary_gcra_and_sliding_do_not() -> None:
    """The fixed window's boundary burst: 10/s lets 20 through within 2 ms; the smooth algorithms do not."""
    second, ms = 1_000_000_000, 1_000_000
    clock = FakeClock()
    cycle = RateLimiter("cycle", RateLimiterConfig(limit_for_period=10, limit_refresh_period="1s"), clock=clock)
    clock.advance_ns(second - ms)  # 1 ms before the boundary
    passed = [clock.now_ns() for _ in range(30) if cycle.acquire_permission()]
    clock.advance_ns(2 * ms)  # 1 ms after it
    passed += [clock.now_ns() for _ in range(30) if cycle.acquire_permission()]
    assert len(passed) == 20 and passed[-1] - passed[0] <= 2 * ms

    # The same traffic (and a full limiter 1 ms before the "boundary") through the pure references.
    for burst in (1, 5, 10):
        tat, handed = 0, []
        for now in (second - ms, second + ms):
            for _ in range(30):
                tat, _, granted = gcra_decide(tat, 1, 0, now, second, 10, burst)
                if granted:
                    handed.append(now)
        assert len(handed) == burst + 0  # 2 ms at 100 ms per permit adds nothing to the burst
        assert len(handed) <= gcra_bound(2 * ms + 1, second, 10, burst)
    times, handed = sliding_initial(10, second), []
    for now in (second - ms, second + ms):
        for _ in range(30):
            times, _, granted = sliding_decide(times, 1, 0, now, second)
            if granted:
                handed.append(now)
    assert len(handed) == 10
