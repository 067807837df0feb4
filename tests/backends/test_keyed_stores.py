"""One ``KeyedRateLimiter`` for every store (issue 9): every store implements ``core.backend.KeyedBackend``, the
Redis names only build their store, and the same scenario through the one limiter gives the same answers,
events, exceptions and counters in memory and in Redis (the machine's Redis, db 15, a unique prefix)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from django.test import override_settings

from django_ratelimit_r4 import registry
from django_ratelimit_r4.backends.memory import MemoryStore
from django_ratelimit_r4.core.backend import KeyedBackend
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import RateLimiterConfig
from django_ratelimit_r4.keyed import KeyedRateLimiter, MemoryKeyedStore
from django_ratelimit_r4.keyed_smooth import SmoothKeyedStore
from tests.test_hot_path_twins import _body

redis = pytest.importorskip("redis")

from django_ratelimit_r4.backends import redis as rb  # noqa: E402
from django_ratelimit_r4.backends import redis_gcra as rg  # noqa: E402
from django_ratelimit_r4.backends import redis_lease as rl  # noqa: E402
from django_ratelimit_r4.backends import redis_sliding as rs  # noqa: E402
from tests.backends.patient import patient_redis_url  # noqa: E402, F401  (exactness tests: patient timeouts)

S = 1_000_000_000
ASYNC_METHODS = ("adecide", "adecide_quota", "aquota")


def _config(algorithm: str = "cycle", limit: int = 3, timeout: str = "0s") -> RateLimiterConfig:
    return RateLimiterConfig(
        limit_for_period=limit, limit_refresh_period="1s", timeout_duration=timeout, algorithm=algorithm
    )


def _stores(redis_url: str, prefix: str, clock: FakeClock) -> dict[str, Any]:
    options = {"clock": clock, "url": redis_url, "prefix": prefix}
    return {
        "memory cycle": MemoryKeyedStore(_config(), clock),
        "memory gcra": SmoothKeyedStore(_config("gcra"), clock),
        "memory sliding window": SmoothKeyedStore(_config("sliding_window"), clock),
        "redis cycle": rb.RedisKeyedStore("c", _config(), **options),
        "redis gcra": rg.RedisGcraKeyedStore("g", _config("gcra"), **options),
        "redis sliding window": rs.RedisSlidingKeyedStore("s", _config("sliding_window"), **options),
        "redis lease": rl.RedisLeaseKeyedStore("l", _config(), lease=2, **options),
    }


def test_every_store_implements_the_keyed_backend_protocol(redis_url: str, prefix: str) -> None:
    for name, store in _stores(redis_url, prefix, FakeClock(start_ns=5 * S)).items():
        assert isinstance(store, KeyedBackend), name
        for method in ASYNC_METHODS:  # declared async twins, awaited as such (never looked up with getattr)
            assert inspect.iscoroutinefunction(getattr(store, method)), (name, method)
        assert store.remote is name.startswith("redis"), name
        limiter = KeyedRateLimiter(name, store.config, clock=FakeClock(), store=store)
        assert limiter.acquire_permission("k") and limiter.successful_calls == 1, name


@pytest.mark.parametrize(
    "cls",
    [rb.RedisKeyedRateLimiter, rg.RedisGcraKeyedRateLimiter, rs.RedisSlidingKeyedRateLimiter,
     rl.RedisLeaseKeyedRateLimiter],
)
def test_the_redis_names_are_the_one_limiter_building_a_store(cls: type) -> None:
    """No copy of the limiter: each name defines nothing but the store it builds (RedisKeyedRateLimiter also the
    constructor that builds it)."""
    assert issubclass(cls, KeyedRateLimiter)
    own = {name for name in vars(cls) if not name.startswith("__") or name == "__init__"}
    assert own <= ({"store_type", "__init__"} if cls is rb.RedisKeyedRateLimiter else {"store_type"})
    assert issubclass(cls.store_type, rb.RedisKeyedStore)  # type: ignore[attr-defined]


@pytest.mark.django_db(databases=[])
def test_the_registry_builds_the_same_limiter_class_over_every_store(redis_url: str, prefix: str) -> None:
    """The stores build stores (``Store.keyed_store``); the registry wraps each in the one ``KeyedRateLimiter``."""
    setting = {
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": redis_url, "OPTIONS": {"key_prefix": prefix}}},
        "ratelimiters": {"instances": {
            "local": {"key": "ip"},
            "smooth": {"key": "ip", "algorithm": "gcra"},
            "global": {"key": "ip", "backend": "shared"},
            "leased": {"key": "ip", "backend": "shared", "lease": 2},
        }},
    }
    with override_settings(RATELIMIT_R4=setting):
        built = {name: registry.get_keyed_rate_limiter(name) for name in ("local", "smooth", "global", "leased")}
    assert {type(limiter) for limiter in built.values()} == {KeyedRateLimiter}
    assert [type(limiter.store) for limiter in built.values()] == [
        MemoryKeyedStore, SmoothKeyedStore, rb.RedisKeyedStore, rl.RedisLeaseKeyedStore
    ]
    store = MemoryStore("default").keyed_store(
        "k", _config(), clock=FakeClock(), max_keys=10, idle_timeout_ns=None, on_error=None
    )
    assert isinstance(store, KeyedBackend) and store.max_keys == 10


def _scenario(limiter: KeyedRateLimiter, clock: FakeClock) -> list[Any]:
    """Decisions, waits, events, exceptions and counters of one run, as plain values."""
    events: list[Any] = []
    limiter.events.on_event(lambda e: events.append((e.event_type, e.number_of_permits)))
    out: list[Any] = []
    for step in range(12):
        key = "ab"[step % 2]
        out.append(("permission", limiter.acquire_permission(key)))
        out.append(("reserve", limiter.reserve_permission(key)))
        try:
            out.append(("quota", limiter.acquire_quota(key)))
        except RequestNotPermitted as exc:
            out.append(("rejected", exc.key, exc.wait_ns, exc.name))
        out.append(("state", limiter.state(key), limiter.get(key).metrics.available_permissions))
        out.append(("async", asyncio.run(limiter.aacquire_permission(key))))
        clock.advance_ns(S // 4)
    out.append(("drain", limiter.drain_permissions("a"), limiter.quota("a")))
    out.append(("counters", limiter.metrics.successful_calls, limiter.metrics.failed_calls))
    out.append(("waiting", limiter.metrics.number_of_waiting_threads))
    return [*out, ("events", events)]


@pytest.mark.parametrize("timeout", ["0s", "400ms"])
def test_the_same_scenario_answers_alike_in_memory_and_in_redis(redis_url: str, prefix: str, timeout: str) -> None:
    runs = []
    for store in ("memory", "redis"):
        clock = FakeClock(start_ns=3 * S)
        config = _config(limit=2, timeout=timeout)
        if store == "memory":
            limiter = KeyedRateLimiter("same", config, clock=clock)
        else:
            limiter = rb.RedisKeyedRateLimiter("same", config, clock=clock, url=redis_url, prefix=prefix)
        runs.append(_scenario(limiter, clock))
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    ("sync", "async_"),
    [
        (KeyedRateLimiter.acquire_permission, KeyedRateLimiter.aacquire_permission),
        (KeyedRateLimiter.acquire_or_raise, KeyedRateLimiter.aacquire_or_raise),
        (KeyedRateLimiter._acquire_quota_of_store, KeyedRateLimiter.aacquire_quota),
    ],
    ids=["acquire_permission", "acquire_or_raise", "acquire_quota (every store but the default)"],
)
def test_the_limiters_sync_and_async_twins_differ_only_in_the_await(sync: Any, async_: Any) -> None:
    renames = {"_adecide": "_decide", "asleep": "sleep", "_adecide_quota": "_decide_quota", "aquota": "quota"}
    assert _body(sync, {}) == _body(async_, renames), "make the same change to both twins"
