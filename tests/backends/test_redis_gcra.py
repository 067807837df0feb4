"""GCRA on Redis (``algorithm="gcra"``): lua/gcra.lua gives the in-memory GcraBackend's answers, one round trip
per decision, exact across processes, all-or-nothing with other GCRA limiters; through ``@ratelimit`` too.

Against a real Redis (db 15, a unique key prefix per test; CI sets R4_REQUIRE_REDIS=1).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_ratelimit_r4 import get_rate_limiter, registry
from django_ratelimit_r4.backends.algorithms import gcra_bound
from django_ratelimit_r4.backends.memory import GcraBackend
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, acquire_all
from django_ratelimit_r4.decorators import ratelimit
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)
from tests.backends.races import assert_no_window_holds_more, granted_across_processes, grants_on_server_time

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")
scripted = pytest.importorskip("django_ratelimit_r4.backends.redis_scripted")
rg = pytest.importorskip("django_ratelimit_r4.backends.redis_gcra")

ROOT = Path(__file__).resolve().parents[2]


def gcra(
    url: str,
    prefix: str,
    limit: int,
    period: Any,
    *,
    burst: int | None = None,
    timeout: Any = "0s",
    clock: Any = None,
    name: str = "g",
    **backend_options: Any,
) -> RateLimiter:
    config = RateLimiterConfig(
        limit_for_period=limit,
        limit_refresh_period=period,
        timeout_duration=timeout,
        algorithm="gcra",
        burst=burst,
    )
    return RateLimiter(name, config, clock=clock, backend=rb.redis_backend(url, prefix=prefix, **backend_options))


# ------------------------------------------------------------------------------- same answers as memory

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "acquire", "acquire", "quota", "state", "drain", "advance"]),
        st.integers(min_value=1, max_value=6),  # permits
        st.integers(min_value=0, max_value=3_000_000_000),  # timeout or advance, ns
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.integers(min_value=1, max_value=7),
    period=st.sampled_from([1_000_000_000, 999_999_937, 60_000_000_000, 3_000]),
    burst=st.one_of(st.none(), st.integers(min_value=1, max_value=8)),
    start=st.integers(min_value=0, max_value=10**12),
    ops=_OPS,
)
def test_redis_gcra_gives_the_memory_backends_answers(
    redis_url: str, prefix: str, limit: int, period: int, burst: int | None, start: int, ops: list[Any]
) -> None:
    clock = FakeClock()
    clock.advance_ns(start)
    memory = GcraBackend("m", limit, period, clock, burst=burst)
    redis_gcra = rg.RedisGcraBackend("prop", limit, period, clock, burst=burst, url=redis_url, prefix=prefix)
    for op, permits, amount in ops:
        if op == "acquire":
            assert redis_gcra.acquire(permits, amount) == memory.acquire(permits, amount), (permits, amount)
        elif op == "quota":
            assert redis_gcra.quota() == memory.quota()
        elif op == "state":
            assert redis_gcra.state()[1:] == memory.state()[1:]
        elif op == "drain":
            assert redis_gcra.drain() == memory.drain()
        else:
            clock.advance_ns(amount)
    assert redis_gcra.quota() == memory.quota()


def test_one_round_trip_per_decision_and_the_limit_follows_change_limit(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    rl = gcra(redis_url, prefix, 10, "1s", clock=clock)
    assert isinstance(rl.backend, rg.RedisGcraBackend)
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
    rl.change_limit_for_period(20)
    clock.advance(0.05)  # 1 permit back at the new rate (50 ms per permit)
    assert rl.acquire_permission() and not rl.acquire_permission()


_DAY = 86_400 * 10**9


@pytest.mark.parametrize(
    ("limit", "days", "burst"), [(100, 30, None), (7, 30, None), (7, 30, 3), (13, 366, 1), (5, 11, None)]
)
def test_long_periods_count_whole_microseconds_like_the_other_algorithms(
    redis_url: str, prefix: str, limit: int, days: int, burst: int | None
) -> None:
    """A monthly (or yearly) GCRA limit on Redis: periods over ~10.4 days are counted in whole microseconds, as
    the cycle and sliding-window scripts count them, so their values stay exact below 2^52 (in ns, twice a
    30-day burst interval did not fit: building the limiter raised ValueError, a 500 on every request). The
    same grants as memory on a clock of whole microseconds, waits rounded up to the microsecond; a multi-limit
    with a 1 s limit (ns) in one script call; the give-back of a split decision (op "g") too."""
    clock = FakeClock(start_ns=10**15)
    memory = GcraBackend("m", limit, days * _DAY, clock, burst=burst)
    remote = rg.RedisGcraBackend("long", limit, days * _DAY, clock, burst=burst, url=redis_url, prefix=prefix)
    rng = random.Random(limit * days)
    for _ in range(60):
        permits = rng.choice([1, 1, 2])
        timeout = rng.choice([0, 0, days * _DAY // limit, 3 * days * _DAY])
        mine, theirs = remote.acquire(permits, timeout), memory.acquire(permits, timeout)
        assert (mine >= 0) == (theirs >= 0), (permits, timeout, mine, theirs)
        assert 0 <= abs(mine) - abs(theirs) < 1000, (mine, theirs)
        (r1, t1), (r2, t2) = remote.quota(), memory.quota()
        assert r1 == r2 and 0 <= t1 - t2 < 1000, (remote.quota(), memory.quota())
        clock.advance_ns(rng.choice([1, 1000, days * _DAY // limit // 3, days * _DAY // 2]) // 1000 * 1000)
    whole = limit if burst is None else burst
    long = gcra(redis_url, prefix, limit, f"{days}d", burst=burst, clock=clock, name="long2")
    short = gcra(redis_url, prefix, 2, "1s", clock=clock, name="short")
    window = RateLimiter(
        "window",
        RateLimiterConfig(limit_for_period=1, limit_refresh_period="1s", algorithm="sliding_window"),
        clock=clock,
        backend=rb.redis_backend(redis_url, prefix=prefix),
    )
    assert acquire_all([long, short]) is None  # one GCRA script call, a µs limit and a ns one
    short.drain_permissions()
    assert acquire_all([long, short]) is not None  # short rejects: nothing taken
    assert long.backend.quota()[0] == whole - 1
    long.backend.reset(clock)
    assert acquire_all([long, window]) is None  # the mixed script
    assert acquire_all([long, window]) is not None  # the window rejects: a take of long's is given back ("g")
    assert long.backend.quota()[0] == whole - 1


def test_a_change_to_a_limit_the_script_cannot_keep_exact_changes_nothing(redis_url: str, prefix: str) -> None:
    """``change_limit_for_period`` to a rate the Redis script cannot keep exact (86399 per day: units of 1/86399
    ns) raises ``ValueError`` and leaves the limiter as it was (the backend took the new limit and kept the old
    figures before: its limit, config and decisions disagreed)."""
    clock = FakeClock(start_ns=10**12)
    rl = gcra(redis_url, prefix, 2, "1d", clock=clock, name="unfit")
    assert rl.acquire_permission()
    with pytest.raises(ValueError, match="cannot keep limit 86399"):
        rl.change_limit_for_period(86399)
    assert rl.config.limit_for_period == 2 and rl.backend._limit == 2
    assert rl.backend.quota() == (1, 43_200 * 10**9)
    assert rl.acquire_permission() and not rl.acquire_permission()
    rl.change_limit_for_period(4)  # a rate it can keep: taken
    assert rl.backend._limit == 4 and rl.config.limit_for_period == 4


# --------------------------------------------------------------------------------- server time, bounds


def test_boundary_bound_over_random_arrivals_on_server_time(redis_url: str, prefix: str) -> None:
    """Random arrivals against 20 per 200 ms (burst 20), server time: no window of 200 ms holds more than
    gcra_bound(200 ms) = 39 grants by the server clock (the cycle limiter allows 40 around a boundary).

    Each grant's server time is bracketed by a TIME read before and after its decision (Redis runs commands
    one at a time), so grants i..j surely lie in one window when after[j] - before[i] < 200 ms, however long
    this process was descheduled in between: the check never depends on the machine's load."""
    # What is checked is the script's bound, so no decision may come from the fault policy: a 0.25 s socket
    # timeout on a loaded machine sent some to "open" (granted without Redis: 40 > 39). A patient connection,
    # and "closed" for whatever still times out (a refusal cannot break an upper bound).
    rl = gcra(redis_url, prefix, 20, "200ms", clock=SYSTEM_CLOCK, name="bound", fault_policy="closed",
              connection_options={"socket_timeout": 5.0})
    before, after = grants_on_server_time(redis_url, rl.acquire_permission, seed=7)
    bound = gcra_bound(200_000_000, 200_000_000, 20, 20)
    assert bound == 39
    assert_no_window_holds_more(before, after, 200_000, bound)
    assert len(before) > 40  # the load did cross several periods
    rl.backend.reset(SYSTEM_CLOCK)


