"""The Redis backend against a real Redis (db 15, a unique key prefix per test; only that prefix is flushed).

Skips without Redis unless R4_REQUIRE_REDIS=1 (CI). What is checked: the Lua script gives decide()'s exact
answers (a property test against MemoryBackend, with nanosecond timestamps far beyond 2**53), seed 000 across
threads and across processes, exact waits, reservations, drain, all-or-nothing multi-limits, key expiry,
the fault policies with an unreachable Redis, the async path on redis.asyncio, and the registry wiring.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.backends import redis as rb
from django_ratelimit_r4.backends.memory import MemoryBackend
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import (
    RateLimiter,
    RateLimiterConfig,
    aacquire_all,
    acquire_all,
    most_grantable,
)
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)
from tests.backends.races import granted_across_processes
from tests.noblock import forbid_blocking

redis = pytest.importorskip("redis")

ROOT = Path(__file__).resolve().parents[2]
S = 1_000_000_000
UNREACHABLE = "redis://127.0.0.1:1/15"



@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def limiter(
    url: str,
    prefix: str,
    limit: int,
    period: str,
    *,
    timeout: str = "0s",
    clock=None,
    name="rl",
    policy="open",
) -> RateLimiter:
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, timeout_duration=timeout)
    return RateLimiter(
        name, config, clock=clock, backend=rb.redis_backend(url, prefix=prefix, fault_policy=policy)
    )


# ------------------------------------------------------------------------------------------- exact math


PERIODS = [1, 7, 500, 999_999_937, S, 3600 * S, rb.MAX_NS_PERIOD]
STARTS = [0, 10**12, 1_700_000_000_123_456_789, 2**62 + 12_345, -(10**15) - 3]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, int, int, list[tuple[str, int, int]]]:
    period = draw(st.sampled_from(PERIODS))
    limit = draw(st.sampled_from([1, 3, 50, 10**9]))
    start = draw(st.sampled_from(STARTS))
    ops = draw(
        st.lists(
            st.one_of(
                st.tuples(
                    st.just("acquire"), st.integers(1, 7), st.sampled_from([0, period // 2, 3 * period])
                ),
                st.tuples(st.just("advance"), st.integers(0, 4 * period), st.just(0)),
                st.tuples(
                    st.just("advance"), st.integers(0, 10**6).map(lambda k: k * period + 1), st.just(0)
                ),
                st.tuples(st.just("drain"), st.just(0), st.just(0)),
            ),
            min_size=1,
            max_size=25,
        )
    )
    return period, limit, start, ops


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=scenarios())
def test_script_matches_memory_backend_exactly(redis_url: str, prefix: str, scenario) -> None:
    """Every answer and every state equals MemoryBackend's (decide()), also with timestamps >> 2**53."""
    period, limit, start, ops = scenario
    name = uuid.uuid4().hex
    clock = FakeClock(start)
    memory = MemoryBackend(name, limit, period, clock)
    # A patient connection: a 0.25 s socket timeout on a loaded machine made a decision a fault (faults == 0 below).
    red = rb.RedisBackend(name, limit, period, clock, url=redis_url, prefix=prefix,
                          connection_options={"socket_timeout": 5.0})
    for op, a, b in ops:
        if op == "acquire":
            assert red.acquire(a, b) == memory.acquire(a, b), (op, a, b)
        elif op == "advance":
            clock.advance_ns(a)
        else:
            assert red.drain() == memory.drain()
        assert red.state() == memory.state()
    assert (red.successful_calls, red.failed_calls, red.faults) == (
        memory.successful_calls,
        memory.failed_calls,
        0,
    )


