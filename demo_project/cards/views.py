"""Demo views: authorization endpoints, the partner switch, probes, the stall demo and the live dashboard."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from health_check.views import HealthCheckView

from django_ratelimit_r4 import get_bulkhead, get_circuit_breaker, get_rate_limiter, stall
from django_ratelimit_r4.decorators import ratelimit
from django_ratelimit_r4.registry import get_keyed_rate_limiter

from .acquirer import (
    CLUSTER_METER,
    METER,
    PARTNER,
    AcquirerError,
    acapture,
    acapture_strict,
    capture,
    capture_strict,
)
from .middleware import TRAFFIC

#: /block never blocks longer than this: enough to see a stall, short of gunicorn's worker timeout.
MAX_BLOCK_MS = 2000
_PROBLEM = "application/problem+json"


def _card_and_amount(request: HttpRequest) -> tuple[str, int]:
    card = request.GET.get("card") or request.POST.get("card") or "4111111111111111"
    try:
        amount = int(request.GET.get("amount") or request.POST.get("amount") or 100)
    except ValueError:
        amount = 100
    return card, amount


def _answer(result: dict[str, object]) -> JsonResponse:
    """The terminal's answer; marks a fallback's decline for the traffic counter (both are 200s)."""
    response = JsonResponse(result)
    response.outcome = "declined" if result.get("status") == "DECLINED" else "approved"  # type: ignore[attr-defined]
    return response


def _partner_failed() -> JsonResponse:
    # What a terminal gets without the fallback when the partner itself fails: an error, not an answer.
    return JsonResponse({"type": "about:blank", "title": "Bad Gateway", "status": 502,
                         "detail": "the acquirer failed"}, status=502, content_type=_PROBLEM)


@csrf_exempt
@ratelimit(["per-client", "authorize-global"])
def authorize(request: HttpRequest) -> JsonResponse:
    """Authorize a payment: 10 per second per client IP and 200 per second overall, all-or-nothing.

    ``?fallback=0`` skips the "temporarily unavailable" fallback: an open breaker or a full bulkhead
    then becomes a 503 with ``Retry-After`` (ResilienceMiddleware) and a partner error a 502.
    """
    card, amount = _card_and_amount(request)
    if request.GET.get("fallback") == "0":
        try:
            return _answer(capture_strict(card, amount))
        except AcquirerError:
            return _partner_failed()
    return _answer(capture(card, amount))


@csrf_exempt
@ratelimit(["per-client", "authorize-global"])
async def authorize_async(request: HttpRequest) -> JsonResponse:
    """The same under ASGI: every wait is an asyncio wait."""
    card, amount = _card_and_amount(request)
    if request.GET.get("fallback") == "0":
        try:
            return _answer(await acapture_strict(card, amount))
        except AcquirerError:
            return _partner_failed()
    return _answer(await acapture(card, amount))


@csrf_exempt
@require_POST
def partner(request: HttpRequest) -> JsonResponse:
    """Switch the simulated partner down/up and set its latency: {"down": true, "latency_ms": 300}.

    With ``DEMO_STATE_DIR`` set (gunicorn/uvicorn via serve.py) the change reaches every worker.
    """
    try:
        body = json.loads(request.body or b"{}")
        if "down" in body:
            PARTNER.down = bool(body["down"])
        if "latency_ms" in body:
            PARTNER.latency_s = float(body["latency_ms"]) / 1000
    except (ValueError, TypeError, AttributeError):
        return JsonResponse({"error": 'body must be JSON like {"down": true, "latency_ms": 300}'}, status=400)
    return JsonResponse(PARTNER.as_dict())


async def block(request: HttpRequest) -> JsonResponse:
    """Deliberately block the event loop for ``?ms=100`` (max 2000): the stall detector's demo.

    ``time.sleep`` inside a coroutine is the bug the detector exists to find: under uvicorn every other
    request of this worker waits too, and ``django_ratelimit_r4.stall`` logs this line's stack.
    """
    try:
        ms = max(0, min(int(request.GET.get("ms", "100")), MAX_BLOCK_MS))
    except ValueError:
        return JsonResponse({"error": "ms must be an integer"}, status=400)
    started = time.perf_counter()
    time.sleep(ms / 1000)  # the deliberate mistake: should be `await asyncio.sleep(...)`
    return JsonResponse({"blocked_ms": round((time.perf_counter() - started) * 1000, 1)})


def live(request: HttpRequest) -> HttpResponse:
    """Liveness: the process answers. Nothing else, and never limiter state."""
    return HttpResponse("ok", content_type="text/plain")


def ready(request: HttpRequest) -> HttpResponse:
    """Readiness: the database answers. A saturated limiter or an open breaker is the system working."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return HttpResponse("ok", content_type="text/plain")


