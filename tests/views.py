"""Views for the HTTP-surface tests (decorators, middleware, DRF)."""

from __future__ import annotations

import asyncio
import copy
import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from django_ratelimit_r4 import get_bulkhead, get_circuit_breaker, get_rate_limiter
from django_ratelimit_r4.core.exceptions import CallNotPermitted
from django_ratelimit_r4.decorators import bulkhead, circuitbreaker, ratelimit, resilient, retry
from django_ratelimit_r4.rest_framework import RateLimiterThrottle, exception_handler


def r4_settings(**top: Any) -> dict[str, Any]:
    """tests.settings.RATELIMIT_R4 plus the instances these tests use (for override_settings)."""
    from django.conf import settings

    value = copy.deepcopy(settings.RATELIMIT_R4)
    value["ratelimiters"]["instances"].update(
        {
            "per_ip": {"limit_for_period": 2, "key": "ip"},
            "burst": {"limit_for_period": 2},
            "burst3": {"limit_for_period": 3},
            "sustained": {"limit_for_period": 3, "limit_refresh_period": "60s"},
            "per_key": {"limit_for_period": 1, "key": "header:X-Api-Key"},
        }
    )
    value.update(top)
    return value


def custom_builder(request: HttpRequest, exc: Exception, *, status: int, retry_after: int) -> HttpResponse:
    """A user response builder (the ``response_builder`` option)."""
    return HttpResponse(f"custom {status} {retry_after}", status=status, content_type="text/plain")


#: Calls that reached a view body, per view name (tests assert nothing ran on rejection).
CALLS: dict[str, int] = {}


def _ran(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


@ratelimit("api")
def api(request: HttpRequest) -> HttpResponse:
    _ran("api")
    return HttpResponse("ok")


@ratelimit("api")
async def api_async(request: HttpRequest) -> HttpResponse:
    _ran("api_async")
    await asyncio.sleep(0)
    return HttpResponse("ok")


@ratelimit("slow")
def slow(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_ip")
def per_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_ip")
async def per_ip_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["burst", "sustained"])
def multi(request: HttpRequest) -> HttpResponse:
    _ran("multi")
    return HttpResponse("ok")


@ratelimit(["burst3", "per_ip"])
def multi_keyed(request: HttpRequest) -> HttpResponse:
    _ran("multi_keyed")
    return HttpResponse("ok")


@ratelimit("api", permits=5)
def heavy(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse(f"heavy {pk}")


# -- a service function below a plain view: the middleware answers for it


@ratelimit("api")
def capture(amount: int) -> str:
    """A service function (no request): rejections raise RequestNotPermitted."""
    return f"captured {amount}"


def deep(request: HttpRequest) -> HttpResponse:
    """Not decorated: the limiter rejects two calls deep, in a service function."""
    return HttpResponse(capture(int(request.GET.get("amount", "1"))))


async def deep_async(request: HttpRequest) -> HttpResponse:
    await get_rate_limiter(request.GET.get("limiter", "api")).aacquire_or_raise()
    return HttpResponse("ok")


def deep_breaker(request: HttpRequest) -> HttpResponse:
    return get_circuit_breaker("acquirer").call(lambda: HttpResponse("ok"))


def deep_bulkhead(request: HttpRequest) -> HttpResponse:
    return get_bulkhead("acquirer").call(lambda: HttpResponse("ok"))


def boom(request: HttpRequest) -> HttpResponse:
    raise ValueError("not ours")


# -- breaker, bulkhead, retry on views


@circuitbreaker("acquirer")
def breaker(request: HttpRequest) -> HttpResponse:
    if request.GET.get("fail"):
        raise ConnectionError("upstream down")
    return HttpResponse("ok")


def breaker_fallback(request: HttpRequest, exc: CallNotPermitted) -> HttpResponse:
    return HttpResponse(f"cached ({exc.name})")


@circuitbreaker("acquirer", fallback=breaker_fallback)
def breaker_with_fallback(request: HttpRequest) -> HttpResponse:
    return HttpResponse("live")


@bulkhead("acquirer")
async def bulkheaded(request: HttpRequest) -> HttpResponse:
    await asyncio.sleep(float(request.GET.get("hold", "0")))
    return HttpResponse("ok")


@retry("acquirer")
def flaky(request: HttpRequest) -> HttpResponse:
    _ran("flaky")
    if CALLS["flaky"] % 3:
        raise ConnectionError("flaky")
    return HttpResponse("third time lucky")


@resilient(retry="acquirer", circuitbreaker="acquirer", ratelimiter="api", bulkhead="acquirer")
def stacked(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


# -- class-based views


@method_decorator(ratelimit("api"), name="dispatch")
class ApiClassView(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("class ok")


class ApiAsyncClassView(View):
    @method_decorator(ratelimit("api"))
    async def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("async class ok")


# -- DRF


class DrfApi(APIView):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "api"

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class DrfScoped(APIView):
    throttle_classes = [RateLimiterThrottle]
    throttle_scope = "slow"

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class DrfKeyed(APIView):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "per_ip"

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class TwoPerMinute(AnonRateThrottle):
    rate = "2/min"


class DrfTwoThrottles(APIView):
    throttle_classes = [TwoPerMinute, RateLimiterThrottle]
    rate_limiter = "slow"

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class DrfUnnamed(APIView):
    throttle_classes = [RateLimiterThrottle]

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class DrfBreaker(APIView):
    def get_exception_handler(self) -> Any:
        return exception_handler

    def get(self, request: Any) -> Response:
        if request.query_params.get("boom"):
            raise KeyError("not ours")
        if request.query_params.get("missing"):
            from rest_framework.exceptions import NotFound

            raise NotFound("nope")
        return get_circuit_breaker("acquirer").call(lambda: Response({"ok": True}))


def json_api(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


# -- predicates and an interval function named by dotted paths in settings (issue 8, item 18)


class UpstreamHTTPError(Exception):
    """An upstream answered with an HTTP error status (like requests' HTTPError with its response)."""

    def __init__(self, status: int, retry_after_s: int | None = None) -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.retry_after_s = retry_after_s


def is_server_error(exc: BaseException) -> bool:
    """Record only 5xx answers as breaker failures: a 404 says nothing about the upstream's health."""
    return isinstance(exc, UpstreamHTTPError) and exc.status >= 500


def is_rate_limited(exc: BaseException) -> bool:
    """Retry an upstream 429 (and nothing else among HTTP errors)."""
    return isinstance(exc, UpstreamHTTPError) and exc.status == 429


def upstream_retry_after(attempt: int, outcome: object) -> datetime.timedelta:
    """Wait what the upstream's Retry-After said, else 100 ms times the attempt."""
    seconds = getattr(outcome, "retry_after_s", None)
    return datetime.timedelta(seconds=seconds) if seconds else datetime.timedelta(milliseconds=100 * attempt)