@st.composite
def keyed_scenarios(draw: st.DrawFn) -> tuple[int, int, int, int, list[tuple[str, int, int]]]:
    period, limit, start, ops = draw(scenarios())
    timeout = draw(st.sampled_from([0, period // 2, 3 * period]))
    keyed_ops = [(op, a, draw(st.integers(0, 2))) if op != "advance" else (op, a, 0) for op, a, _ in ops]
    return period, limit, start, timeout, keyed_ops


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=keyed_scenarios())
def test_keyed_script_matches_memory_backends_exactly(redis_url: str, prefix: str, scenario) -> None:
    """The same replay through RedisKeyedRateLimiter: three client keys, each equal to its own MemoryBackend."""
    period, limit, start, timeout, ops = scenario
    clock = FakeClock(start)
    config = RateLimiterConfig(
        limit_for_period=limit, limit_refresh_period=f"{period}ns", timeout_duration=f"{timeout}ns"
    )
    keyed = rb.RedisKeyedRateLimiter(uuid.uuid4().hex, config, clock=clock, url=redis_url, prefix=prefix)
    memory = [MemoryBackend("m", limit, period, clock) for _ in range(3)]
    for op, a, key in ops:
        if op == "acquire" and a > most_grantable(config, timeout):
            with pytest.raises(ValueError, match="can never grant"):  # refused before any round trip
                keyed.reserve_permission(f"client-{key}", a)
        elif op == "acquire":
            wait = memory[key].acquire(a, timeout)
            assert keyed.reserve_permission(f"client-{key}", a) == (wait if wait >= 0 else -1), (op, a, key)
        elif op == "advance":
            clock.advance_ns(a)
        else:
            assert keyed.drain_permissions(f"client-{key}") == memory[key].drain()
        for k in range(3):
            assert keyed.state(f"client-{k}") == memory[k].state()
    assert keyed.store.faults == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limits=st.lists(st.tuples(st.sampled_from(PERIODS[:-1]), st.sampled_from([1, 3, 50])), min_size=2, max_size=3),
    start=st.sampled_from(STARTS),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("many"), st.integers(1, 4)),
            st.tuples(st.just("one"), st.integers(0, 2)),
            st.tuples(st.just("advance"), st.integers(0, 3 * S)),
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_all_or_nothing_matches_memory_backends_exactly(redis_url: str, prefix: str, limits, start, ops) -> None:
    """acquire_many over 2-3 limits (and single acquires in between): the same answers as MemoryBackend's."""
    clock = FakeClock(start)
    names = [uuid.uuid4().hex for _ in limits]
    memory = [MemoryBackend(n, limit, period, clock) for n, (period, limit) in zip(names, limits, strict=True)]
    red = [
        rb.RedisBackend(n, limit, period, clock, url=redis_url, prefix=prefix)
        for n, (period, limit) in zip(names, limits, strict=True)
    ]
    for op, a in ops:
        if op == "many":
            assert red[0].acquire_many(red, a) == memory[0].acquire_many(memory, a), (op, a)
        elif op == "one":
            index = a % len(red)
            assert red[index].acquire(1, 0) == memory[index].acquire(1, 0)
        else:
            clock.advance_ns(a)
        assert [r.state() for r in red] == [m.state() for m in memory]


def test_the_client_caches_the_anchor_and_the_script_takes_the_fast_path(
    redis_url: str, prefix: str, raw
) -> None:
    """After one decision the limiter holds the anchor it saw; the script then proves it without reading it."""
    rl = limiter(redis_url, prefix, 5, "60s", clock=SYSTEM_CLOCK, name="cached")
    backend = rl.backend
    assert isinstance(backend, rb.RedisBackend)
    assert rl.acquire_permission()
    anchor = raw.get(backend.anchor_key)
    assert backend._cache[0] == anchor  # the token the script compares
    state = raw.get(backend.state_key)
    assert state.endswith(b" " + anchor)  # the state names the anchor it was written under
    calls: list[bytes] = []
    real = rb.RedisConnection.call

    def spy(self, numkeys, args, *more):
        calls.append(args[3])
        return real(self, numkeys, args, *more)

    rb.RedisConnection.call = spy  # type: ignore[method-assign]
    try:
        assert all(rl.acquire_permission() for _ in range(4)) and not rl.acquire_permission()
    finally:
        rb.RedisConnection.call = real  # type: ignore[method-assign]
    assert calls == [anchor] * 5


@pytest.mark.parametrize("clock_mode", ["server", "client"])
def test_a_reset_by_another_process_takes_effect_for_a_cached_limiter(
    redis_url: str, prefix: str, clock_mode: str
) -> None:
    """A's cached anchor is stale once B resets: A's next decision is exact on the new anchor, and A learns it."""
    clock = SYSTEM_CLOCK if clock_mode == "server" else FakeClock(10**12)
    a = limiter(redis_url, prefix, 3, "60s", clock=clock, name="shared")
    assert all(a.acquire_permission() for _ in range(3)) and not a.acquire_permission()
    old = a.backend._cache[0]  # type: ignore[attr-defined]
    if clock_mode == "client":
        clock.advance(7)  # type: ignore[attr-defined]
    b = limiter(redis_url, prefix, 3, "60s", clock=clock, name="shared")
    b.reset()  # another process (same name, same Redis): full again, cycle 0 starts now
    assert a.acquire_permission()  # A sees the reset at once
    assert a.backend._cache[0] == b.backend._cache[0] != old  # type: ignore[attr-defined]
    assert a.metrics.available_permissions == 2 and b.metrics.available_permissions == 2
    assert a.metrics.nanos_to_wait == 0


def test_large_values_stay_exact(redis_url: str, prefix: str) -> None:
    """Anchor at 2**62 ns, an odd period: the wait is exact to the nanosecond (no float rounding)."""
    clock = FakeClock(2**62 + 1)
    rl = limiter(redis_url, prefix, 2, "999999937ns", clock=clock)
    assert rl.acquire_permission(2)
    clock.advance_ns(999_999_937 * 1_000_000 + 5)  # a million cycles later, 5 ns in
    assert rl.metrics.cycle == 1_000_000
    assert rl.acquire_permission(2)
    assert rl.metrics.nanos_to_wait == 999_999_937 - 5


# --------------------------------------------------------------------------------------- seed 000


def _burst(rl: RateLimiter, threads: int) -> int:
    barrier = threading.Barrier(threads)
    results: list[bool] = []
    lock = threading.Lock()

    def work() -> None:
        barrier.wait()
        ok = rl.acquire_permission()
        with lock:
            results.append(ok)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(results)


def test_seed_000_threads(redis_url: str, prefix: str) -> None:
    """20 threads at a barrier on 5 per 60 s: exactly 5 granted, every trial; then the wait; +60 s: 5 more."""
    old = sys.getswitchinterval()
    try:
        for trial in range(12):
            if trial % 2:
                sys.setswitchinterval(1e-6)
            clock = FakeClock()
            rl = limiter(redis_url, prefix, 5, "60s", clock=clock, name=f"seed{trial}")
            assert _burst(rl, 20) == 5
            assert not rl.acquire_permission()
            assert rl.metrics.nanos_to_wait == 60 * S
            assert (rl.metrics.successful_calls, rl.metrics.failed_calls) == (5, 16)
            clock.advance(60)
            assert _burst(rl, 20) == 5
            sys.setswitchinterval(old)
    finally:
        sys.setswitchinterval(old)


def test_seed_000_server_time_threads(redis_url: str, prefix: str) -> None:
    """The same with Redis server time (the production mode): anchor set by the first decision."""
    for trial in range(5):
        rl = limiter(redis_url, prefix, 5, "60s", clock=SYSTEM_CLOCK, name=f"srv{trial}")
        assert _burst(rl, 20) == 5
        assert 59 * S < rl.metrics.nanos_to_wait <= 60 * S


def test_seed_000_across_two_processes(redis_url: str, prefix: str) -> None:
    """Two processes x 10 threads on one 5-per-60 s limit: exactly 5 granted in total, not 5 per process."""
    for trial in range(2):
        granted = granted_across_processes(
            redis_url, prefix, f"mp{trial}", algorithm="cycle", processes=2, start_in=1.2, timeout=30
        )
        assert sum(granted) == 5, granted


def test_forked_child_gets_its_own_connection(redis_url: str, prefix: str) -> None:
    """After fork the child must not reuse the parent's sockets: it rebuilds its clients and shares the budget."""
    import multiprocessing

    rl = limiter(redis_url, prefix, 3, "60s", clock=SYSTEM_CLOCK, name="fork")
    assert rl.acquire_permission()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def child() -> None:
        queue.put((rb.connection(redis_url).pid == os.getpid(), [rl.acquire_permission() for _ in range(3)]))

    proc = ctx.Process(target=child)
    proc.start()
    fresh, results = queue.get(timeout=20)
    proc.join(20)
    assert fresh
    assert results == [True, True, False]
    assert not rl.acquire_permission()


# -------------------------------------------------------------------------- waits, reservations, drain


def test_wait_ns_exact_with_the_client_clock(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    rl = limiter(redis_url, prefix, 5, "60s", clock=clock)
    for _ in range(5):
        rl.acquire_or_raise()
    clock.advance(10.5)
    with pytest.raises(RequestNotPermitted) as info:
        rl.acquire_or_raise()
    assert info.value.wait_ns == 49_500_000_000
    with pytest.raises(ValueError, match="can never grant 7 permits"):
        rl.acquire_or_raise(7)  # 7 > limit without a timeout: no Retry-After could be true


def test_reservations_make_debt_that_later_cycles_repay(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    rl = limiter(redis_url, prefix, 2, "10s", timeout="25s", clock=clock)
    assert rl.reserve_permission(2) == 0
    assert rl.reserve_permission(2) == 10 * S
    assert rl.reserve_permission(2) == 20 * S
    assert rl.reserve_permission(1) == -1  # 30 s > timeout: nothing reserved
    assert rl.metrics.available_permissions == -4
    clock.advance(20)
    assert rl.metrics.available_permissions == 0
    clock.advance(10)
    assert rl.metrics.available_permissions == 2


def test_drain_keeps_debt_and_works_across_cycles(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    rl = limiter(redis_url, prefix, 5, "1s", timeout="5s", clock=clock)
    assert rl.acquire_permission(2)
    assert rl.drain_permissions() == 3
    assert rl.reserve_permission() == 1 * S  # a reservation: debt of 1
    clock.advance(1)
    assert rl.drain_permissions() == 4  # refreshed: -1 + 5, not the stale count
    assert rl.metrics.available_permissions == 0
    clock.advance(3)
    assert rl.drain_permissions() == 5  # capped at the limit


# --------------------------------------------------------------------------------- multi-limit atomic


def test_acquire_all_is_all_or_nothing(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    a = limiter(redis_url, prefix, 3, "60s", clock=clock, name="a")
    b = limiter(redis_url, prefix, 1, "30s", clock=clock, name="b")
    assert acquire_all([a, b]) is None
    loser, wait = acquire_all([a, b])  # type: ignore[misc]
    assert loser is b and wait == 30 * S
    assert a.metrics.available_permissions == 2  # nothing taken from a
    assert (a.metrics.failed_calls, b.metrics.failed_calls) == (0, 1)
    with pytest.raises(ValueError):
        acquire_all([a, a])


def test_acquire_all_atomic_under_concurrency(redis_url: str, prefix: str) -> None:
    """20 threads take (A, B) together while 20 take B alone: A's grants never exceed what B paid for."""
    for trial in range(5):
        a = limiter(redis_url, prefix, 5, "60s", clock=SYSTEM_CLOCK, name=f"A{trial}")
        b = limiter(redis_url, prefix, 12, "60s", clock=SYSTEM_CLOCK, name=f"B{trial}")
        pairs, singles = _mixed_burst(a, b)
        assert pairs <= 5 and pairs + singles == 12
        assert a.metrics.available_permissions == 5 - pairs
        assert b.metrics.available_permissions == 0


def _mixed_burst(a: RateLimiter, b: RateLimiter) -> tuple[int, int]:
    barrier = threading.Barrier(40)
    both: list[bool] = []
    alone: list[bool] = []

    def pair() -> None:
        barrier.wait()
        both.append(acquire_all([a, b]) is None)

    def single() -> None:
        barrier.wait()
        alone.append(b.acquire_permission())

    pool = [threading.Thread(target=pair) for _ in range(20)] + [
        threading.Thread(target=single) for _ in range(20)
    ]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(both), sum(alone)


def test_mixed_keyed_and_unkeyed_in_one_round_trip(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    shared = limiter(redis_url, prefix, 10, "60s", clock=clock, name="global")
    config = RateLimiterConfig(limit_for_period=1, limit_refresh_period="5s")
    per_client = rb.RedisKeyedRateLimiter("client", config, clock=clock, url=redis_url, prefix=prefix)
    assert rb.acquire_all_keyed([(shared, None), (per_client, "1.2.3.4")]) is None
    assert rb.acquire_all_keyed([(shared, None), (per_client, "1.2.3.4")]) == (1, 5 * S)
    assert shared.metrics.available_permissions == 9
    assert asyncio.run(rb.aacquire_all_keyed([(shared, None), (per_client, "5.6.7.8")])) is None
    assert shared.metrics.available_permissions == 8
    with pytest.raises(ValueError):
        rb.acquire_all_keyed([(per_client, "x"), (per_client, "x")])


# ------------------------------------------------------------------------------ keys, expiry, layout


def test_states_expire_once_full_and_idle_clients_cost_nothing(redis_url: str, prefix: str, raw) -> None:
    config = RateLimiterConfig(limit_for_period=2, limit_refresh_period="80ms", timeout_duration="1s")
    keyed = rb.RedisKeyedRateLimiter("exp", config, url=redis_url, prefix=prefix)
    assert keyed.acquire_permission("client")
    state_key = keyed.store._state_key("client")
    assert 0 < raw.pttl(state_key) <= 81
    assert keyed.reserve_permission("client", 5) > 0  # debt of 4: full again 3 cycles later
    assert 160 < raw.pttl(state_key) <= 241
    assert len(keyed) == 1 and "client" in keyed
    deadline = time.monotonic() + 2
    while raw.exists(state_key) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not raw.exists(state_key)
    assert raw.exists(keyed.store.anchor_key) and raw.pttl(keyed.store.anchor_key) == -1
    assert keyed.state("client")[1] == 2  # an expired key reads as full


def test_keys_without_an_expiry_are_one_per_limiter_whatever_the_clients(redis_url: str, prefix: str, raw) -> None:
    """Only a cycle limiter's anchor never expires (docs/redis.md, Key layout): one per limiter, one per keyed
    limiter (not per client key), none for GCRA or the sliding window; a busy Redis never fills with them."""
    for algorithm in ("cycle", "gcra", "sliding_window"):
        config = RateLimiterConfig(limit_for_period=3, limit_refresh_period="60s", algorithm=algorithm)
        rl = RateLimiter(f"u-{algorithm}", config, clock=SYSTEM_CLOCK, backend=rb.redis_backend(redis_url, prefix=prefix))
        assert rl.acquire_permission() and asyncio.run(rl.aacquire_permission())
    keyed = rb.RedisKeyedRateLimiter("k", RateLimiterConfig(limit_for_period=3, limit_refresh_period="60s"),
                                     url=redis_url, prefix=prefix)
    for i in range(30):
        assert keyed.acquire_permission(f"client-{i}")
    forever = sorted(k.decode() for k in raw.scan_iter(match=f"{prefix}:*") if raw.pttl(k) == -1)
    assert forever == [f"{prefix}:rl:{{u-cycle}}:anchor", f"{prefix}:rlk:{{k}}:anchor"]


def test_client_keys_are_hashed_and_names_escaped(redis_url: str, prefix: str, raw) -> None:
    clock = FakeClock()
    config = RateLimiterConfig(limit_for_period=1, limit_refresh_period="60s")
    keyed = rb.RedisKeyedRateLimiter("a:k*", config, clock=clock, url=redis_url, prefix=prefix)
    other = rb.RedisKeyedRateLimiter("a", config, clock=clock, url=redis_url, prefix=prefix)
    for key in ("x", "x:anchor", "*", "\udcff"):
        assert keyed.acquire_permission(key)
    assert not keyed.acquire_permission("x")
    assert other.acquire_permission("k*:k:x")
    names = {k.decode() for k in raw.scan_iter(match=prefix + ":*")}
    assert all("x" not in n.rsplit(":", 1)[-1] or len(n.rsplit(":", 1)[-1]) == 32 for n in names)
    assert f"{prefix}:rlk:{{a%3Ak%2A}}:anchor" in names
    assert len(keyed) == 4 and len(other) == 1
    keyed.reset("x")
    assert keyed.acquire_permission("x")
    keyed.reset()
    assert len(keyed) == 0 and keyed.acquire_permission("x:anchor")


def test_noscript_falls_back_to_eval(redis_url: str, prefix: str, raw) -> None:
    rl = limiter(redis_url, prefix, 2, "60s", clock=FakeClock())
    raw.script_flush()
    assert rl.acquire_permission()
    assert raw.script_exists(rb.SCRIPT_SHA) == [True]


def test_server_time_is_the_default(redis_url: str, prefix: str, raw) -> None:
    rl = limiter(redis_url, prefix, 2, "60s", clock=SYSTEM_CLOCK)
    assert rl.acquire_permission()
    seconds, _ = raw.get(rl.backend.anchor_key).split()  # type: ignore[attr-defined]
    assert abs(int(seconds) - raw.time()[0]) <= 2


# -------------------------------------------------------------------------------------- fault policy


def test_fault_policy_open_allows_without_exception_or_hang(caplog: pytest.LogCaptureFixture) -> None:
    rl = limiter(UNREACHABLE, "r4test", 1, "60s", clock=SYSTEM_CLOCK, name="down-open")
    keyed = rb.RedisKeyedRateLimiter("down-open", url=UNREACHABLE, fault_policy="open")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="django_ratelimit_r4.redis"):
        assert all(rl.acquire_permission() for _ in range(50))
        assert all(keyed.acquire_permission("k") for _ in range(50))
        assert acquire_all([rl]) is None
        assert rl.metrics.available_permissions == 1 and keyed.quota("k")[0] == 50  # full: the default limit
    assert time.monotonic() - started < 2
    assert rl.backend.faults >= 50  # type: ignore[attr-defined]
    assert len([r for r in caplog.records if "fault policy" in r.getMessage()]) == 1
    assert "127.0.0.1:1" in caplog.records[0].getMessage()


SECRET = "s3cret-pw"


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@127.0.0.1:1/15",
        f"redis://user:{SECRET}@127.0.0.1:1/15",
        f"redis://user:{SECRET}@x@127.0.0.1:1/15",  # an unquoted "@" inside the password
        f"redis://127.0.0.1:1/15?password={SECRET}",  # redis-py reads the password from the query too
        f"unix:///tmp/r4-nowhere.sock?db=15&password={SECRET}",
    ],
)
def test_a_password_in_the_url_reaches_no_log_and_no_status(url: str, caplog: pytest.LogCaptureFixture) -> None:
    rl = limiter(url, "r4test", 1, "60s", clock=SYSTEM_CLOCK, name="down-secret")
    with caplog.at_level(logging.INFO, logger="django_ratelimit_r4"):
        assert rl.acquire_permission()  # the fault policy ("open") answered: the server is unreachable
    shown = caplog.text + repr(rl.backend) + repr(rl.backend.backend_health())  # type: ignore[attr-defined]
    assert "fault policy" in caplog.text
    assert SECRET not in shown
    assert "***" in rl.backend.backend_health()["url"]  # type: ignore[attr-defined]


def test_fault_policy_closed_rejects_with_short_retry_after() -> None:
    rl = limiter(UNREACHABLE, "r4test", 100, "60s", clock=SYSTEM_CLOCK, name="down-closed", policy="closed")
    keyed = rb.RedisKeyedRateLimiter("down-closed", url=UNREACHABLE, fault_policy="closed")
    started = time.monotonic()
    for _ in range(20):
        with pytest.raises(RequestNotPermitted) as info:
            rl.acquire_or_raise()
        assert info.value.wait_ns == rb.FAULT_RETRY_AFTER_NS
        with pytest.raises(RequestNotPermitted):
            keyed.acquire_or_raise("k")
    loser, wait = acquire_all([rl])  # type: ignore[misc]
    assert loser is rl and wait == rb.FAULT_RETRY_AFTER_NS
    assert time.monotonic() - started < 2


async def test_fault_policy_on_the_async_path() -> None:
    rl = limiter(UNREACHABLE, "r4test", 1, "60s", clock=SYSTEM_CLOCK, name="adown", policy="closed")
    keyed = rb.RedisKeyedRateLimiter("adown", url=UNREACHABLE, fault_policy="open")
    assert not await rl.aacquire_permission()
    assert await keyed.aacquire_permission("k")


def test_reset_and_state_never_raise_when_down() -> None:
    rl = limiter(UNREACHABLE, "r4test", 3, "60s", clock=FakeClock(), name="down-reset")
    rl.reset()
    assert rl.drain_permissions() == 0
    assert rl.metrics.available_permissions == 3


# ----------------------------------------------------------------------------------------- async path


async def test_async_path_uses_redis_asyncio_and_never_blocks_the_loop(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rl = limiter(redis_url, prefix, 30, "60s", clock=SYSTEM_CLOCK, name="aio")
    keyed = rb.RedisKeyedRateLimiter(
        "aio", RateLimiterConfig(limit_for_period=2, limit_refresh_period="60s"), url=redis_url, prefix=prefix
    )
    b = limiter(redis_url, prefix, 10, "60s", clock=SYSTEM_CLOCK, name="aio-b")

    def no_sync(*args, **kwargs):
        raise AssertionError("sync Redis call on the event loop")

    monkeypatch.setattr(rb.RedisConnection, "call", no_sync)
    # Any blocking call on the loop's thread (a sync socket, a sleep, a thread wait) is recorded, whatever
    # the machine's load: connections are opened during the burst, on the loop, without blocking it.
    with forbid_blocking(monkeypatch) as blocking:
        results = await asyncio.gather(*(rl.aacquire_permission() for _ in range(60)))
        keyed_results = await asyncio.gather(*(keyed.aacquire_permission(f"c{i % 3}") for i in range(9)))
        assert await aacquire_all([rl, b]) is not None  # rl is empty now
        with pytest.raises(RequestNotPermitted):
            await keyed.aacquire_or_raise("c0")
    assert blocking == [], blocking
    assert sum(results) == 30
    assert sum(keyed_results) == 6
    assert rl.backend.faults == 0 and keyed.store.faults == 0  # type: ignore[attr-defined]


async def test_async_client_per_event_loop(redis_url: str) -> None:
    conn = rb.connection(redis_url)
    mine = conn.aio()
    assert conn.aio() is mine
    other = await asyncio.to_thread(lambda: asyncio.run(_client_in_new_loop(conn)))
    assert other is not mine


async def _client_in_new_loop(conn: rb.RedisConnection):
    return conn.aio()


# ------------------------------------------------------------------------------------------- registry


def test_registry_builds_redis_limiters_driven_by_r4_clock(
    redis_url: str, prefix: str, settings, r4_clock
) -> None:
    from django_ratelimit_r4 import registry

    settings.RATELIMIT_R4 = {
        "backend": "redis",
        "redis_url": redis_url,
        "redis_key_prefix": prefix,
        "redis_fault_policy": "closed",
        "ratelimiters": {"instances": {"api": {"limit_for_period": 2, "limit_refresh_period": "60s"}}},
    }
    rl = registry.get_rate_limiter("api")
    keyed = registry.get_keyed_rate_limiter("api")
    assert isinstance(rl.backend, rb.RedisBackend) and rl.backend.fault_policy == "closed"  # type: ignore[union-attr]
    assert isinstance(keyed.store, rb.RedisKeyedStore) and keyed.clock is r4_clock
    assert rl.backend.anchor_key.startswith(prefix + ":rl:{api}")  # type: ignore[union-attr]
    for _ in range(2):
        rl.acquire_or_raise()  # type: ignore[union-attr]
        keyed.acquire_or_raise("1.2.3.4")
    r4_clock.advance(15)
    with pytest.raises(RequestNotPermitted) as info:
        keyed.acquire_or_raise("1.2.3.4")
    assert info.value.wait_ns == 45 * S
    assert not rl.acquire_permission()  # type: ignore[union-attr]
    view = registry.get_rate_limiter("api", key="1.2.3.4")
    assert view.metrics.nanos_to_wait == 45 * S
    r4_clock.advance(45)
    assert rl.acquire_permission() and keyed.acquire_permission("1.2.3.4")  # type: ignore[union-attr]


def test_registry_refuses_redis_with_invalid_options(settings) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from django_ratelimit_r4 import registry

    settings.RATELIMIT_R4 = {"backend": "redis", "ratelimiters": {"instances": {"api": {}}}}
    with pytest.raises(ImproperlyConfigured, match="redis_url"):
        registry.get_rate_limiter("api")


def test_a_glob_in_the_key_prefix_never_reaches_another_prefix(redis_url: str, prefix: str, raw) -> None:
    """reset() and len() scan by prefix: a prefix with glob characters must match only itself."""
    clock = FakeClock()
    config = RateLimiterConfig(limit_for_period=1, limit_refresh_period="60s")
    globbed = rb.RedisKeyedRateLimiter("g", config, clock=clock, url=redis_url, prefix=prefix + "*")
    other = rb.RedisKeyedRateLimiter("g", config, clock=clock, url=redis_url, prefix=prefix + "x")
    try:
        assert other.acquire_permission("victim")
        assert len(globbed) == 0
        globbed.reset()
        assert not other.acquire_permission("victim")  # the other prefix's state survived
        assert len(other) == 1
    finally:
        raw.delete(*raw.keys(rb._glob_escape(prefix) + "[*x]:*") or ["-"])


# ------------------------------------------------------------------------------- async quota, listings


def _two_limiters(url: str, prefix: str, clock: FakeClock):
    config = RateLimiterConfig(limit_for_period=3, limit_refresh_period="10s", timeout_duration="30s")
    rl = RateLimiter("q", config, clock=clock, backend=rb.redis_backend(url, prefix=prefix))
    keyed = rb.RedisKeyedRateLimiter("q", config, clock=clock, url=url, prefix=prefix)
    return rl, keyed


async def test_aquota_equals_quota_in_every_state(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aquota() is quota() on redis.asyncio: same (remaining, reset_ns) full, partial, empty and in debt."""
    clock = FakeClock(1_700_000_000_123_456_789)
    rl, keyed = _two_limiters(redis_url, prefix, clock)
    backend = rl.backend
    assert isinstance(backend, rb.RedisBackend)
    calls: list[bytes] = []
    real_acall = rb.RedisConnection.acall

    async def counting_acall(self, numkeys, args, *more):
        calls.append(args[2])
        return await real_acall(self, numkeys, args, *more)

    seen = []
    for step in range(6):  # full, 2 left, 1 left, 0 left, 1 in debt (reserved), next cycle
        sync_answers = (backend.quota(), keyed.quota("c"), keyed.quota("other"))
        with monkeypatch.context() as patch:
            patch.setattr(rb.RedisConnection, "acall", counting_acall)
            patch.setattr(rb.RedisConnection, "call", _no_sync_call)
            calls.clear()
            async_answers = (await backend.aquota(), await keyed.aquota("c"), await keyed.aquota("other"))
            assert calls == [b"s", b"s", b"s"]  # one round trip each, read-only op
        assert async_answers == sync_answers, step
        seen.append(async_answers[0])
        if step < 4:
            assert backend.acquire(1, 30 * S) >= 0 and keyed.reserve_permission("c") >= 0
        else:
            clock.advance_ns(10 * S)
    # reset_ns: the time to the next cycle while permits remain, else the wait for one (next refill).
    assert seen == [(3, 10 * S), (2, 10 * S), (1, 10 * S), (0, 10 * S), (-1, 10 * S), (2, 10 * S)]


def _no_sync_call(*args, **kwargs):
    raise AssertionError("sync Redis call on the event loop")


async def test_aquota_applies_the_fault_policy_without_raising() -> None:
    opened = limiter(UNREACHABLE, "r4test", 4, "60s", clock=SYSTEM_CLOCK, name="aq-open")
    closed = rb.RedisKeyedRateLimiter(
        "aq-closed", RateLimiterConfig(limit_for_period=4), url=UNREACHABLE, fault_policy="closed"
    )
    started = time.monotonic()
    assert await opened.backend.aquota() == (4, 60 * S)  # type: ignore[union-attr]
    assert await closed.aquota("k") == (0, rb.FAULT_RETRY_AFTER_NS)
    assert time.monotonic() - started < 2


def test_keyed_keys_is_empty_and_validates_like_the_memory_store(redis_url: str, prefix: str) -> None:
    _, keyed = _two_limiters(redis_url, prefix, FakeClock())
    assert keyed.acquire_permission("203.0.113.7")
    assert "203.0.113.7" in keyed and len(keyed) == 1  # the state exists ...
    assert keyed.keys() == [] and keyed.keys(5) == []  # ... but only its digest: nothing to list
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(ValueError, match="limit"):
            keyed.keys(bad)  # type: ignore[arg-type]


def test_counters_are_per_process_and_the_limiter_state_is_global(redis_url: str, prefix: str) -> None:
    """Two instances of one name stand for two workers: they share the budget, not the counters."""
    clock = FakeClock()
    worker_a, keyed_a = _two_limiters(redis_url, prefix, clock)
    config = worker_a.config
    worker_b = RateLimiter(
        "q", config, clock=clock, backend=rb.redis_backend(redis_url, prefix=prefix)
    )  # building with a FakeClock resets the shared state: build B before A decides
    keyed_b = rb.RedisKeyedRateLimiter("q", config, clock=clock, url=redis_url, prefix=prefix)
    assert worker_a.acquire_permission(2) and keyed_a.acquire_permission("c", 3)
    assert worker_b.metrics.available_permissions == 1 and keyed_b.quota("c")[0] == 0  # global
    assert worker_a.metrics.successful_calls == 1 and worker_b.metrics.successful_calls == 0  # per process
    assert keyed_a.metrics.successful_calls == 1 and keyed_b.metrics.successful_calls == 0


def test_state_snapshot_is_honest_about_redis_keys(redis_url: str, prefix: str, settings, r4_clock) -> None:
    import json

    from django_ratelimit_r4 import registry, state

    settings.RATELIMIT_R4 = {
        "backend": "redis",
        "redis_url": redis_url,
        "redis_key_prefix": prefix,
        "ratelimiters": {
            "instances": {"per_ip": {"limit_for_period": 2, "limit_refresh_period": "60s", "key": "ip"}}
        },
    }
    registry.get_keyed_rate_limiter("per_ip").acquire_permission("203.0.113.7")
    [item] = state.snapshot(["per_ip"], include_keys=True)
    keyed = item["state"]["keyed"]
    assert keyed["live_keys"] is None and keyed["note"] == state.UNCOUNTED_KEYS_NOTE
    assert keyed["keys"] == {}  # keys() is [] on Redis: nothing listed, nothing raised
    assert keyed["successful_calls"] == 1
    assert '"live_keys": null' in json.dumps(item)
    [plain] = state.snapshot(["per_ip"])
    assert "keys" not in plain["state"]["keyed"] and plain["state"]["keyed"]["live_keys"] is None


def test_memory_snapshot_keeps_its_count_and_has_no_note(settings) -> None:
    from django_ratelimit_r4 import registry, state

    settings.RATELIMIT_R4 = {"ratelimiters": {"instances": {"per_ip": {"limit_for_period": 2, "key": "ip"}}}}
    registry.get_keyed_rate_limiter("per_ip").acquire_permission("203.0.113.7")
    [item] = state.snapshot(["per_ip"])
    assert item["state"]["keyed"]["live_keys"] == 1 and "note" not in item["state"]["keyed"]


def test_prometheus_shows_redis_keyed_limiters_as_documented(redis_url: str, prefix: str, settings) -> None:
    """docs/operations.md: a Redis keyed limiter exports no keys series (unknown) and no available_permissions."""
    from prometheus_client import CollectorRegistry

    from django_ratelimit_r4 import registry
    from django_ratelimit_r4.contrib import prometheus

    settings.RATELIMIT_R4 = {
        "backend": "redis",
        "redis_url": redis_url,
        "redis_key_prefix": prefix,
        "ratelimiters": {
            "instances": {
                "per_ip": {"limit_for_period": 2, "limit_refresh_period": "60s", "key": "ip"},
                "api": {"limit_for_period": 5, "limit_refresh_period": "60s"},
            }
        },
    }
    registry.get_keyed_rate_limiter("per_ip").acquire_permission("203.0.113.7")
    scrape = CollectorRegistry()
    scrape.register(prometheus.R4Collector())
    assert scrape.get_sample_value("resilience4j_ratelimiter_keys", {"name": "per_ip"}) is None
    assert scrape.get_sample_value("resilience4j_ratelimiter_calls_total", {"name": "per_ip", "kind": "successful"}) == 1
    available = "resilience4j_ratelimiter_available_permissions"
    assert scrape.get_sample_value(available, {"name": "per_ip"}) is None
    assert scrape.get_sample_value(available, {"name": "api"}) is not None


# ------------------------------------------------------------ connection set-up under a burst (issue 7)


def _connections_of(client) -> int:
    """Connections a pool has opened (redis-py internals: the sync pool keeps them all in ``_connections``)."""
    pool = client.connection_pool
    if hasattr(pool, "_connections"):
        return len(pool._connections)
    return len(pool._available_connections) + len(pool._in_use_connections)


async def test_a_burst_of_first_calls_waits_for_a_bounded_pool_instead_of_failing(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection takes longer to open than a command may take: the burst still decides in Redis.

    Opening is slowed to 0.4 s (a loaded worker), beyond the 0.25 s command timeout that also bounded the
    connect before: then every caller timed out and the fault policy granted all 60 (open policy).
    """
    real_open = asyncio.open_connection
    opened: list[int] = []

    async def slow_open(*args, **kwargs):  # redis.asyncio opens its sockets with asyncio.open_connection
        opened.append(1)
        await asyncio.sleep(0.4)
        return await real_open(*args, **kwargs)

    monkeypatch.setattr(asyncio, "open_connection", slow_open)
    rl = limiter(redis_url, prefix, 30, "60s", clock=SYSTEM_CLOCK, name="burst-first")
    results = await asyncio.gather(*(rl.aacquire_permission() for _ in range(60)))
    conn = rb.connection(redis_url)
    assert sum(results) == 30 and rl.backend.faults == 0  # type: ignore[attr-defined]
    assert not conn.is_down()
    assert _connections_of(conn.aio()) <= rb.MAX_CONNECTIONS and len(opened) <= rb.MAX_CONNECTIONS


def test_a_burst_of_first_sync_calls_waits_for_a_bounded_pool_instead_of_failing(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync twin: 60 threads released together make the first calls of a process whose connections take
    0.4 s each to open (a loaded worker), beyond the 0.25 s command timeout; Redis still decides every one."""
    real_connect = redis.connection.Connection._connect
    opened: list[int] = []

    def slow_connect(self):  # redis-py's sync connections open their sockets here
        opened.append(1)
        time.sleep(0.4)
        return real_connect(self)

    monkeypatch.setattr(redis.connection.Connection, "_connect", slow_connect)
    rl = limiter(redis_url, prefix, 30, "60s", clock=SYSTEM_CLOCK, name="burst-first-sync")
    start = threading.Barrier(60)
    results: list[bool] = []

    def first_call() -> None:
        start.wait()
        results.append(rl.acquire_permission())

    threads = [threading.Thread(target=first_call) for _ in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results) == 30 and rl.backend.faults == 0  # type: ignore[attr-defined]
    assert not rb.connection(redis_url).is_down() and len(opened) <= rb.MAX_CONNECTIONS


def test_threads_share_a_bounded_sync_pool(redis_url: str, prefix: str) -> None:
    rl = limiter(redis_url, prefix, 1000, "60s", clock=SYSTEM_CLOCK, name="sync-pool")
    start = threading.Barrier(40)

    def worker() -> None:
        start.wait()
        for _ in range(5):
            assert rl.acquire_permission()

    threads = [threading.Thread(target=worker) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rl.metrics.successful_calls == 200 and rl.backend.faults == 0  # type: ignore[attr-defined]
    assert _connections_of(rb.connection(redis_url).sync) <= rb.MAX_CONNECTIONS


def test_no_free_pooled_connection_decides_one_call_and_is_not_a_server_fault(
    redis_url: str, prefix: str
) -> None:
    url = redis_url + "&max_connections=1&timeout=0.05"  # redis_url has a query: the patient timeouts
    rl = limiter(url, prefix, 5, "60s", clock=SYSTEM_CLOCK, name="exhausted", policy="closed")
    conn = rb.connection(url)
    held = conn.sync.connection_pool.get_connection(*rb._GET_ARGS)
    try:
        assert not rl.acquire_permission()  # the closed policy decided: no connection was free in time
    finally:
        conn.sync.connection_pool.release(held)
    assert not conn.is_down() and rl.backend.faults == 1  # type: ignore[attr-defined]
    assert rl.acquire_permission()  # straight back to Redis: no cool-down
    assert rl.metrics.available_permissions == 4


def test_a_timeout_counts_against_the_server_only_if_no_reply_came_meanwhile() -> None:
    import redis.exceptions

    conn = rb.RedisConnection("redis://127.0.0.1:1/15")
    timeout = redis.exceptions.TimeoutError("Timeout reading from socket")
    before = conn.replies
    conn.replies += 1  # another call got its reply while this one waited: this process was slow
    conn.fault(timeout, "acquire", before)
    assert not conn.is_down()
    conn.fault(timeout, "acquire", conn.replies)  # no reply meanwhile: the server is not answering
    assert conn.is_down()
    conn.recovered()
    conn.fault(redis.exceptions.ConnectionError("Connection refused"), "acquire", before)
    assert conn.is_down()  # refused is the server's whatever else happened
    conn.recovered()
    conn.fault(redis.exceptions.ConnectionError("No connection available."), "acquire", conn.replies)
    assert not conn.is_down()  # pool exhausted: ours


def test_reset_ends_the_fault_window(redis_url: str, prefix: str) -> None:
    """The reset tests (and operators) already use clears a cool-down: its reply proves the server answers."""
    import redis.exceptions

    rl = limiter(redis_url, prefix, 1, "60s", clock=SYSTEM_CLOCK, name="recover", policy="closed")
    conn = rb.connection(redis_url)
    conn.fault(redis.exceptions.ConnectionError("Connection reset by peer"), "acquire")
    assert not rl.acquire_permission() and rl.backend.faults == 1  # type: ignore[attr-defined]
    rl.reset()
    assert not conn.is_down()
    assert rl.acquire_permission() and not rl.acquire_permission()  # Redis decides again: limit 1
    assert rl.backend.faults == 0  # type: ignore[attr-defined]


def test_close_connections_ends_every_fault_window(redis_url: str) -> None:
    import redis.exceptions

    conn = rb.connection(redis_url)
    conn.fault(redis.exceptions.ConnectionError("Connection reset by peer"), "acquire")
    assert conn.is_down()
    rb.close_connections()
    assert not conn.is_down()


# ------------------------------------------------------------------------ faults are visible (issue 9)


def test_an_outage_is_logged_once_visible_everywhere_and_its_end_logged_once(
    redis_server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, settings
) -> None:
    from prometheus_client import CollectorRegistry

    from django_ratelimit_r4 import health, registry, state
    from django_ratelimit_r4.contrib import prometheus
    from django_ratelimit_r4.management.commands.r4 import render_table

    monkeypatch.setattr(rb, "FAULT_COOLDOWN_S", 0.0)  # retry Redis at every decision: no waiting in the test
    settings.RATELIMIT_R4 = {
        "backend": "redis",
        "redis_url": redis_server.url,
        "redis_fault_policy": "open",
        "ratelimiters": {"instances": {"api": {"limit_for_period": 2, "limit_refresh_period": "60s"}}},
    }
    rl = registry.get_rate_limiter("api")
    scrape = CollectorRegistry()
    scrape.register(prometheus.R4Collector())
    degraded = "resilience4j_ratelimiter_backend_degraded"
    faults = "resilience4j_ratelimiter_backend_fault_decisions_total"
    assert rl.acquire_permission()
    # Labelled per instance AND per backend (the shorthand is backends["default"]).
    label = {"name": "api", "backend": "default"}
    assert scrape.get_sample_value(degraded, label) == 0.0

    redis_server.stop()
    with caplog.at_level(logging.INFO, logger="django_ratelimit_r4.redis"):
        assert all(rl.acquire_permission() for _ in range(20))  # the open policy decides, every time
        [item] = state.snapshot(["api"])
        backend = item["state"]["backend"]
        assert backend["degraded"] and backend["fault_decisions"] == 20 and backend["server_faults"] >= 20
        assert "ConnectionError" in backend["last_error"] and backend["url"] == redis_server.url
        assert "DEGRADED for" in render_table([item]) and "fault policy open" in render_table([item])
        assert "redis degraded (fault policy open)" in health.summarize([item])
        assert scrape.get_sample_value(degraded, label) == 1.0
        assert scrape.get_sample_value(faults, label) == 20

        redis_server.start()
        # Redis decides again: the restarted server is empty, so a full budget of 2, then a rejection.
        assert [rl.acquire_permission() for _ in range(3)] == [True, True, False]
    messages = [r.getMessage() for r in caplog.records]
    began = [m for m in messages if "fault policy until it answers again" in m]
    ended = [m for m in messages if "answers again after" in m]
    assert len(began) == 1 and len(ended) == 1, messages  # once each, not per request
    [item] = state.snapshot(["api"])
    assert not item["state"]["backend"]["degraded"] and "DEGRADED" not in render_table([item])
    assert scrape.get_sample_value(degraded, label) == 0.0


def test_fault_metrics_name_the_backend_of_each_instance(redis_server, monkeypatch: pytest.MonkeyPatch, settings) -> None:
    """Faults are counted per backend and instance (issue 9): two named Redis backends, one down, one up; a
    memory instance has no backend series."""
    from prometheus_client import CollectorRegistry

    from django_ratelimit_r4 import registry
    from django_ratelimit_r4.contrib import prometheus

    monkeypatch.setattr(rb, "FAULT_COOLDOWN_S", 0.0)
    refused = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    settings.RATELIMIT_R4 = {
        "backends": {
            "shared": {"BACKEND": "redis", "LOCATION": redis_server.url},
            "down": {"BACKEND": "redis", "LOCATION": refused, "OPTIONS": {"socket_timeout": "50ms"}},
        },
        "ratelimiters": {"instances": {
            "global": {"limit_for_period": 5, "limit_refresh_period": "60s", "backend": "shared"},
            "other": {"limit_for_period": 5, "limit_refresh_period": "60s", "backend": "down",
                      "on_backend_error": "allow"},
            "pool": {"limit_for_period": 5, "limit_refresh_period": "1s"},
        }},
    }
    for name in ("global", "other", "pool"):
        for _ in range(3):
            registry.get_rate_limiter(name).acquire_permission()
    scrape = CollectorRegistry()
    scrape.register(prometheus.R4Collector())
    faults = "resilience4j_ratelimiter_backend_fault_decisions_total"
    degraded = "resilience4j_ratelimiter_backend_degraded"
    assert scrape.get_sample_value(faults, {"name": "global", "backend": "shared"}) == 0
    assert scrape.get_sample_value(degraded, {"name": "global", "backend": "shared"}) == 0.0
    assert scrape.get_sample_value(faults, {"name": "other", "backend": "down"}) == 3
    assert scrape.get_sample_value(degraded, {"name": "other", "backend": "down"}) == 1.0
    names = {s.labels.get("name") for m in scrape.collect() if m.name.startswith("resilience4j_ratelimiter_backend")
             for s in m.samples}
    assert "pool" not in names  # in-process state: nothing remote to fault


def test_all_or_nothing_over_one_redis_limiter(redis_url: str, prefix: str) -> None:
    """The script's single-limit fast path must keep the all-or-nothing reply shape for one entry."""
    clock = FakeClock()
    rl = limiter(redis_url, prefix, 2, "60s", clock=clock, name="lone")
    keyed = rb.RedisKeyedRateLimiter(
        "lone-k", RateLimiterConfig(limit_for_period=1, limit_refresh_period="60s"), clock=clock, url=redis_url,
        prefix=prefix,
    )
    assert acquire_all([rl]) is None and acquire_all([rl]) is None
    loser, wait = acquire_all([rl])  # type: ignore[misc]
    assert loser is rl and wait == 60 * S
    assert rb.acquire_all_keyed([(keyed, "c")]) is None
    assert rb.acquire_all_keyed([(keyed, "c")]) == (0, 60 * S)
