"""The async methods of a backend doing I/O are a protocol (``core.backend.RemoteRateLimiterBackend``), not
attributes looked up per call: every Redis backend implements all of it, the in-memory ones none of it, and a
limiter decides which once, when it is built (issue 10, item 5)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from django_ratelimit_r4.core.backend import RemoteRateLimiterBackend, as_remote
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, aacquire_all
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)

pytest.importorskip("redis")

S = 1_000_000_000
ALGORITHMS = ("cycle", "gcra", "sliding_window")


def _config(algorithm: str) -> RateLimiterConfig:
    return RateLimiterConfig(limit_for_period=2, limit_refresh_period="1s", timeout_duration="0s", algorithm=algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_in_memory_backends_are_not_remote(algorithm: str) -> None:
    limiter = RateLimiter("m", _config(algorithm), clock=FakeClock())
    assert limiter.remote_backend is None
    assert as_remote(limiter.backend) is None


def _redis_factories(redis_url: str, prefix: str) -> dict[str, Any]:
    from django_ratelimit_r4.backends.redis import redis_backend
    from django_ratelimit_r4.backends.redis_lease import redis_lease_backend

    return {
        **{a: redis_backend(redis_url, prefix=prefix) for a in ALGORITHMS},
        "lease": redis_lease_backend(redis_url, prefix=prefix, lease=1),
    }


@pytest.mark.parametrize("which", [*ALGORITHMS, "lease"])
def test_every_redis_backend_implements_the_whole_remote_protocol(redis_url: str, prefix: str, which: str) -> None:
    factory = _redis_factories(redis_url, prefix)[which]
    limiter = RateLimiter(f"r-{which}", _config("cycle" if which == "lease" else which), clock=FakeClock(), backend=factory)
    assert isinstance(limiter.backend, RemoteRateLimiterBackend)
    assert limiter.remote_backend is limiter.backend

    async def run() -> tuple[Any, ...]:
        quota = await limiter.aacquire_quota()
        granted = await limiter.aacquire_permission()
        rejected = await limiter.aacquire_permission()
        return quota, granted, rejected, await aacquire_all([limiter])

    quota, granted, rejected, all_outcome = asyncio.run(run())
    assert quota[0] == 1 and granted and not rejected
    assert all_outcome is not None and all_outcome[0] is limiter


@pytest.mark.parametrize("which", [*ALGORITHMS, "lease"])
def test_the_operator_reads_are_protocols_redis_backends_implement(redis_url: str, prefix: str, which: str) -> None:
    """``backend_health()`` / ``lease_snapshot()`` are the optional operator protocols (``HealthReporting``,
    ``LeaseReporting``) that state and the Prometheus collector check with isinstance, not getattr."""
    from django_ratelimit_r4.core.backend import HealthReporting, LeaseReporting
    from django_ratelimit_r4.keyed import KeyedRateLimiter

    factory = _redis_factories(redis_url, prefix)[which]
    limiter = RateLimiter(f"o-{which}", _config("cycle" if which == "lease" else which), clock=FakeClock(), backend=factory)
    assert isinstance(limiter.backend, HealthReporting)
    assert isinstance(limiter.backend, LeaseReporting) is (which == "lease")
    memory = RateLimiter("m", _config("cycle"), clock=FakeClock())
    assert not isinstance(memory.backend, (HealthReporting, LeaseReporting))
    store = KeyedRateLimiter("k", _config("cycle"), clock=FakeClock()).store
    assert not isinstance(store, (HealthReporting, LeaseReporting))
