"""Per-client key functions: compile a ``key`` spec once into ``callable(request) -> str | None``.

Specs, and the key each one stores (every key is namespaced by its kind, see below):

* ``"ip"``: the client IP from a :class:`~django_ratelimit_r4.ip.ClientIPResolver`: ``"ip:203.0.113.7"``.
* ``"user"``: the authenticated user's primary key, ``"user:42"``; ``None`` (not limited) for anonymous users.
* ``"user_or_ip"``: ``"user:<pk>"`` when authenticated, else ``"ip:<address>"``: the same keys as ``"user"``
  and ``"ip"`` (one client, one budget, whichever spec a view uses), never each other's.
* ``"session"``: ``"session:<session key>"`` for a session the session store knows; a request without a
  session, or whose session id the store does not know (a made-up cookie), is keyed like ``"ip"``
  (``"ip:<address>"``, the same resolver). Knowing costs one read of the store per request that sends a
  session cookie (the read the view would make anyway; none without a cookie).
* ``"header:<Name>"``: ``"header:<name>:<value>"`` (the name lower-cased); ``None`` when absent or empty.
* a dotted path to (or the object itself) ``callable(request) -> str | None``: ``"<dotted.path>:<value>"``.

Async views. ``request.user`` and ``request.session`` are lazy: their first read queries the database (or
the session store), which Django refuses on the event loop (``SynchronousOnlyOperation``). A key function
that reads them says so with an attribute, and in an async view the gate loads them with Django's async API
first (``request.auser()``, ``session.akeys()``): ``"user"`` and ``"user_or_ip"`` have ``reads_user = True``,
``"session"`` has ``reads_session = True``, and a custom key function may set either on itself (a dotted path
or the object; ``fn.reads_user = True``).

A ``None`` key means the request is not limited by that instance. Values longer than
:data:`MAX_KEY_LENGTH` characters (client-controlled headers, custom callables) are replaced by
``"sha256:<hex>"`` so an attacker cannot make the keyed store hold huge strings.

Namespaces. One rate limiter instance has one store of keys, whichever ``key=`` each decorator gives it,
so values are stored as ``<namespace><value>`` (:func:`key_namespace`): an ``X-Api-Key: 203.0.113.7``
cannot drain the budget of the IP 203.0.113.7, nor a header value ``1`` the user with pk 1. The prefix is
built once when the spec is compiled. Operators name a client by this stored form (``r4 status --keys``
lists it; ``r4 reset NAME --key ip:203.0.113.7``), and ``get_rate_limiter(name, key=...)`` takes it too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from .ip import ClientIPResolver
from .keyspec import BUILTIN_KEYS, HEADER_PREFIX, resolve_key_callable, validate_key_spec

__all__ = [
    "BUILTIN_KEYS",
    "MAX_KEY_LENGTH",
    "KeyFunc",
    "bound_key",
    "compile_key",
    "key_namespace",
    "validate_key_spec",
]

KeyFunc = Callable[[Any], "str | None"]

#: Longer key values are hashed (see :func:`bound_key`).
MAX_KEY_LENGTH = 256
_HASH_PREFIX = "sha256:"

_HEADER_PREFIX = HEADER_PREFIX
_UNPREFIXED_META = frozenset({"CONTENT_TYPE", "CONTENT_LENGTH"})


def bound_key(value: str) -> str:
    """Return ``value``, or ``"sha256:<hex>"`` of it when longer than :data:`MAX_KEY_LENGTH`.

    Values that already look hashed are hashed again, so a client cannot send the digest of someone
    else's long key and land in that budget.
    """
    if len(value) > MAX_KEY_LENGTH or value.startswith(_HASH_PREFIX):
        return _HASH_PREFIX + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return value


_IP = "ip:"
_USER = "user:"
_SESSION = "session:"


def _user_pk(request: Any) -> str | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return _USER + bound_key(str(user.pk))


_user_pk.reads_user = True  # type: ignore[attr-defined]  # async views load request.user off the loop first


def _make_ip(resolver: ClientIPResolver) -> KeyFunc:
    return resolver.as_function(prefix=_IP)


def _make_user_or_ip(resolver: ClientIPResolver) -> KeyFunc:
    client_ip = resolver.as_function(prefix=_IP)

    def user_or_ip(request: Any) -> str:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return _USER + bound_key(str(user.pk))
        return client_ip(request)

    user_or_ip.reads_user = True  # type: ignore[attr-defined]
    return user_or_ip


def _make_session(resolver: ClientIPResolver) -> KeyFunc:
    client_ip = resolver.as_function(prefix=_IP)

    def session_key(request: Any) -> str:
        session = getattr(request, "session", None)
        if session is None or not session.session_key:
            return client_ip(request)  # no cookie: no read of the session store
        # Reading the data loads the session once (cached on request.session: a view that reads it later
        # pays nothing more). Every engine loads an id it does not know (made up, expired, badly signed) as
        # empty, and the db, cache and file engines also drop its key; Django never stores an empty session.
        if not session.keys():
            return client_ip(request)
        key = session.session_key
        return _SESSION + bound_key(key) if key else client_ip(request)

    session_key.reads_session = True  # type: ignore[attr-defined]  # async views load it off the loop first
    return session_key


def _header_name(header: str) -> str:
    """The canonical header name of a namespace: lower-case, ``-`` (``X_Api_Key`` reads the same field)."""
    return header.strip().lower().replace("_", "-")


def _meta_name(header: str) -> str:
    name = header.strip().upper().replace("-", "_")
    return name if name in _UNPREFIXED_META else "HTTP_" + name


def _make_header(header: str) -> KeyFunc:
    meta_name = _meta_name(header)
    namespace = f"{_HEADER_PREFIX}{_header_name(header)}:"

    def header_key(request: Any) -> str | None:
        value = request.META.get(meta_name)
        if not value:
            return None
        return namespace + bound_key(value)

    header_key.__qualname__ = f"header_key[{header}]"
    return header_key


def _callable_path(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a key function object (of its class for a callable instance)."""
    target: Any = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', None) or '?'}.{target.__qualname__}"


