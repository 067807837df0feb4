"""Decorators on the ``dispatch`` of a class-based view whose handlers are ``async def``.

``@method_decorator(ratelimit(...), name="dispatch")`` is the usual way to cover every method of a class-based
view. Django's ``View.dispatch`` is a plain ``def``; on a view whose handlers are async (``View.view_is_async``)
it returns the handler's coroutine, which Django awaits. The decorators took it for a sync function: the
"response" they saw was that coroutine (no RateLimit fields), a rejection was a sync 429 where Django awaits a
coroutine (a 500), and a circuit breaker or a bulkhead measured the return of the coroutine, not the handler.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from django_ratelimit_r4 import get_bulkhead, get_circuit_breaker
from django_ratelimit_r4.decorators import bulkhead, circuitbreaker, ratelimit
from tests import views

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(databases=[])]


def _settings() -> dict[str, Any]:
    value = views.r4_settings()
    value["ratelimiters"]["instances"]["burst_dispatch"] = {"limit_for_period": 2}
    value["circuitbreakers"]["instances"]["tiny"] = {
        "sliding_window_size": 2,
        "minimum_number_of_calls": 2,
        "failure_rate_threshold": 50,
        "wait_duration_in_open_state": "60s",
    }
    value["bulkheads"]["instances"]["one"] = {"max_concurrent_calls": 1}
    return value


@method_decorator(ratelimit("burst_dispatch"), name="dispatch")
class AsyncDispatchView(View):
    async def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    async def post(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("posted")


@method_decorator(ratelimit("burst"), name="get")
class AsyncGetView(View):
    async def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


@method_decorator(ratelimit("burst3"), name="dispatch")
class SyncDispatchView(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


@method_decorator(circuitbreaker("tiny"), name="dispatch")
class AsyncFailingView(View):
    async def get(self, request: HttpRequest) -> HttpResponse:
        raise RuntimeError("upstream down")


SEEN_HELD: list[int] = []


@method_decorator(bulkhead("one"), name="dispatch")
class AsyncBulkheadView(View):
    async def get(self, request: HttpRequest) -> HttpResponse:
        SEEN_HELD.append(get_bulkhead("one").metrics.concurrent_calls)
        await asyncio.sleep(0)
        return HttpResponse("ok")


urlpatterns = [
    path("dispatch/", AsyncDispatchView.as_view()),
    path("get/", AsyncGetView.as_view()),
    path("sync-dispatch/", SyncDispatchView.as_view()),
    path("failing/", AsyncFailingView.as_view()),
    path("bulkhead/", AsyncBulkheadView.as_view()),
]


async def _awaited(response: Any) -> Any:
    return await response


def _codes(client: Any, url: str, n: int, method: str = "get") -> list[tuple[int, bool]]:
    out = []
    for _ in range(n):
        response = getattr(client, method)(url)
        if asyncio.iscoroutine(response):
            response = async_to_sync(_awaited)(response)
        out.append((response.status_code, "RateLimit" in response))
    return out


@pytest.mark.parametrize("client_class", [AsyncClient, Client], ids=["asgi", "wsgi"])
def test_ratelimit_on_the_dispatch_of_an_async_view_is_the_same_as_on_its_handler(
    r4_clock: Any, client_class: type
) -> None:
    with override_settings(RATELIMIT_R4=_settings()):
        on_get = _codes(client_class(raise_request_exception=False), "/get/", 3)
        on_dispatch = _codes(client_class(raise_request_exception=False), "/dispatch/", 3)
    assert on_get == [(200, True), (200, True), (429, True)]
    assert on_dispatch == on_get  # was [(200, False), (200, False), (500, False)]


def test_every_method_of_the_async_view_shares_the_dispatch_limit(r4_clock: Any) -> None:
    with override_settings(RATELIMIT_R4=_settings()):
        client = Client(raise_request_exception=False)
        assert _codes(client, "/dispatch/", 1) + _codes(client, "/dispatch/", 2, "post") == [
            (200, True), (200, True), (429, True)
        ]
        # A method the view does not have: Django's async 405, counted as any other request.
        assert _codes(client, "/dispatch/", 1, "delete") == [(429, True)]


def test_a_sync_views_dispatch_is_unchanged(r4_clock: Any) -> None:
    with override_settings(RATELIMIT_R4=_settings()):
        codes = _codes(Client(raise_request_exception=False), "/sync-dispatch/", 4)
    assert codes == [(200, True), (200, True), (200, True), (429, True)]


async def test_a_breaker_on_the_dispatch_of_an_async_view_records_the_handlers_failures(r4_clock: Any) -> None:
    with override_settings(RATELIMIT_R4=_settings()):
        client = AsyncClient(raise_request_exception=False)
        codes = [(await client.get("/failing/")).status_code for _ in range(4)]
        assert get_circuit_breaker("tiny").state.name == "OPEN"
    assert codes == [500, 500, 503, 503]  # was 500 for ever: every call counted as a success


async def test_a_bulkhead_on_the_dispatch_of_an_async_view_is_held_while_the_handler_runs(r4_clock: Any) -> None:
    SEEN_HELD.clear()
    with override_settings(RATELIMIT_R4=_settings()):
        client = AsyncClient()
        assert (await client.get("/bulkhead/")).status_code == 200
        assert get_bulkhead("one").metrics.concurrent_calls == 0
    assert SEEN_HELD == [1]  # was [0]: released when dispatch returned the coroutine, before the handler ran