def test_exact_across_four_processes(redis_url: str, prefix: str) -> None:
    """Four processes x 10 threads released together on one GCRA limit of 5 per 60 s: exactly 5 granted."""
    for trial in range(3):
        granted = granted_across_processes(redis_url, prefix, f"mp{trial}", algorithm="gcra", processes=4)
        assert sum(granted) == 5, granted


def test_a_late_call_changes_nothing(redis_url: str, prefix: str) -> None:
    """Server time: a call whose deadline has passed answers LATE and takes nothing (no ghost charge)."""
    rl = gcra(redis_url, prefix, 1, "60s", clock=SYSTEM_CLOCK, name="late")
    backend = rl.backend
    conn = backend._connection()
    args = backend._script_args(b"a", 1, 0)
    args[-1] = b"1"  # a deadline long past (server microseconds)
    pool = conn.sync.connection_pool
    c = pool.get_connection(*rb._GET_ARGS)
    try:
        c.send_command("EVAL", rg.GCRA_SCRIPT, 1, backend.state_key, *rb._flat(args))
        assert c.read_response() == b"LATE"
    finally:
        pool.release(c)
    assert rl.acquire_permission()  # the late call took nothing
    assert not rl.acquire_permission()
    backend.reset(SYSTEM_CLOCK)