#: Informational: every limiter, bulkhead and breaker, always 200 for normal states.
resilience_health = HealthCheckView.as_view(checks=["django_ratelimit_r4.health.ResilienceState"])


def dashboard(request: HttpRequest) -> HttpResponse:
    """The live dashboard (polls dashboard/state.json)."""
    return render(request, "cards/dashboard.html")


def _stalls() -> dict[str, float]:
    stats = [d.snapshot() for d in stall.get_detectors()]
    return {"detectors": len(stats), "stalls_total": sum(s.stalls_total for s in stats),
            "max_stall_ms": round(max((s.max_stall_seconds for s in stats), default=0.0) * 1000, 1)}


def _limiters() -> dict[str, dict[str, object]]:
    """Counters of the two rate limiters: how many requests each let through or turned away, in total.

    Counts only: no client key (an IP address) ever leaves the server here. The full state, keys
    included, is the state endpoint's, for operators with its token (``manage.py r4 status --url``).
    """
    clients = get_keyed_rate_limiter("per-client")
    live = clients.metrics.live_keys
    overall = get_rate_limiter("authorize-global")
    return {
        "per-client": {
            "granted": clients.metrics.successful_calls,
            "rejected": clients.metrics.failed_calls,
            "clients": live if live is not None and live >= 0 else None,  # Redis cannot count them
        },
        "authorize-global": {
            "granted": overall.metrics.successful_calls,
            "rejected": overall.metrics.failed_calls,
            "available": overall.metrics.available_permissions,
        },
    }


def _adaptive(bulkhead: Any) -> dict[str, Any] | None:
    """The adaptive limit's algorithm and, for littles_law, the no-load latency it multiplies (None if fixed)."""
    adaptive = bulkhead.config.adaptive
    if adaptive is None:
        return None
    noload = getattr(bulkhead.adaptive_limit, "no_load_latency_ns", None)
    return {
        "algorithm": adaptive.algorithm,
        "headroom": adaptive.headroom,
        "no_load_latency_ms": None if not noload else round(noload / 1e6, 1),
    }


def dashboard_state(request: HttpRequest) -> JsonResponse:
    """What the dashboard draws, from the worker that answered: aggregate counters, never client keys.

    Each worker has its own counters (and, with the memory backend, its own limiters, bulkhead and
    breaker): the page adds up the workers it has heard from.
    """
    breaker, bulkhead = get_circuit_breaker("acquirer"), get_bulkhead("acquirer")
    return JsonResponse({
        "pid": os.getpid(),
        "server": "asgi" if isinstance(request, ASGIRequest) else "wsgi",
        "backend": settings.DEMO_BACKEND,
        "traffic": TRAFFIC.snapshot(),
        "limiters": _limiters(),
        "breaker": {
            "state": breaker.state.name,
            "failure_rate": breaker.metrics.failure_rate,
            "remaining_open_seconds": breaker.remaining_open_ns() / 1e9,
            "not_permitted": breaker.metrics.total_not_permitted_calls,
            "shared": bool(getattr(breaker, "shared", False)),  # make demo-cluster: one breaker for every worker
        },
        "bulkhead": {
            "max": bulkhead.metrics.max_allowed_concurrent_calls,
            "in_use": bulkhead.metrics.max_allowed_concurrent_calls - bulkhead.metrics.available_concurrent_calls,
            "rejected": bulkhead.metrics.rejected_calls,
            "adaptive": _adaptive(bulkhead),
        },
        "partner": PARTNER.as_dict(),
        "partner_calls": METER.snapshot(),
        # make demo-cluster: what the partner sees from every worker of every host (None otherwise).
        "partner_cluster": CLUSTER_METER.snapshot() if CLUSTER_METER is not None else None,
        "stalls": _stalls(),
    })
