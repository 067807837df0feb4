"""A bulkhead instance naming a redis backend is cluster-wide (issue 11): ``"backend"``, ``lease_ttl`` and
``on_backend_error`` on a bulkhead, checked by ``manage.py check``, and the HTTP behaviour unchanged (503
with the instance's Retry-After when every slot of the cluster is taken by another worker)."""

from __future__ import annotations

from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from django_ratelimit_r4 import registry
from django_ratelimit_r4.core.bulkhead import Bulkhead, BulkheadConfig
from django_ratelimit_r4.decorators import bulkhead
from tests.test_docs_examples import r4_problems

pytest.importorskip("redis")
from django_ratelimit_r4.backends.redis_bulkhead import RedisBulkhead
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(databases=[])]


@bulkhead("partner")
def partner_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@bulkhead("partner")
async def async_partner_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("partner/", partner_view), path("async-partner/", async_partner_view)]


def setting(url: str, prefix: str, **partner: Any) -> dict[str, Any]:
    return {
        "backends": {
            "default": {"BACKEND": "redis", "LOCATION": url, "OPTIONS": {"key_prefix": prefix}},
            "shared": {"BACKEND": "redis", "LOCATION": url, "OPTIONS": {"key_prefix": prefix}},
            "mem": {"BACKEND": "memory"},
        },
        "bulkheads": {
            "instances": {
                "partner": {"max_concurrent_calls": 1, "backend": "shared", "retry_after": "3s", **partner},
                "local": {"max_concurrent_calls": 1},  # no backend: in-process, even with a redis default
                "on_memory": {"max_concurrent_calls": 1, "backend": "mem"},
            }
        },
    }


def test_a_bulkhead_naming_a_redis_backend_is_shared_by_every_worker(redis_url: str, prefix: str) -> None:
    with override_settings(RATELIMIT_R4=setting(redis_url, prefix, lease_ttl="2s", on_backend_error="deny")):
        shared = registry.get_bulkhead("partner")
        assert isinstance(shared, RedisBulkhead)
        assert (shared.prefix, shared.lease_ttl_ns, shared.fault_policy) == (prefix, 2_000_000_000, "closed")
        assert type(registry.get_bulkhead("local")) is Bulkhead
        assert type(registry.get_bulkhead("on_memory")) is Bulkhead
        # Another worker (same name, same backend) takes the cluster's only slot.
        worker = RedisBulkhead(
            "partner", BulkheadConfig(max_concurrent_calls=1), url=redis_url, prefix=prefix
        )
        try:
            assert worker.try_acquire_permission()
            response = Client().get("/partner/")
            assert response.status_code == 503 and response["Retry-After"] == "3"
            worker.on_complete()
            assert Client().get("/partner/").status_code == 200
            assert shared.cluster_concurrent_calls() == 0
        finally:
            worker.close()
            shared.close()


def test_the_defaults_lease_ttl_10s_and_on_backend_error_local(redis_url: str, prefix: str) -> None:
    with override_settings(RATELIMIT_R4=setting(redis_url, prefix)):
        shared = registry.get_bulkhead("partner")
        assert (shared.lease_ttl_ns, shared.fault_policy) == (10_000_000_000, "local")
        assert registry.instance_options("bulkheads", "local")["backend"] is None
        shared.close()
    assert r4_problems(setting(redis_url, prefix)) == []


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (
            {"lease_ttl": "100ms"},
            '(ratelimit_r4.E008) RATELIMIT_R4["bulkheads"]["instances"]["partner"]["lease_ttl"]: must be between 300ms',
        ),
        ({"lease_ttl": "0s"}, '["partner"]["lease_ttl"]'),
        ({"backend": "sharde"}, "ratelimit_r4.E028"),
        ({"on_backend_error": "open"}, "ratelimit_r4.E029"),
    ],
)
def test_checks_name_the_bulkhead_option(redis_url: str, prefix: str, option: dict, expected: str) -> None:
    problems = r4_problems(setting(redis_url, prefix, **option))
    assert len(problems) == 1 and expected in problems[0], problems


