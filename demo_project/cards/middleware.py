"""``X-Worker-Pid`` on every response, so the dashboard can tell the gunicorn workers apart."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from django.utils.decorators import sync_and_async_middleware

__all__ = ["worker_pid"]

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