def _make_custom(fn: Callable[[Any], Any], namespace: str) -> KeyFunc:
    def custom_key(request: Any) -> str | None:
        value = fn(request)
        if value is None:
            return None
        return namespace + bound_key(value if isinstance(value, str) else str(value))

    custom_key.__wrapped__ = fn  # type: ignore[attr-defined]
    # What the function declares it reads (see the module's "Async views").
    custom_key.reads_user = bool(getattr(fn, "reads_user", False))  # type: ignore[attr-defined]
    custom_key.reads_session = bool(getattr(fn, "reads_session", False))  # type: ignore[attr-defined]
    return custom_key


def key_namespace(spec: str | Callable[[Any], Any]) -> str:
    """The prefix that ``spec``'s compiled key function puts before every value, e.g. ``"ip:"``.

    ``"ip"`` -> ``"ip:"``, ``"user"`` -> ``"user:"``, ``"session"`` -> ``"session:"`` (its fallback keys
    are ``"ip:"`` ones), ``"header:X-Api-Key"`` -> ``"header:x-api-key:"``, a dotted path ->
    ``"<path>:"``, a callable object -> ``"<module>.<qualname>:"``. ``"user_or_ip"`` has two
    (``"user:"``, ``"ip:"``), so it raises ``ValueError`` like an invalid spec.
    """
    if not isinstance(spec, str):
        return _callable_path(spec) + ":"
    if spec in ("ip", "user", "session"):
        return spec + ":"
    if spec == "user_or_ip":
        raise ValueError("'user_or_ip' stores 'user:<pk>' or 'ip:<address>' keys: it has no single namespace")
    if spec.startswith(_HEADER_PREFIX):
        return f"{_HEADER_PREFIX}{_header_name(spec[len(_HEADER_PREFIX) :])}:"
    error = validate_key_spec(spec)
    if error is not None:
        raise ValueError(error)
    return spec + ":"


def compile_key(spec: str | Callable[[Any], Any], *, ip_resolver: ClientIPResolver | None = None) -> KeyFunc:
    """Compile ``spec`` into ``callable(request) -> str | None``. Do this once, not per request.

    The function's keys carry the spec's namespace (see :func:`key_namespace`), built here once.

    :param ip_resolver: used by ``"ip"``, ``"user_or_ip"`` and ``"session"``; defaults to ``REMOTE_ADDR`` only.
    :raises ValueError: for an unknown spec, a bad header name or an unimportable dotted path.
    """
    if spec is None:
        raise ValueError("key spec is None; an unkeyed limiter needs no key function")
    error = validate_key_spec(spec)
    if error is not None:
        raise ValueError(error)
    if not isinstance(spec, str):
        return _make_custom(spec, key_namespace(spec))
    resolver = ip_resolver if ip_resolver is not None else ClientIPResolver()
    if spec == "ip":
        return _make_ip(resolver)
    if spec == "user":
        return _user_pk
    if spec == "user_or_ip":
        return _make_user_or_ip(resolver)
    if spec == "session":
        return _make_session(resolver)
    if spec.startswith(_HEADER_PREFIX):
        return _make_header(spec[len(_HEADER_PREFIX) :])
    fn, _ = resolve_key_callable(spec)
    assert fn is not None  # validated above
    return _make_custom(fn, key_namespace(spec))
