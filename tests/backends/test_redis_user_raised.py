"""Rejections raised by the user's own code on Redis-backed limiters answer with the real wait.

``raise RequestNotPermitted(limiter)`` (no wait given) reads the wait from Redis when the response is
built; on an async path it is read with redis.asyncio, never with the sync client on the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path

from django_ratelimit_r4 import get_rate_limiter, registry
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.decorators import ratelimit
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)
from tests.backends.test_redis_http import no_sync_redis_on_loop, r4_settings

rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(databases=[])]

WITH_MIDDLEWARE = [*settings.MIDDLEWARE, "django_ratelimit_r4.middleware.ResilienceMiddleware"]


def own_limiter(request: HttpRequest) -> HttpResponse:
    limiter = get_rate_limiter("sustained")  # 3 per 60 s
    if not limiter.acquire_permission():
        raise RequestNotPermitted(limiter)
    return HttpResponse("ok")


def own_keyed(request: HttpRequest) -> HttpResponse:
    limiter = get_rate_limiter("sustained", key=request.GET["client"])
    if not limiter.acquire_permission():
        raise RequestNotPermitted(limiter)
    return HttpResponse("ok")


async def own_limiter_async(request: HttpRequest) -> HttpResponse:
    limiter = get_rate_limiter("sustained")
    if not await limiter.aacquire_permission():
        raise RequestNotPermitted(limiter)
    return HttpResponse("ok")


@ratelimit("shared")
async def drained_async(request: HttpRequest) -> HttpResponse:
    """Passes its decorator, then rejects by hand: the decorator answers without blocking the loop."""
    limiter = get_rate_limiter("shared")
    await asyncio.to_thread(limiter.drain_permissions)
    raise RequestNotPermitted(limiter)


urlpatterns = [
    path("own-limiter/", own_limiter),
    path("own-keyed/", own_keyed),
    path("own-limiter-async/", own_limiter_async),
    path("drained-async/", drained_async),
]


@pytest.fixture
def on_redis(redis_url: str, prefix: str, r4_clock: Any) -> Iterator[Any]:
    with override_settings(RATELIMIT_R4=r4_settings(redis_url, prefix), MIDDLEWARE=WITH_MIDDLEWARE):
        for name in ("sustained", "shared"):  # built (and reset in Redis) off any event loop
            assert isinstance(get_rate_limiter(name).backend, rb.RedisBackend)
        assert isinstance(registry.get_keyed_rate_limiter("sustained").store, rb.RedisKeyedStore)
        yield r4_clock


def _retry_after(response: Any) -> tuple[int, str]:
    return response.status_code, response["Retry-After"]


def test_sync_views_read_the_wait_from_redis(on_redis: Any) -> None:
    client = Client()
    assert [client.get("/own-limiter/").status_code for _ in range(3)] == [200] * 3
    assert [client.get("/own-keyed/?client=a").status_code for _ in range(3)] == [200] * 3
    on_redis.advance(20)
    assert _retry_after(client.get("/own-limiter/")) == (429, "40")
    assert _retry_after(client.get("/own-keyed/?client=a")) == (429, "40")
    assert client.get("/own-keyed/?client=b").status_code == 200


async def test_async_paths_read_the_wait_with_redis_asyncio(on_redis: Any, monkeypatch: Any) -> None:
    client = AsyncClient()
    with no_sync_redis_on_loop(monkeypatch) as violations:
        codes = [(await client.get("/own-limiter-async/")).status_code for _ in range(3)]
        on_redis.advance(15)
        rejected = await client.get("/own-limiter-async/")  # answered by the middleware, on a thread
        drained = await client.get("/drained-async/")  # answered by @ratelimit, on the loop
        view = get_rate_limiter("sustained", key="c")
        for _ in range(3):
            assert await view.aacquire_permission()
        wait = await RequestNotPermitted(view).await_wait_ns()
    assert codes == [200] * 3
    assert _retry_after(rejected) == (429, "45")
    assert _retry_after(drained) == (429, "3585")  # "shared": 10 per hour, 15 s into the hour
    assert wait == 60_000_000_000 - 15_000_000_000
    assert violations == []
