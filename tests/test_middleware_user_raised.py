"""Rejections raised by the user's own code (built without a wait) still answer with the real wait.

``if not limiter.acquire_permission(): raise RequestNotPermitted(limiter)`` and
``raise CallNotPermitted(breaker)`` carry no wait: the response reads it from the instance's state when
it is built (``nanos_to_wait`` of the limiter or of the client's key, the breaker's remaining open
time), rounded up, never 0. Through ``ResilienceMiddleware``, a decorator that owns the instance, and
DRF's ``exception_handler``.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from django_ratelimit_r4 import get_circuit_breaker, get_rate_limiter
from django_ratelimit_r4.core.exceptions import CallNotPermitted, RequestNotPermitted
from django_ratelimit_r4.decorators import ratelimit
from django_ratelimit_r4.registry import get_keyed_rate_limiter
from django_ratelimit_r4.responses import response_for_exception
from django_ratelimit_r4.rest_framework import exception_handler

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(databases=[])]

WITH_MIDDLEWARE = [*settings.MIDDLEWARE, "django_ratelimit_r4.middleware.ResilienceMiddleware"]


# ------------------------------------------------------------------------------------------------ views


def own_limiter(request: HttpRequest) -> HttpResponse:
    limiter = get_rate_limiter("slow")  # 10 per 60 s
    if not limiter.acquire_permission():
        raise RequestNotPermitted(limiter)
    return HttpResponse("ok")


async def own_limiter_async(request: HttpRequest) -> HttpResponse:
    limiter = get_rate_limiter("slow")
    if not await limiter.aacquire_permission():
        raise RequestNotPermitted(limiter)
    return HttpResponse("ok")


def own_keyed(request: HttpRequest) -> HttpResponse:
    limiter = get_rate_limiter("slow", key=request.GET["client"])  # that client's own budget
    if not limiter.acquire_permission():
        raise RequestNotPermitted(limiter)
    return HttpResponse("ok")


def own_keyed_store(request: HttpRequest) -> HttpResponse:
    store = get_keyed_rate_limiter("slow")
    if not store.acquire_permission(request.GET["client"]):
        raise RequestNotPermitted(store)  # the store, without the key: its wait is not knowable
    return HttpResponse("ok")


def own_breaker(request: HttpRequest) -> HttpResponse:
    breaker = get_circuit_breaker("acquirer")
    if not breaker.try_acquire_permission():
        raise CallNotPermitted(breaker)
    breaker.release_permission()
    return HttpResponse("ok")


@ratelimit("slow")
def drained(request: HttpRequest) -> HttpResponse:
    """Passes its decorator, then drains the limiter and rejects by hand: the decorator answers."""
    limiter = get_rate_limiter("slow")
    limiter.drain_permissions()
    raise RequestNotPermitted(limiter)


@ratelimit("slow")
async def drained_async(request: HttpRequest) -> HttpResponse:
    limiter = get_rate_limiter("slow")
    limiter.drain_permissions()
    raise RequestNotPermitted(limiter)


class DrfOwnLimiter(APIView):  # type: ignore[misc]
    def get_exception_handler(self) -> Any:
        return exception_handler

    def get(self, request: Any) -> Response:
        limiter = get_rate_limiter("slow")
        if not limiter.acquire_permission():
            raise RequestNotPermitted(limiter)
        return Response({"ok": True})


urlpatterns = [
    path("own-limiter/", own_limiter),
    path("own-limiter-async/", own_limiter_async),
    path("own-keyed/", own_keyed),
    path("own-keyed-store/", own_keyed_store),
    path("own-breaker/", own_breaker),
    path("drained/", drained),
    path("drained-async/", drained_async),
    path("drf-own-limiter/", DrfOwnLimiter.as_view()),
]


@pytest.fixture
def mw(r4_clock: Any) -> Any:
    with override_settings(MIDDLEWARE=WITH_MIDDLEWARE):
        yield r4_clock


def _retry_after(response: Any) -> tuple[int, str, int]:
    return response.status_code, response["Retry-After"], response.json()["retry_after"]


# ------------------------------------------------------------------------------------------------ tests


def test_a_limiter_rejection_raised_by_hand_gets_the_limiters_wait(mw: Any) -> None:
    client = Client()
    assert [client.get("/own-limiter/").status_code for _ in range(10)] == [200] * 10
    mw.advance(10)
    assert _retry_after(client.get("/own-limiter/")) == (429, "50", 50)
    mw.advance(20.5)
    rejected = client.get("/own-limiter/")
    assert _retry_after(rejected) == (429, "30", 30)  # 29.5 s rounded up, read when answered
    assert "retry after 30 seconds" in rejected.json()["detail"]
    mw.advance(29.5)
    assert client.get("/own-limiter/").status_code == 200


async def test_async_view_gets_the_limiters_wait(mw: Any) -> None:
    client = AsyncClient()
    for _ in range(10):
        assert (await client.get("/own-limiter-async/")).status_code == 200
    mw.advance(15)
    assert _retry_after(await client.get("/own-limiter-async/")) == (429, "45", 45)


def test_a_client_view_gives_that_clients_wait(mw: Any) -> None:
    client = Client()
    assert [client.get("/own-keyed/?client=a").status_code for _ in range(10)] == [200] * 10
    mw.advance(12)
    assert _retry_after(client.get("/own-keyed/?client=a")) == (429, "48", 48)
    assert client.get("/own-keyed/?client=b").status_code == 200


def test_a_keyed_store_without_the_key_answers_one_period_not_one_second(mw: Any) -> None:
    client = Client()
    assert [client.get("/own-keyed-store/?client=a").status_code for _ in range(10)] == [200] * 10
    assert _retry_after(client.get("/own-keyed-store/?client=a")) == (429, "60", 60)


def test_a_breaker_rejection_raised_by_hand_gets_the_remaining_open_time(mw: Any) -> None:
    client = Client()
    assert client.get("/own-breaker/").status_code == 200
    get_circuit_breaker("acquirer").transition_to_open_state()  # 3 s open
    mw.advance(0.5)
    rejected = client.get("/own-breaker/")
    assert _retry_after(rejected) == (503, "3", 3)
    assert "is OPEN" in rejected.json()["detail"]  # the breaker's state, not "None"
    mw.advance(1.25)
    assert _retry_after(client.get("/own-breaker/")) == (503, "2", 2)  # 1.25 s left
    get_circuit_breaker("acquirer").transition_to_forced_open_state()
    forced = client.get("/own-breaker/")
    assert _retry_after(forced) == (503, "3", 3)
    assert "is FORCED_OPEN" in forced.json()["detail"]


def test_a_decorated_view_raising_its_own_limiters_rejection(r4_clock: Any) -> None:
    # No middleware: @ratelimit("slow") owns the rejection and answers it with the limiter's wait.
    r4_clock.advance(5)
    rejected = Client().get("/drained/")
    assert _retry_after(rejected) == (429, "55", 55)
    assert rejected["RateLimit"] == '"slow";r=0;t=55'


async def test_an_async_decorated_view_raising_its_own_limiters_rejection(r4_clock: Any) -> None:
    r4_clock.advance(5)
    assert _retry_after(await AsyncClient().get("/drained-async/")) == (429, "55", 55)


def test_drf_exception_handler_gets_the_limiters_wait(r4_clock: Any) -> None:
    client = Client()
    assert [client.get("/drf-own-limiter/").status_code for _ in range(10)] == [200] * 10
    r4_clock.advance(1.5)
    assert _retry_after(client.get("/drf-own-limiter/")) == (429, "59", 59)


def test_the_wait_is_read_when_the_response_is_built(r4_clock: Any) -> None:
    limiter = get_rate_limiter("slow")
    limiter.drain_permissions()
    exc = RequestNotPermitted(limiter)
    request = RequestFactory().get("/")
    assert response_for_exception(request, exc)["Retry-After"] == "60"
    r4_clock.advance(25)
    assert exc.wait_ns == 35_000_000_000
    assert response_for_exception(request, exc)["Retry-After"] == "35"
    assert exception_handler(exc, {"request": request})["Retry-After"] == "35"


def test_a_given_wait_is_kept_and_a_pickled_rejection_keeps_the_wait_of_its_pickling(r4_clock: Any) -> None:
    limiter = get_rate_limiter("slow")
    assert RequestNotPermitted(limiter, 7_000_000_000).retry_after == 7
    limiter.drain_permissions()
    r4_clock.advance(20)
    copy = pickle.loads(pickle.dumps(RequestNotPermitted(limiter)))
    assert (copy.rate_limiter, copy.name, copy.wait_ns, copy.retry_after) == (None, "slow", 40_000_000_000, 40)
    breaker = get_circuit_breaker("acquirer")
    breaker.transition_to_open_state()
    r4_clock.advance(1)
    opened = pickle.loads(pickle.dumps(CallNotPermitted(breaker)))
    assert (opened.circuit_breaker, opened.state.name, opened.wait_ns) == (None, "OPEN", 2_000_000_000)
