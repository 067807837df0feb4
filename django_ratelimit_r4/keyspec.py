"""The grammar of a rate limiter's ``key`` spec: which specs are valid (the one source of that rule).

A spec is ``None`` (unkeyed), one of :data:`BUILTIN_KEYS`, ``"header:<Name>"``, a dotted path to
``callable(request) -> str | None`` or such a callable itself. :func:`validate_key_spec` says what is wrong
with one; the settings (:mod:`~django_ratelimit_r4.conf`) turn its message into a check problem and
:func:`~django_ratelimit_r4.keys.compile_key` into a ``ValueError``. It lives apart from
:mod:`~django_ratelimit_r4.keys` (which turns a valid spec into a request function, the HTTP edge) so the
settings layer can validate specs without importing the request edge.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

__all__ = ["BUILTIN_KEYS", "HEADER_PREFIX", "resolve_key_callable", "validate_key_spec"]

#: The spec names understood without a dotted path ("header:<Name>" aside).
BUILTIN_KEYS = ("ip", "user", "user_or_ip", "session")
#: The prefix of a header spec, ``"header:X-Api-Key"``.
HEADER_PREFIX = "header:"


def _check_header_name(name: str) -> str | None:
    if not name.strip():
        return "the header name after 'header:' is empty (e.g. 'header:X-Api-Key')"
    if not all(c.isalnum() or c in "-_" for c in name.strip()) or not name.isascii():
        return f"'{name}' is not a valid HTTP header name (letters, digits and '-')"
    return None


def resolve_key_callable(path: str) -> tuple[Callable[[Any], Any] | None, str | None]:
    """Import the key function at dotted ``path``: ``(function, None)``, or ``(None, error message)``."""
    try:
        obj = import_string(path)
    except ImportError as exc:
        return None, f"cannot import key function '{path}': {exc}"
    if not callable(obj):
        return None, f"key function '{path}' is not callable"
    return obj, None


def _unknown(spec: str) -> str:
    return (
        f"unknown key '{spec}': use 'ip', 'user', 'user_or_ip', 'session', 'header:<Name>' "
        "or a dotted path to a callable(request) -> str | None"
    )


def validate_key_spec(spec: object, *, imports: bool = True) -> str | None:
    """Return an error message for an invalid key spec, or ``None`` when it is valid.

    Imports dotted paths (so it belongs in system checks, not on a request path); with ``imports=False`` a
    dotted path is only checked for its shape (a decorator's ``key=``: it may name a function of the module
    being imported).
    """
    if spec is None:
        return None
    if callable(spec) and not isinstance(spec, str):
        return _call_error(spec, getattr(spec, "__qualname__", None) or repr(spec))
    if not isinstance(spec, str):
        return f"key must be a string or a callable, got {type(spec).__name__}"
    if spec in BUILTIN_KEYS:
        return None
    if spec.startswith(HEADER_PREFIX):
        return _check_header_name(spec[len(HEADER_PREFIX) :])
    if "." not in spec or spec.startswith(".") or spec.endswith("."):
        return _unknown(spec)
    if not imports:
        return None
    fn, error = resolve_key_callable(spec)
    return error if fn is None else _call_error(fn, spec)


def _call_error(fn: Callable[..., Any], shown: str) -> str | None:
    """Why ``fn`` cannot be called as ``key(request)`` (a TypeError at every request, a 500), or None."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
        # Its coroutine, never awaited, would be the key: a new one per request, so no limit at all.
        return (
            f"key function '{shown}' is a coroutine function (async def): key functions are called, not awaited, "
            "so every request would get a key of its own and no limit; make it a plain def (in an async view, "
            "set reads_user / reads_session on it to have request.user / request.session loaded first)"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins): the first request will tell
        return None
    try:
        signature.bind(None)
    except TypeError as exc:
        return f"key function '{shown}' cannot be called as key(request): {exc}"
    return None
