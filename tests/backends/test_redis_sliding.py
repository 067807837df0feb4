"""The sliding window on Redis (``algorithm="sliding_window"``): lua/sliding_window.lua gives the in-memory
SlidingWindowBackend's answers (and so the pure reference's), one round trip per decision, exact across
processes, never more than ``limit`` in any window of ``period`` by the server clock, no ghost charges,
all-or-nothing with other sliding-window limiters; through ``@ratelimit`` too.

Against a real Redis (db 15, a unique key prefix per test; CI sets R4_REQUIRE_REDIS=1).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from django_ratelimit_r4 import get_rate_limiter, registry
from django_ratelimit_r4.backends.algorithms import (
    sliding_available,
    sliding_decide,
    sliding_initial,
    sliding_quota,
)
from django_ratelimit_r4.backends.memory import SlidingWindowBackend
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, acquire_all
from django_ratelimit_r4.decorators import ratelimit
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)
from tests.backends.races import assert_no_window_holds_more, granted_across_processes, grants_on_server_time

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")
scripted = pytest.importorskip("django_ratelimit_r4.backends.redis_scripted")
rs = pytest.importorskip("django_ratelimit_r4.backends.redis_sliding")
rg = pytest.importorskip("django_ratelimit_r4.backends.redis_gcra")

ROOT = Path(__file__).resolve().parents[2]



def sliding(
    url: str, prefix: str, limit: int, period: Any, *, timeout: Any = "0s", clock: Any = None, name: str = "s"
) -> RateLimiter:
    config = RateLimiterConfig(
        limit_for_period=limit, limit_refresh_period=period, timeout_duration=timeout, algorithm="sliding_window"
    )
    return RateLimiter(name, config, clock=clock, backend=rb.redis_backend(url, prefix=prefix))


# ------------------------------------------------------------------------ same answers as the reference

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "acquire", "acquire", "quota", "state", "drain", "advance", "advance"]),
        st.integers(min_value=1, max_value=8),  # permits (more than the limit too)
        st.integers(min_value=0, max_value=3_000_000_000),  # timeout or advance, ns
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.integers(min_value=1, max_value=7),
    period=st.sampled_from([1_000_000_000, 999_999_937, 60_000_000_000, 3_000]),
    start=st.integers(min_value=0, max_value=10**12),
    ops=_OPS,
)
def test_redis_sliding_gives_the_pure_references_answers(
    redis_url: str, prefix: str, limit: int, period: int, start: int, ops: list[Any]
) -> None:
    """Random operations on the Redis limiter (FakeClock time) and on sliding_decide / sliding_quota /
    sliding_available over absolute time, and on the in-memory SlidingWindowBackend: the same answers."""
    clock = FakeClock()
    clock.advance_ns(start)
    memory = SlidingWindowBackend("m", limit, period, clock)
    remote = rs.RedisSlidingBackend("prop", limit, period, clock, url=redis_url, prefix=prefix)
    times = tuple(t + clock.now_ns() for t in sliding_initial(limit, period))
    for op, permits, amount in ops:
        now = clock.now_ns()
        if op == "acquire":
            times, wait, granted = sliding_decide(times, permits, amount, now, period)
            expected = wait if granted else -wait
            assert remote.acquire(permits, amount) == expected == memory.acquire(permits, amount), (permits, amount)
        elif op == "quota":
            assert remote.quota() == sliding_quota(times, now, period) == memory.quota()
        elif op == "state":
            assert remote.state()[1:] == memory.state()[1:]
            assert remote.state()[1] == sliding_available(times, now, period)
        elif op == "drain":
            drained = sliding_available(times, now, period)
            if drained:
                times = times[drained:] + (now,) * drained
            assert remote.drain() == drained == memory.drain()
        else:
            clock.advance_ns(amount)
    assert remote.quota() == memory.quota()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.sampled_from([1, 2, 3, 5, 8, 40]),
    period=st.sampled_from([1_000_000_000, 3_000]),
    behind=st.integers(min_value=0, max_value=2_000_000_000),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["quota", "quota", "quota", "acquire", "drain", "state", "advance", "advance", "other"]),
            st.integers(min_value=1, max_value=9),
            st.integers(min_value=0, max_value=1_500_000_000),
        ),
        max_size=50,
    ),
)
def test_acquire_quota_search_hint_gives_the_reference_answers(
    redis_url: str, prefix: str, limit: int, period: int, behind: int, ops: list[Any]
) -> None:
    """acquire_quota (op "q") leaves a hint in the header for the next search of the window's edge (the oldest
    slots known to be outside it, and when); grants without figures, drains and a caller whose clock is behind
    (the hint is from its future: not used) must keep every answer the reference's."""
    clock, late = FakeClock(), FakeClock()
    clock.advance_ns(10**12 + behind)
    late.advance_ns(10**12)
    remote = rs.RedisSlidingBackend("hint", limit, period, clock, url=redis_url, prefix=prefix)
    other = rs.RedisSlidingBackend("hint", limit, period, late, url=redis_url, prefix=prefix)  # same key
    times = tuple(t + late.now_ns() for t in sliding_initial(limit, period))
    for op, permits, amount in ops:
        if op == "advance":
            clock.advance_ns(amount)
            late.advance_ns(amount)
            continue
        backend, now = (other, late.now_ns()) if op == "other" else (remote, clock.now_ns())
        if op in ("quota", "other"):
            times, wait, granted = sliding_decide(times, permits, amount, now, period)
            expected = (wait if granted else -wait, *sliding_quota(times, now, period))
            assert backend.acquire_quota(permits, amount) == expected, (op, permits, amount)
        elif op == "acquire":
            times, wait, granted = sliding_decide(times, permits, amount, now, period)
            assert backend.acquire(permits, amount) == (wait if granted else -wait)
        elif op == "drain":
            drained = sliding_available(times, now, period)
            if drained:
                times = times[drained:] + (now,) * drained
            assert backend.drain() == drained
        else:
            assert backend.state()[1] == sliding_available(times, now, period)
    assert remote.quota() == sliding_quota(times, clock.now_ns(), period)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.sampled_from([2, 3, 5, 17, 40]),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["quota", "quota", "quota", "quota", "acquire", "drain", "state", "advance"]),
            st.one_of(st.integers(min_value=0, max_value=400_000_000), st.sampled_from([1_000_000_000, 1_500_000_000])),
        ),
        max_size=120,
    ),
)
# The slot just written is read back from the read-ahead (one granted, the window passes, one more granted).
@example(limit=5, ops=[("quota", 0), ("advance", 1_500_000_000), ("quota", 0), ("advance", 1_500_000_000), ("quota", 0)])
def test_single_permit_quotas_read_ahead_give_the_reference_answers(
    redis_url: str, prefix: str, limit: int, ops: list[Any]
) -> None:
    """acquire_quota of one permit reads the slots its header figures need together with the newest and the
    oldest (one GETRANGE around the hint, cached for the search): every answer stays the reference's, as the
    ring wraps, the hint moves and the window fills and empties."""
    period = 1_000_000_000
    clock = FakeClock()
    clock.advance_ns(10**12)
    remote = rs.RedisSlidingBackend("ahead", limit, period, clock, url=redis_url, prefix=prefix)
    times = tuple(t + clock.now_ns() for t in sliding_initial(limit, period))
    for op, amount in ops:
        now = clock.now_ns()
        if op == "advance":
            clock.advance_ns(amount)
        elif op == "quota":
            times, wait, granted = sliding_decide(times, 1, amount, now, period)
            expected = (wait if granted else -wait, *sliding_quota(times, now, period))
            assert remote.acquire_quota(1, amount) == expected, (op, amount)
            clock.advance_ns(amount // 8)
        elif op == "acquire":
            times, wait, granted = sliding_decide(times, 1, amount, now, period)
            assert remote.acquire(1, amount) == (wait if granted else -wait)
        elif op == "drain":
            drained = sliding_available(times, now, period)
            if drained:
                times = times[drained:] + (now,) * drained
            assert remote.drain() == drained
        else:
            assert remote.state()[1] == sliding_available(times, now, period)
    assert remote.quota() == sliding_quota(times, clock.now_ns(), period)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.integers(min_value=250, max_value=262),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["acquire", "acquire", "quota", "state", "drain", "advance"]),
            st.sampled_from([1, 2, 50, 130, 256, 257, 300]),
            st.integers(min_value=0, max_value=1_500_000_000),
        ),
        max_size=30,
    ),
)
def test_large_rings_slot_by_slot_give_the_same_answers(
    redis_url: str, prefix: str, limit: int, ops: list[Any]
) -> None:
    """Logs of more than 256 permits are read and written slot by slot (GETRANGE / SETRANGE), smaller ones
    whole: both give the in-memory answers, across the size boundary too."""
    clock = FakeClock()
    memory = SlidingWindowBackend("m", limit, 10**9, clock)
    remote = rs.RedisSlidingBackend("big", limit, 10**9, clock, url=redis_url, prefix=prefix)
    for op, permits, amount in ops:
        if op == "acquire":
            assert remote.acquire(permits, amount) == memory.acquire(permits, amount), (permits, amount)
        elif op == "quota":
            assert remote.quota() == memory.quota()
        elif op == "state":
            assert remote.state()[1:] == memory.state()[1:]
        elif op == "drain":
            assert remote.drain() == memory.drain()
        else:
            clock.advance_ns(amount)
    for limit in (300, 200, 257):  # across the whole-string / slot-by-slot boundary
        memory.change_limit(limit)
        remote.change_limit(limit)
        assert remote.quota() == memory.quota()
        assert remote.acquire(limit // 2, 0) == memory.acquire(limit // 2, 0)
        assert remote.quota() == memory.quota()
        clock.advance_ns(400_000_000)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limits=st.lists(st.integers(min_value=1, max_value=6), min_size=2, max_size=4),
    ops=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 400_000_000)), max_size=30),
)
def test_change_limit_keeps_the_newest_times_like_memory(
    redis_url: str, prefix: str, limits: list[int], ops: list[tuple[int, int]]
) -> None:
    clock = FakeClock()
    memory = SlidingWindowBackend("m", limits[0], 1_000_000_000, clock)
    remote = rs.RedisSlidingBackend("chg", limits[0], 1_000_000_000, clock, url=redis_url, prefix=prefix)
    for step, (permits, advance) in enumerate(ops):
        if step % 5 == 4:
            limit = limits[(step // 5) % len(limits)]
            memory.change_limit(limit)
            remote.change_limit(limit)
        assert remote.acquire(permits, 0) == memory.acquire(permits, 0)
        assert remote.quota() == memory.quota()
        clock.advance_ns(advance)


def test_long_periods_count_whole_microseconds_and_the_base_moves_on(redis_url: str, prefix: str) -> None:
    """A 30-day period (counted in µs by Redis), and 20 days of continuous use in ns (the ring's base is
    rewritten once past 2^50 ns): the same answers as memory."""
    clock = FakeClock()
    day = 86_400 * 10**9
    memory = SlidingWindowBackend("m", 3, 30 * day, clock)
    remote = rs.RedisSlidingBackend("long", 3, 30 * day, clock, url=redis_url, prefix=prefix)
    assert remote._unit == 1000
    for _ in range(12):
        assert remote.acquire(1, 0) == memory.acquire(1, 0)
        assert remote.quota() == memory.quota()
        clock.advance_ns(7 * day + 1_000)
    memory = SlidingWindowBackend("m2", 2, 10**9, clock)
    remote = rs.RedisSlidingBackend("rebase", 2, 10**9, clock, url=redis_url, prefix=prefix)
    for _ in range(40):
        assert remote.acquire(1, 10**9) == memory.acquire(1, 10**9)
        assert remote.acquire(2, 3 * 10**9) == memory.acquire(2, 3 * 10**9)
        assert remote.quota() == memory.quota()
        clock.advance_ns(day // 2 + 123)


def test_one_round_trip_per_decision(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    rl = sliding(redis_url, prefix, 10, "1s", clock=clock)
    assert isinstance(rl.backend, rs.RedisSlidingBackend)
    calls = []
    original = scripted.call

    def counting(*args: Any) -> Any:
        calls.append(args[2])  # (script, conn, keys, args, server)
        return original(*args)

    scripted.call = counting
    try:
        assert [rl.acquire_permission() for _ in range(11)] == [True] * 10 + [False]
    finally:
        scripted.call = original
    assert len(calls) == 11
    clock.advance(0.999)
    assert not rl.acquire_permission()  # nothing has left the window yet: no boundary
    clock.advance(0.001)
    assert [rl.acquire_permission() for _ in range(11)] == [True] * 10 + [False]


def test_reservations_within_the_timeout(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    rl = sliding(redis_url, prefix, 2, "1s", timeout="2s", clock=clock, name="res")
    assert rl.backend.acquire(2, 0) == 0
    assert rl.backend.acquire(1, 2 * 10**9) == 10**9  # handed over when the first permit leaves the window
    assert rl.backend.quota() == (0, 10**9)  # pending reservation: nothing now, one more at the same time
    assert rl.backend.acquire(2, 500_000_000) == -(2 * 10**9)  # would wait until the reservation left: refused
    assert rl.backend.quota() == (0, 10**9)  # the refusal took nothing


# --------------------------------------------------------------------------------- server time, bounds


def test_never_more_than_the_limit_in_any_window_on_server_time(redis_url: str, prefix: str) -> None:
    """Random arrivals against 20 per 200 ms, server time: no window of 200 ms holds more than 20 grants by the
    server clock (a cycle limiter admits 40 around a boundary).

    Each grant's server time is bracketed by a TIME read before and after its decision (Redis runs commands
    one at a time), so grants i..j surely lie in one window when after[j] - before[i] < 200 ms, however long
    this process was descheduled in between: the check never depends on the machine's load."""
    rl = sliding(redis_url, prefix, 20, "200ms", clock=SYSTEM_CLOCK, name="bound")
    before, after = grants_on_server_time(redis_url, rl.acquire_permission, seed=11)
    assert_no_window_holds_more(before, after, 200_000, 20)
    assert len(before) > 40  # the load did cross several windows
    rl.backend.reset(SYSTEM_CLOCK)


def test_exact_across_four_processes(redis_url: str, prefix: str) -> None:
    """Four processes x 10 threads released together on one sliding window of 5 per 60 s: exactly 5 granted."""
    for trial in range(3):
        granted = granted_across_processes(redis_url, prefix, f"mp{trial}", algorithm="sliding_window", processes=4)
        assert sum(granted) == 5, granted


def test_a_late_call_changes_nothing(redis_url: str, prefix: str) -> None:
    """Server time: a call whose deadline has passed answers LATE and takes nothing (no ghost charge)."""
    rl = sliding(redis_url, prefix, 1, "60s", clock=SYSTEM_CLOCK, name="late")
    backend = rl.backend
    conn = backend._connection()
    for op in (b"a", b"q", b"d"):
        args = backend._script_args(op, 1, 0)
        args[-1] = b"1"  # a deadline long past (server microseconds)
        pool = conn.sync.connection_pool
        c = pool.get_connection(*rb._GET_ARGS)
        try:
            c.send_command("EVAL", rs.SLIDING_SCRIPT, 1, backend.state_key, *rb._flat(args))
            assert c.read_response() == b"LATE"
        finally:
            pool.release(c)
    assert not conn.sync.exists(backend.state_key)
    assert rl.acquire_permission()  # the late calls took nothing
    assert not rl.acquire_permission()
    backend.reset(SYSTEM_CLOCK)


def test_a_late_reply_is_retried_once_with_a_fresh_deadline(redis_url: str, prefix: str) -> None:
    """The client's LATE path: a first call refused as late is run again, and only once, deciding then."""
    rl = sliding(redis_url, prefix, 2, "60s", clock=SYSTEM_CLOCK, name="late2")
    original = scripted.call
    seen: list[Any] = []

    def late_once(script: Any, conn: Any, keys: Any, args: list[Any], server: bool) -> Any:
        seen.append(list(args))
        if len(seen) == 1:
            raise rb._Late(True)
        return original(script, conn, keys, args, server)

    scripted.call = late_once
    try:
        assert rl.acquire_permission()
    finally:
        scripted.call = original
    assert len(seen) == 2
    assert rl.backend.quota()[0] == 1  # one permit taken, not two
    rl.backend.reset(SYSTEM_CLOCK)


# ---------------------------------------------------------------------------------------- all-or-nothing


def test_all_or_nothing_over_sliding_limiters_in_one_script(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    a = sliding(redis_url, prefix, 3, "60s", clock=clock, name="a")
    b = sliding(redis_url, prefix, 1, "30s", clock=clock, name="b")
    assert acquire_all([a, b]) is None
    loser, wait = acquire_all([a, b])  # type: ignore[misc]
    assert loser is b and wait == 30 * 10**9
    assert a.metrics.available_permissions == 2  # nothing taken from a
    cycle = RateLimiter(
        "c",
        RateLimiterConfig(limit_for_period=3, limit_refresh_period="1s"),
        clock=clock,
        backend=rb.redis_backend(redis_url, prefix=prefix),
    )
    g = RateLimiter(
        "g",
        RateLimiterConfig(limit_for_period=3, limit_refresh_period="1s", algorithm="gcra"),
        clock=clock,
        backend=rb.redis_backend(redis_url, prefix=prefix),
    )
    # with other algorithms: one call per algorithm, sent at once (tests/backends/test_redis_mixed.py)
    assert acquire_all([a, cycle, g]) is None
    assert acquire_all([g, cycle, a]) is None
    loser, _ = acquire_all([cycle, a, g])  # type: ignore[misc]
    assert loser is a
    assert cycle.metrics.available_permissions == 1 and g.metrics.available_permissions == 1


def test_keyed_sliding_on_redis_and_all_or_nothing_with_keys(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    config = RateLimiterConfig(limit_for_period=2, limit_refresh_period="1s", algorithm="sliding_window")
    keyed = rs.RedisSlidingKeyedRateLimiter("k", config, clock=clock, url=redis_url, prefix=prefix)
    assert [keyed.acquire_permission("x") for _ in range(3)] == [True, True, False]
    assert keyed.acquire_permission("y")
    assert keyed.quota("x") == (0, 1_000_000_000)
    clock.advance(0.5)
    assert keyed.quota("x") == (0, 500_000_000)
    clock.advance(0.5)
    assert keyed.quota("x") == (2, 0)
    u = sliding(redis_url, prefix, 5, "1s", clock=clock, name="u")
    assert rb.acquire_all_keyed([(u, None), (keyed, "x")]) is None
    assert rb.acquire_all_keyed([(u, None), (keyed, "x")]) is None
    assert rb.acquire_all_keyed([(u, None), (keyed, "x")]) == (1, 1_000_000_000)
    assert u.metrics.available_permissions == 3
    outcome, quotas = rb.acquire_all_quotas([(u, None), (keyed, "y")])
    assert outcome is None and quotas == [(2, 1_000_000_000), (1, 1_000_000_000)]

    async def both() -> Any:
        return await rb.aacquire_all_keyed([(u, None), (keyed, "z")]), await rb.aacquire_all_quotas(
            [(u, None), (keyed, "z")]
        )

    first, (second, figures) = asyncio.run(both())
    assert first is None and second is None and figures == [(0, 1_000_000_000), (0, 1_000_000_000)]
    assert keyed.acquire_permission("z") is False


# ------------------------------------------------------------------------------------------------ HTTP


@ratelimit("smooth")
def smooth(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("smooth_ip")
def smooth_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["smooth", "smooth_ip"])
def smooth_both(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["smooth", "smooth_ip"])
async def smooth_both_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("smooth/", smooth),
    path("smooth-ip/", smooth_ip),
    path("smooth-both/", smooth_both),
    path("smooth-both-async/", smooth_both_async),
]


def _settings(redis_url: str, prefix: str) -> dict[str, Any]:
    return {
        "backend": "redis",
        "redis_url": redis_url,
        "redis_key_prefix": prefix,
        "ratelimiters": {
            "instances": {
                "smooth": {"rate": "4/s", "algorithm": "sliding_window"},
                "smooth_ip": {"rate": "2/s", "algorithm": "sliding_window", "key": "ip"},
            },
        },
    }


@pytest.mark.urls(__name__)
@pytest.mark.django_db(databases=[])
def test_http_sliding_on_redis_headers_from_the_state(redis_url: str, prefix: str, r4_clock: Any) -> None:
    with override_settings(RATELIMIT_R4=_settings(redis_url, prefix)):
        assert isinstance(get_rate_limiter("smooth").backend, rs.RedisSlidingBackend)
        assert isinstance(registry.get_keyed_rate_limiter("smooth_ip").store, rs.RedisSlidingKeyedStore)
        client = Client()
        first = client.get("/smooth/")
        assert first.status_code == 200
        assert first["RateLimit"] == '"smooth";r=3;t=1'  # the whole log out of the window in 1 s
        r4_clock.advance(0.6)
        assert [client.get("/smooth/").status_code for _ in range(3)] == [200] * 3
        rejected = client.get("/smooth/")
        assert rejected.status_code == 429
        assert rejected["Retry-After"] == "1"  # 400 ms until the first permit leaves the window, rounded up
        assert rejected["RateLimit"] == '"smooth";r=0;t=1'
        r4_clock.advance(0.4)  # the first permit left the window: exactly one back
        assert client.get("/smooth/").status_code == 200
        assert client.get("/smooth/").status_code == 429
        assert [client.get("/smooth-ip/").status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(databases=[])
def test_http_multi_limit_of_sliding_limiters_all_or_nothing(redis_url: str, prefix: str, r4_clock: Any) -> None:
    """Two sliding-window limits (one keyed) on one view: one script call decides both; a rejection takes
    nothing; async the same."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    with override_settings(RATELIMIT_R4=_settings(redis_url, prefix)):
        get_rate_limiter("smooth")
        registry.get_keyed_rate_limiter("smooth_ip")
        client = Client()
        assert [client.get("/smooth-both/").status_code for _ in range(3)] == [200, 200, 429]
        assert get_rate_limiter("smooth").metrics.available_permissions == 2  # the 429 took nothing
        assert client.get("/smooth-both/")["Retry-After"] == "1"
        r4_clock.advance(1)
        aclient = AsyncClient()

        async def three() -> list[int]:
            return [(await aclient.get("/smooth-both-async/")).status_code for _ in range(3)]

        assert async_to_sync(three)() == [200, 200, 429]
        assert get_rate_limiter("smooth").metrics.available_permissions == 2


# ------------------------------------------------------------------------------------- async and faults

UNREACHABLE = "redis://127.0.0.1:1/14?socket_timeout=0.25"  # nothing listens on port 1


def test_async_acquire_and_quota_match_sync(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    rl = sliding(redis_url, prefix, 2, "1s", clock=clock, name="async")

    async def run() -> tuple[list[bool], tuple[int, int], tuple[int, int, int]]:
        granted = [await rl.aacquire_permission() for _ in range(3)]
        return granted, await rl.backend.aquota(), await rl.backend.aacquire_quota(1, 0)

    granted, quota, acq = asyncio.run(run())
    assert granted == [True, True, False]
    assert quota == rl.backend.quota() == (0, 1_000_000_000)
    assert acq == (-1_000_000_000, 0, 1_000_000_000)


def test_fault_policy_local_decides_by_the_sliding_window_in_process() -> None:
    """Redis unreachable: under "local" the in-process SlidingWindowBackend decides; "closed" rejects."""
    clock = FakeClock()
    config = RateLimiterConfig(limit_for_period=2, limit_refresh_period="1s", algorithm="sliding_window")
    rl = RateLimiter("down", config, clock=clock, backend=rb.redis_backend(UNREACHABLE, fault_policy="local"))
    assert isinstance(rl.backend, rs.RedisSlidingBackend)
    assert isinstance(rl.backend._local, SlidingWindowBackend)
    assert [rl.acquire_permission() for _ in range(3)] == [True, True, False]
    clock.advance(0.5)
    assert not rl.acquire_permission()
    assert rl.backend.quota() == (0, 500_000_000)
    clock.advance(0.5)
    assert rl.acquire_permission()
    keyed = rs.RedisSlidingKeyedRateLimiter("down", config, clock=clock, url=UNREACHABLE, fault_policy="local")
    assert [keyed.acquire_permission("x") for _ in range(3)] == [True, True, False]
    assert rs.sliding_acquire_all(keyed.store, [(keyed.store, keyed.store._state_key("y"))], 1) is None
    closed = rs.RedisSlidingKeyedRateLimiter(
        "down2", config, clock=clock, url=UNREACHABLE, fault_policy="closed"
    )
    assert not closed.acquire_permission("x")
    opened = rs.RedisSlidingKeyedRateLimiter("down3", config, clock=clock, url=UNREACHABLE, fault_policy="open")
    assert all(opened.acquire_permission("x") for _ in range(5))


def test_sliding_window_on_the_cluster(redis_cluster: Any) -> None:
    """On a 3-primary Redis Cluster: the script touches one slot (hash-tagged keys), keyed and unkeyed."""
    import uuid

    prefix = f"r4c:{uuid.uuid4().hex[:10]}"
    options = {"cluster": True}
    config = RateLimiterConfig(limit_for_period=3, limit_refresh_period="60s", algorithm="sliding_window")
    backend = rb.redis_backend(redis_cluster.url, prefix=prefix, connection_options=options)
    rl = RateLimiter("s", config, backend=backend)
    assert [rl.acquire_permission() for _ in range(4)] == [True] * 3 + [False]
    assert rl.backend.quota()[0] == 0
    keyed = rs.RedisSlidingKeyedRateLimiter(
        "sk", config, url=redis_cluster.url, prefix=prefix, connection_options=options
    )
    assert [keyed.acquire_permission("x") for _ in range(4)] == [True] * 3 + [False]
    assert asyncio.run(keyed.aacquire_permission("y"))
    keyed.reset()
    assert keyed.acquire_permission("x")
