"""``core.coroutines.is_async``: one answer for every way a callable can be async, on Python 3.10 to 3.13.

Run under 3.10 and 3.13 too (tox -e py310-django52,py313-django52 -- tests/core/test_coroutines.py): before 3.12,
``asgiref.sync.markcoroutinefunction`` marks differently from ``inspect`` and ``inspect`` did not see it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
from typing import Any
from unittest import mock

import pytest
from asgiref.sync import markcoroutinefunction

from django_ratelimit_r4.core.adaptivethrottler import AdaptiveThrottler
from django_ratelimit_r4.core.bulkhead import Bulkhead
from django_ratelimit_r4.core.circuitbreaker import CircuitBreaker
from django_ratelimit_r4.core.coroutines import is_async
from django_ratelimit_r4.core.ratelimiter import RateLimiter
from django_ratelimit_r4.core.retry import Retry
from django_ratelimit_r4.core.timelimiter import TimeLimiter


async def coro(x: int = 1) -> int:
    return x


def plain(x: int = 1) -> int:
    return x


def _asgiref_marked() -> Any:
    def handler(x: int = 1) -> Any:
        return coro(x)

    return markcoroutinefunction(handler)


class Service:
    async def afetch(self, x: int = 1) -> int:
        return x

    def fetch(self, x: int = 1) -> int:
        return x

    @staticmethod
    async def astatic(x: int = 1) -> int:
        return x

    @classmethod
    async def aclass(cls, x: int = 1) -> int:
        return x


class AsyncCallable:
    async def __call__(self, x: int = 1) -> int:
        return x


class SyncCallable:
    def __call__(self, x: int = 1) -> int:
        return x


class MarkedInstance:
    """What Django's async-capable middleware does: the instance itself is marked (its __call__ is sync)."""

    def __init__(self) -> None:
        markcoroutinefunction(self)

    def __call__(self, x: int = 1) -> Any:
        return coro(x)


ASYNC: list[tuple[str, Any]] = [
    ("async def", coro),
    ("asgiref markcoroutinefunction", _asgiref_marked()),
    ("partial of async def", functools.partial(coro, 2)),
    ("partial of a partial", functools.partial(functools.partial(coro), 2)),
    ("partial of asgiref-marked", functools.partial(_asgiref_marked(), 2)),
    ("bound async method", Service().afetch),
    ("async staticmethod", Service.astatic),
    ("async classmethod", Service.aclass),
    ("partial of a bound async method", functools.partial(Service().afetch, 2)),
    ("object with async __call__", AsyncCallable()),
    ("partial of an object with async __call__", functools.partial(AsyncCallable(), 2)),
    ("marked instance (middleware)", MarkedInstance()),
    ("AsyncMock", mock.AsyncMock(return_value=1)),
]
SYNC: list[tuple[str, Any]] = [
    ("def", plain),
    ("lambda", lambda: 1),
    ("partial of def", functools.partial(plain, 2)),
    ("bound sync method", Service().fetch),
    ("object with sync __call__", SyncCallable()),
    ("a class with async __call__ (calling it builds an instance)", AsyncCallable),
    ("builtin", len),
    ("not callable", None),
    ("Mock", mock.Mock()),
]
if sys.version_info >= (3, 12):

    def _inspect_marked() -> Any:
        def handler(x: int = 1) -> Any:
            return coro(x)

        return inspect.markcoroutinefunction(handler)  # type: ignore[attr-defined,unused-ignore]

    ASYNC.append(("inspect.markcoroutinefunction", _inspect_marked()))
    ASYNC.append(("partial of inspect-marked", functools.partial(_inspect_marked(), 2)))


@pytest.mark.parametrize(("what", "fn"), ASYNC, ids=[w for w, _ in ASYNC])
def test_async_callables_are_async(what: str, fn: Any) -> None:
    assert is_async(fn), what


@pytest.mark.parametrize(("what", "fn"), SYNC, ids=[w for w, _ in SYNC])
def test_sync_callables_are_not(what: str, fn: Any) -> None:
    assert not is_async(fn), what


def test_it_agrees_with_asgiref_where_asgiref_answers() -> None:
    # Django decides sync vs async with asgiref: on every callable asgiref recognises, is_async says the same.
    from asgiref.sync import iscoroutinefunction

    for what, fn in ASYNC + SYNC:
        if iscoroutinefunction(fn):
            assert is_async(fn), what


PRIMITIVES = {
    "ratelimiter": lambda: RateLimiter("r"),
    "bulkhead": lambda: Bulkhead("b"),
    "circuitbreaker": lambda: CircuitBreaker("c"),
    "retry": lambda: Retry("t"),
    "adaptivethrottler": lambda: AdaptiveThrottler("a"),
    "timelimiter": lambda: TimeLimiter("l"),
}
MARKED = {
    "asgiref-marked": _asgiref_marked,
    "object with async __call__": AsyncCallable,
    "partial of asgiref-marked": lambda: functools.partial(_asgiref_marked()),
}


@pytest.mark.parametrize("primitive", PRIMITIVES)
@pytest.mark.parametrize("make", MARKED.values(), ids=list(MARKED))
def test_every_primitive_decorates_a_marked_callable_as_async(primitive: str, make: Any) -> None:
    # Before is_async the core checked with inspect only: on 3.10/3.11 an asgiref-marked handler got the sync
    # wrapper, which returned an un-awaited coroutine outside the primitive's guard.
    wrapped = PRIMITIVES[primitive]().decorate(make())
    assert inspect.iscoroutinefunction(wrapped)
    assert asyncio.run(wrapped(x=7)) == 7
