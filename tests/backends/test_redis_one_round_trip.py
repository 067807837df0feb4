"""One round trip per request, headers included (issue 9): a request through a Redis-backed ``@ratelimit`` or
``RateLimiterThrottle`` with RateLimit header fields on costs exactly one ``EVALSHA``, allowed or denied,
on every path (single, keyed, all-or-nothing multi-limit, keyed multi-limit; sync and async decorator, DRF).

Counted with ``INFO commandstats`` on a dedicated ``redis-server`` (the ``redis_server`` fixture), so nothing
else runs commands on it. The header fields must be exactly what separate quota reads give (``headers()``
reads each limit's ``quota()`` after the request, on the FakeClock, so nothing moved in between).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings
from django.urls import path

from django_ratelimit_r4 import get_rate_limiter, registry
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.decorators import RateLimitGate, ratelimit
from tests.backends.drf_views import drf_view
from tests.cyclic import cyclic_garbage

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(databases=[])]

PEER = "203.0.113.7"


@ratelimit("one")
def one(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("one")
async def one_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_ip")
def keyed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_ip")
async def keyed_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["one", "sustained"])
def multi(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["one", "sustained"])
async def multi_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["per_ip", "sustained"])
def multi_keyed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["per_ip", "sustained"])
async def multi_keyed_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


# A gate over limits in memory and in Redis (backends chosen per instance): the memory limits are decided and
# read in this process, the Redis ones in one round trip that also reads their figures.
@ratelimit(["mem", "one"])
def mixed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["mem", "one"])
async def mixed_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["mem_ip", "per_ip", "sustained"])
def mixed_keyed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["mem_ip", "per_ip", "sustained"])
async def mixed_keyed_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


_drf = drf_view


urlpatterns = [
    path("one/", one),
    path("one-async/", one_async),
    path("keyed/", keyed),
    path("keyed-async/", keyed_async),
    path("multi/", multi),
    path("multi-async/", multi_async),
    path("multi-keyed/", multi_keyed),
    path("multi-keyed-async/", multi_keyed_async),
    path("drf/", _drf("one")),
    path("drf-keyed/", _drf("per_ip")),
    path("drf-multi/", _drf(["one", "sustained"])),
    path("drf-multi-keyed/", _drf(["per_ip", "sustained"])),
    path("mixed/", mixed),
    path("mixed-mem-first/", ratelimit(["mem", "sustained"])(lambda request: HttpResponse("ok"))),
    path("mixed-async/", mixed_async),
    path("mixed-keyed/", mixed_keyed),
    path("mixed-keyed-async/", mixed_keyed_async),
    path("drf-mixed/", _drf(["mem", "one"])),
    path("drf-mixed-keyed/", _drf(["mem_ip", "per_ip", "sustained"])),
]

# url -> the names its gate decides (for the headers a separate quota read gives)
NAMES = {
    "one": ["one"],
    "keyed": ["per_ip"],
    "multi": ["one", "sustained"],
    "multi-keyed": ["per_ip", "sustained"],
    "mixed": ["mem", "one"],
    "mixed-keyed": ["mem_ip", "per_ip", "sustained"],
}


def _settings(url: str, algorithm: str = "cycle", **top: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "backend": "redis",
        "redis_url": url,
        "backends": {"local": {"BACKEND": "memory"}},
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": "1s", "timeout_duration": "0s"}},
            "instances": {
                "one": {"limit_for_period": 2},
                "per_ip": {"limit_for_period": 2, "key": "ip"},
                "sustained": {"limit_for_period": 5, "limit_refresh_period": "60s"},
                "mem": {"limit_for_period": 3, "backend": "local"},
                "mem_ip": {"limit_for_period": 3, "key": "ip", "backend": "local"},
            },
        },
    }
    for instance in value["ratelimiters"]["instances"].values():
        instance["algorithm"] = algorithm  # (each limit's burst, window or cycle: the same counts below)
    value.update(top)
    return value


@pytest.fixture(params=["cycle", "gcra", "sliding_window"])
def server(redis_server: Any, r4_clock: Any, request: Any) -> Iterator[Any]:
    """Every limiter in the dedicated Redis, built (their reset is a script call) before anything is counted;
    all of one algorithm (issue 13: one round trip per decision for GCRA and the sliding window too)."""
    with override_settings(RATELIMIT_R4=_settings(redis_server.url, request.param)):
        for name in ("one", "sustained", "mem"):
            get_rate_limiter(name)
        registry.get_keyed_rate_limiter("per_ip")
        registry.get_keyed_rate_limiter("mem_ip")
        _load_scripts(redis_server.url)  # (a GCRA or sliding-window reset runs no script)
        yield redis_server


def _load_scripts(url: str) -> None:
    """Every rate-limiter script known to the server before counting (else the first call is EVALSHA + EVAL)."""
    from django_ratelimit_r4.backends.redis_gcra import GCRA
    from django_ratelimit_r4.backends.redis_mixed import MIXED_SCRIPT
    from django_ratelimit_r4.backends.redis_sliding import SLIDING

    client = redis.Redis.from_url(url)
    try:
        for text in (rb.SCRIPT, GCRA.text, SLIDING.text, MIXED_SCRIPT):
            client.script_load(text)
    finally:
        client.close()


def _scripts(url: str) -> int:
    """Script calls (EVALSHA, and EVAL when the script had to be loaded) the server has run since the reset."""
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
        client.config_resetstat()
    finally:
        client.close()
    return sum(int(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0)) for cmd in ("evalsha", "eval"))


def _separate_reads(names: list[str]) -> dict[str, str]:
    """The header fields as the separate ``quota()`` reads give them (the behaviour before one round trip)."""
    gate = RateLimitGate(names)
    request = RequestFactory().get("/", REMOTE_ADDR=PEER)
    return gate.headers(gate._keys(gate.plan(), request))


class PeerAsyncClient(AsyncClient):
    """AsyncClient from PEER (ASGI takes REMOTE_ADDR from scope["client"], not a header)."""

    def _base_scope(self, **request: Any) -> dict[str, Any]:
        scope = super()._base_scope(**request)
        scope["client"] = [PEER, 0]
        return scope


def _fields(response: Any) -> dict[str, str]:
    return {name: response[name] for name in ("RateLimit-Policy", "RateLimit")}


@pytest.mark.parametrize(
    "url",
    [
        "one", "keyed", "multi", "multi-keyed", "drf", "drf-keyed", "drf-multi", "drf-multi-keyed",
        "mixed", "mixed-keyed", "drf-mixed", "drf-mixed-keyed",
    ],
)
def test_one_evalsha_per_request_allowed_and_denied_sync(server: Any, url: str) -> None:
    client = Client(REMOTE_ADDR=PEER)
    names = NAMES[url.removeprefix("drf-") if url != "drf" else "one"]
    _scripts(server.url)
    statuses = []
    for _ in range(3):
        response = client.get(f"/{url}/")
        assert _scripts(server.url) == 1, (url, response.status_code)
        statuses.append(response.status_code)
        assert _fields(response) == _separate_reads(names)
        _scripts(server.url)  # the separate reads are not the request's
    assert statuses == [200, 200, 429]


@pytest.mark.parametrize(
    "url", ["one-async", "keyed-async", "multi-async", "multi-keyed-async", "mixed-async", "mixed-keyed-async"]
)
async def test_one_evalsha_per_request_allowed_and_denied_async(server: Any, url: str) -> None:
    from asgiref.sync import sync_to_async

    client = PeerAsyncClient()
    names = NAMES[url.removesuffix("-async")]
    await sync_to_async(_scripts)(server.url)
    statuses = []
    for _ in range(3):
        response = await client.get(f"/{url}/")
        assert await sync_to_async(_scripts)(server.url) == 1, (url, response.status_code)
        statuses.append(response.status_code)
        assert _fields(response) == await sync_to_async(_separate_reads)(names)
        await sync_to_async(_scripts)(server.url)
    assert statuses == [200, 200, 429]


def test_multi_limit_denied_by_the_long_limit_reports_both_figures(server: Any, r4_clock: Any) -> None:
    # "sustained" (5 per 60 s) runs out while "one" refills every second: the 429 shows both limits' figures.
    client = Client(REMOTE_ADDR=PEER)
    got = []
    for _ in range(3):
        got += [client.get("/multi/").status_code for _ in range(2)]
        r4_clock.advance(1)
    assert got == [200, 200, 200, 200, 200, 429]
    _scripts(server.url)
    response = client.get("/multi/")
    assert _scripts(server.url) == 1
    assert response.status_code == 429
    assert _fields(response) == _separate_reads(["one", "sustained"])
    assert "r=0" in response["RateLimit"].split(",")[1]


def test_a_mixed_gate_refused_in_memory_reads_its_redis_figures_in_one_round_trip(server: Any) -> None:
    """Memory says no first: Redis is not asked to decide, and its figures for the 429 cost one read."""
    client = Client(REMOTE_ADDR=PEER)
    statuses = []
    for _ in range(4):
        _scripts(server.url)
        response = client.get("/mixed-mem-first/")
        assert _scripts(server.url) == 1, response.status_code
        statuses.append(response.status_code)
        assert _fields(response) == _separate_reads(["mem", "sustained"])
    assert statuses == [200, 200, 200, 429]
    assert get_rate_limiter("sustained").metrics.available_permissions == 2  # the 429 took nothing from Redis


@pytest.mark.parametrize("view", [one, keyed, multi, _drf("one"), _drf("per_ip")], ids=["one", "keyed", "multi", "drf", "drf-keyed"])
def test_a_rejected_request_leaves_nothing_to_the_cyclic_gc(server: Any, view: Any) -> None:
    """A 429 is freed as soon as it is answered: the rejection (returned by the one-round-trip decision, then
    raised) keeps no traceback linking back to a frame that holds it, so no reference cycle carries the
    request, the response and every frame of the call to the cyclic GC (found with 52 objects per request)."""
    factory = RequestFactory()

    def requests() -> None:
        for _ in range(3):
            response = view(factory.get("/", REMOTE_ADDR=PEER))
        assert response.status_code == 429

    left = cyclic_garbage(requests)
    assert not [o for o in left if isinstance(o, RequestNotPermitted) or type(o).__name__ in ("frame", "traceback")]
