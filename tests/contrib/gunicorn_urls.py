"""URLs of the gunicorn test site: a rate-limited view, a breaker switch and django-prometheus' /metrics."""

from __future__ import annotations

import os

from django.http import HttpRequest, HttpResponse
from django.urls import include, path

from django_ratelimit_r4 import get_circuit_breaker
from django_ratelimit_r4.decorators import ratelimit


@ratelimit("api")
def api(request: HttpRequest) -> HttpResponse:
    """10 per second per worker process; the response names the worker."""
    return HttpResponse(headers={"X-Worker-Pid": str(os.getpid())})


def force_open(request: HttpRequest) -> HttpResponse:
    """Force this worker's breaker ``payments`` open."""
    get_circuit_breaker("payments").transition_to_forced_open_state()
    return HttpResponse(headers={"X-Worker-Pid": str(os.getpid())})


urlpatterns = [
    path("api/", api),
    path("force-open/", force_open),
    path("", include("django_prometheus.urls")),
]
