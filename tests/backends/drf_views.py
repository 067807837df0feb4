"""A DRF view throttled by the named rate limiters, shared by the round-trip counting tests."""

from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import APIView

from django_ratelimit_r4.rest_framework import RateLimiterThrottle


def drf_view(names: str | list[str]) -> Any:
    """An ``APIView`` answering 200 behind :class:`RateLimiterThrottle` with ``rate_limiter = names``."""

    class View(APIView):  # type: ignore[misc]
        throttle_classes = [RateLimiterThrottle]
        rate_limiter = names

        def get(self, request: Any) -> Response:
            return Response({"ok": True})

    return View.as_view()
