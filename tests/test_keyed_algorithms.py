"""Per-key GCRA and sliding-window limits: same answers as the unkeyed backends, bounded memory, multi-limits,
threads, and over HTTP (Retry-After and RateLimit fields from the state, r4 status)."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client, override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.backends.memory import GcraBackend, SlidingWindowBackend
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig
from django_ratelimit_r4.keyed import KeyedRateLimiter, acquire_all_keyed
from django_ratelimit_r4.keyed_smooth import SmoothKeyedStore

from . import views

SECOND, MS = 1_000_000_000, 1_000_000


def config(algorithm: str, limit: int = 3, period: str = "1s", **kw: Any) -> RateLimiterConfig:
    return RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm, **kw)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["gcra", "sliding_window"]),
    st.integers(min_value=1, max_value=6),
    st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.integers(min_value=0, max_value=400 * MS),
            st.integers(min_value=1, max_value=7),
            st.sampled_from([0, 0, 1, 300 * MS, 2 * SECOND]),
        ),
        max_size=50,
    ),
)
def test_each_key_decides_like_an_unkeyed_backend(algorithm: str, limit: int, steps: list) -> None:
    clock = FakeClock()
    keyed = KeyedRateLimiter("k", config(algorithm, limit, burst=max(1, limit - 1) if algorithm == "gcra" else None), clock=clock)
    assert isinstance(keyed.store, SmoothKeyedStore)
    backends: dict[str, Any] = {}
    for key, step, permits, timeout in steps:
        clock.advance_ns(step)
        if key not in backends:
            if algorithm == "gcra":
                backends[key] = GcraBackend(key, limit, SECOND, clock, burst=max(1, limit - 1))
            else:
                backends[key] = SlidingWindowBackend(key, limit, SECOND, clock)
        backend = backends[key]
        assert keyed._decide(key, permits, timeout) == backend.acquire(permits, timeout)
        for other, b in backends.items():
            assert keyed.quota(other) == b.quota()
            assert keyed.state(other)[1:] == b.state()[1:]
        assert len(keyed) <= 3


@pytest.mark.parametrize("algorithm", ["gcra", "sliding_window"])
def test_memory_is_bounded_and_full_keys_are_dropped(algorithm: str) -> None:
    clock = FakeClock()
    keyed = KeyedRateLimiter("k", config(algorithm, 2), clock=clock, max_keys=5)
    for i in range(20):
        assert keyed.acquire_permission(f"client-{i}")
    assert len(keyed) == 5 and keyed.metrics.lossy_evictions == 15
    clock.advance_ns(SECOND)
    assert keyed.acquire_permission("late")
    assert keyed.purge() >= 3 and len(keyed) <= 2  # full again one period later: dropped for free
    assert keyed.metrics.lossy_evictions == 15


@pytest.mark.parametrize("algorithm", ["gcra", "sliding_window"])
def test_view_quota_reservation_and_drain(algorithm: str) -> None:
    clock = FakeClock()
    keyed = KeyedRateLimiter("k", config(algorithm, 2, timeout_duration="1s"), clock=clock)
    view = keyed.get("a")
    assert keyed.acquire_quota("a") == (1, 500 * MS if algorithm == "gcra" else SECOND)
    assert view.reserve_permission() == 0
    assert view.reserve_permission() == (500 * MS if algorithm == "gcra" else SECOND)
    assert view.metrics.available_permissions == (-1 if algorithm == "gcra" else 0)
    strict = KeyedRateLimiter("s", config(algorithm, 2), clock=clock)
    assert strict.drain_permissions("b") == 2
    with pytest.raises(RequestNotPermitted) as info:
        strict.acquire_or_raise("b")
    assert info.value.wait_ns == (500 * MS if algorithm == "gcra" else SECOND)


def test_acquire_all_keyed_mixes_algorithms_all_or_nothing() -> None:
    clock = FakeClock()
    gcra = KeyedRateLimiter("g", config("gcra", 10, burst=1), clock=clock)
    sliding = KeyedRateLimiter("s", config("sliding_window", 2), clock=clock)
    cycle = RateLimiter("c", config("cycle", 5), clock=clock)
    assert acquire_all_keyed([(gcra, "a"), (sliding, "a"), (cycle, None)]) is None
    assert acquire_all_keyed([(gcra, "a"), (sliding, "a"), (cycle, None)]) == (0, 100 * MS)
    assert sliding.state("a")[1] == 1 and cycle.metrics.available_permissions == 4  # nothing taken
    clock.advance_ns(100 * MS)
    assert acquire_all_keyed([(gcra, "a"), (sliding, "a")]) is None
    assert acquire_all_keyed([(sliding, "a"), (gcra, "b")]) == (0, 900 * MS)
    assert "b" not in gcra


@pytest.mark.parametrize(("algorithm", "granted"), [("gcra", 4), ("sliding_window", 10)])
def test_one_key_is_exact_under_20_threads(algorithm: str, granted: int, fast_switching: None) -> None:
    for _ in range(10):
        keyed = KeyedRateLimiter(
            "k", config(algorithm, 10, burst=4 if algorithm == "gcra" else None), clock=FakeClock()
        )
        barrier = threading.Barrier(20)
        results: list[int] = []

        def worker(keyed: KeyedRateLimiter = keyed, barrier: threading.Barrier = barrier, results: list = results) -> None:
            barrier.wait()
            results.append(sum(keyed.acquire_permission("same") for _ in range(5)))

        threads = [threading.Thread(target=worker) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(results) == granted


def smooth_settings() -> dict[str, Any]:
    value = views.r4_settings()
    value["ratelimiters"]["instances"]["api"].update({"algorithm": "gcra", "burst": 2})
    value["ratelimiters"]["instances"]["per_ip"].update({"algorithm": "sliding_window"})
    return value


def test_http_retry_after_and_ratelimit_fields_from_state(r4_clock: FakeClock) -> None:
    with override_settings(RATELIMIT_R4=smooth_settings()):
        client = Client()
        first = client.get("/api/")  # gcra 10/s, burst 2
        assert first.status_code == 200 and first["RateLimit"] == '"api";r=1;t=1'
        assert client.get("/api/").status_code == 200
        rejected = client.get("/api/")
        assert rejected.status_code == 429
        assert rejected["Retry-After"] == "1" and rejected["RateLimit"] == '"api";r=0;t=1'
        r4_clock.advance(0.1)
        assert client.get("/api/").status_code == 200  # one permit back after 100 ms
        assert [client.get("/per-ip/", REMOTE_ADDR="203.0.113.7").status_code for _ in range(3)] == [200, 200, 429]
        r4_clock.advance(0.5)
        assert client.get("/per-ip/", REMOTE_ADDR="203.0.113.7").status_code == 429  # still in the window
        r4_clock.advance(0.5)
        assert client.get("/per-ip/", REMOTE_ADDR="203.0.113.7").status_code == 200
        out = io.StringIO()
        call_command("r4", "status", "--json", stdout=out)
        api = next(i for i in json.loads(out.getvalue()) if i["type"] == "ratelimiter" and i["name"] == "api")
        assert api["config"]["algorithm"] == "gcra" and api["config"]["burst"] == 2
        assert api["state"]["successful_calls"] == 3 and api["state"]["failed_calls"] == 1


@pytest.mark.django_db(databases=[])
def test_drf_throttles_with_gcra_and_a_keyed_sliding_window(r4_clock: FakeClock) -> None:
    from django.core.cache import cache

    cache.clear()
    with override_settings(RATELIMIT_R4=smooth_settings()):
        client = Client()
        assert [client.get("/drf/").status_code for _ in range(3)] == [200, 200, 429]  # gcra burst 2
        r4_clock.advance(0.1)
        assert client.get("/drf/").status_code == 200
        a = {"REMOTE_ADDR": "203.0.113.7"}
        responses = [client.get("/drf-keyed/", **a) for _ in range(3)]
        assert [r.status_code for r in responses] == [200, 200, 429]
        # The 429's fields come with the rejection (rejection_quotas): the wait, not t=0 as they were.
        assert responses[2]["RateLimit"].startswith('"per_ip";r=0;t=1;')
        r4_clock.advance(0.95)
        rejected = client.get("/drf-keyed/", **a)
        assert rejected.status_code == 429 and rejected["Retry-After"] == "1"  # 50 ms left, rounded up
        r4_clock.advance(0.05)
        assert client.get("/drf-keyed/", **a).status_code == 200
