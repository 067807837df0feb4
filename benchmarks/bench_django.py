"""Per-request cost of ``@ratelimit`` through Django's WSGI handler, against the bare view; DRF throttles too.

Target (issue 3): an allowed ``@ratelimit`` view costs at most +5 us over the bare view, a denied one at
most +15 us (the denied request builds a 429 with a problem body instead of running the view).
DRF's ``RateLimiterThrottle`` is shown next to DRF's own ``SimpleRateThrottle`` (``AnonRateThrottle`` on
the local-memory cache) over the same bare ``APIView``.

Each request goes through ``WSGIHandler`` (request object, URL resolution, signals, response) with a
copy of one WSGI environ. Every timing is the best of several interleaved repeats, so the deltas come
from one run on one machine. Run: ``python benchmarks/bench_django.py`` or ``python benchmarks/run.py django``.

``python benchmarks/bench_django.py --peers`` (issue 9) puts a full request through ``WSGIHandler`` side by side
with the peers, allowed and denied, in memory and on Redis (``R4_REDIS_URL``, default redis://127.0.0.1:6379/15):
ours (``@ratelimit`` unkeyed and keyed by ip; DRF ``APIView`` + ``RateLimiterThrottle`` keyed by ip) against DRF's
own ``AnonRateThrottle`` (per ip) on the local-memory cache and on django-redis, with one bare ``EVALSHA`` of a
trivial script on the same Redis as the round-trip reference. Each row's cost is its request minus the bare
request of its kind (function view or ``APIView``; a DRF denied row: an ``APIView`` whose throttle refuses without
I/O, i.e. DRF's own 429 (``Throttled`` raised, handled and rendered), which every DRF throttle pays alike), all callers
interleaved in blocks of 10 requests (medians). An info row puts one bare ``EVALSHA`` where a DRF throttle makes its
round trip (a throttle of an ``APIView``), the reference of a round trip in that place. In DRF's favour: its allowed rows
keep one entry in the window (DRF stores every request's time and pickles the list per request). Targets: ours below the peer on every
path; on Redis, decorated request <= bare view + 1.10x one round trip, and a DRF throttle <= 1.10x one bare
``EVALSHA`` made in its place (the info rows: a round trip costs more inside a DRF request). ``--peers --cpu`` measures this thread's
CPU time instead of wall time (the client's work, robust under load; the wait for Redis is not in it). Needs the
``redis`` extra and
django-redis (in the ``bench`` extra; its rows are skipped without it).
"""

from __future__ import annotations

import itertools
import os
import sys
import time
import timeit
import types
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
from django.conf import settings

try:  # python -m benchmarks.bench_django
    from ._timing import best_pair as _best_pair
except ImportError:  # benchmarks/run.py, or run as a script
    from _timing import best_pair as _best_pair  # type: ignore[no-redef]

__all__ = ["run"]

NUMBER = 2_000
REPEAT = 7
ALLOWED_TARGET_NS = 5_000
DENIED_TARGET_NS = 15_000

BENCH_R4: dict[str, Any] = {
    "ratelimiters": {
        "instances": {
            "bench_open": {"limit_for_period": 1_000_000_000, "limit_refresh_period": "1h"},
            "bench_keyed": {"limit_for_period": 1_000_000_000, "limit_refresh_period": "1h", "key": "ip"},
            "bench_closed": {"limit_for_period": 1, "limit_refresh_period": "1h"},
        }
    },
    "retries": {"instances": {"bench_stack": {}}},
    "circuitbreakers": {"instances": {"bench_stack": {}, "bench_open": {"wait_duration_in_open_state": "1h"}}},
    "bulkheads": {"instances": {"bench_stack": {"max_concurrent_calls": 1000}}},
}


REDIS_URL = os.environ.get("R4_REDIS_URL", "redis://127.0.0.1:6379/15")
#: Keys of the --peers run (ours and django-redis's) go under this prefix and are deleted afterwards.
PEERS_PREFIX = f"r4bench:{uuid.uuid4().hex[:8]}"
PEER_IP_TARGET = 1.10

