"""Per-request cost of ``@ratelimit`` through Django's WSGI handler, against the bare view; DRF throttles too.

Target (issue 3): an allowed ``@ratelimit`` view costs at most +5 us over the bare view, a denied one at
most +15 us (the denied request builds a 429 with a problem body instead of running the view).
DRF's ``RateLimiterThrottle`` is shown next to DRF's own ``SimpleRateThrottle`` (``AnonRateThrottle`` on
the local-memory cache) over the same bare ``APIView``.

Each request goes through ``WSGIHandler`` (request object, URL resolution, signals, response) with a
copy of one WSGI environ. Every timing is the best of several interleaved repeats, so the deltas come
from one run on one machine. Run: ``python benchmarks/bench_django.py`` or ``python benchmarks/run.py django``.
"""

from __future__ import annotations

import sys
import timeit
import types
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
            CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
            LOGGING_CONFIG=None,
            REST_FRAMEWORK={"DEFAULT_AUTHENTICATION_CLASSES": [], "DEFAULT_PERMISSION_CLASSES": []},
            RATELIMIT_R4=BENCH_R4,
        )
    django.setup()


_configure()

from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402
from rest_framework.response import Response  # noqa: E402
from rest_framework.throttling import AnonRateThrottle  # noqa: E402
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
urlpatterns = [path(f"{name}/", view) for name, view in VIEWS.items()]


def _urlconf(name: str) -> str:
    """A one-pattern urlconf for ``name``: URL patterns resolve linearly, so each variant gets the
    same resolution cost (first pattern) instead of paying for its position in a shared list."""
    module_name = f"{__name__}_urls_{name.replace('-', '_')}"
    module = types.ModuleType(module_name)
    module.urlpatterns = [path(f"{name}/", VIEWS[name])]  # type: ignore[attr-defined]
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


if __name__ == "__main__":
    print(f"{'benchmark':46} {'ns/op':>9} {'baseline':>9} {'ratio':>6} {'delta':>9}  target")
    for row in run():
        met = "" if row["met"] is None else ("ok" if row["met"] else "MISSED")
        print(
            f"{row['name']:46} {row['ns_per_op']:9.0f} {row['baseline_ns']:9.0f} {row['ratio']:6.2f} "
            f"{row['delta_ns']:+9.0f}  {row['target']} {met}"
        )
