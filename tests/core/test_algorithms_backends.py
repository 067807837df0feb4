"""The in-memory GCRA and sliding-window backends through RateLimiter: same answers as the pure references,
their bounds on the fake clock, reservations, async, multi-limits mixing algorithms, metrics and threads."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.backends.algorithms import (
    gcra_bound,
    gcra_decide,
    gcra_quota,
    sliding_decide,
    sliding_initial,
    sliding_quota,
)
from django_ratelimit_r4.backends.memory import GcraBackend, MemoryBackend, SlidingWindowBackend
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import ConfigurationError, RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, acquire_all, most_grantable

from .test_algorithms_properties import max_in_window

SETTINGS = settings(max_examples=120, deadline=None)
SECOND, MS = 1_000_000_000, 1_000_000

requests = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=3_000),
        st.integers(min_value=1, max_value=14),
        st.sampled_from([0, 0, 0, 1, 500, 4_000]),
    ),
    max_size=60,
)


def limiter(algorithm: str, limit: int = 10, period: object = "1s", clock: FakeClock | None = None, **kw: object) -> RateLimiter:
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm, **kw)
    return RateLimiter(algorithm, config, clock=clock or FakeClock())


@SETTINGS
@given(
    st.integers(min_value=1, max_value=12),
    st.integers(min_value=1, max_value=5_000),
    st.integers(min_value=1, max_value=15),
    requests,
)
def test_gcra_backend_matches_the_reference(limit: int, period: int, burst: int, steps: list) -> None:
    clock = FakeClock()
    backend = GcraBackend("g", limit, period, clock, burst=burst)
    start, tat = clock.now_ns(), 0
    for step, permits, timeout in steps:
        clock.advance_ns(step)
        now = clock.now_ns() - start
        tat, wait, granted = gcra_decide(tat, permits, timeout, now, period, limit, burst)
        if timeout == 0 and wait > 0:
            granted = False  # timeout 0 never reserves a wait (the pure function says the same for wait > 0)
        assert backend.acquire(permits, timeout) == (wait if granted else -wait)
        remaining, reset = gcra_quota(tat, now, period, limit, burst)
        assert backend.quota() == (remaining, reset)
        assert backend.state()[1:] == (remaining, gcra_decide(tat, 1, -1, now, period, limit, burst)[1])


@SETTINGS
@given(st.integers(min_value=1, max_value=12), st.integers(min_value=1, max_value=5_000), requests)
def test_sliding_backend_matches_the_reference(limit: int, period: int, steps: list) -> None:
    clock = FakeClock()
    backend = SlidingWindowBackend("s", limit, period, clock)
    start, times = clock.now_ns(), sliding_initial(limit, period)
    for step, permits, timeout in steps:
        clock.advance_ns(step)
        now = clock.now_ns() - start
        times, wait, granted = sliding_decide(times, permits, timeout, now, period)
        assert backend.acquire(permits, timeout) == (wait if granted else -wait)
        assert backend.quota() == sliding_quota(times, now, period)
        assert backend.state()[1:] == (sliding_quota(times, now, period)[0], sliding_decide(times, 1, -1, now, period)[1])


@SETTINGS
@given(st.sampled_from(["gcra", "sliding_window"]), st.integers(min_value=1, max_value=10), requests)
def test_limiters_never_exceed_their_bound_in_any_window_on_the_fake_clock(
    algorithm: str, limit: int, steps: list
) -> None:
    """Random arrivals through the public API; a granted call is handed over when acquire returns."""
    clock = FakeClock()
    period = 2_000
    burst = max(1, limit // 2) if algorithm == "gcra" else None
    rl = limiter(algorithm, limit, f"{period}ns", clock, burst=burst, timeout_duration=f"{3 * period}ns")
    handed: list[int] = []
    for step, permits, _ in steps:
        clock.advance_ns(step)
        if permits <= most_grantable(rl.config, 3 * period) and rl.acquire_permission(permits):
            handed.extend([clock.now_ns()] * permits)  # after the (fake) wait for a reservation
    bound = limit if algorithm == "sliding_window" else gcra_bound(period, period, limit, burst or limit)
    assert max_in_window(sorted(handed), period) <= bound


@pytest.mark.parametrize(("algorithm", "expected"), [("cycle", 20), ("gcra", 10), ("sliding_window", 10)])
def test_boundary_burst_through_rate_limiter(algorithm: str, expected: int) -> None:
    """10/s, a burst 1 ms before a cycle boundary and another 1 ms after: only the cycle limiter gives 20."""
    clock = FakeClock()
    rl = limiter(algorithm, 10, "1s", clock)
    clock.advance_ns(SECOND - MS)
    passed = sum(rl.acquire_permission() for _ in range(30))
    clock.advance_ns(2 * MS)
    passed += sum(rl.acquire_permission() for _ in range(30))
    assert passed == expected


def test_gcra_spacing_reservations_and_retry_after() -> None:
    clock = FakeClock()
    rl = limiter("gcra", 10, "1s", clock, burst=2, timeout_duration="150ms")
    assert rl.reserve_permission() == 0 and rl.reserve_permission() == 0
    assert rl.reserve_permission() == 100 * MS  # reserved: one emission interval later
    assert rl.reserve_permission() == -1  # would wait 200 ms > 150 ms: nothing reserved
    assert rl.metrics.available_permissions == -1 and rl.metrics.nanos_to_wait == 200 * MS
    strict = limiter("gcra", 10, "1s", clock, burst=2)
    strict.acquire_or_raise(2)
    with pytest.raises(RequestNotPermitted) as info:
        strict.acquire_or_raise()
    assert info.value.wait_ns == 100 * MS  # Retry-After from state
    assert strict.backend.quota() == (0, 100 * MS)
    clock.advance_ns(100 * MS)
    assert strict.backend.quota() == (1, 100 * MS)  # one back, full again in another 100 ms
    with pytest.raises(ValueError, match="can never grant 3"):
        strict.acquire_permission(3)  # more than the burst


def test_sliding_window_reservations_retry_after_and_drain() -> None:
    clock = FakeClock()
    rl = limiter("sliding_window", 3, "1s", clock, timeout_duration="1s")
    assert [rl.reserve_permission() for _ in range(2)] == [0, 0]
    clock.advance_ns(400 * MS)
    assert rl.reserve_permission() == 0
    assert rl.reserve_permission() == 600 * MS  # the first permit leaves the window at 1 s
    assert rl.metrics.available_permissions == 0
    strict = limiter("sliding_window", 3, "1s", clock)
    assert strict.drain_permissions() == 3
    with pytest.raises(RequestNotPermitted) as info:
        strict.acquire_or_raise()
    assert info.value.wait_ns == SECOND
    assert strict.backend.quota() == (0, SECOND)
    assert strict.metrics.failed_calls == 1 and strict.metrics.successful_calls == 0


@pytest.mark.parametrize("algorithm", ["gcra", "sliding_window"])
def test_async_acquire_waits_on_the_fake_clock(algorithm: str) -> None:
    clock = FakeClock()
    rl = limiter(algorithm, 2, "1s", clock, timeout_duration="2s")

    async def run() -> list[bool]:
        return [await rl.aacquire_permission() for _ in range(3)]

    start = clock.now_ns()
    assert asyncio.run(run()) == [True, True, True]
    assert clock.now_ns() - start == (500 * MS if algorithm == "gcra" else SECOND)


def test_acquire_all_mixes_algorithms_all_or_nothing() -> None:
    clock = FakeClock()
    cycle = limiter("cycle", 5, "1s", clock)
    gcra = limiter("gcra", 10, "1s", clock, burst=2)
    sliding = limiter("sliding_window", 3, "1s", clock)
    assert acquire_all([cycle, gcra, sliding]) is None
    assert acquire_all([cycle, gcra, sliding]) is None
    rejecting, wait = acquire_all([cycle, gcra, sliding])  # type: ignore[misc]
    assert rejecting is gcra and wait == 100 * MS
    # nothing was taken anywhere: the cycle and sliding limiters still have 3 and 1
    assert cycle.metrics.available_permissions == 3 and sliding.metrics.available_permissions == 1
    clock.advance_ns(100 * MS)
    assert acquire_all([sliding, gcra, cycle]) is None
    rejecting, wait = acquire_all([cycle, sliding])  # type: ignore[misc]
    assert rejecting is sliding and wait == 900 * MS


def test_change_limit_keeps_state_meaningful() -> None:
    clock = FakeClock()
    gcra = limiter("gcra", 10, "1s", clock)
    assert gcra.acquire_permission(10)
    gcra.change_limit_for_period(20)  # burst follows the limit when not set; the time until full is kept
    assert gcra.metrics.available_permissions == 0 and gcra.metrics.nanos_to_wait == 50 * MS
    clock.advance_ns(SECOND)
    assert gcra.metrics.available_permissions == 20
    sliding = limiter("sliding_window", 3, "1s", clock)
    assert sliding.acquire_permission(3)
    sliding.change_limit_for_period(5)
    assert sliding.metrics.available_permissions == 2
    sliding.change_limit_for_period(2)
    assert sliding.metrics.available_permissions == 0


def test_config_validation_and_backend_choice() -> None:
    with pytest.raises(ConfigurationError, match="algorithm"):
        RateLimiterConfig(algorithm="token_bucket")
    with pytest.raises(ConfigurationError, match="burst"):
        RateLimiterConfig(burst=5)  # only for gcra
    with pytest.raises(ConfigurationError, match="burst"):
        RateLimiterConfig(algorithm="gcra", burst=0)
    with pytest.raises(ConfigurationError, match="sliding_window"):
        RateLimiterConfig(algorithm="sliding_window", limit_for_period=10**6)
    assert RateLimiterConfig(algorithm="GCRA").algorithm == "gcra"
    assert isinstance(limiter("cycle").backend, MemoryBackend)
    assert isinstance(limiter("gcra").backend, GcraBackend)
    assert isinstance(limiter("sliding_window").backend, SlidingWindowBackend)

    def other_backend(name: str, limit: int, period: int, clock: object) -> MemoryBackend:
        raise AssertionError("not called")

    with pytest.raises(ValueError, match="needs the memory backend"):
        RateLimiter("x", RateLimiterConfig(algorithm="gcra"), backend=other_backend)


@pytest.mark.parametrize(("algorithm", "granted"), [("gcra", 7), ("sliding_window", 10)])
def test_exact_under_20_threads(algorithm: str, granted: int, fast_switching: None) -> None:
    """20 threads race on a frozen fake clock with a 1 µs switch interval: exactly the budget is granted."""
    for _ in range(20):
        rl = limiter(algorithm, 10, "1s", FakeClock(), **({"burst": 7} if algorithm == "gcra" else {}))
        barrier = threading.Barrier(20)
        results: list[int] = []

        def worker(rl: RateLimiter = rl, barrier: threading.Barrier = barrier, results: list = results) -> None:
            barrier.wait()
            results.append(sum(rl.acquire_permission() for _ in range(5)))

        threads = [threading.Thread(target=worker) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(results) == granted
        assert rl.metrics.successful_calls == granted and rl.metrics.failed_calls == 100 - granted


def test_keyed_limits_with_smooth_unkeyed_ones() -> None:
    from django_ratelimit_r4.keyed import KeyedRateLimiter, acquire_all_keyed

    clock = FakeClock()
    keyed = KeyedRateLimiter("k", RateLimiterConfig(limit_for_period=1, limit_refresh_period="1s"), clock=clock)
    gcra = limiter("gcra", 10, "1s", clock, burst=1)
    assert acquire_all_keyed([(keyed, "a"), (gcra, None)]) is None
    # key "a" rejects (wait 1 s); the GCRA limiter, peeked, would need 100 ms: the larger wait wins
    assert acquire_all_keyed([(gcra, None), (keyed, "a")]) == (1, SECOND)
    clock.advance_ns(50 * MS)
    assert acquire_all_keyed([(keyed, "b"), (gcra, None)]) == (1, 50 * MS)
    assert "b" not in keyed  # all-or-nothing: nothing was taken for key b
    assert type(KeyedRateLimiter("g", RateLimiterConfig(algorithm="gcra")).store).__name__ == "SmoothKeyedStore"


ring_ops = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.integers(min_value=1, max_value=14), st.sampled_from([0, 0, 1, 500, 4_000])),
        st.tuples(st.just("advance"), st.integers(min_value=0, max_value=3_000), st.just(0)),
        st.tuples(st.just("drain"), st.just(0), st.just(0)),
        st.tuples(st.just("give_back"), st.integers(min_value=1, max_value=14), st.just(0)),
        st.tuples(st.just("change_limit"), st.integers(min_value=1, max_value=12), st.just(0)),
    ),
    max_size=80,
)


@SETTINGS
@given(st.integers(min_value=1, max_value=12), st.integers(min_value=1, max_value=5_000), ring_ops)
def test_sliding_backend_keeps_its_newest_time_and_successors_with_the_ring(
    limit: int, period: int, ops: list
) -> None:
    """The one-permit fast path reads ``_newest`` and ``_next`` instead of the ring's index arithmetic: after
    every operation that writes the ring (grants, reservations, drain, give-back, a new limit) they agree."""
    clock = FakeClock()
    backend = SlidingWindowBackend("s", limit, period, clock)
    granted_at = clock.now_ns()
    for op, n, timeout in ops:
        if op == "acquire":
            granted_at = clock.now_ns()
            backend.acquire(n, timeout)
        elif op == "advance":
            clock.advance_ns(n)
        elif op == "drain":
            backend.drain()
        elif op == "give_back":
            backend.give_back(n, granted_at)
        else:
            backend.change_limit(n)
        ring, head = backend._ring, backend._head
        assert backend._newest == ring[head - 1]
        assert backend._next == [*range(1, len(ring)), 0]