# --peers: the same instances in memory and on a Redis backend; keyed ones per client ip, as DRF's AnonRateThrottle.
PEERS_R4: dict[str, Any] = {
    "backends": {
        "shared": {"BACKEND": "redis", "LOCATION": REDIS_URL, "OPTIONS": {"key_prefix": PEERS_PREFIX}},
    },
    "ratelimiters": {
        "instances": {
            f"peer_{where}_{shape}_{outcome}": {
                "limit_for_period": 1_000_000_000 if outcome == "open" else 1,
                "limit_refresh_period": "1h",
                **({"key": "ip"} if shape == "keyed" else {}),
                **({"backend": "shared"} if where == "redis" else {}),
            }
            for where in ("memory", "redis")
            for shape in ("unkeyed", "keyed")
            for outcome in ("open", "closed")
        }
    },
}


def _django_redis() -> bool:
    try:
        import django_redis  # noqa: F401
    except ImportError:
        return False
    return True


def _caches() -> dict[str, Any]:
    caches: dict[str, Any] = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    if _django_redis():
        caches["redis"] = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL, "KEY_PREFIX": PEERS_PREFIX}
    return caches


def _configure() -> None:
    if not settings.configured:
        settings.configure(
            SECRET_KEY="bench-only",
            DEBUG=False,
            ALLOWED_HOSTS=["*"],
            ROOT_URLCONF=__name__,
            MIDDLEWARE=[],
            INSTALLED_APPS=[
                "django.contrib.auth",
                "django.contrib.contenttypes",
                "rest_framework",
                "django_ratelimit_r4",
            ],
            DATABASES={},
            CACHES=_caches(),
            LOGGING_CONFIG=None,
            REST_FRAMEWORK={"DEFAULT_AUTHENTICATION_CLASSES": [], "DEFAULT_PERMISSION_CLASSES": []},
            RATELIMIT_R4=BENCH_R4,
        )
    django.setup()


_configure()

from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402
from rest_framework.response import Response  # noqa: E402
from rest_framework.throttling import AnonRateThrottle, BaseThrottle  # noqa: E402
from rest_framework.views import APIView  # noqa: E402

from django_ratelimit_r4.decorators import ratelimit  # noqa: E402
from django_ratelimit_r4.rest_framework import RateLimiterThrottle  # noqa: E402


