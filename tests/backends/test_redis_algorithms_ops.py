"""Issue 13 on Redis, the operations side: GCRA and sliding-window limiters (unkeyed and keyed) through
``manage.py r4`` (status, drain, reset of the limiter and of one client key), the state endpoint's snapshot and
actions, and the Prometheus collector, as cycle limiters are. Against a real Redis (db 15, a unique prefix)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client, override_settings

from django_ratelimit_r4 import get_rate_limiter, registry
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)

pytest.importorskip("redis")
TOKEN = "t" * 40


def r4(*args: str) -> str:
    out = io.StringIO()
    call_command("r4", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def setting(redis_url: str, prefix: str) -> dict[str, Any]:
    return {
        "backend": "redis",
        "redis_url": redis_url,
        "redis_key_prefix": prefix,
        "state_endpoint_token": TOKEN,
        "ratelimiters": {
            "instances": {
                "g": {"rate": "4/s", "algorithm": "gcra", "burst": 2},
                "s": {"rate": "3/s", "algorithm": "sliding_window"},
                "gk": {"rate": "4/s", "algorithm": "gcra", "key": "ip"},
                "sk": {"rate": "3/s", "algorithm": "sliding_window", "key": "ip"},
            }
        },
    }


@pytest.mark.django_db(databases=[])
def test_r4_status_drain_and_reset_of_gcra_and_sliding_limiters_on_redis(
    redis_url: str, prefix: str, r4_clock: Any
) -> None:
    with override_settings(RATELIMIT_R4=setting(redis_url, prefix)):
        g, s = get_rate_limiter("g"), get_rate_limiter("s")
        assert type(g.backend).__name__ == "RedisGcraBackend"
        assert type(s.backend).__name__ == "RedisSlidingBackend"
        assert [g.acquire_permission() for _ in range(3)] == [True, True, False]
        assert s.acquire_permission()
        r4_clock.advance(0.1)
        items = {i["name"]: i for i in json.loads(r4("status", "--json")) if i["type"] == "ratelimiter"}
        # GCRA 4/s burst 2, both spent 100 ms ago: the next in 150 ms; the window: 2 left, full in 900 ms.
        assert (items["g"]["state"]["available_permissions"], items["g"]["state"]["nanos_to_wait"]) == (0, 150_000_000)
        assert (items["s"]["state"]["available_permissions"], items["s"]["state"]["nanos_to_wait"]) == (2, 0)
        assert items["g"]["config"]["algorithm"] == "gcra" and items["s"]["config"]["algorithm"] == "sliding_window"
        assert "ratelimiter 's': drained 2 permission(s)" in r4("drain", "s")
        assert not s.acquire_permission()
        r4("reset", "g")
        r4("reset", "s")
        assert [g.acquire_permission() for _ in range(3)] == [True, True, False]
        assert [s.acquire_permission() for _ in range(4)] == [True, True, True, False]

        gk, sk = registry.get_keyed_rate_limiter("gk"), registry.get_keyed_rate_limiter("sk")
        for keyed, whole in ((gk, 4), (sk, 3)):
            assert keyed.acquire_permission("a")
            assert keyed.acquire_permission("b")
            name = keyed.name
            assert f"drained {whole - 1} permission(s)" in r4("drain", name, "--key", "b")
            assert not keyed.acquire_permission("b")
            assert keyed.acquire_permission("a")  # another client's budget is untouched
            r4("reset", name, "--key", "b")
            assert [keyed.acquire_permission("b") for _ in range(whole + 1)] == [True] * whole + [False]


@pytest.mark.urls("tests.state_urls")
@pytest.mark.django_db(databases=[])
def test_state_endpoint_snapshot_and_actions_on_gcra_and_sliding_limiters(
    redis_url: str, prefix: str, r4_clock: Any
) -> None:
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    with override_settings(RATELIMIT_R4=setting(redis_url, prefix)):
        g, s = get_rate_limiter("g"), get_rate_limiter("s")
        g.acquire_permission()
        s.acquire_permission()
        client = Client()
        snapshot = {i["name"]: i for i in client.get("/ops/r4/", **bearer).json()}
        assert snapshot["g"]["state"]["available_permissions"] == 1
        assert snapshot["s"]["state"]["available_permissions"] == 2
        assert client.post("/ops/r4/g/drain", **bearer).json()["drained"] == 1
        assert client.post("/ops/r4/s/drain", **bearer).json()["drained"] == 2
        assert (g.metrics.available_permissions, s.metrics.available_permissions) == (0, 0)
        client.post("/ops/r4/g/reset", **bearer)
        client.post("/ops/r4/s/reset", **bearer)
        assert (g.metrics.available_permissions, s.metrics.available_permissions) == (2, 3)


@pytest.mark.django_db(databases=[])
def test_prometheus_exports_gcra_and_sliding_limiters_on_redis(redis_url: str, prefix: str, r4_clock: Any) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import REGISTRY

    from django_ratelimit_r4.contrib import prometheus

    before = prometheus.installed_mode()
    assert before in (None, prometheus.SINGLE_PROCESS)
    prometheus.install(multiprocess=False)
    try:
        with override_settings(RATELIMIT_R4=setting(redis_url, prefix)):
            g, s = get_rate_limiter("g"), get_rate_limiter("s")
            assert [g.acquire_permission() for _ in range(3)] == [True, True, False]
            assert s.acquire_permission()
            gk = registry.get_keyed_rate_limiter("gk")
            assert [gk.acquire_permission("a") for _ in range(5)] == [True] * 4 + [False]

            def value(metric: str, **labels: str) -> float | None:
                return REGISTRY.get_sample_value(metric, labels)

            assert value("resilience4j_ratelimiter_available_permissions", name="g") == 0
            assert value("resilience4j_ratelimiter_available_permissions", name="s") == 2
            assert value("resilience4j_ratelimiter_calls_total", kind="successful", name="g") == 2
            assert value("resilience4j_ratelimiter_calls_total", kind="failed", name="g") == 1
            assert value("resilience4j_ratelimiter_calls_total", kind="successful", name="gk") == 4
            assert value("resilience4j_ratelimiter_calls_total", kind="failed", name="gk") == 1
            assert value("resilience4j_ratelimiter_backend_degraded", name="s", backend="default") == 0
    finally:
        if before is None:
            prometheus.uninstall()
