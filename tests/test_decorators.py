"""The decorators on real views through Django's test client, and on plain service functions."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings

from django_ratelimit_r4 import get_bulkhead, get_circuit_breaker, get_rate_limiter, registry
from django_ratelimit_r4.core.circuitbreaker import State
from django_ratelimit_r4.core.exceptions import (
    BulkheadFull,
    CallNotPermitted,
    RequestNotPermitted,
    TimeLimitExceeded,
)
from django_ratelimit_r4.decorators import (
    RateLimitGate,
    _secret_salt,
    bulkhead,
    circuitbreaker,
    fallback_exceptions,
    ratelimit,
    resilient,
    retry,
    timelimiter,
)
from django_ratelimit_r4.headers import QuotaStatus, draft10_headers, partition_key
from tests import views

pytestmark = pytest.mark.django_db(databases=[])

POLICY = '"api";q=10;w=1'


@pytest.fixture(autouse=True)
def _fresh() -> None:
    views.CALLS.clear()


@pytest.fixture
def extra(r4_clock):
    with override_settings(RATELIMIT_R4=views.r4_settings()):
        yield r4_clock


def statuses(client: Client, path: str, n: int, **extra: str) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(n)]


# ------------------------------------------------------------------------------------ seed 000 on a view


def test_ten_pass_eleventh_is_429_then_one_second_later_passes(r4_clock) -> None:
    client = Client()
    assert statuses(client, "/api/", 10) == [200] * 10
    rejected = client.get("/api/")
    assert rejected.status_code == 429
    assert rejected["Retry-After"] == "1"
    assert rejected["Cache-Control"] == "no-store"
    assert views.CALLS["api"] == 10  # the view body never ran for the rejection
    r4_clock.advance(1)
    assert client.get("/api/").status_code == 200


def test_retry_after_follows_the_cycle(r4_clock) -> None:
    client = Client()
    assert statuses(client, "/slow/", 10) == [200] * 10
    r4_clock.advance(10)
    rejected = client.get("/slow/")
    assert rejected.status_code == 429
    assert rejected["Retry-After"] == "50"
    assert rejected["RateLimit"] == '"slow";r=0;t=50'
    r4_clock.advance(49.5)
    assert client.get("/slow/")["Retry-After"] == "1"  # 0.5 s rounds up, never 0
    r4_clock.advance(0.5)
    assert client.get("/slow/").status_code == 200


def test_ratelimit_headers_exact_strings_on_allowed_and_rejected(r4_clock) -> None:
    client = Client()
    first = client.get("/api/")
    assert first["RateLimit-Policy"] == POLICY
    assert first["RateLimit"] == '"api";r=9;t=1'
    r4_clock.advance(0.25)
    second = client.get("/api/")
    assert second["RateLimit"] == '"api";r=8;t=1'  # 0.75 s to the boundary, rounded up
    statuses(client, "/api/", 8)
    rejected = client.get("/api/")
    assert rejected.status_code == 429
    assert rejected["RateLimit-Policy"] == POLICY
    assert rejected["RateLimit"] == '"api";r=0;t=1'


def test_problem_json_or_text_body(r4_clock) -> None:
    client = Client()
    statuses(client, "/api/", 10)
    as_json = client.get("/api/", HTTP_ACCEPT="application/json")
    assert as_json["Content-Type"] == "application/problem+json"
    body = as_json.json()
    assert (body["status"], body["name"], body["retry_after"]) == (429, "api", 1)
    as_text = client.get("/api/", HTTP_ACCEPT="text/plain")
    assert as_text["Content-Type"].startswith("text/plain")
    assert b"api" in as_text.content
    as_html = client.get("/api/", HTTP_ACCEPT="text/html")
    assert as_html["Content-Type"].startswith("text/html")
    assert b"api" in as_html.content


def test_permits_and_url_kwargs(r4_clock) -> None:
    client = Client()
    assert client.get("/heavy/7/").content == b"heavy 7"
    assert client.get("/heavy/7/")["RateLimit"] == '"api";r=0;t=1'
    rejected = client.get("/heavy/7/")
    assert rejected.status_code == 429
    assert rejected["Retry-After"] == "1"


# --------------------------------------------------------------------------------- async and class views


async def test_async_view_seed(r4_clock) -> None:
    client = AsyncClient()
    for _ in range(10):
        assert (await client.get("/api-async/")).status_code == 200
    rejected = await client.get("/api-async/")
    assert rejected.status_code == 429
    assert rejected["Retry-After"] == "1"
    assert rejected["RateLimit"] == '"api";r=0;t=1'
    r4_clock.advance(1)
    assert (await client.get("/api-async/")).status_code == 200


def test_async_view_stays_a_coroutine_function() -> None:
    from asgiref.sync import iscoroutinefunction

    assert iscoroutinefunction(views.api_async)
    assert not iscoroutinefunction(views.api)
    assert views.api.__name__ == "api" and views.api.__wrapped__ is not None


def test_class_based_view_through_method_decorator(r4_clock) -> None:
    client = Client()
    assert statuses(client, "/class/", 10) == [200] * 10
    rejected = client.get("/class/")
    assert (rejected.status_code, rejected["Retry-After"]) == (429, "1")


async def test_async_class_based_view(r4_clock) -> None:
    client = AsyncClient()
    ok = await client.get("/class-async/")
    assert ok.content == b"async class ok"
    assert ok["RateLimit"] == '"api";r=9;t=1'
    for _ in range(9):
        await client.get("/class-async/")
    assert (await client.get("/class-async/")).status_code == 429


# ------------------------------------------------------------------------------------------ per client


def test_keyed_two_clients_two_budgets_forged_xff_changes_nothing(extra) -> None:
    client = Client()
    a = {"REMOTE_ADDR": "203.0.113.7"}
    b = {"REMOTE_ADDR": "198.51.100.2"}
    assert statuses(client, "/per-ip/", 2, **a) == [200, 200]
    assert client.get("/per-ip/", **a).status_code == 429
    forged = client.get("/per-ip/", HTTP_X_FORWARDED_FOR="10.9.8.7", **a)
    assert forged.status_code == 429
    assert statuses(client, "/per-ip/", 2, **b) == [200, 200]
    assert client.get("/per-ip/", **b).status_code == 429
    assert get_rate_limiter("per_ip", key="ip:203.0.113.7").metrics.available_permissions == 0
    assert get_rate_limiter("per_ip", key="ip:10.9.8.7").metrics.available_permissions == 2
    extra.advance(1)
    assert client.get("/per-ip/", **a).status_code == 200


def test_keyed_headers_carry_a_salted_hash_never_the_key(extra) -> None:
    response = Client().get("/per-ip/", REMOTE_ADDR="203.0.113.7")
    pk = partition_key("ip:203.0.113.7", _secret_salt())  # the stored (namespaced) key
    assert response["RateLimit-Policy"] == f'"per_ip";q=2;w=1;pk={pk}'
    assert response["RateLimit"] == f'"per_ip";r=1;t=1;pk={pk}'
    assert "203.0.113.7" not in str(response.headers)
    assert pk != partition_key("ip:203.0.113.7")  # salted with the server secret


def test_trusted_proxy_count_reads_xff_from_the_right(r4_clock) -> None:
    with override_settings(RATELIMIT_R4=views.r4_settings(trusted_proxies=1)):
        client = Client()
        proxy = {"REMOTE_ADDR": "10.0.0.1"}
        assert statuses(client, "/per-ip/", 2, HTTP_X_FORWARDED_FOR="203.0.113.7", **proxy) == [200, 200]
        assert client.get("/per-ip/", HTTP_X_FORWARDED_FOR="203.0.113.7", **proxy).status_code == 429
        # A client-forged entry on the left does not buy a fresh budget: the proxy's entry decides.
        forged = client.get("/per-ip/", HTTP_X_FORWARDED_FOR="1.2.3.4, 203.0.113.7", **proxy)
        assert forged.status_code == 429
        assert client.get("/per-ip/", HTTP_X_FORWARDED_FOR="198.51.100.2", **proxy).status_code == 200


async def test_keyed_async_view(extra) -> None:
    from django.test import RequestFactory

    rf = RequestFactory()
    codes = [(await views.per_ip_async(rf.get("/", REMOTE_ADDR="203.0.113.9"))).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    assert (await views.per_ip_async(rf.get("/", REMOTE_ADDR="203.0.113.10"))).status_code == 200


def test_key_function_returning_none_is_not_limited(extra) -> None:
    @ratelimit("per_key")
    def view(request):
        from django.http import HttpResponse

        return HttpResponse("ok")

    from django.test import RequestFactory

    rf = RequestFactory()
    for _ in range(5):
        response = view(rf.get("/"))  # no X-Api-Key header: key None, not limited, no fields
        assert response.status_code == 200
        assert "RateLimit" not in response
    assert view(rf.get("/", HTTP_X_API_KEY="k1")).status_code == 200
    assert view(rf.get("/", HTTP_X_API_KEY="k1")).status_code == 429
    assert view(rf.get("/", HTTP_X_API_KEY="k2")).status_code == 200


def test_decorator_key_overrides_the_instance_spec(r4_clock) -> None:
    @ratelimit("api", key=lambda request: request.GET.get("tenant"))
    def view(request):
        from django.http import HttpResponse

        return HttpResponse("ok")

    from django.test import RequestFactory

    rf = RequestFactory()
    assert [view(rf.get("/?tenant=a")).status_code for _ in range(11)][-1] == 429
    assert view(rf.get("/?tenant=b")).status_code == 200
    assert get_rate_limiter("api").metrics.available_permissions == 10  # the shared limiter untouched


# ----------------------------------------------------------------------------------------- multi-limit


def test_multi_limit_all_or_nothing(extra) -> None:
    client = Client()
    burst, sustained = get_rate_limiter("burst"), get_rate_limiter("sustained")
    assert statuses(client, "/multi/", 2) == [200, 200]
    rejected = client.get("/multi/")
    assert (rejected.status_code, rejected["Retry-After"]) == (429, "1")
    assert sustained.metrics.available_permissions == 1  # burst said no: sustained kept its permit
    extra.advance(1)
    assert client.get("/multi/").status_code == 200
    rejected = client.get("/multi/")
    assert (rejected.status_code, rejected["Retry-After"]) == (429, "59")  # sustained's wait
    assert burst.metrics.available_permissions == 1  # sustained said no: burst kept its permit
    assert views.CALLS["multi"] == 3
    assert rejected["RateLimit-Policy"] == '"burst";q=2;w=1, "sustained";q=3;w=60'
    assert rejected["RateLimit"] == '"burst";r=1;t=1, "sustained";r=0;t=59'


def test_multi_limit_with_a_keyed_limiter(extra) -> None:
    client = Client()
    a = {"REMOTE_ADDR": "203.0.113.7"}
    b = {"REMOTE_ADDR": "198.51.100.2"}
    burst3 = get_rate_limiter("burst3")
    assert statuses(client, "/multi-keyed/", 2, **a) == [200, 200]
    assert client.get("/multi-keyed/", **a).status_code == 429  # A's own budget said no ...
    assert burst3.metrics.available_permissions == 1  # ... and the shared one was not charged
    assert client.get("/multi-keyed/", **b).status_code == 200
    assert client.get("/multi-keyed/", **b).status_code == 429  # the shared one said no ...
    assert get_rate_limiter("per_ip", key="ip:198.51.100.2").metrics.available_permissions == 1  # ... B kept its
    assert views.CALLS["multi_keyed"] == 3


def test_acquire_all_keyed_largest_wait_and_nothing_consumed(extra) -> None:
    from django_ratelimit_r4.keyed import acquire_all_keyed

    burst, sustained = get_rate_limiter("burst"), get_rate_limiter("sustained")
    per_ip = registry.get_keyed_rate_limiter("per_ip")
    entries = [(burst, None), (sustained, None), (per_ip, "a")]
    assert acquire_all_keyed(entries) is None
    assert acquire_all_keyed(entries) is None  # burst 0, sustained 1, a 0
    extra.advance(0.5)
    index, wait = acquire_all_keyed(entries)
    assert (index, wait) == (0, 500_000_000) or (index, wait) == (2, 500_000_000)
    assert sustained.metrics.available_permissions == 1
    assert acquire_all_keyed([(sustained, None), (per_ip, "b")]) is None  # sustained 0
    extra.advance(0.5)  # burst and a are back, sustained has 59 s to go
    assert acquire_all_keyed([(per_ip, "a"), (sustained, None)]) == (1, 59_000_000_000)
    assert per_ip.quota("a")[0] == 2  # the key was not charged
    with pytest.raises(ValueError):
        acquire_all_keyed([(per_ip, "a"), (per_ip, "a")])
    with pytest.raises(ValueError):
        acquire_all_keyed([(per_ip, None)])


def test_multi_limit_keyed_rejection_reports_the_larger_unkeyed_wait(extra) -> None:
    from django_ratelimit_r4.keyed import acquire_all_keyed

    sustained = get_rate_limiter("sustained")
    per_ip = registry.get_keyed_rate_limiter("per_ip")
    for _ in range(3):
        sustained.acquire_or_raise()
    per_ip.acquire_or_raise("a", 2)
    # Both reject; the key is decided first, yet Retry-After must be the largest wait (sustained's).
    assert acquire_all_keyed([(per_ip, "a"), (sustained, None)]) == (1, 60_000_000_000)
    assert per_ip.failed_calls == 1


# -------------------------------------------------------------------------------------- header styles


def test_headers_off_and_draft6(r4_clock) -> None:
    with override_settings(RATELIMIT_R4=views.r4_settings(headers=None)):
        response = Client().get("/api/")
        assert response.status_code == 200
        assert not any(name.lower().startswith("ratelimit") for name in response.headers)
    with override_settings(RATELIMIT_R4=views.r4_settings(headers="draft-6")):
        client = Client()
        response = client.get("/api/")
        assert response["RateLimit-Limit"] == "10"
        assert response["RateLimit-Remaining"] == "9"
        assert response["RateLimit-Reset"] == "1"
        assert response["RateLimit-Policy"] == "10;w=1"
        statuses(client, "/api/", 9)
        rejected = client.get("/api/")
        assert rejected.status_code == 429
        assert (rejected["RateLimit-Remaining"], rejected["Retry-After"]) == ("0", "1")


def test_fast_header_strings_match_the_reference_formatter(r4_clock) -> None:
    client = Client()
    for step in range(12):
        response = client.get("/slow/")
        limiter = get_rate_limiter("slow")
        remaining = max(0, limiter.metrics.available_permissions)
        reset = 60 - step * 3  # seconds to the cycle boundary (never 0 left with permits here)
        expected = draft10_headers([QuotaStatus("slow", 10, 60, remaining, reset)])
        assert response["RateLimit-Policy"] == expected["RateLimit-Policy"]
        assert response["RateLimit"] == expected["RateLimit"], step
        r4_clock.advance(3)


def test_custom_response_builder(r4_clock) -> None:
    with override_settings(RATELIMIT_R4=views.r4_settings(response_builder="tests.views.custom_builder")):
        client = Client()
        statuses(client, "/api/", 10)
        rejected = client.get("/api/")
        assert rejected.content == b"custom 429 1"
        assert rejected["Retry-After"] == "1"
        assert rejected["Cache-Control"] == "no-store"


def builder_without_keywords(request, exc):  # forgot status= and retry_after=
    return HttpResponse("busy", status=429)


def builder_returning_none(request, exc, *, status, retry_after):  # forgot the return
    HttpResponse("busy", status=status)


def test_a_response_builder_that_cannot_answer_is_caught_by_the_check_and_named_at_the_429(r4_clock) -> None:
    # Both passed manage.py check and made every 429 a 500 (TypeError), found only when a client was limited.
    from django.core.checks import run_checks

    wrong_signature = views.r4_settings(response_builder="tests.test_decorators.builder_without_keywords")
    with override_settings(RATELIMIT_R4=wrong_signature):
        messages = [m for m in run_checks() if m.id and m.id.startswith("ratelimit_r4.")]
        assert [m.id for m in messages] == ["ratelimit_r4.E013"], messages
        assert "builder(request, exc, status=..., retry_after=...)" in messages[0].msg
    with override_settings(RATELIMIT_R4=views.r4_settings(response_builder="tests.test_decorators.builder_returning_none")):
        assert not [m for m in run_checks() if m.id and m.id.startswith("ratelimit_r4.")]
        client = Client(raise_request_exception=True)
        statuses(client, "/api/", 10)
        with pytest.raises(ImproperlyConfigured, match=r'RATELIMIT_R4\["response_builder"\].*returned None'):
            client.get("/api/")


def test_override_settings_rebuilds_the_cached_limiter(r4_clock) -> None:
    client = Client()
    statuses(client, "/api/", 10)
    assert client.get("/api/").status_code == 429
    value = views.r4_settings()
    value["ratelimiters"]["instances"]["api"] = {"limit_for_period": 3}
    with override_settings(RATELIMIT_R4=value):
        assert statuses(client, "/api/", 4) == [200, 200, 200, 429]
        assert client.get("/api/")["RateLimit-Policy"] == '"api";q=3;w=1'


# --------------------------------------------------------------------------------- breaker and bulkhead


def test_breaker_open_is_503_with_remaining_open_time(r4_clock) -> None:
    client = Client(raise_request_exception=False)
    assert client.get("/breaker/").status_code == 200
    for _ in range(9):  # 9 failures of 10 calls: over the 50 % threshold
        assert client.get("/breaker/?fail=1").status_code == 500
    assert get_circuit_breaker("acquirer").state is State.OPEN
    r4_clock.advance(1.2)
    rejected = client.get("/breaker/")
    assert rejected.status_code == 503
    assert rejected["Retry-After"] == "2"  # 1.8 s of the 3 s left, rounded up
    assert rejected["Cache-Control"] == "no-store"
    assert "RateLimit" not in rejected
    r4_clock.advance(1.81)
    assert client.get("/breaker/").status_code == 200  # open time over: a half-open trial passes


def test_breaker_forced_open_is_503(r4_clock) -> None:
    get_circuit_breaker("acquirer").transition_to_forced_open_state()
    rejected = Client().get("/breaker/")
    assert (rejected.status_code, rejected["Retry-After"]) == (503, "3")


def test_breaker_fallback_with_annotated_exception(r4_clock) -> None:
    client = Client()
    assert client.get("/breaker-fallback/").content == b"live"
    get_circuit_breaker("acquirer").transition_to_open_state()
    assert client.get("/breaker-fallback/").content == b"cached (acquirer)"
    assert fallback_exceptions(views.breaker_fallback) == (CallNotPermitted,)


async def test_bulkhead_full_is_503_with_configured_retry_after(r4_clock) -> None:
    value = views.r4_settings()
    value["bulkheads"]["instances"]["acquirer"]["retry_after"] = "7s"
    with override_settings(RATELIMIT_R4=value):
        held = get_bulkhead("acquirer")
        assert held.try_acquire_permission() and held.try_acquire_permission()
        try:
            rejected = await AsyncClient().get("/bulkhead/")
            assert (rejected.status_code, rejected["Retry-After"]) == (503, "7")
            assert rejected["Cache-Control"] == "no-store"
        finally:
            held.on_complete()
            held.on_complete()
        assert (await AsyncClient().get("/bulkhead/")).status_code == 200


def test_retry_on_a_view(r4_clock) -> None:
    assert Client().get("/flaky/").content == b"third time lucky"
    assert views.CALLS["flaky"] == 3


# ------------------------------------------------------------------------------ service functions, order


def test_service_function_raises_and_middlewareless_view_sees_it(r4_clock) -> None:
    assert [views.capture(1) for _ in range(10)][-1] == "captured 1"
    with pytest.raises(RequestNotPermitted) as info:
        views.capture(1)
    assert info.value.name == "api" and info.value.retry_after == 1


async def test_async_service_function(r4_clock) -> None:
    @ratelimit("api")
    async def acapture(amount: int) -> int:
        await asyncio.sleep(0)
        return amount

    assert [await acapture(i) for i in range(10)] == list(range(10))
    with pytest.raises(RequestNotPermitted):
        await acapture(1)


async def test_async_callable_objects_and_partials_get_the_async_wrapper(r4_clock) -> None:
    # asgiref's iscoroutinefunction, which chose the wrapper before core.coroutines.is_async, took an object with
    # async __call__ and a partial of an asgiref-marked function for sync: the sync wrapper returned the coroutine
    # unawaited, outside the limiter's accounting.
    import functools

    from asgiref.sync import markcoroutinefunction

    class Capture:
        async def __call__(self, amount: int) -> int:
            await asyncio.sleep(0)
            return amount

    def marked(amount: int) -> object:
        return Capture()(amount)

    for fn in (Capture(), functools.partial(markcoroutinefunction(marked))):
        registry.invalidate()
        limited = ratelimit("api")(fn)
        assert asyncio.iscoroutinefunction(limited)
        assert [await limited(i) for i in range(10)] == list(range(10))
        with pytest.raises(RequestNotPermitted):
            await limited(1)


def test_fallback_gets_the_arguments_plus_the_exception(r4_clock) -> None:
    seen = []

    def fallback(amount: int, currency: str, exc: RequestNotPermitted) -> str:
        seen.append((amount, currency, type(exc).__name__))
        return "later"

    @ratelimit("api", fallback=fallback)
    def capture(amount: int, currency: str = "EUR") -> str:
        return "now"

    results = [capture(5, currency="USD") for _ in range(11)]
    assert results == ["now"] * 10 + ["later"]
    assert seen == [(5, "USD", "RequestNotPermitted")]


def test_fallback_ignores_exceptions_outside_its_annotation(r4_clock) -> None:
    def fallback(x: int, exc: CallNotPermitted | BulkheadFull) -> str:
        return "fallback"

    @circuitbreaker("acquirer", fallback=fallback)
    def call(x: int) -> str:
        raise KeyError(x)

    with pytest.raises(KeyError):
        call(1)
    get_circuit_breaker("acquirer").transition_to_open_state()
    assert call(1) == "fallback"


async def test_async_fallback(r4_clock) -> None:
    async def fallback(x: int, exc: Exception) -> str:
        return f"fallback {type(exc).__name__}"

    @retry("acquirer", fallback=fallback)
    async def call(x: int) -> str:
        raise ConnectionError(x)

    assert await call(1) == "fallback ConnectionError"
    assert get_retry_metrics().number_of_failed_calls_with_retry_attempt == 1


def get_retry_metrics():
    return registry.get_retry("acquirer").metrics


def test_resilient_order_retry_outside_breaker_outside_limiter_outside_bulkhead(r4_clock) -> None:
    breaker = get_circuit_breaker("acquirer")
    limiter = get_rate_limiter("api")
    held = get_bulkhead("acquirer")
    calls = []

    @resilient(retry="acquirer", circuitbreaker="acquirer", ratelimiter="api", bulkhead="acquirer")
    def service() -> str:
        calls.append(1)
        return "ok"

    assert service() == "ok"
    assert limiter.metrics.available_permissions == 9
    # Bulkhead innermost: full -> each retry attempt already paid a rate-limiter permit.
    assert held.try_acquire_permission() and held.try_acquire_permission()
    with pytest.raises(BulkheadFull):
        service()
    held.on_complete()
    held.on_complete()
    assert limiter.metrics.available_permissions == 6  # 3 attempts (retry outside the limiter)
    assert breaker.metrics.number_of_failed_calls == 3  # the breaker saw each attempt fail
    # Breaker open: Retry (outside) retries the rejection, the breaker counts each not-permitted call.
    breaker.transition_to_open_state()
    with pytest.raises(CallNotPermitted):
        service()
    assert breaker.metrics.number_of_not_permitted_calls == 3
    assert limiter.metrics.available_permissions == 6  # the limiter (inside) was never reached
    assert calls == [1]


def test_resilient_view_answers_429_with_headers(r4_clock) -> None:
    client = Client()
    assert statuses(client, "/stacked/", 10) == [200] * 10
    rejected = client.get("/stacked/")
    assert rejected.status_code == 429
    assert rejected["RateLimit-Policy"] == POLICY
    assert re.fullmatch(r'"api";r=0;t=1', rejected["RateLimit"])


async def test_timelimiter_async_with_fallback(r4_clock) -> None:
    value = views.r4_settings()
    value["timelimiters"]["instances"]["acquirer"] = {"timeout_duration": "20ms"}
    with override_settings(RATELIMIT_R4=value):

        async def fallback(delay: float, exc: TimeLimitExceeded) -> str:
            return "timed out"

        @timelimiter("acquirer", fallback=fallback)
        async def work(delay: float) -> str:
            await asyncio.sleep(delay)
            return "done"

        assert await work(0) == "done"
        assert await work(5) == "timed out"


def test_timelimiter_refuses_sync_functions() -> None:
    with pytest.raises(TypeError, match="cannot limit the sync function"):

        @timelimiter("acquirer")
        def work() -> None: ...

    with pytest.raises(TypeError):
        resilient(retry="acquirer", timelimiter="acquirer")(lambda: None)


def test_keyed_limit_on_a_function_without_request_is_a_clear_error(extra) -> None:
    @ratelimit("per_ip")
    def service() -> None: ...

    with pytest.raises(TypeError, match="keyed per request"):
        service()


@pytest.mark.parametrize(
    "make",
    [
        lambda: ratelimit([]),
        lambda: ratelimit(["a", "a"]),
        lambda: ratelimit("api", permits=0),
        lambda: bulkhead(""),
        lambda: resilient(),
        lambda: circuitbreaker("x", fallback="nope"),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments_fail_at_decoration(make) -> None:
    with pytest.raises((TypeError, ValueError)):
        make()


@pytest.mark.parametrize(
    ("key", "error", "fragment"),
    [
        ("ipp", ValueError, "unknown key 'ipp'"),
        ("header:", ValueError, "header name after 'header:' is empty"),
        ("header:X Api", ValueError, "not a valid HTTP header name"),
        (42, TypeError, "key must be a string or a callable, got int"),
    ],
)
def test_a_bad_key_spec_fails_at_decoration_not_as_a_500_on_every_request(
    r4_clock, key: Any, error: type[Exception], fragment: str
) -> None:
    # It used to decorate fine and raise ValueError at each request: every request to the view a 500.
    with pytest.raises(error, match=re.escape(fragment)):
        ratelimit("api", key=key)
    with pytest.raises(error, match=re.escape(fragment)):
        resilient(ratelimiter="api", key=key)


def test_a_dotted_key_path_is_imported_at_first_use_so_the_view_module_may_define_it(r4_clock) -> None:
    view = ratelimit("api", key="tests.test_decorators.no_such_key_function")(lambda request: HttpResponse("ok"))
    with pytest.raises(ValueError, match="cannot import key function"):
        view(RequestFactory().get("/"))


def test_unknown_name_fails_at_first_call_with_the_configured_names(r4_clock) -> None:
    @ratelimit("nope")
    def service() -> None: ...

    with pytest.raises(KeyError, match="'api'"):
        service()


def test_gate_check_returns_rejection_and_headers(r4_clock) -> None:
    from django.test import RequestFactory

    gate = RateLimitGate("api")
    request = RequestFactory().get("/")
    for _ in range(10):
        assert gate.check(request)[0] is None
    rejection, headers = gate.check(request)
    assert isinstance(rejection, RequestNotPermitted)
    assert headers == {"RateLimit-Policy": POLICY, "RateLimit": '"api";r=0;t=1'}


def test_pinned_forwarded_header_ignores_the_other_one(r4_clock) -> None:
    """"forwarded_header": "x-forwarded-for": a client adding a forged Forwarded header is still charged as itself."""
    from django.http import HttpResponse
    from django.test import RequestFactory, override_settings

    from django_ratelimit_r4 import registry
    from django_ratelimit_r4.decorators import ratelimit

    @ratelimit("per_ip")
    def view(request):
        return HttpResponse("ok")

    setting = {
        "trusted_proxies": 1,
        "forwarded_header": "x-forwarded-for",
        "ratelimiters": {"instances": {"per_ip": {"limit_for_period": 5, "limit_refresh_period": "60s", "key": "ip"}}},
    }
    rf = RequestFactory()
    with override_settings(RATELIMIT_R4=setting):
        plain = rf.get("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.7")
        forged = rf.get("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.7", HTTP_FORWARDED="for=9.9.9.9")
        assert view(plain).status_code == 200
        assert view(forged).status_code == 200
        assert registry.get_keyed_rate_limiter("per_ip").keys() == ["ip:203.0.113.7"]


def test_a_stacked_service_function_follows_a_settings_change() -> None:
    """The stack is built once per set of instances: after override_settings it must use the new ones."""
    import pytest as _pytest
    from django.test import override_settings

    from django_ratelimit_r4 import get_circuit_breaker
    from django_ratelimit_r4.decorators import resilient
    from django_ratelimit_r4.exceptions import CallNotPermitted

    @resilient(circuitbreaker="svc", bulkhead="svc")
    def capture(amount: int) -> int:
        return amount

    first = {"circuitbreakers": {"instances": {"svc": {}}}, "bulkheads": {"instances": {"svc": {}}}}
    second = {"circuitbreakers": {"instances": {"svc": {"failure_rate_threshold": 60}}},
              "bulkheads": {"instances": {"svc": {}}}}
    with override_settings(RATELIMIT_R4=first):
        assert capture(1) == 1
        get_circuit_breaker("svc").transition_to_forced_open_state()
        with _pytest.raises(CallNotPermitted):
            capture(2)
        with override_settings(RATELIMIT_R4=second):
            assert capture(3) == 3  # a fresh, closed breaker: not the forced-open one of the old chain
        assert capture(4) == 4  # leaving the override rebuilds the registry too: fresh instances again


# ----------------------------------------------------------------------------- the rate shorthand (issue 8)


def test_a_rate_shorthand_limits_a_view_with_its_retry_after(r4_clock) -> None:
    setting = views.r4_settings()
    setting["ratelimiters"]["instances"]["api"] = {"rate": "3/m"}
    with override_settings(RATELIMIT_R4=setting):
        client = Client()
        assert statuses(client, "/api/", 3) == [200] * 3
        rejected = client.get("/api/")
        assert rejected.status_code == 429
        assert rejected["Retry-After"] == "60"
        assert rejected["RateLimit-Policy"] == '"api";q=3;w=60'


def test_a_rate_written_where_a_name_goes_says_how_to_declare_it() -> None:
    with pytest.raises(registry.UnknownInstance, match=r"'5/m' is a rate, not a name.*\{\"rate\": \"5/m\"\}"):
        get_rate_limiter("5/m")


# ------------------------------------------------------------------ impossible configurations (issue 8)


def test_permits_above_the_limit_is_a_clear_error_at_first_use_not_a_lying_429(r4_clock) -> None:
    setting = views.r4_settings()
    setting["ratelimiters"]["instances"]["api"] = {"limit_for_period": 3}
    with override_settings(RATELIMIT_R4=setting):
        with pytest.raises(
            ImproperlyConfigured,
            match=r"permits=5, but rate limiter 'api' allows only 3 per period "
            r'\(RATELIMIT_R4\["ratelimiters"\]\["instances"\]\["api"\]\["limit_for_period"\]\)',
        ):
            Client().get("/heavy/7/")  # @ratelimit("api", permits=5)
        assert get_rate_limiter("api").metrics.available_permissions == 3


def test_a_gcra_limit_admits_permits_up_to_its_burst_and_refuses_more_at_first_use(r4_clock) -> None:
    # The gate compared permits with limit_for_period where GCRA's bound is its burst (manage.py check, E025,
    # already did): a burst of 6 over 3 per minute refused permits=5 at every request (ImproperlyConfigured, a
    # 500) though GCRA grants it, and a burst of 2 passed it, then every request died on the limiter's
    # ValueError ("can never grant 5 permits"), a 500 again.
    setting = views.r4_settings()
    setting["ratelimiters"]["instances"]["api"] = {"algorithm": "gcra", "rate": "3/m", "burst": 6}
    with override_settings(RATELIMIT_R4=setting):
        assert [Client().get("/heavy/7/").status_code for _ in range(2)] == [200, 429]  # @ratelimit("api", permits=5)
    setting["ratelimiters"]["instances"]["api"] = {"algorithm": "gcra", "rate": "10/m", "burst": 2}
    with override_settings(RATELIMIT_R4=setting), pytest.raises(
        ImproperlyConfigured,
        match=r"permits=5, but rate limiter 'api' allows only 2 at once "
        r'\(RATELIMIT_R4\["ratelimiters"\]\["instances"\]\["api"\]\["burst"\]\)',
    ):
        Client().get("/heavy/7/")


def test_a_period_of_centuries_is_an_error_at_first_use_naming_the_setting(r4_clock) -> None:
    setting = views.r4_settings()
    setting["ratelimiters"]["instances"]["api"] = {"rate": "1/100000d"}
    with override_settings(RATELIMIT_R4=setting), pytest.raises(
        ImproperlyConfigured, match=r'\["instances"\]\["api"\]\["rate"\]: must be at most 366d, got 100000d'
    ):
        Client().get("/api/")


def test_the_longest_period_keeps_retry_after_and_ratelimit_fields_short(r4_clock) -> None:
    setting = views.r4_settings()
    setting["ratelimiters"]["instances"]["api"] = {
        "limit_for_period": 999_999_999_999_999,
        "limit_refresh_period": "366d",
    }
    with override_settings(RATELIMIT_R4=setting):
        get_rate_limiter("api").drain_permissions()
        rejected = Client().get("/api/")
        assert rejected.status_code == 429
        assert rejected["Retry-After"] == str(366 * 86_400)
        assert rejected["RateLimit-Policy"] == f'"api";q=999999999999999;w={366 * 86_400}'


# ------------------------------------------------------------------------------ the off switch (issue 8)


@pytest.fixture
def disabled(r4_clock):
    with override_settings(RATELIMIT_R4=views.r4_settings(enabled=False)):
        yield r4_clock


def test_disabled_decorators_are_pass_throughs_no_permit_no_headers(disabled) -> None:
    client = Client()
    for path in ("/api/", "/multi/", "/per-ip/", "/class/", "/stacked/", "/drf/", "/drf-scoped/", "/drf-keyed/"):
        responses = [client.get(path) for _ in range(15)]
        assert [r.status_code for r in responses] == [200] * 15, path
        assert not any(h.lower().startswith("ratelimit") for r in responses for h in r.headers), path
    assert get_rate_limiter("api").metrics.available_permissions == 10  # not one permit taken
    assert get_rate_limiter("api").metrics.successful_calls == 0


def test_disabled_breaker_bulkhead_and_retry_do_not_wrap_the_view(disabled) -> None:
    get_circuit_breaker("acquirer").transition_to_forced_open_state()
    client = Client()
    assert client.get("/breaker/").content == b"ok"
    assert client.get("/breaker-fallback/").content == b"live"
    with pytest.raises(ConnectionError):
        client.get("/flaky/")  # no retry: the first failure reaches the client
    assert views.CALLS["flaky"] == 1


async def test_disabled_async_views_pass_through(disabled) -> None:
    client = AsyncClient()
    responses = [await client.get("/api-async/") for _ in range(15)]
    assert [r.status_code for r in responses] == [200] * 15
    assert "RateLimit" not in responses[-1]
    assert (await client.get("/bulkhead/")).status_code == 200


def test_the_off_switch_is_read_once_per_registry_build_not_per_request(
    disabled, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Client()
    assert client.get("/api/").status_code == 200
    assert client.get("/stacked/").status_code == 200

    def no_lookup() -> None:
        raise AssertionError("settings read on the request path")

    monkeypatch.setattr("django_ratelimit_r4.conf.get_options", no_lookup)
    assert [client.get("/api/").status_code for _ in range(3)] == [200] * 3
    assert client.get("/stacked/").status_code == 200


def test_turning_it_back_on_limits_again(r4_clock) -> None:
    client = Client()
    with override_settings(RATELIMIT_R4=views.r4_settings(enabled=False)):
        assert statuses(client, "/api/", 12) == [200] * 12
    with override_settings(RATELIMIT_R4=views.r4_settings(enabled=True)):
        assert statuses(client, "/api/", 11) == [200] * 10 + [429]


# ----------------------------------------------------------------- predicates from settings (issue 8)


def test_a_breaker_records_only_what_its_dotted_path_predicate_accepts(r4_clock) -> None:
    setting = views.r4_settings()
    setting["circuitbreakers"]["instances"]["acquirer"]["record_exception"] = "tests.views.is_server_error"
    with override_settings(RATELIMIT_R4=setting):
        client = Client(raise_request_exception=False)
        assert [client.get("/breaker/?fail=1").status_code for _ in range(20)] == [500] * 20
        breaker = get_circuit_breaker("acquirer")
        assert breaker.state is State.CLOSED  # ConnectionError is not a 5xx HTTPError: recorded as success
        assert breaker.metrics.number_of_failed_calls == 0
    with override_settings(RATELIMIT_R4=views.r4_settings()):  # without the predicate every error counts
        client = Client(raise_request_exception=False)
        [client.get("/breaker/?fail=1") for _ in range(10)]
        assert get_circuit_breaker("acquirer").state is State.OPEN
