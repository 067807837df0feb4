"""Demo views: authorization endpoints, the partner switch, probes and the live dashboard."""

from __future__ import annotations

import json

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from health_check.views import HealthCheckView

from django_ratelimit_r4 import state
from django_ratelimit_r4.decorators import ratelimit

from .acquirer import PARTNER, acapture, capture


def _card_and_amount(request: HttpRequest) -> tuple[str, int]:
    card = request.GET.get("card") or request.POST.get("card") or "4111111111111111"
    try:
        amount = int(request.GET.get("amount") or request.POST.get("amount") or 100)
    except ValueError:
        amount = 100
    return card, amount


@csrf_exempt
@ratelimit(["per-client", "authorize-global"])
def authorize(request: HttpRequest) -> JsonResponse:
    """Authorize a payment: 10 per second per client IP and 200 per second overall, all-or-nothing."""
    return JsonResponse(capture(*_card_and_amount(request)))


@csrf_exempt
@ratelimit(["per-client", "authorize-global"])
async def authorize_async(request: HttpRequest) -> JsonResponse:
    """The same under ASGI: every wait is an asyncio wait."""
    return JsonResponse(await acapture(*_card_and_amount(request)))


@csrf_exempt
@require_POST
def partner(request: HttpRequest) -> JsonResponse:
    """Switch the simulated partner down/up and set its latency: {"down": true, "latency_ms": 300}."""
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return JsonResponse({"error": "body must be JSON"}, status=400)
    if "down" in body:
        PARTNER.down = bool(body["down"])
    if "latency_ms" in body:
        PARTNER.latency_s = max(0.0, min(float(body["latency_ms"]), 5000.0)) / 1000
    return JsonResponse({"down": PARTNER.down, "latency_ms": PARTNER.latency_s * 1000})


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


def dashboard_state(request: HttpRequest) -> JsonResponse:
    """This process's live state, for the dashboard (the demo runs one process)."""
    return JsonResponse({"instances": state.snapshot(), "partner": {"down": PARTNER.down,
                         "latency_ms": PARTNER.latency_s * 1000}})