def test_r4_reset_frees_the_shared_slots_and_never_raises(redis_url: str, prefix: str) -> None:
    with override_settings(RATELIMIT_R4=setting(redis_url, prefix)):
        shared = registry.get_bulkhead("partner")
        assert shared.try_acquire_permission() and not shared.try_acquire_permission()
        registry.reset_all()
        assert shared.try_acquire_permission()
        shared.close()
    with override_settings(RATELIMIT_R4=setting("redis://127.0.0.1:1/15", prefix)):
        registry.get_bulkhead("partner")
        registry.reset_all()  # Redis unreachable: only this process resets


def test_the_state_endpoint_shows_the_cluster_count(redis_url: str, prefix: str) -> None:
    from django_ratelimit_r4 import state

    with override_settings(RATELIMIT_R4=setting(redis_url, prefix, max_concurrent_calls=3)):
        shared = registry.get_bulkhead("partner")
        worker = RedisBulkhead(
            "partner", BulkheadConfig(max_concurrent_calls=3), url=redis_url, prefix=prefix
        )
        try:
            assert worker.try_acquire_permission() and shared.try_acquire_permission()
            [item] = state.snapshot(["bulkhead:partner"])
            assert item["config"]["max_concurrent_calls"] == 3
            s = item["state"]
            assert (
                s["concurrent_calls"],
                s["cluster_concurrent_calls"],
                s["available_concurrent_calls"],
            ) == (1, 2, 1)
            [local] = state.snapshot(["bulkhead:local"])
            assert "cluster_concurrent_calls" not in local["state"]
        finally:
            worker.close()
            shared.close()


async def test_an_async_view_uses_the_shared_slots_without_blocking_the_loop(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.test import AsyncClient

    from tests.noblock import forbid_blocking

    with override_settings(RATELIMIT_R4=setting(redis_url, prefix)):
        shared = registry.get_bulkhead("partner")
        worker = RedisBulkhead("partner", BulkheadConfig(max_concurrent_calls=1), url=redis_url, prefix=prefix)
        try:
            client = AsyncClient()
            with forbid_blocking(monkeypatch) as blocking:
                assert (await client.get("/async-partner/")).status_code == 200
                assert await worker.atry_acquire_permission()
                response = await client.get("/async-partner/")
                await worker.aon_complete()
            assert blocking == [], blocking
            assert response.status_code == 503 and response["Retry-After"] == "3"
        finally:
            worker.close()
            shared.close()


def test_a_settings_change_gives_back_the_leases_and_stops_the_thread_of_a_bulkhead_it_drops(
    redis_url: str, prefix: str
) -> None:
    """The registry dropped a cluster-wide bulkhead on ``setting_changed`` without closing it: its renewal
    thread and connection lived on (one per changed setting in a user's test suite) and kept renewing the leases
    this process still held. Now the registry closes what it drops: the leases go back, the thread ends."""
    import threading
    import time

    with override_settings(RATELIMIT_R4=setting(redis_url, prefix, max_concurrent_calls=2)):
        shared = registry.get_bulkhead("partner")
        assert isinstance(shared, RedisBulkhead)
        assert shared.try_acquire_permission()  # a lease held, renewed by the thread
        assert shared.cluster_concurrent_calls() == 1
    other = RedisBulkhead("partner", BulkheadConfig(max_concurrent_calls=2), url=redis_url, prefix=prefix)
    try:
        assert other.cluster_concurrent_calls() == 0  # given back when the setting changed
    finally:
        other.close()
    deadline = time.monotonic() + 30  # a hang guard, not a timing assertion
    while any(t.name == "r4-bulkhead-partner" and t.is_alive() for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the dropped bulkhead's renewal thread did not end"
        time.sleep(0.01)
