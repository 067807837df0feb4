"""A decorator used without its parentheses fails at import with a TypeError that says what to write."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_ratelimit_r4 import decorators


@pytest.mark.parametrize(
    ("decorator", "fix"),
    [
        (decorators.ratelimit, '@ratelimit("name")'),
        (decorators.bulkhead, '@bulkhead("name")'),
        (decorators.circuitbreaker, '@circuitbreaker("name")'),
        (decorators.retry, '@retry("name")'),
        (decorators.timelimiter, '@timelimiter("name")'),
        (decorators.resilient, '@resilient(circuitbreaker="name", ...)'),
    ],
)
@pytest.mark.parametrize("asynchronous", [False, True])
def test_bare_decorator_names_the_fix(decorator: Callable[..., Any], fix: str, asynchronous: bool) -> None:
    with pytest.raises(TypeError, match=re.escape(fix)) as raised:
        if asynchronous:

            @decorator
            async def view(request: HttpRequest) -> HttpResponse:
                return HttpResponse("ok")

        else:

            @decorator
            def view(request: HttpRequest) -> HttpResponse:  # type: ignore[no-redef]
                return HttpResponse("ok")

    message = str(raised.value)
    assert "without arguments" in message and "view" in message  # names the decorated function


def test_bare_decorator_through_method_decorator() -> None:
    with pytest.raises(TypeError, match=re.escape('@ratelimit("name")')):

        class Search(View):
            @method_decorator(decorators.ratelimit)
            def get(self, request: HttpRequest) -> HttpResponse:
                return HttpResponse("ok")


def test_names_must_still_be_strings() -> None:
    with pytest.raises(TypeError, match="rate limiter names must be non-empty strings"):
        decorators.ratelimit([1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="bulkhead must be an instance name"):
        decorators.bulkhead(3)  # type: ignore[arg-type]
