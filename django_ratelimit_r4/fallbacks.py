"""Fallbacks, as in Resilience4j: which exceptions a fallback handles and the arguments it gets.

A ``fallback`` gets the protected function's arguments plus the exception:
``fallback(*args, exc, **kwargs)``. Keyword arguments given for positional parameters are passed
positionally (:func:`fallback_args`), so ``def fallback(request, pk, exc)`` works with URL kwargs.
The exception parameter's annotation chooses which exceptions it handles (:func:`fallback_exceptions`:
``exc: CallNotPermitted``, a union, ...); without one it handles every ``Exception``.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["fallback_args", "fallback_exceptions"]


def _exception_types(annotation: Any) -> tuple[type[BaseException], ...]:
    if isinstance(annotation, type) and issubclass(annotation, BaseException):
        return (annotation,)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        if all(isinstance(m, type) and issubclass(m, BaseException) for m in members):
            return members
    return ()


def fallback_exceptions(fallback: Callable[..., Any]) -> tuple[type[BaseException], ...]:
    """Which exceptions ``fallback`` handles: its last positional parameter's annotation, else ``Exception``.

    Resilience4j picks a fallback by the type of its exception parameter; this is the Python reading.
    """
    try:
        params = [
            p
            for p in inspect.signature(fallback).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return (Exception,)
    if not params:
        return (Exception,)
    annotation = params[-1].annotation
    if isinstance(annotation, str):
        try:
            annotation = typing.get_type_hints(fallback).get(params[-1].name, annotation)
        except Exception:  # an unresolvable forward reference: be permissive
            return (Exception,)
    return _exception_types(annotation) or (Exception,)


def fallback_args(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments normalised to the protected function's signature, so the exception can follow them."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return args, kwargs
    return bound.args, bound.kwargs

