"""``methods=``: every method counts by default, ``OPTIONS`` included; a collection limits only those methods.

Through Django's test client on function views (sync and async, unkeyed, keyed, several limits), a
``@resilient`` stack, and the DRF throttles (``rate_limiter_methods``, a drop-in's ``methods``), next to
DRF's own throttle, which counts ``OPTIONS`` too.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path
from rest_framework import throttling as drf_throttling
from rest_framework.response import Response
from rest_framework.views import APIView

from django_ratelimit_r4 import get_rate_limiter
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.decorators import UNSAFE_METHODS, RateLimitGate, method_filter, ratelimit, resilient
from django_ratelimit_r4.rest_framework import AnonRateThrottle, RateLimiterThrottle
from tests import views

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(databases=[])]

PREFLIGHT = {"HTTP_ORIGIN": "https://app.example", "HTTP_ACCESS_CONTROL_REQUEST_METHOD": "POST"}


def _ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


async def _aok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class DrfDefault(APIView):  # type: ignore[misc]
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "burst"

    def get(self, request: Any) -> Response:
        return Response({"ok": True})

    def post(self, request: Any) -> Response:
        return Response({"ok": True})


class DrfPostOnly(DrfDefault):
    rate_limiter_methods = ["POST"]


class DrfGetOnly(DrfDefault):
    rate_limiter_methods = ["GET"]


class DrfWithoutPreflights(DrfDefault):
    rate_limiter_methods = ["GET", "POST"]


class AnonWithoutPreflights(AnonRateThrottle):
    methods = ("GET", "POST")


class DrfAnon(APIView):  # type: ignore[misc]
    throttle_classes = [AnonRateThrottle]

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class DrfAnonWithoutPreflights(DrfAnon):
    throttle_classes = [AnonWithoutPreflights]


class DrfOwnAnon(DrfAnon):
    throttle_classes = [drf_throttling.AnonRateThrottle]


_BODY_RUNS: list[str] = []


def _expensive(request: HttpRequest) -> HttpResponse:
    _BODY_RUNS.append(request.method or "")  # Django runs a function view's body for any method, OPTIONS too
    return HttpResponse("ok")


urlpatterns = [
    path("default/", ratelimit("burst")(_ok)),
    path("default-async/", ratelimit("burst")(_aok)),
    path("keyed/", ratelimit("per_ip")(_ok)),
    path("keyed-async/", ratelimit("per_ip")(_aok)),
    path("multi/", ratelimit(["burst", "per_ip"])(_ok)),
    path("header/", ratelimit("burst", key="header:X-Api-Key")(_ok)),
    path("post-only/", ratelimit("burst", methods=["POST"])(_ok)),
    path("post-only-async/", ratelimit("burst", methods="post")(_aok)),
    path("unsafe/", ratelimit("burst", methods=UNSAFE_METHODS)(_ok)),
    path("with-options/", ratelimit("burst", methods=("GET", "OPTIONS"))(_ok)),
    path("without-options/", ratelimit("burst", methods=("GET", "POST"))(_ok)),
    path("without-options-async/", ratelimit("burst", methods=("GET", "POST"))(_aok)),
    path("expensive/", ratelimit("burst")(_expensive)),
    path("stacked/", resilient(ratelimiter="burst", circuitbreaker="acquirer")(_ok)),
    path("drf/", DrfDefault.as_view()),
    path("drf-post-only/", DrfPostOnly.as_view()),
    path("get-only/", ratelimit("burst", methods=["GET"])(_ok)),
    path("get-only-async/", ratelimit("burst", methods="get")(_aok)),
    path("drf-get-only/", DrfGetOnly.as_view()),
    path("drf-anon/", DrfAnon.as_view()),
    path("drf-without-preflights/", DrfWithoutPreflights.as_view()),
    path("drf-anon-without-preflights/", DrfAnonWithoutPreflights.as_view()),
    path("drf-own-anon/", DrfOwnAnon.as_view()),
]


@pytest.fixture
def extra(r4_clock: Any) -> Any:
    with override_settings(RATELIMIT_R4=views.r4_settings()):  # burst: 2 per second; per_ip: 2 per second per IP
        yield r4_clock


def codes(client: Client, method: str, url: str, n: int, **extra: str) -> list[int]:
    return [getattr(client, method)(url, **extra).status_code for _ in range(n)]


@pytest.mark.parametrize("url", ["/default/", "/keyed/", "/multi/", "/header/", "/stacked/", "/drf/"])
def test_options_counts_by_default(extra: Any, url: str) -> None:
    # An uncounted OPTIONS was an unlimited way into the view: count it as django-ratelimit (method=ALL) and
    # DRF's throttles do. CORS preflights are answered by django-cors-headers' middleware before any view.
    client = Client()
    assert codes(client, "options", url, 3, HTTP_X_API_KEY="k", **PREFLIGHT) == [200, 200, 429]
    assert client.get(url, HTTP_X_API_KEY="k").status_code == 429  # one budget for every method


def test_a_limited_options_does_not_run_a_function_views_body(extra: Any) -> None:
    _BODY_RUNS.clear()
    assert codes(Client(), "options", "/expensive/", 5) == [200, 200, 429, 429, 429]
    assert _BODY_RUNS == ["OPTIONS", "OPTIONS"]


@pytest.mark.parametrize("url", ["/default-async/", "/keyed-async/"])
async def test_async_views_count_options_too(extra: Any, url: str) -> None:
    client = AsyncClient()
    assert [(await client.options(url, **PREFLIGHT)).status_code for _ in range(3)] == [200, 200, 429]
    assert (await client.get(url)).status_code == 429


@pytest.mark.parametrize(
    "url", ["/post-only/", "/without-options/", "/unsafe/", "/drf-post-only/", "/drf-without-preflights/"]
)
def test_a_method_list_without_options_leaves_preflights_uncounted(extra: Any, url: str) -> None:
    client = Client()
    preflights = [client.options(url, **PREFLIGHT) for _ in range(5)]
    assert [r.status_code for r in preflights] == [200] * 5
    assert all("RateLimit" not in r and "Retry-After" not in r for r in preflights)
    assert codes(client, "post", url, 3) == [200, 200, 429]
    assert client.options(url, **PREFLIGHT).status_code == 200  # not limited either


async def test_a_method_list_without_options_in_async_views(extra: Any) -> None:
    client = AsyncClient()
    for url in ("/post-only-async/", "/without-options-async/"):
        assert [(await client.options(url, **PREFLIGHT)).status_code for _ in range(5)] == [200] * 5
    assert [(await client.post("/post-only-async/")).status_code for _ in range(3)] == [200, 200, 429]


def test_a_collection_limits_only_those_methods(extra: Any) -> None:
    client = Client()
    assert codes(client, "get", "/post-only/", 5) == [200] * 5
    assert codes(client, "post", "/post-only/", 3) == [200, 200, 429]
    assert client.get("/post-only/").status_code == 200
    assert codes(client, "get", "/unsafe/", 3) == [200] * 3
    assert codes(client, "delete", "/unsafe/", 1) + codes(client, "patch", "/unsafe/", 1) == [429, 429]


def test_options_counts_when_listed(extra: Any) -> None:
    client = Client()
    assert codes(client, "options", "/with-options/", 3, **PREFLIGHT) == [200, 200, 429]
    assert client.post("/with-options/").status_code == 200


@pytest.mark.parametrize("url", ["/get-only/", "/drf-get-only/"])
def test_get_counts_head_too_since_django_answers_head_with_the_get_view(extra: Any, url: str) -> None:
    # Django runs the GET code for a HEAD (a function view, View.head = View.get, DRF alike) and drops the
    # body: with methods=["GET"] a HEAD did all of the view's work and was never limited.
    client = Client()
    assert codes(client, "head", url, 3) == [200, 200, 429]
    assert client.get(url).status_code == 429
    assert client.post(url).status_code in (200, 405)  # not counted: POST is not listed


async def test_get_counts_head_too_in_async_views(extra: Any) -> None:
    client = AsyncClient()
    assert [(await client.head("/get-only-async/")).status_code for _ in range(3)] == [200, 200, 429]


def test_drf_throttle_reads_rate_limiter_methods(extra: Any) -> None:
    client = Client()
    assert codes(client, "options", "/drf-post-only/", 3) == [200] * 3
    assert codes(client, "get", "/drf-post-only/", 3) == [200] * 3
    assert codes(client, "post", "/drf-post-only/", 3) == [200, 200, 429]


@pytest.mark.parametrize("url", ["/drf-anon/", "/drf-own-anon/"])
def test_drf_drop_in_counts_options_like_drfs_own_throttle(
    settings: Any, r4_clock: Any, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    settings.REST_FRAMEWORK = {"DEFAULT_THROTTLE_RATES": {"anon": "2/min"}}
    # DRF binds its throttle rates when rest_framework is imported: give its class what a settings file would.
    monkeypatch.setattr(drf_throttling.SimpleRateThrottle, "THROTTLE_RATES", {"anon": "2/min"})
    cache.clear()
    client = Client()
    assert codes(client, "options", url, 3) == [200, 200, 429]
    assert client.get(url).status_code == 429


def test_drf_drop_in_methods_without_options_leave_preflights_uncounted(settings: Any, r4_clock: Any) -> None:
    settings.REST_FRAMEWORK = {"DEFAULT_THROTTLE_RATES": {"anon": "2/min"}}
    client = Client()
    assert codes(client, "options", "/drf-anon-without-preflights/", 5) == [200] * 5
    assert codes(client, "get", "/drf-anon-without-preflights/", 3) == [200, 200, 429]


def test_plain_functions_are_always_counted(extra: Any) -> None:
    @ratelimit("burst", methods=["POST"])
    def service(amount: int) -> int:
        return amount

    assert [service(1), service(2)] == [1, 2]
    with pytest.raises(RequestNotPermitted):
        service(3)
    assert get_rate_limiter("burst").metrics.available_permissions == 0


@pytest.mark.parametrize(
    ("methods", "error", "message"),
    [
        ([], ValueError, "methods=[] would limit no request"),
        ("", ValueError, "not an HTTP method"),
        (["GET", 1], TypeError, "HTTP method names (strings), got 1"),
        (["GET POST"], ValueError, "'GET POST' is not an HTTP method"),
        (42, TypeError, "methods must be None"),
        (b"GET", TypeError, "methods must be None"),
    ],
)
def test_methods_is_validated_at_decoration(methods: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        ratelimit("burst", methods=methods)


def test_methods_needs_a_rate_limiter_in_resilient() -> None:
    with pytest.raises(TypeError, match="methods= applies to the rate limiter"):
        resilient(circuitbreaker="acquirer", methods=["POST"])


def test_the_default_skips_the_method_test() -> None:
    # methods=None is the common case: the hot path tests `gate.methods is None` and nothing else.
    assert RateLimitGate("burst").methods is None
    assert method_filter(None) == (frozenset(), True)  # nothing listed to skip
    assert RateLimitGate("burst", methods=["get"]).methods == frozenset({"GET", "HEAD"})