def bare(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("bench_open")
def allowed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("bench_keyed")
def keyed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("bench_closed")
def denied(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class BigAnonThrottle(AnonRateThrottle):
    rate = "1000000000/hour"


class DrfBare(APIView):
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    throttle_classes: list[Any] = []

    def get(self, request: Any) -> Response:
        return Response("ok")


class DrfR4(DrfBare):
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "bench_open"


class DrfSimple(DrfBare):
    throttle_classes = [BigAnonThrottle]


VIEWS: dict[str, Callable[..., Any]] = {
    "bare": bare,
    "allowed": allowed,
    "keyed": keyed,
    "denied": denied,
    "drf-bare": DrfBare.as_view(),
    "drf-r4": DrfR4.as_view(),
    "drf-simple": DrfSimple.as_view(),
}

# --peers views: (row name, view, expected status, baseline view name).
PEER_VIEWS: dict[str, tuple[str, Callable[..., Any], int, str]] = {}


def _peer_views() -> None:
    import redis
    from django.core.cache import caches

    try:
        from ._timing import bare_evalsha
    except ImportError:
        from _timing import bare_evalsha  # type: ignore[no-redef]

    # The round trip's reference: the bare view plus one bare EVALSHA of a trivial script, on a redis-py client
    # of its own. A round trip inside a request costs more than one in a tight loop (the server has gone idle
    # while the request ran), so the Redis rows count round trips against this one.
    evalsha = bare_evalsha(redis.Redis.from_url(REDIS_URL))

    def round_trip(request: HttpRequest) -> HttpResponse:
        evalsha()
        return HttpResponse("ok")

    VIEWS["bare-rt"] = round_trip

    # The DRF rows' references: one bare EVALSHA where a throttle makes its round trip (DRF's check_throttles),
    # and DRF's own 429 (a throttle that refuses without I/O: DRF raises Throttled and renders it). A denied
    # DRF request pays that 429 whatever the throttle, so DRF denied rows are judged against it + 1.10 RT.
    class RoundTripThrottle(BaseThrottle):
        def allow_request(self, request: Any, view: Any) -> bool:
            evalsha()
            return True

    class RefusingThrottle(BaseThrottle):
        def allow_request(self, request: Any, view: Any) -> bool:
            return False

        def wait(self) -> float:
            return 3600.0

    VIEWS["drf-bare-rt"] = type("DrfBareRT", (DrfBare,), {"throttle_classes": [RoundTripThrottle]}).as_view()
    VIEWS["drf-bare-throttled"] = type("DrfThrottled", (DrfBare,), {"throttle_classes": [RefusingThrottle]}).as_view()

    class RoundTripRefusingThrottle(RefusingThrottle):
        def allow_request(self, request: Any, view: Any) -> bool:
            evalsha()
            return False

    VIEWS["drf-bare-rt-throttled"] = type(
        "DrfThrottledRT", (DrfBare,), {"throttle_classes": [RoundTripRefusingThrottle]}
    ).as_view()

    def function_view(instance: str) -> Callable[..., Any]:
        @ratelimit(instance)
        def view(request: HttpRequest) -> HttpResponse:
            return HttpResponse("ok")

        return view

    for where in ("memory", "redis"):
        for outcome, status in (("open", 200), ("closed", 429)):
            word = "allowed" if outcome == "open" else "denied"
            for shape in ("unkeyed", "keyed"):
                instance = f"peer_{where}_{shape}_{outcome}"
                PEER_VIEWS[f"dec-{where}-{shape}-{word}"] = (
                    f"ours @ratelimit {shape}, {where}, {word}", function_view(instance), status, "bare"
                )
            drf_r4 = type(f"DrfR4_{where}_{outcome}", (DrfBare,), {
                "throttle_classes": [RateLimiterThrottle], "rate_limiter": f"peer_{where}_keyed_{outcome}",
            })
            # A denied DRF request is answered by DRF (Throttled, its handler, a rendered body) whatever the
            # throttle: DRF denied rows count from DRF's own 429 without any throttle.
            drf_base = "drf-bare" if outcome == "open" else "drf-bare-throttled"
            PEER_VIEWS[f"drf-r4-{where}-{word}"] = (
                f"ours DRF RateLimiterThrottle per ip, {where}, {word}", drf_r4.as_view(), status, drf_base
            )
            if where == "redis" and not _django_redis():
                continue
            cache_name = "default" if where == "memory" else "redis"
            attributes: dict[str, Any] = {
                "rate": "1000/hour" if outcome == "open" else "1/hour", "cache": caches[cache_name],
                "scope": f"peer-{where}-{outcome}",
            }
            if outcome == "open":
                # DRF keeps every request's time within the window and (un)pickles the list on each request:
                # its clock jumps 2 h per request, so the window holds one entry (DRF's cheapest allowed path).
                ticks = itertools.count(start=1)
                attributes["timer"] = lambda self, ticks=ticks: next(ticks) * 7200.0
            throttle = type(f"Anon_{where}_{outcome}", (AnonRateThrottle,), attributes)
            drf_own = type(f"DrfOwn_{where}_{outcome}", (DrfBare,), {"throttle_classes": [throttle]})
            cache_label = "LocMemCache" if where == "memory" else "django-redis"
            PEER_VIEWS[f"drf-own-{where}-{word}"] = (
                f"DRF AnonRateThrottle, {cache_label}, {word}", drf_own.as_view(), status, drf_base
            )
urlpatterns = [path(f"{name}/", view) for name, view in VIEWS.items()]


def _urlconf(name: str) -> str:
    """A one-pattern urlconf for ``name``: URL patterns resolve linearly, so each variant gets the
    same resolution cost (first pattern) instead of paying for its position in a shared list."""
    module_name = f"{__name__}_urls_{name.replace('-', '_')}"
    module = types.ModuleType(module_name)
    view = VIEWS[name] if name in VIEWS else PEER_VIEWS[name][1]
    module.urlpatterns = [path(f"{name}/", view)]  # type: ignore[attr-defined]
    sys.modules[module_name] = module
    return module_name


def _caller(name: str, override_settings: Any) -> Callable[[], Any]:
    """One GET of ``/<name>/`` through ``WSGIHandler``, with that variant's urlconf active."""
    from django.core.handlers.wsgi import WSGIHandler
    from django.test.client import RequestFactory

    handler = WSGIHandler()
    environ = RequestFactory()._base_environ(PATH_INFO=f"/{name}/", REQUEST_METHOD="GET", QUERY_STRING="")
    environ["REMOTE_ADDR"] = "203.0.113.7"
    urlconf = override_settings(ROOT_URLCONF=_urlconf(name))

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        pass

    def call() -> Any:
        response = handler(dict(environ), start_response)
        response.close()
        return response

    call.urlconf = urlconf  # type: ignore[attr-defined]
    return call


def _best(callers: dict[str, Callable[[], Any]], number: int, repeat: int) -> dict[str, float]:
    """Best ns/request of each caller, the repeats interleaved so drift hits all of them alike."""
    best = dict.fromkeys(callers, float("inf"))
    for _ in range(repeat):
        for name, fn in callers.items():
            with fn.urlconf:  # type: ignore[attr-defined]
                for _ in range(20):  # warm the resolver of this urlconf
                    fn()
                elapsed = timeit.Timer("f()", globals={"f": fn}).timeit(number)
            best[name] = min(best[name], elapsed / number * 1e9)
    return best


def _row(name: str, ns: float, base: float, budget_ns: float | None, target: str) -> dict[str, Any]:
    delta = ns - base
    return {
        "name": name,
        "ns_per_op": ns,
        "baseline_ns": base,
        "ratio": ns / base,
        "target": target,
        "delta_ns": delta,
        "met": None if budget_ns is None else delta <= budget_ns,
    }


def run(number: int = NUMBER, repeat: int = REPEAT) -> list[dict[str, Any]]:
    """Rows: name, ns_per_op, baseline_ns, ratio, target (plus delta_ns and met)."""
    import logging

    from django.test.utils import override_settings

    # Django logs every 4xx on "django.request" (a 429 too): that is the deployment's logging cost,
    # the same for any 4xx, not the limiter's. Silenced here so the deltas measure this library.
    request_logger = logging.getLogger("django.request")
    old_level = request_logger.level
    request_logger.setLevel(logging.ERROR)
    try:
        return _measure(number, repeat, override_settings)
    finally:
        request_logger.setLevel(old_level)


def _measure(number: int, repeat: int, override_settings: Any) -> list[dict[str, Any]]:
    with override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=[], RATELIMIT_R4=BENCH_R4):
        callers = {name: _caller(name, override_settings) for name in VIEWS}
        for name, call in callers.items():  # warm up: resolve names, fill caches, exhaust bench_closed
            with call.urlconf:  # type: ignore[attr-defined]
                for _ in range(20):
                    response = call()
                assert response.status_code == (429 if name == "denied" else 200), (name, response)
        best = _best(callers, number, repeat)
        stacked_ns, plain_ns = _stack(number * 20, repeat)
        decorated_open_ns, core_open_ns = _open_breaker(number * 20, repeat)
    base, drf = best["bare"], best["drf-bare"]
    return [
        _row("django view, bare (baseline)", base, base, None, "~44 us here"),
        _row(
            "@ratelimit allowed (draft-10 headers)",
            best["allowed"],
            base,
            ALLOWED_TARGET_NS,
            "<= bare + 5 us",
        ),
        _row("@ratelimit keyed by ip, allowed", best["keyed"], base, ALLOWED_TARGET_NS, "<= bare + 5 us"),
        _row("info: keyed over unkeyed (both allowed)", best["keyed"], best["allowed"], None, "info"),
        _row(
            "@ratelimit denied (429 + problem body)",
            best["denied"],
            base,
            DENIED_TARGET_NS,
            "<= bare + 15 us",
        ),
        _row("DRF APIView, no throttle (baseline)", drf, drf, None, ""),
        _row("DRF + RateLimiterThrottle", best["drf-r4"], drf, None, "info"),
        _row("DRF + SimpleRateThrottle (AnonRateThrottle)", best["drf-simple"], drf, None, "info"),
        _row("@resilient(retry, circuitbreaker, bulkhead) service call", stacked_ns, plain_ns, None, "info"),
        _row("CircuitBreaker.call rejected by OPEN (raise + catch)", core_open_ns, core_open_ns, None, "baseline"),
        _row(
            "@circuitbreaker rejected by OPEN, service function",
            decorated_open_ns,
            core_open_ns,
            None,
            "little more than the core's (issue 10, item 9)",
        ),
    ]


def _stack(number: int, repeat: int) -> tuple[float, float]:
    """A plain service function through Resilience4j's stack (Retry > CircuitBreaker > Bulkhead) vs bare."""
    from django_ratelimit_r4.decorators import resilient

    def plain(amount: int) -> int:
        return amount

    stacked = resilient(retry="bench_stack", circuitbreaker="bench_stack", bulkhead="bench_stack")(plain)
    return _best_pair(lambda: stacked(1), lambda: plain(1), number, repeat)


def _open_breaker(number: int, repeat: int) -> tuple[float, float]:
    """A service function's rejection by an OPEN breaker: through ``@circuitbreaker`` vs ``CircuitBreaker.call``.

    The decorator adds one Python frame to the rejection's way out (its wrapper catches, to answer views with
    a 503, and re-raises for anything else): that frame is the floor of any Python decorator that catches.
    """
    from django_ratelimit_r4 import get_circuit_breaker
    from django_ratelimit_r4.core.exceptions import CallNotPermitted
    from django_ratelimit_r4.decorators import circuitbreaker

    def plain(amount: int) -> int:
        return amount

    breaker = get_circuit_breaker("bench_open")
    breaker.transition_to_open_state()
    decorated = circuitbreaker("bench_open")(plain)
    core_call = breaker.call

    def through_decorator() -> None:
        try:  # noqa: SIM105 - what a caller writes; contextlib.suppress would add its own cost
            decorated(1)
        except CallNotPermitted:
            pass

    def through_core() -> None:
        try:  # noqa: SIM105 - same shape as above
            core_call(plain, 1)
        except CallNotPermitted:
            pass

    # Thread CPU time, not wall time: on a shared machine the two sides would otherwise measure the neighbours.
    import time

    timers = [timeit.Timer(fn, timer=time.thread_time) for fn in (through_decorator, through_core)]
    best = [float("inf"), float("inf")]
    for _ in range(repeat):
        for i, timer in enumerate(timers):
            best[i] = min(best[i], timer.timeit(number) / number * 1e9)
    return best[0], best[1]


def urlconf_middleware(get_response: Callable[..., Any]) -> Callable[..., Any]:
    """--peers: each request names its one-pattern urlconf in its environ (every row pays this alike), so the
    callers can be interleaved request by request without switching settings."""

    def middleware(request: Any) -> Any:
        request.urlconf = request.META["r4bench.urlconf"]
        return get_response(request)

    return middleware


def _peer_caller(name: str) -> Callable[[], Any]:
    from django.core.handlers.wsgi import WSGIHandler
    from django.test.client import RequestFactory

    handler = WSGIHandler()
    environ = RequestFactory()._base_environ(PATH_INFO=f"/{name}/", REQUEST_METHOD="GET", QUERY_STRING="")
    environ["REMOTE_ADDR"] = "203.0.113.7"
    environ["r4bench.urlconf"] = _urlconf(name)

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        pass

    def call() -> Any:
        response = handler(dict(environ), start_response)
        response.close()
        return response

    return call


def run_peers(rounds: int = 300, block: int = 10, cpu: bool = False) -> list[dict[str, Any]]:
    """The --peers table: rows ``{name, ns_per_op, baseline_ns, delta_ns, round_trips, peer, target, met}``.

    Round robin: per round, ``block`` requests of each caller in turn (and ``block`` bare ``EVALSHA`` calls),
    each block timed as a whole, so a busy neighbour slows every caller alike while each block runs warm. Each
    figure is the median block's time per request. ``cpu``: this thread's CPU time instead of wall time (what
    the client spends: robust on a loaded machine, but a round trip's wait for the server is not in it).
    """
    import logging
    import statistics

    import redis
    from django.test.utils import override_settings

    try:
        from ._timing import bare_evalsha
    except ImportError:
        from _timing import bare_evalsha  # type: ignore[no-redef]

    request_logger = logging.getLogger("django.request")
    old_level = request_logger.level
    request_logger.setLevel(logging.ERROR)
    client = redis.Redis.from_url(REDIS_URL)
    middleware = [f"{__name__}.urlconf_middleware"]
    try:
        with override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=middleware, RATELIMIT_R4=PEERS_R4):
            _peer_views()
            names = ["bare", "bare-rt", "drf-bare", "drf-bare-rt", "drf-bare-throttled", "drf-bare-rt-throttled",
                     *PEER_VIEWS]
            callers = {name: _peer_caller(name) for name in names}
            for name, call in callers.items():  # warm up; exhaust the denied limits
                for _ in range(20):
                    response = call()
                expected = PEER_VIEWS[name][2] if name in PEER_VIEWS else 429 if "throttled" in name else 200
                assert response.status_code == expected, (name, response.status_code, expected)
            evalsha = bare_evalsha(client)
            clock = time.thread_time_ns if cpu else time.perf_counter_ns
            times: dict[str, list[int]] = {name: [] for name in callers}
            loop: list[int] = []
            order = list(callers.items())
            each = range(block)
            for _ in range(rounds):
                started = clock()
                for _ in each:
                    evalsha()
                loop.append((clock() - started) // block)
                for name, fn in order:
                    started = clock()
                    for _ in each:
                        fn()
                    times[name].append((clock() - started) // block)
                order.reverse()  # no caller always runs right after the same one
    finally:
        request_logger.setLevel(old_level)
        keys = list(client.scan_iter(match=f"*{PEERS_PREFIX}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    best = {name: float(statistics.median(values)) for name, values in times.items()}
    best_rt = float(statistics.median(loop))
    loop_rt = best_rt
    best_rt = best["bare-rt"] - best["bare"]
    rows: list[dict[str, Any]] = [
        {"name": "info: bare EVALSHA in a tight loop", "ns_per_op": loop_rt, "baseline_ns": None, "delta_ns": None,
         "round_trips": loop_rt / best_rt, "peer": None, "target": "", "met": None},
        {"name": "django view + one bare EVALSHA (1 RT)", "ns_per_op": best["bare-rt"], "baseline_ns": best["bare"],
         "delta_ns": best_rt, "round_trips": 1.0, "peer": None, "target": "", "met": None},
        {"name": "django view, bare", "ns_per_op": best["bare"], "baseline_ns": None, "delta_ns": None,
         "round_trips": None, "peer": None, "target": "", "met": None},
        {"name": "DRF APIView, no throttle", "ns_per_op": best["drf-bare"], "baseline_ns": None, "delta_ns": None,
         "round_trips": None, "peer": None, "target": "", "met": None},
        {"name": "info: DRF APIView + throttle making 1 bare EVALSHA", "ns_per_op": best["drf-bare-rt"],
         "baseline_ns": best["drf-bare"], "delta_ns": best["drf-bare-rt"] - best["drf-bare"],
         "round_trips": (best["drf-bare-rt"] - best["drf-bare"]) / best_rt, "peer": None, "target": "", "met": None},
        {"name": "DRF APIView raising Throttled (DRF's 429)", "ns_per_op": best["drf-bare-throttled"],
         "baseline_ns": best["drf-bare"], "delta_ns": best["drf-bare-throttled"] - best["drf-bare"],
         "round_trips": None, "peer": None, "target": "DRF denied rows count from this", "met": None},
        {"name": "info: DRF's 429 + throttle making 1 bare EVALSHA", "ns_per_op": best["drf-bare-rt-throttled"],
         "baseline_ns": best["drf-bare-throttled"],
         "delta_ns": best["drf-bare-rt-throttled"] - best["drf-bare-throttled"],
         "round_trips": (best["drf-bare-rt-throttled"] - best["drf-bare-throttled"]) / best_rt, "peer": None,
         "target": "", "met": None},
    ]
    place_rt = {"allowed": best["drf-bare-rt"] - best["drf-bare"],
                "denied": best["drf-bare-rt-throttled"] - best["drf-bare-throttled"]}
    for name, (label, _, _, base_name) in PEER_VIEWS.items():
        ns, base = best[name], best[base_name]
        delta = ns - base
        where = "redis" if "-redis-" in name else "memory"
        word = name.rsplit("-", 1)[1]
        peer = f"drf-own-{where}-{word}"
        row: dict[str, Any] = {
            "name": label, "ns_per_op": ns, "baseline_ns": base, "delta_ns": delta,
            "round_trips": delta / best_rt if where == "redis" else None, "peer": None, "target": "", "met": None,
        }
        if not name.startswith("drf-own") and peer in best:
            peer_delta = best[peer] - best[PEER_VIEWS[peer][3]]  # DRF's own throttle over its own baseline
            row["peer"] = peer_delta
            ok = delta < peer_delta
            row["target"] = "< peer"
            if where == "redis" and name.startswith("drf-"):
                # Issue 9 asks a DRF throttle to be ahead of every peer; its 1.10 RT is the decorated request's.
                # The fair floor of a DRF throttle is one bare EVALSHA made where the throttle makes its round
                # trip (the info rows above: the same round trip costs more inside a DRF request).
                place = place_rt["denied" if word == "denied" else "allowed"]
                ok = ok and delta <= PEER_IP_TARGET * place
                row["target"] = f"< peer, <= {PEER_IP_TARGET}x bare EVALSHA in its place"
            elif where == "redis":
                ok = ok and delta <= PEER_IP_TARGET * best_rt
                row["target"] = f"< peer, <= {PEER_IP_TARGET} RT"
            row["met"] = ok
        rows.append(row)
    return rows


def print_peers(rows: list[dict[str, Any]]) -> int:
    """Print the --peers table; 1 if a targeted row missed."""
    print(f"{'request through WSGIHandler':52} {'us/req':>8} {'+us':>8} {'x RT':>6} {'peer +us':>9}  target")
    missed = False
    for row in rows:
        cells = [
            f"{row['ns_per_op'] / 1000:8.1f}",
            "" if row["delta_ns"] is None else f"{row['delta_ns'] / 1000:+8.1f}",
            "" if row["round_trips"] is None else f"{row['round_trips']:6.2f}",
            "" if row["peer"] is None else f"{row['peer'] / 1000:+9.1f}",
        ]
        met = "" if row["met"] is None else ("ok" if row["met"] else "MISSED")
        missed = missed or row["met"] is False
        print(f"{row['name']:52} {cells[0]:>8} {cells[1]:>8} {cells[2]:>6} {cells[3]:>9}  {row['target']} {met}")
    return 1 if missed else 0


if __name__ == "__main__" and "--peers" in sys.argv:
    raise SystemExit(print_peers(run_peers(cpu="--cpu" in sys.argv)))

if __name__ == "__main__":
    print(f"{'benchmark':46} {'ns/op':>9} {'baseline':>9} {'ratio':>6} {'delta':>9}  target")
    for row in run():
        met = "" if row["met"] is None else ("ok" if row["met"] else "MISSED")
        print(
            f"{row['name']:46} {row['ns_per_op']:9.0f} {row['baseline_ns']:9.0f} {row['ratio']:6.2f} "
            f"{row['delta_ns']:+9.0f}  {row['target']} {met}"
        )
