"""Whether a callable is async: the one check every primitive, decorator and middleware uses.

``inspect.iscoroutinefunction`` alone disagrees with Django on Python 3.10 and 3.11: there
``asgiref.sync.markcoroutinefunction`` (what Django's own async-capable middleware and views use) marks a
function with asyncio's legacy ``_is_coroutine`` attribute, which only ``asyncio.iscoroutinefunction`` and
asgiref read; from 3.12 both mark with ``inspect.markcoroutinefunction``. And neither sees an object whose
class defines ``async def __call__``. :func:`is_async` answers all of them alike on every supported Python,
without importing asgiref or Django (``core`` stays Django-free).
"""

from __future__ import annotations

import asyncio.coroutines
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeGuard, TypeVar, overload

__all__ = ["is_async", "twin_wrapper"]

#: asyncio's legacy marker (``asyncio.coroutines._is_coroutine``), set by ``asgiref.sync.markcoroutinefunction`` and
#: ``unittest.mock.AsyncMock`` on Python < 3.12 (still defined on 3.12 and 3.13; None where a Python drops it).
_LEGACY_MARK: object | None = getattr(asyncio.coroutines, "_is_coroutine", None)

P = ParamSpec("P")
R = TypeVar("R")


def _marked(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or (
        _LEGACY_MARK is not None and getattr(fn, "_is_coroutine", None) is _LEGACY_MARK
    )


@overload
def is_async(fn: Callable[P, object]) -> TypeGuard[Callable[P, Awaitable[Any]]]: ...
@overload
def is_async(fn: object) -> TypeGuard[Callable[..., Awaitable[Any]]]: ...


def is_async(fn: object) -> bool:
    """True when calling ``fn`` returns an awaitable to await: an ``async def`` function, a function marked with
    ``inspect.markcoroutinefunction`` or ``asgiref.sync.markcoroutinefunction``, a ``functools.partial`` or a
    bound method of one, or an object whose class defines ``async def __call__``.

    A plain function that happens to return a coroutine cannot be told apart (as with ``inspect``): mark it.
    Decoration time only, never per call.
    """
    while True:
        if _marked(fn):
            return True
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif inspect.ismethod(fn):
            fn = fn.__func__
        else:
            break
    if inspect.isroutine(fn) or isinstance(fn, type) or not callable(fn):
        return False
    # A callable object: what its class's __call__ is (looked up on the type, as a call does).
    call = getattr(type(fn), "__call__", None)  # noqa: B004
    return call is not None and _marked(call)


def twin_wrapper(
    fn: Callable[P, R], call: Callable[..., Any], acall: Callable[..., Awaitable[Any]]
) -> Callable[P, R]:
    """What every primitive's ``decorate(fn)`` returns: for an async ``fn`` (:func:`is_async`) an ``async def``
    wrapper awaiting ``acall(fn, *args, **kwargs)``, else a wrapper returning ``call(fn, *args, **kwargs)``;
    both carry ``fn``'s name and docstring (``functools.wraps``)."""
    if is_async(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            return await acall(fn, *args, **kwargs)

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        return call(fn, *args, **kwargs)  # type: ignore[no-any-return]

    return wrapper
