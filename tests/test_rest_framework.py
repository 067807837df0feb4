"""DRF: RateLimiterThrottle on APIViews and the exception handler."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client, RequestFactory, override_settings
from rest_framework.request import Request

from django_ratelimit_r4 import get_circuit_breaker, get_rate_limiter
from django_ratelimit_r4.core.exceptions import BulkheadFull
from django_ratelimit_r4.decorators import _secret_salt
from django_ratelimit_r4.headers import partition_key
from django_ratelimit_r4.rest_framework import RateLimiterThrottle, exception_handler
from tests import views

pytestmark = pytest.mark.django_db(databases=[])


@pytest.fixture(autouse=True)
def _clear_drf_cache() -> None:
    cache.clear()  # DRF's own throttles keep history in the default cache


def codes(client: Client, path: str, n: int, **extra: str) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(n)]


def test_apiview_seed(r4_clock) -> None:
    client = Client()
    first = client.get("/drf/")
    assert first["RateLimit-Policy"] == '"api";q=10;w=1'
    assert first["RateLimit"] == '"api";r=9;t=1'
    assert codes(client, "/drf/", 9) == [200] * 9
    rejected = client.get("/drf/")
    assert rejected.status_code == 429
    assert rejected["Retry-After"] == "1"
    assert rejected["Cache-Control"] == "no-store"
    assert rejected["RateLimit"] == '"api";r=0;t=1'
    r4_clock.advance(1)
    assert client.get("/drf/").status_code == 200


def test_throttle_scope_names_the_limiter_and_retry_after_follows_the_cycle(r4_clock) -> None:
    client = Client()
    assert codes(client, "/drf-scoped/", 10) == [200] * 10
    r4_clock.advance(10)
    rejected = client.get("/drf-scoped/")
    assert (rejected.status_code, rejected["Retry-After"]) == (429, "50")


def test_keyed_two_clients_forged_xff_changes_nothing(r4_clock) -> None:
    with override_settings(RATELIMIT_R4=views.r4_settings()):
        client = Client()
        a = {"REMOTE_ADDR": "203.0.113.7"}
        assert codes(client, "/drf-keyed/", 3, **a) == [200, 200, 429]
        assert client.get("/drf-keyed/", HTTP_X_FORWARDED_FOR="192.0.2.1", **a).status_code == 429
        ok = client.get("/drf-keyed/", REMOTE_ADDR="198.51.100.2")
        assert ok.status_code == 200
        assert ok["RateLimit"] == f'"per_ip";r=1;t=1;pk={partition_key("ip:198.51.100.2", _secret_salt())}'


def test_several_throttles_on_one_view(r4_clock) -> None:
    client = Client()
    assert codes(client, "/drf-scoped/", 10) == [200] * 10  # "slow" is now empty
    r4_clock.advance(10)
    only_ours = client.get("/drf-two/")  # DRF's 2/min throttle allows, ours says no
    assert (only_ours.status_code, only_ours["Retry-After"]) == (429, "50")
    client.get("/drf-two/")
    both = client.get("/drf-two/")  # now DRF's throttle (about 60 s) says no as well: DRF takes the max
    assert both.status_code == 429
    assert int(both["Retry-After"]) >= 58


def test_view_without_a_name_is_not_throttled(r4_clock) -> None:
    client = Client()
    assert codes(client, "/drf-unnamed/", 30) == [200] * 30


def test_wait_is_the_limiters_real_wait(r4_clock) -> None:
    class View:
        rate_limiter = "slow"
        headers: dict[str, str] = {}

    request = Request(RequestFactory().get("/"))
    for _ in range(10):
        assert RateLimiterThrottle().allow_request(request, View())
    r4_clock.advance(12.25)
    throttle = RateLimiterThrottle()
    assert not throttle.allow_request(request, View())
    assert throttle.wait() == pytest.approx(47.75)
    assert RateLimiterThrottle().wait() is None


def test_exception_handler_maps_ours_and_delegates_the_rest(r4_clock) -> None:
    client = Client(raise_request_exception=False)
    assert client.get("/drf-breaker/").json() == {"ok": True}
    get_circuit_breaker("acquirer").transition_to_open_state()
    r4_clock.advance(1)
    rejected = client.get("/drf-breaker/")
    assert (rejected.status_code, rejected["Retry-After"]) == (503, "2")
    assert rejected["Cache-Control"] == "no-store"
    assert client.get("/drf-breaker/?missing=1").status_code == 404  # DRF's handler
    assert client.get("/drf-breaker/?boom=1").status_code == 500  # not handled by anyone


def test_exception_handler_rate_limiter_and_bulkhead() -> None:
    from django_ratelimit_r4.core.bulkhead import Bulkhead
    from django_ratelimit_r4.core.exceptions import RequestNotPermitted

    request = Request(RequestFactory().get("/"))
    limited = exception_handler(
        RequestNotPermitted(get_rate_limiter("api"), 2_500_000_000), {"request": request}
    )
    assert (limited.status_code, limited["Retry-After"]) == (429, "3")
    full = exception_handler(BulkheadFull(Bulkhead("unconfigured")), {"request": request})
    assert (full.status_code, full["Retry-After"]) == (503, "1")
    assert exception_handler(ValueError("x"), {"request": request, "view": None}) is None


class _CountingRequest(Request):
    """A DRF Request counting the reads that fall through to its HttpRequest (``__getattr__``)."""

    fallthrough: list[str] = []

    def __getattr__(self, attr: str) -> object:
        _CountingRequest.fallthrough.append(attr)
        return super().__getattr__(attr)


@pytest.mark.parametrize("name", ["per_ip", "api"])
def test_a_decision_reads_method_and_remote_addr_from_the_httprequest(r4_clock, name: str) -> None:
    """Issue 9: DRF proxies ``method`` / ``META`` to its HttpRequest through ``__getattr__``, reached only after
    the normal lookup failed (an AttributeError built and dropped per read, ~8 k instructions each): the
    throttle's decision reads them from the HttpRequest underneath, keyed (by REMOTE_ADDR) or not."""

    class View:
        rate_limiter = name
        headers: dict[str, str] = {}

    with override_settings(RATELIMIT_R4=views.r4_settings()):
        request = _CountingRequest(RequestFactory().get("/", REMOTE_ADDR="203.0.113.9"))
        assert RateLimiterThrottle().allow_request(request, View())  # first use: plan, client constants
        _CountingRequest.fallthrough.clear()
        view = View()
        assert RateLimiterThrottle().allow_request(request, view)
        assert _CountingRequest.fallthrough == []
        assert view.headers["RateLimit-Policy"].startswith(f'"{name}"')
