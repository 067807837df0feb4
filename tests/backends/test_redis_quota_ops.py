"""The script's decisions that also read the RateLimit figures ("q", "M"): the same figures as a decision
followed by ``quota()``, on the fast path and on the exact slow path, for single limits and all-or-nothing;
under a fault, the fault policy's decision and view. Against the machine's Redis (db 15, a unique prefix)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.backends import redis as rb
from django_ratelimit_r4.backends.memory import MemoryBackend
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)

redis = pytest.importorskip("redis")

S = 1_000_000_000
PERIODS = [7, 999_999_937, S, 3600 * S, 30 * 86400 * S]
STARTS = [0, 1_700_000_000_123_456_789, 2**62 + 12_345]


def _forget(backend: rb.RedisBackend) -> None:
    """Drop the anchor cache: the next call takes the script's exact slow path."""
    backend._cache = (b"", 0, 0)
    backend._build_lim()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    period=st.sampled_from(PERIODS),
    limit=st.sampled_from([1, 3, 50]),
    start=st.sampled_from(STARTS),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("acquire"), st.integers(1, 7), st.sampled_from([0, 1, 2])),
            st.tuples(st.just("advance"), st.integers(0, 3), st.integers(0, 10**6)),
            st.tuples(st.just("forget"), st.just(0), st.just(0)),
        ),
        min_size=1,
        max_size=25,
    ),
)
def test_acquire_quota_is_acquire_then_quota(redis_url: str, prefix: str, period, limit, start, ops) -> None:
    clock = FakeClock(start)
    name = uuid.uuid4().hex
    memory = MemoryBackend(name, limit, period, clock)
    red = rb.RedisBackend(name, limit, period, clock, url=redis_url, prefix=prefix)
    for op, a, b in ops:
        if op == "acquire":
            timeout = b * period  # 0, one period, two periods: reservations make debt
            assert red.acquire_quota(a, timeout) == (memory.acquire(a, timeout), *memory.quota()), (op, a, b)
        elif op == "advance":
            clock.advance_ns(a * period // 2 + b * 1000)  # whole µs: long periods count in µs
        else:
            _forget(red)
        assert red.quota() == memory.quota()
    assert red.faults == 0


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limits=st.lists(st.tuples(st.sampled_from(PERIODS), st.sampled_from([1, 3, 50])), min_size=1, max_size=3),
    start=st.sampled_from(STARTS),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("many"), st.integers(1, 4)),
            st.tuples(st.just("advance"), st.integers(0, 3 * S // 1000).map(lambda us: us * 1000)),  # whole µs
            st.tuples(st.just("forget"), st.integers(0, 2)),
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_acquire_all_quotas_is_all_or_nothing_then_quotas(
    redis_url: str, prefix: str, limits, start, ops
) -> None:
    clock = FakeClock(start)
    names = [uuid.uuid4().hex for _ in limits]
    memory = [MemoryBackend(n, limit, period, clock) for n, (period, limit) in zip(names, limits, strict=True)]
    red = [
        RateLimiter(
            n,
            RateLimiterConfig(limit_for_period=limit, limit_refresh_period=f"{period}ns", timeout_duration=0),
            clock=clock,
            backend=rb.redis_backend(redis_url, prefix=prefix),
        )
        for n, (period, limit) in zip(names, limits, strict=True)
    ]
    for op, a in ops:
        if op == "many":
            if a > min(limit for _, limit in limits):
                continue  # never grantable: refused before any round trip
            expected = memory[0].acquire_many(memory, a)
            assert rb.acquire_all_quotas([(r, None) for r in red], a) == (
                expected,
                [m.quota() for m in memory],
            ), (op, a)
        elif op == "advance":
            clock.advance_ns(a)
        else:
            _forget(red[a % len(red)].backend)  # type: ignore[arg-type]
        assert [r.backend.quota() for r in red] == [m.quota() for m in memory]


def test_async_twins_and_the_rejection_carries_the_figures(redis_url: str, prefix: str) -> None:
    clock = FakeClock(10**12)
    config = RateLimiterConfig(limit_for_period=2, limit_refresh_period="1s", timeout_duration=0)
    rl = RateLimiter("q", config, clock=clock, backend=rb.redis_backend(redis_url, prefix=prefix))
    keyed = rb.RedisKeyedRateLimiter("qk", config, clock=clock, url=redis_url, prefix=prefix)
    assert rl.acquire_quota() == (1, S)
    assert asyncio.run(rl.aacquire_quota()) == (0, S)
    with pytest.raises(RequestNotPermitted) as raised:
        rl.acquire_quota()
    assert (raised.value.wait_ns, raised.value.quotas) == (S, ((0, S),))
    clock.advance_ns(S // 4)
    assert keyed.acquire_quota("a") == (1, 3 * S // 4)
    assert asyncio.run(keyed.aacquire_quota("a")) == (0, 3 * S // 4)
    with pytest.raises(RequestNotPermitted) as raised:
        asyncio.run(keyed.aacquire_quota("a"))
    assert (raised.value.key, raised.value.quotas) == ("a", ((0, 3 * S // 4),))
    assert (keyed.successful_calls, keyed.failed_calls) == (2, 1)


@pytest.mark.parametrize(("policy", "outcome"), [("open", (1, S)), ("closed", None)])
def test_a_fault_answers_the_policy_and_its_view(policy: str, outcome) -> None:
    clock = FakeClock(10**12)
    config = RateLimiterConfig(limit_for_period=2, limit_refresh_period="1s", timeout_duration=0)
    down = "redis://127.0.0.1:1/14?socket_timeout=0.25"  # nothing listens on port 1
    rl = RateLimiter(
        "f", config, clock=clock, backend=rb.redis_backend(down, prefix="r4test:f", fault_policy=policy)
    )
    if outcome is not None:
        assert rl.acquire_quota() == (2, S)  # "open": allowed, full
    else:
        with pytest.raises(RequestNotPermitted) as raised:
            rl.acquire_quota()
        assert raised.value.quotas == ((0, rb.FAULT_RETRY_AFTER_NS),)
    entries = [(rl, None)]
    got, quotas = rb.acquire_all_quotas(entries)
    assert (got is None) == (policy == "open")
    assert quotas == [rl.backend.quota()]
