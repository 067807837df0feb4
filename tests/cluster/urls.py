"""URLs of the cluster test site: a breaker-guarded view, and the state endpoint."""

from __future__ import annotations

import os

from django.http import HttpRequest, HttpResponse
from django.urls import include, path

from django_ratelimit_r4.decorators import circuitbreaker


@circuitbreaker("payments")
def pay(request: HttpRequest) -> HttpResponse:
    """200 while this worker's breaker ``payments`` lets calls through (503 when it is open); names the worker."""
    return HttpResponse(headers={"X-Worker-Pid": str(os.getpid())})


urlpatterns = [
    path("pay/", pay),
    path("ops/r4/", include("django_ratelimit_r4.urls")),
]
