"""``ResilienceMiddleware``: turn rejections raised below a view into 429/503 responses.

Add it to ``MIDDLEWARE`` and every :class:`~django_ratelimit_r4.exceptions.RequestNotPermitted`,
:class:`~django_ratelimit_r4.exceptions.CallNotPermitted` or
:class:`~django_ratelimit_r4.exceptions.BulkheadFull` that escapes a view (raised by a service, a model
method, a template tag rendered by a ``TemplateResponse``...) becomes the same response the decorators
give: 429 or 503, ``Retry-After`` computed by the instance that rejected, ``Cache-Control: no-store``.
It limits nothing by itself and costs nothing on requests that raise nothing.

It is sync- and async-capable and picks its mode once, in ``__init__`` (django-cors-headers' pattern),
so an async stack never hops to a thread for it. Django runs ``process_exception`` hooks synchronously
(on a worker thread under ASGI); the hook only builds a small response.

In async mode it also starts the event-loop stall detector when ``RATELIMIT_R4["stall_detector"]``
has ``"enabled": True``: one detector per running loop, at the loop's first request (no ``asgi.py``
change needed; a loop already watched, e.g. by ``monitor_asgi``, is left alone). The setting is read
at the first request; afterwards a request pays one attribute check (disabled) or one loop identity
check (enabled).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import markcoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from . import stall
from .core.coroutines import is_async
from .responses import HANDLED_EXCEPTIONS, bulkhead_retry_after_ns, rejection_response

# bulkhead_retry_after_ns and rejection_response live in responses.py; importable from here as before.
__all__ = ["ResilienceMiddleware", "bulkhead_retry_after_ns", "rejection_response"]


class ResilienceMiddleware:
    """Answer rejections raised anywhere below a view with 429/503 (see the module docstring)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        """Wrap ``get_response``; decide sync or async mode once."""
        self.get_response = get_response
        self.async_mode = is_async(get_response)
        if self.async_mode:
            markcoroutinefunction(self)
        # Stall detector (async mode): True until the setting says disabled; the loop already watched.
        self._watch_loops = self.async_mode
        self._watched_loop: asyncio.AbstractEventLoop | None = None
        self._stall_threshold_s: float | None = None

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        """Pass the request on (as a coroutine in async mode)."""
        if self.async_mode:
            return self.__acall__(request)
        response: HttpResponseBase = self.get_response(request)
        return response

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        """Async twin of :meth:`__call__`; starts the stall detector of a new loop when enabled."""
        if self._watch_loops:
            loop = asyncio.get_running_loop()
            if loop is not self._watched_loop:
                self._watch(loop)
        response: HttpResponseBase = await self.get_response(request)
        return response

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        threshold = self._stall_threshold_s
        if threshold is None:  # first request: read the setting once
            options = stall.configured_options()
            if not options.enabled:
                self._watch_loops = False
                return
            threshold = self._stall_threshold_s = options.threshold_ns / 1e9
        stall.ensure_detector(loop, threshold=threshold)
        self._watched_loop = loop

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """Django's hook for exceptions raised by the view: our rejections become 429/503, others pass."""
        if isinstance(exception, HANDLED_EXCEPTIONS):
            return rejection_response(request, exception)
        return None
