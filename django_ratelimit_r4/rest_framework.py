"""Django REST framework integration: a throttle backed by named rate limiters, and an exception handler.

::

    from django_ratelimit_r4.rest_framework import RateLimiterThrottle

    class SearchView(APIView):
        throttle_classes = [RateLimiterThrottle]
        rate_limiter = "api"            # or a list (all-or-nothing); falls back to throttle_scope

    REST_FRAMEWORK = {"EXCEPTION_HANDLER": "django_ratelimit_r4.rest_framework.exception_handler"}

:class:`RateLimiterThrottle` consults the named limiter (per client when the instance has a ``key``),
returns the limiter's real wait from :meth:`~RateLimiterThrottle.wait` so DRF's 429 carries the right
``Retry-After``, and adds the RateLimit header fields to the response. It combines with other
throttles as DRF intends (DRF answers with the largest wait). :func:`exception_handler` answers our
rejections raised inside DRF views (429, or 503 for circuit breakers and bulkheads, with
``Retry-After``) and delegates everything else to DRF's own handler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rest_framework.throttling import BaseThrottle
from rest_framework.views import exception_handler as drf_exception_handler

from .decorators import RateLimitGate
from .middleware import rejection_response
from .responses import HANDLED_EXCEPTIONS

__all__ = ["RateLimiterThrottle", "exception_handler"]

_gates: dict[tuple[tuple[str, ...], int], RateLimitGate] = {}


def _gate(names: str | Sequence[str], permits: int) -> RateLimitGate:
    """One gate per (names, permits), shared by every view and request that uses them."""
    key = ((names,) if isinstance(names, str) else tuple(names), permits)
    gate = _gates.get(key)
    if gate is None:
        gate = _gates.setdefault(key, RateLimitGate(key[0], permits=permits))
    return gate


class RateLimiterThrottle(BaseThrottle):  # type: ignore[misc,unused-ignore]  # typed only with DRF stubs
    """DRF throttle that asks the view's named rate limiter(s).

    The view sets ``rate_limiter = "api"`` (or a list, decided all-or-nothing), else its
    ``throttle_scope`` names the limiter; a view with neither is not throttled. Optional
    ``rate_limiter_permits`` (default 1) is the cost of one request. Per-client limits come from the
    instance's ``key`` option, computed on DRF's request (so ``"user"`` sees DRF authentication).
    """

    def __init__(self) -> None:
        """DRF builds one throttle per request; the wait of a rejection is kept here for :meth:`wait`."""
        self._wait: float | None = None

    def allow_request(self, request: Any, view: Any) -> bool:
        """Take the permits for this request; False (throttled) when a limiter rejects."""
        names = getattr(view, "rate_limiter", None) or getattr(view, "throttle_scope", None)
        if not names:
            return True
        gate = _gate(names, getattr(view, "rate_limiter_permits", 1))
        rejection, headers = gate.check(request)
        view_headers = getattr(view, "headers", None)
        if isinstance(view_headers, dict):
            # APIView.finalize_response copies view.headers onto the response, throttled or not.
            view_headers.update(headers)
            if rejection is not None:
                view_headers["Cache-Control"] = "no-store"
        if rejection is None:
            return True
        self._wait = rejection.wait_ns / 1e9
        return False

    def wait(self) -> float | None:
        """Seconds until the rejecting limiter admits the request (DRF rounds it up for ``Retry-After``)."""
        return self._wait


def exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    """DRF ``EXCEPTION_HANDLER``: 429/503 for our rejections, DRF's handler for everything else."""
    if isinstance(exc, HANDLED_EXCEPTIONS):
        return rejection_response(context["request"], exc)
    return drf_exception_handler(exc, context)
