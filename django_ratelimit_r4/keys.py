"""Per-client key functions: compile a ``key`` spec once into ``callable(request) -> str | None``.

Specs:

* ``"ip"``: the client IP from a :class:`~django_ratelimit_r4.ip.ClientIPResolver`.
* ``"user"``: the authenticated user's primary key; ``None`` (not limited) for anonymous users.
* ``"user_or_ip"``: ``"user:<pk>"`` when authenticated, else ``"ip:<address>"`` (prefixed so the two
  kinds never share a budget).
* ``"session"``: the session key; ``None`` when the request has no session yet.
* ``"header:<Name>"``: that request header's value; ``None`` when absent or empty.
* a dotted path to (or the object itself) ``callable(request) -> str | None``.

A ``None`` key means the request is not limited by that instance. Values longer than
:data:`MAX_KEY_LENGTH` characters (client-controlled headers, custom callables) are replaced by
``"sha256:<hex>"`` so an attacker cannot make the keyed store hold huge strings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from .ip import ClientIPResolver

__all__ = [
    "BUILTIN_KEYS",
    "MAX_KEY_LENGTH",
    "KeyFunc",
    "bound_key",
    "compile_key",
    "validate_key_spec",
]

KeyFunc = Callable[[Any], "str | None"]

#: Longer key values are hashed (see :func:`bound_key`).
MAX_KEY_LENGTH = 256
_HASH_PREFIX = "sha256:"

#: The spec names understood without a dotted path ("header:<Name>" aside).
BUILTIN_KEYS = ("ip", "user", "user_or_ip", "session")
_HEADER_PREFIX = "header:"
_UNPREFIXED_META = frozenset({"CONTENT_TYPE", "CONTENT_LENGTH"})


def bound_key(value: str) -> str:
    """Return ``value``, or ``"sha256:<hex>"`` of it when longer than :data:`MAX_KEY_LENGTH`.

    Values that already look hashed are hashed again, so a client cannot send the digest of someone
    else's long key and land in that budget.
    """
    if len(value) > MAX_KEY_LENGTH or value.startswith(_HASH_PREFIX):
        return _HASH_PREFIX + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return value


def _user_pk(request: Any) -> str | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return str(user.pk)


def _session_key(request: Any) -> str | None:
    session = getattr(request, "session", None)
    if session is None:
        return None
    return session.session_key or None


def _make_user_or_ip(resolver: ClientIPResolver) -> KeyFunc:
    client_ip = resolver.as_function()

    def user_or_ip(request: Any) -> str:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return f"user:{user.pk}"
        return "ip:" + client_ip(request)

    return user_or_ip


def _meta_name(header: str) -> str:
    name = header.strip().upper().replace("-", "_")
    return name if name in _UNPREFIXED_META else "HTTP_" + name


def _make_header(header: str) -> KeyFunc:
    meta_name = _meta_name(header)

    def header_key(request: Any) -> str | None:
        value = request.META.get(meta_name)
        if not value:
            return None
        return bound_key(value)

    header_key.__qualname__ = f"header_key[{header}]"
    return header_key


def _make_custom(fn: Callable[[Any], Any]) -> KeyFunc:
    def custom_key(request: Any) -> str | None:
        value = fn(request)
        if value is None:
            return None
        return bound_key(value if isinstance(value, str) else str(value))

    custom_key.__wrapped__ = fn  # type: ignore[attr-defined]
    return custom_key


def _check_header_name(name: str) -> str | None:
    if not name.strip():
        return "the header name after 'header:' is empty (e.g. 'header:X-Api-Key')"
    if not all(c.isalnum() or c in "-_" for c in name.strip()) or not name.isascii():
        return f"'{name}' is not a valid HTTP header name (letters, digits and '-')"
    return None


def _resolve_callable(path: str) -> tuple[Callable[[Any], Any] | None, str | None]:
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


def validate_key_spec(spec: object) -> str | None:
    """Return an error message for an invalid key spec, or ``None`` when it is valid.

    Imports dotted paths (so it belongs in system checks, not on a request path).
    """
    if spec is None or (callable(spec) and not isinstance(spec, str)):
        return None
    if not isinstance(spec, str):
        return f"key must be a string or a callable, got {type(spec).__name__}"
    if spec in BUILTIN_KEYS:
        return None
    if spec.startswith(_HEADER_PREFIX):
        return _check_header_name(spec[len(_HEADER_PREFIX) :])
    if "." not in spec or spec.startswith(".") or spec.endswith("."):
        return _unknown(spec)
    return _resolve_callable(spec)[1]


def compile_key(spec: str | Callable[[Any], Any], *, ip_resolver: ClientIPResolver | None = None) -> KeyFunc:
    """Compile ``spec`` into ``callable(request) -> str | None``. Do this once, not per request.

    :param ip_resolver: used by ``"ip"`` and ``"user_or_ip"``; defaults to ``REMOTE_ADDR`` only.
    :raises ValueError: for an unknown spec, a bad header name or an unimportable dotted path.
    """
    if spec is None:
        raise ValueError("key spec is None; an unkeyed limiter needs no key function")
    error = validate_key_spec(spec)
    if error is not None:
        raise ValueError(error)
    if not isinstance(spec, str):
        return _make_custom(spec)
    if spec == "ip":
        return (ip_resolver if ip_resolver is not None else ClientIPResolver()).as_function()
    if spec == "user":
        return _user_pk
    if spec == "user_or_ip":
        return _make_user_or_ip(ip_resolver if ip_resolver is not None else ClientIPResolver())
    if spec == "session":
        return _session_key
    if spec.startswith(_HEADER_PREFIX):
        return _make_header(spec[len(_HEADER_PREFIX) :])
    fn, _ = _resolve_callable(spec)
    assert fn is not None  # validated above
    return _make_custom(fn)
