"""ResilienceMiddleware: rejections raised below a view become 429/503; it limits nothing itself."""

from __future__ import annotations

import pytest
from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings

from django_ratelimit_r4 import get_bulkhead, get_circuit_breaker
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.middleware import ResilienceMiddleware
from tests import views

pytestmark = pytest.mark.django_db(databases=[])

WITH_MIDDLEWARE = [*settings.MIDDLEWARE, "django_ratelimit_r4.middleware.ResilienceMiddleware"]


@pytest.fixture
def mw(r4_clock):
    with override_settings(MIDDLEWARE=WITH_MIDDLEWARE):
        yield r4_clock


def test_exception_deep_inside_a_view_becomes_429(mw) -> None:
    client = Client()
    assert [client.get("/deep/").status_code for _ in range(10)] == [200] * 10
    rejected = client.get("/deep/")
    assert rejected.status_code == 429
    assert rejected["Retry-After"] == "1"
    assert rejected["Cache-Control"] == "no-store"
    assert rejected.json()["name"] == "api"
    mw.advance(1)
    assert client.get("/deep/").content == b"captured 1"


def test_without_the_middleware_the_exception_escapes(r4_clock) -> None:
    client = Client()
    for _ in range(10):
        client.get("/deep/")
    with pytest.raises(RequestNotPermitted):
        client.get("/deep/")


async def test_async_stack_retry_after_follows_the_cycle(mw) -> None:
    client = AsyncClient()
    for _ in range(10):
        assert (await client.get("/deep-async/?limiter=slow")).status_code == 200
    mw.advance(10)
    rejected = await client.get("/deep-async/?limiter=slow")
    assert rejected.status_code == 429
    assert rejected["Retry-After"] == "50"


def test_breaker_below_a_view_is_503_with_remaining_open_time(mw) -> None:
    get_circuit_breaker("acquirer").transition_to_open_state()
    mw.advance(0.5)
    rejected = Client().get("/deep-breaker/", HTTP_ACCEPT="text/plain")
    assert rejected.status_code == 503
    assert rejected["Retry-After"] == "3"  # 2.5 s rounded up
    assert rejected["Content-Type"].startswith("text/plain")


def test_bulkhead_below_a_view_uses_the_instance_retry_after(r4_clock) -> None:
    value = views.r4_settings()
    value["bulkheads"]["instances"]["acquirer"]["retry_after"] = "4s"
    with override_settings(MIDDLEWARE=WITH_MIDDLEWARE, RATELIMIT_R4=value):
        held = get_bulkhead("acquirer")
        assert held.try_acquire_permission() and held.try_acquire_permission()
        try:
            rejected = Client().get("/deep-bulkhead/")
        finally:
            held.on_complete()
            held.on_complete()
        assert (rejected.status_code, rejected["Retry-After"]) == (503, "4")


def test_other_exceptions_pass_through(mw) -> None:
    with pytest.raises(ValueError):
        Client().get("/boom/")
    assert Client(raise_request_exception=False).get("/boom/").status_code == 500


def test_it_limits_nothing_itself(mw) -> None:
    client = Client()
    assert all(client.get("/deep-breaker/").status_code == 200 for _ in range(50))


def test_mode_is_decided_once() -> None:
    def sync_get_response(request):
        return HttpResponse("ok")

    async def async_get_response(request):
        return HttpResponse("ok")

    sync_mw = ResilienceMiddleware(sync_get_response)
    async_mw = ResilienceMiddleware(async_get_response)
    assert not sync_mw.async_mode and not iscoroutinefunction(sync_mw)
    assert async_mw.async_mode and iscoroutinefunction(async_mw)
    assert ResilienceMiddleware.sync_capable and ResilienceMiddleware.async_capable
    request = RequestFactory().get("/")
    assert sync_mw(request).content == b"ok"
    assert sync_mw.process_exception(request, KeyError("x")) is None


async def test_async_mode_returns_a_coroutine() -> None:
    async def get_response(request):
        return HttpResponse("async ok")

    middleware = ResilienceMiddleware(get_response)
    assert (await middleware(RequestFactory().get("/"))).content == b"async ok"