# ---------------------------------------------------------------------------------------- all-or-nothing


def test_all_or_nothing_over_gcra_limiters_in_one_script(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    a = gcra(redis_url, prefix, 3, "60s", clock=clock, name="a")
    b = gcra(redis_url, prefix, 1, "30s", clock=clock, name="b")
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
    # with a cycle limiter: one call per algorithm, sent at once (tests/backends/test_redis_mixed.py)
    assert acquire_all([a, cycle]) is None
    assert acquire_all([cycle, a]) is None
    assert a.metrics.available_permissions == 0 and cycle.metrics.available_permissions == 1


def test_keyed_gcra_on_redis_and_all_or_nothing_with_keys(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    config = RateLimiterConfig(limit_for_period=2, limit_refresh_period="1s", algorithm="gcra")
    keyed = rg.RedisGcraKeyedRateLimiter("k", config, clock=clock, url=redis_url, prefix=prefix)
    assert [keyed.acquire_permission("x") for _ in range(3)] == [True, True, False]
    assert keyed.acquire_permission("y")
    assert keyed.quota("x") == (0, 500_000_000)
    clock.advance(0.5)
    assert keyed.quota("x") == (1, 500_000_000)
    g = gcra(redis_url, prefix, 5, "1s", clock=clock, name="u")
    assert rb.acquire_all_keyed([(g, None), (keyed, "x")]) is None
    assert rb.acquire_all_keyed([(g, None), (keyed, "x")]) == (1, 500_000_000)
    assert g.metrics.available_permissions == 4


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


@pytest.mark.urls(__name__)
@pytest.mark.django_db(databases=[])
def test_http_gcra_on_redis_headers_from_the_state(redis_url: str, prefix: str, r4_clock: Any) -> None:
    value = {
        "backend": "redis",
        "redis_url": redis_url,
        "redis_key_prefix": prefix,
        "ratelimiters": {
            "instances": {
                "smooth": {"rate": "4/s", "algorithm": "gcra"},
                "smooth_ip": {"rate": "2/s", "algorithm": "gcra", "key": "ip"},
            },
        },
    }
    with override_settings(RATELIMIT_R4=value):
        assert isinstance(get_rate_limiter("smooth").backend, rg.RedisGcraBackend)
        assert isinstance(registry.get_keyed_rate_limiter("smooth_ip").store, rg.RedisGcraKeyedStore)
        client = Client()
        first = client.get("/smooth/")
        assert first.status_code == 200
        assert first["RateLimit"] == '"smooth";r=3;t=1'  # 250 ms until full again, rounded up
        assert [client.get("/smooth/").status_code for _ in range(3)] == [200] * 3
        rejected = client.get("/smooth/")
        assert rejected.status_code == 429
        assert rejected["Retry-After"] == "1"  # 250 ms to the next permit, rounded up
        assert rejected["RateLimit"] == '"smooth";r=0;t=1'
        r4_clock.advance(0.25)  # one emission interval: exactly one permit back (no cycle boundary)
        assert client.get("/smooth/").status_code == 200
        assert client.get("/smooth/").status_code == 429
        assert [client.get("/smooth-ip/").status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(databases=[])
def test_http_monthly_gcra_on_redis_passes_the_checks_and_serves(redis_url: str, prefix: str, r4_clock: Any) -> None:
    """2 per 30 days by GCRA on Redis through the settings: ``manage.py check`` is clean and the view answers
    (every request was a 500 before: the limiter raised ValueError when built), Retry-After from the state."""
    from django.core.checks import run_checks

    value = {
        "backend": "redis",
        "redis_url": redis_url,
        "redis_key_prefix": prefix,
        "ratelimiters": {"instances": {"smooth": {"rate": "2/30d", "algorithm": "gcra"}, "smooth_ip": {"rate": "1/s"}}},
    }
    with override_settings(RATELIMIT_R4=value):
        assert [m for m in run_checks() if m.id.startswith("ratelimit_r4")] == []
        client = Client()
        assert [client.get("/smooth/").status_code for _ in range(2)] == [200, 200]
        rejected = client.get("/smooth/")
        assert rejected.status_code == 429
        assert rejected["Retry-After"] == str(15 * 86_400)  # one emission interval: 30 days / 2
        assert rejected["RateLimit"] == f'"smooth";r=0;t={15 * 86_400}'
        r4_clock.advance(15 * 86_400)
        assert [client.get("/smooth/").status_code for _ in range(2)] == [200, 429]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(databases=[])
def test_http_multi_limit_of_gcra_limiters_all_or_nothing(redis_url: str, prefix: str, r4_clock: Any) -> None:
    """Two GCRA limits (one keyed) on one view: one script call decides both; a rejection takes nothing."""
    value = {
        "backend": "redis",
        "redis_url": redis_url,
        "redis_key_prefix": prefix,
        "ratelimiters": {
            "instances": {
                "smooth": {"rate": "4/s", "algorithm": "gcra"},
                "smooth_ip": {"rate": "2/s", "algorithm": "gcra", "key": "ip"},
            },
        },
    }
    with override_settings(RATELIMIT_R4=value):
        get_rate_limiter("smooth")
        registry.get_keyed_rate_limiter("smooth_ip")
        client = Client()
        assert [client.get("/smooth-both/").status_code for _ in range(3)] == [200, 200, 429]
        assert get_rate_limiter("smooth").metrics.available_permissions == 2  # the 429 took nothing
        rejected = client.get("/smooth-both/")
        assert rejected["Retry-After"] == "1"
        r4_clock.advance(0.5)  # one permit back on smooth_ip (500 ms per permit)
        assert client.get("/smooth-both/").status_code == 200


@pytest.mark.urls(__name__)
@pytest.mark.django_db(databases=[])
def test_http_multi_limit_of_gcra_limiters_async(redis_url: str, prefix: str, r4_clock: Any) -> None:
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    value = {
        "backend": "redis",
        "redis_url": redis_url,
        "redis_key_prefix": prefix,
        "ratelimiters": {
            "instances": {
                "smooth": {"rate": "4/s", "algorithm": "gcra"},
                "smooth_ip": {"rate": "2/s", "algorithm": "gcra", "key": "ip"},
            },
        },
    }
    with override_settings(RATELIMIT_R4=value):
        get_rate_limiter("smooth")
        registry.get_keyed_rate_limiter("smooth_ip")
        client = AsyncClient()

        async def three() -> list[int]:
            return [(await client.get("/smooth-both-async/")).status_code for _ in range(3)]

        assert async_to_sync(three)() == [200, 200, 429]
        assert get_rate_limiter("smooth").metrics.available_permissions == 2


# ------------------------------------------------------------------------------------- async and faults

UNREACHABLE = "redis://127.0.0.1:1/14?socket_timeout=0.25"  # nothing listens on port 1


def test_async_acquire_and_quota_match_sync(redis_url: str, prefix: str) -> None:
    import asyncio

    clock = FakeClock()
    rl = gcra(redis_url, prefix, 2, "1s", clock=clock, name="async")

    async def run() -> tuple[list[bool], tuple[int, int]]:
        granted = [await rl.aacquire_permission() for _ in range(3)]
        return granted, await rl.backend.aquota()

    granted, quota = asyncio.run(run())
    assert granted == [True, True, False]
    assert quota == rl.backend.quota() == (0, 500_000_000)


def test_fault_policy_local_decides_by_gcra_in_process() -> None:
    """Redis unreachable: under "local" the in-process GcraBackend decides (burst 2, then 1 per 500 ms)."""
    clock = FakeClock()
    config = RateLimiterConfig(limit_for_period=2, limit_refresh_period="1s", algorithm="gcra")
    rl = RateLimiter("down", config, clock=clock, backend=rb.redis_backend(UNREACHABLE, fault_policy="local"))
    assert isinstance(rl.backend._local, GcraBackend)
    assert [rl.acquire_permission() for _ in range(3)] == [True, True, False]
    clock.advance(0.5)
    assert rl.acquire_permission()
    assert rl.backend.quota() == (0, 500_000_000)
    keyed = rg.RedisGcraKeyedRateLimiter("down", config, clock=clock, url=UNREACHABLE, fault_policy="local")
    assert [keyed.acquire_permission("x") for _ in range(3)] == [True, True, False]
    closed = rg.RedisGcraKeyedRateLimiter(
        "down2", config, clock=clock, url=UNREACHABLE, fault_policy="closed"
    )
    assert not closed.acquire_permission("x")


@pytest.mark.parametrize("module", ["redis_gcra", "redis_sliding"])
def test_every_policy_decision_of_an_all_or_nothing_decision_is_counted_as_a_fault(module: str) -> None:
    """While the connection cools down after a fault, an all-or-nothing decision is the policy's too: counted in
    ``fault_decisions`` like a single decision (GCRA's copy of the multi-limit path skipped the count)."""
    algorithm = "gcra" if module == "redis_gcra" else "sliding_window"
    config = RateLimiterConfig(limit_for_period=2, limit_refresh_period="1s", algorithm=algorithm)
    backend = rb.redis_backend(UNREACHABLE, fault_policy="local")
    rl = RateLimiter("down-many", config, clock=FakeClock(), backend=backend)
    other = RateLimiter("down-many2", config, clock=FakeClock(), backend=backend)
    assert rl.acquire_permission()  # the refused connection: a fault, decided locally; the cool-down starts
    assert rl.backend._connection().is_down()
    before = rl.backend.backend_health()["fault_decisions"]
    assert rl.backend.acquire_many([rl.backend, other.backend], 1) is None
    assert rl.backend.backend_health()["fault_decisions"] == before + 1
