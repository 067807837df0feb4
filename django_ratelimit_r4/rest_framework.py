"""Django REST framework integration: throttles backed by named rate limiters, and an exception handler.

::

    from django_ratelimit_r4.rest_framework import RateLimiterThrottle

    class SearchView(APIView):
        throttle_classes = [RateLimiterThrottle]
        rate_limiter = "api"            # or a list (all-or-nothing); falls back to throttle_scope

    REST_FRAMEWORK = {"EXCEPTION_HANDLER": "django_ratelimit_r4.rest_framework.exception_handler"}

:class:`RateLimiterThrottle` consults the named limiter (per client when the instance has a ``key``),
returns the limiter's real wait from :meth:`~RateLimiterThrottle.wait` so DRF's 429 carries the right
``Retry-After``, and adds the RateLimit header fields to the response. It combines with other
throttles as DRF intends (DRF answers with the largest wait). :func:`exception_handler` answers our
rejections raised inside DRF views (429, or 503 for circuit breakers and bulkheads, with
``Retry-After``) and delegates everything else to DRF's own handler.

Migrating from DRF's throttles without rewriting settings: a ``throttle_scope`` found in DRF's
``DEFAULT_THROTTLE_RATES`` and not declared in ``RATELIMIT_R4`` is a rate limiter of that rate (per user,
else per client IP, as DRF keys it); a scope that is in neither is not limited, so the class sits next to
DRF's ``ScopedRateThrottle`` in ``DEFAULT_THROTTLE_CLASSES``. :class:`AnonRateThrottle` and
:class:`UserRateThrottle` replace DRF's classes of the same names and read the same ``anon`` / ``user`` rates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpResponseBase
from rest_framework.throttling import BaseThrottle
from rest_framework.views import exception_handler as drf_exception_handler

from . import registry
from .decorators import RateLimitGate
from .headers import write_fields
from .keyspec import validate_key_spec
from .responses import HANDLED_EXCEPTIONS, rejection_response

__all__ = ["AnonRateThrottle", "RateLimiterThrottle", "UserRateThrottle", "exception_handler"]

_GateKey = tuple[tuple[str, ...], int, str | None, Any]
_gates: dict[_GateKey, RateLimitGate] = {}
#: (names as written, permits, key spec, named explicitly, methods) -> (generation, gate or None for "not limited").
_bindings: dict[tuple[Any, ...], tuple[int, RateLimitGate | None]] = {}


def _gate(names: tuple[str, ...], permits: int, key: str | None, methods: Any = None) -> RateLimitGate:
    """One gate per (names, permits, key, methods), shared by every view and request that uses them."""
    gate_key = (names, permits, key, methods)
    gate = _gates.get(gate_key)
    if gate is None:
        gate = _gates.setdefault(gate_key, RateLimitGate(names, key=key, permits=permits, methods=methods))
    return gate


def _hashable_methods(methods: Any) -> Any:
    """``rate_limiter_methods`` as a binding-key part: a list becomes a tuple; the gate validates it."""
    if methods is None or isinstance(methods, (str, tuple, frozenset)):
        return methods
    try:
        return tuple(methods)
    except TypeError:
        return methods  # not iterable: the gate's TypeError names the problem


def _resolve(binding_key: tuple[Any, ...]) -> RateLimitGate | None:
    """Decide once per registry generation what a throttle's names mean (never per request).

    Names given explicitly (``rate_limiter``, a drop-in's ``scope``) must exist: an unknown one reaches the
    gate, whose first use raises ``ImproperlyConfigured`` naming it and the closest configured name. A DRF
    scope with a ``None`` rate is not limited. A ``throttle_scope`` that is neither a rate limiter nor a DRF
    rate passes through, as DRF's ``ScopedRateThrottle`` does for a view without a scope.
    """
    written, permits, key, explicit, methods = binding_key
    generation = registry.generation  # read first: a rebuild racing with us makes this binding stale
    names = (written,) if isinstance(written, str) else tuple(written)
    unthrottled = registry.unthrottled_scopes()
    if not explicit:
        names = tuple(n for n in names if n in registry.names("ratelimiters"))
    names = tuple(n for n in names if n not in unthrottled)
    gate = _gate(names, permits, key, methods) if names else None
    _bindings[binding_key] = (generation, gate)
    return gate


def _bound_gate(
    written: Any, permits: int, key: str | None, explicit: bool, methods: Any = None
) -> RateLimitGate | None:
    binding_key = (
        written if isinstance(written, str) else tuple(written),
        permits,
        key,
        explicit,
        methods if methods is None else _hashable_methods(methods),  # None: the common case, no call
    )
    try:
        binding = _bindings.get(binding_key)
    except TypeError:  # an unhashable argument: a drop-in's key as a list (ratelimit_r4.E036 in manage.py check)
        problem = validate_key_spec(key, imports=False)
        if problem is None:
            raise
        raise TypeError(f"{problem} (a DRF throttle's key)") from None
    if binding is not None and binding[0] == registry.generation:
        return binding[1]
    return _resolve(binding_key)


class _FieldsOnFinalize:
    """An APIView's ``finalize_response`` for one request (DRF builds a view per request): writes this request's
    RateLimit fields with :func:`~.headers.write_fields` (straight into Django's header store), then runs the
    view's own ``finalize_response``. So the fields are not copied from ``view.headers`` one by one through
    ``response[name] = value`` (~1.5 µs each), and a field the view sets in ``view.headers`` itself still wins,
    as it did when ours were put there."""

    __slots__ = ("fields", "finalize")

    def __init__(self, finalize: Callable[..., Any], fields: dict[str, str]) -> None:
        self.finalize = finalize
        self.fields = fields

    def __call__(self, request: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(response, HttpResponseBase):
            write_fields(response, self.fields)
        return self.finalize(request, response, *args, **kwargs)


def _write_on_finalize(view: Any, view_headers: dict[str, str], fields: dict[str, str]) -> None:
    finalize = getattr(view, "finalize_response", None)
    if finalize is None:  # not an APIView after all: the fields go where APIView would read them
        view_headers.update(fields)
    elif type(finalize) is _FieldsOnFinalize:  # a second throttle of ours on this view: its fields win, as before
        finalize.fields.update(fields)
    else:
        view.finalize_response = _FieldsOnFinalize(finalize, fields)


class RateLimiterThrottle(BaseThrottle):  # type: ignore[misc,unused-ignore]  # typed only with DRF stubs
    """DRF throttle that asks the view's named rate limiter(s).

    The view sets ``rate_limiter = "api"`` (or a list, decided all-or-nothing), else its
    ``throttle_scope`` names the limiter: one declared in ``RATELIMIT_R4``, or a scope of DRF's
    ``DEFAULT_THROTTLE_RATES`` (made a limiter automatically). A view with neither, or whose scope is in
    neither setting, is not throttled. Optional ``rate_limiter_permits`` (default 1) is the cost of one
    request. Per-client limits come from the instance's ``key`` option, computed on DRF's request (so
    ``"user"`` sees DRF authentication).

    DRF asks throttles about every request, ``OPTIONS`` included, and this one counts them all, as DRF's own
    throttles do; ``rate_limiter_methods = ["POST"]`` on the view counts only those methods (the decorator's
    ``methods=``).
    """

    def __init__(self) -> None:
        """DRF builds one throttle per request; the wait of a rejection is kept here for :meth:`wait`."""
        self._wait: float | None = None

    def allow_request(self, request: Any, view: Any) -> bool:
        """Take the permits for this request; False (throttled) when a limiter rejects."""
        names = getattr(view, "rate_limiter", None)
        explicit = bool(names)
        if not explicit:
            names = getattr(view, "throttle_scope", None)
            if not names:
                return True
        gate = _bound_gate(
            names,
            getattr(view, "rate_limiter_permits", 1),
            None,
            explicit,
            getattr(view, "rate_limiter_methods", None),
        )
        return True if gate is None else self._decide(gate, request, view)

    def _decide(self, gate: RateLimitGate, request: Any, view: Any) -> bool:
        rejection, headers = gate.check(request)
        view_headers = getattr(view, "headers", None)
        if isinstance(view_headers, dict):  # APIView.finalize_response adds view.headers, throttled or not
            if rejection is not None:
                headers["Cache-Control"] = "no-store"
            if headers:
                _write_on_finalize(view, view_headers, headers)
        if rejection is None:
            return True
        self._wait = rejection.wait_ns / 1e9
        return False

    def wait(self) -> float | None:
        """Seconds until the rejecting limiter admits the request (DRF rounds it up for ``Retry-After``)."""
        return self._wait

    @classmethod
    def referenced_names(cls, view: Any) -> list[tuple[str, bool]]:
        """``(rate limiter name, named explicitly)`` this throttle would use for ``view`` (for the URL check)."""
        names = getattr(view, "rate_limiter", None)
        if names:
            return [(n, True) for n in ((names,) if isinstance(names, str) else names)]
        scope = getattr(view, "throttle_scope", None)
        return [(scope, False)] if isinstance(scope, str) and scope else []


class _ScopeThrottle(RateLimiterThrottle):
    """A drop-in for a DRF ``SimpleRateThrottle``: the class's ``scope`` names the limiter, keyed by ``key``.

    ``methods`` (a class attribute, the decorator's ``methods=``) chooses the methods counted: by default
    every method, ``OPTIONS`` included, as DRF's own classes count them.
    """

    scope: str = ""
    key: str = "user_or_ip"
    methods: Any = None

    def allow_request(self, request: Any, view: Any) -> bool:
        """Throttle with the limiter named by ``scope`` (declared in ``RATELIMIT_R4`` or a DRF rate)."""
        gate = _bound_gate(self.scope, 1, self.key, True, self.methods)
        return True if gate is None else self._decide(gate, request, view)

    @classmethod
    def referenced_names(cls, view: Any) -> list[tuple[str, bool]]:
        """The class's ``scope``, always explicit (DRF raises ``ImproperlyConfigured`` without its rate)."""
        return [(cls.scope, True)]


class AnonRateThrottle(_ScopeThrottle):
    """Drop-in for DRF's ``AnonRateThrottle``: anonymous requests, per client IP, at the ``anon`` rate.

    The limiter is ``RATELIMIT_R4``'s ``"anon"`` instance if declared, else DRF's
    ``DEFAULT_THROTTLE_RATES["anon"]``. Authenticated users are not this throttle's concern. Subclass and set
    ``scope`` for another rate, as with DRF. The IP honours ``RATELIMIT_R4["trusted_proxies"]`` (DRF's
    ``NUM_PROXIES`` is not read).
    """

    scope = "anon"
    key = "ip"

    def allow_request(self, request: Any, view: Any) -> bool:
        """Only anonymous requests are throttled (DRF's rule)."""
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return True
        return super().allow_request(request, view)


class UserRateThrottle(_ScopeThrottle):
    """Drop-in for DRF's ``UserRateThrottle``: per user (pk) when authenticated, else per client IP.

    The limiter is ``RATELIMIT_R4``'s ``"user"`` instance if declared, else DRF's
    ``DEFAULT_THROTTLE_RATES["user"]``. Subclass and set ``scope`` (``"burst"``, ``"sustained"``) for more
    rates, as with DRF.
    """

    scope = "user"
    key = "user_or_ip"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    """DRF ``EXCEPTION_HANDLER``: 429/503 for our rejections, DRF's handler for everything else."""
    if isinstance(exc, HANDLED_EXCEPTIONS):
        return rejection_response(context["request"], exc)
    return drf_exception_handler(exc, context)
