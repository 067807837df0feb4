"""``X-Worker-Pid`` on every response, so the dashboard can tell the gunicorn workers apart, and the
count of every answer of the authorization endpoints, whoever sent the request (the dashboard's charts)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from django.utils.decorators import sync_and_async_middleware

from .traffic import TrafficCounter

__all__ = ["TRAFFIC", "count_traffic", "worker_pid"]

#: What this process answered on /authorize and /authorize-async (state.json reports it).
TRAFFIC = TrafficCounter()
_COUNTED = frozenset({"authorize", "authorize-async"})

@sync_and_async_middleware
def worker_pid(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Add ``X-Worker-Pid`` (this process's id) to every response; sync or async like the stack."""
    if iscoroutinefunction(get_response):

        async def amiddleware(request: HttpRequest) -> HttpResponseBase:
            response: HttpResponseBase = await get_response(request)
            # getpid() per response, not at import: with gunicorn --preload the import runs in the master.
            response["X-Worker-Pid"] = str(os.getpid())
            return response

        return amiddleware

    def middleware(request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase = get_response(request)
        response["X-Worker-Pid"] = str(os.getpid())
        return response

    return middleware


def _count(request: HttpRequest, response: HttpResponseBase) -> None:
    match = request.resolver_match
    if match is None or match.url_name not in _COUNTED:
        return
    status = response.status_code
    if status == 200:
        kind = getattr(response, "outcome", "approved")  # the view marks a fallback's decline
    else:
        kind = str(status) if status in (429, 503) else "other"
    TRAFFIC.count(kind, response.get("Retry-After"))


@sync_and_async_middleware
def count_traffic(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Count each answer of the authorization endpoints in :data:`TRAFFIC` (429s and 503s included)."""
    if iscoroutinefunction(get_response):

        async def amiddleware(request: HttpRequest) -> HttpResponseBase:
            response: HttpResponseBase = await get_response(request)
            _count(request, response)
            return response

        return amiddleware

    def middleware(request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase = get_response(request)
        _count(request, response)
        return response

    return middleware
