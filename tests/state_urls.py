"""URLconf of the operations tests: the state endpoint, the health check and a rate-limited view."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from health_check.views import HealthCheckView

from django_ratelimit_r4 import get_rate_limiter


def limited(request: HttpRequest) -> HttpResponse:
    """10 calls per second through the "api" limiter of tests.settings; a 429 beyond."""
    if get_rate_limiter("api").acquire_permission():
        return HttpResponse("ok")
    return HttpResponse("slow down", status=429)


urlpatterns = [
    path("ops/r4/", include("django_ratelimit_r4.urls")),
    path(
        "healthz/resilience", HealthCheckView.as_view(checks=["django_ratelimit_r4.health.ResilienceState"])
    ),
    path("limited", limited),
]
