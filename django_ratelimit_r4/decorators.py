"""Decorators for views and service functions: rate limiter, bulkhead, circuit breaker, retry, time limiter.

::

    @ratelimit("api")                      # 429 + Retry-After when the limiter says no
    def search(request): ...

    @ratelimit(["burst", "sustained"])     # all-or-nothing over several limits
    async def upload(request): ...

    @resilient(retry="backend", circuitbreaker="backend", bulkhead="backend", fallback=cached)
    def fetch_rates(currency): ...         # a plain service function, sync or async

Every decorator works on function views, ``async def`` views, class-based views through
``method_decorator`` and plain functions (sync or async): Django's pattern, a sync and an async wrapper
chosen with :func:`django_ratelimit_r4.core.coroutines.is_async` (asgiref's and inspect's marks, partials, bound
methods and objects with ``async def __call__``). Names are resolved lazily from ``RATELIMIT_R4``
at the first call and cached; each call revalidates the cache with one int compare of
:data:`django_ratelimit_r4.registry.generation`, so ``override_settings`` works and nothing reads
settings per request.

When the first argument is a request (``HttpRequest`` or a DRF ``Request``), a rejection by the
decorator's *own* instances is answered here: 429 (rate limiter) or 503 (circuit breaker OPEN /
FORCED_OPEN, bulkhead full) with the computed ``Retry-After``, exactly like
:class:`~django_ratelimit_r4.middleware.ResilienceMiddleware`. Rate-limited views also get RateLimit
header fields on allowed and rejected responses (the ``headers`` option); for a single in-memory
keyed limit (draft-10) an allowed request's figures are those of its own decision
(:meth:`~django_ratelimit_r4.keyed.KeyedRateLimiter.acquire_quota`), otherwise they are read after
the view. On other functions the exception is raised
(:class:`~django_ratelimit_r4.exceptions.RequestNotPermitted`, ...).

A ``fallback`` gets the protected function's arguments plus the exception, as in Resilience4j:
``fallback(*args, exc, **kwargs)`` (keyword arguments given for positional parameters are passed
positionally, so ``def fallback(request, pk, exc)`` works with URL kwargs). Annotate the exception
parameter to choose which exceptions it handles (``exc: CallNotPermitted``, a union, ...); without an
annotation it handles every ``Exception``. Anything else is re-raised.

What lives where: this module holds the decorators and the stack they build (``_Resilience``); the
rate-limit check is :class:`~django_ratelimit_r4.gate.RateLimitGate`, fallbacks are
:mod:`~django_ratelimit_r4.fallbacks`, the RateLimit fields :mod:`~django_ratelimit_r4.headers`, the 429/503
:mod:`~django_ratelimit_r4.responses`. ``RateLimitGate``, ``UNSAFE_METHODS``, ``request_of``,
``method_filter`` and ``fallback_exceptions`` are importable from here as before.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.views import View

from . import conf, registry
from .core.coroutines import is_async
from .core.exceptions import (
    BulkheadFull,
    CallNotPermitted,
    CallThrottled,
    RequestNotPermitted,
    ResilienceError,
)
from .fallbacks import fallback_args, fallback_exceptions
from .gate import UNSAFE_METHODS, KeySpec, RateLimitGate, _secret_salt, method_filter, request_of  # noqa: F401 (re-exported)
from .keyspec import BUILTIN_KEYS, HEADER_PREFIX
from .responses import HANDLED_EXCEPTIONS, bulkhead_retry_after_ns, rejection_response

__all__ = [
    "UNSAFE_METHODS",
    "DecisionGroup",
    "KeyUse",
    "RateLimitGate",
    "bulkhead",
    "circuitbreaker",
    "decision_groups",
    "fallback_exceptions",
    "key_uses",
    "method_filter",
    "permit_demands",
    "ratelimit",
    "referenced_names",
    "request_of",
    "resilient",
    "retry",
    "timelimiter",
]

F = TypeVar("F", bound=Callable[..., Any])
_RERAISE = object()
# One attribute per name a decorator uses, e.g. "_r4_uses:ratelimiters:api": functools.wraps and
# method_decorator copy a function's __dict__ with dict.update(), so distinct keys add up across stacked
# decorators and a method_decorator list, where one shared attribute would keep only the last decorator's.
_USES_PREFIX = "_r4_uses:"
_PERMITS_PREFIX = "_r4_permits:"
# One attribute per decorator deciding several rate limiters at once, its value that DecisionGroup: the names of
# stacked decorators are each decided alone, so the check must know which names one decorator decides together.
_GROUP_PREFIX = "_r4_group:"
# One attribute per dotted-path key= a decorator imports at its first request (the view's module may define it):
# manage.py check imports it (key_paths) so a typo is an error before that request, not a 500 at each one.
_KEY_PATH_PREFIX = "_r4_key_path:"
# One attribute per decorator with a rate limiter, its value that KeyUse: manage.py check (key_uses) warns when a
# limit is keyed by request.user and no middleware sets it (ratelimit_r4.W007).
_KEY_USE_PREFIX = "_r4_key_use:"


#: Class-based views by whether their handlers are async (``View.view_is_async``), read once per class:
#: ``method_decorator`` decorates anew on every request.
_ASYNC_VIEWS: dict[type, bool] = {}


def _dispatch_of_async_view(fn: Any) -> bool:
    """``fn`` is the ``dispatch`` of a class-based view whose handlers are ``async def``, as ``method_decorator``
    gives it (a partial of the bound method). Django's ``View.dispatch`` is a plain def that returns the
    handler's coroutine, which Django awaits: decorated as sync, the "response" a decorator saw was that
    coroutine, a rejection was a sync 429 where a coroutine is awaited (a 500), and a breaker or a bulkhead
    measured the return of the coroutine instead of the handler."""
    while isinstance(fn, partial):
        fn = fn.func
    view = getattr(fn, "__self__", None)
    if not isinstance(view, View) or getattr(fn, "__name__", None) != "dispatch":
        return False
    cls = type(view)
    known = _ASYNC_VIEWS.get(cls)
    if known is None:
        known = _ASYNC_VIEWS[cls] = bool(cls.view_is_async)
    return known


@dataclass(frozen=True, slots=True)
class DecisionGroup:
    """The rate limiters one ``@ratelimit([...])`` / ``@resilient(ratelimiter=[...])`` decides all-or-nothing
    (read by ``manage.py check``, :func:`decision_groups`); recorded only for two or more names."""

    #: The instance names, in the decorator's order.
    names: tuple[str, ...]
    #: True when the decorator's ``key=`` makes every limit keyed (else each instance's ``key`` option decides).
    key_override: bool


@dataclass(frozen=True, slots=True)
class KeyUse:
    """The rate limiters one decorator decides and the ``key=`` it gives them (read by ``manage.py check``,
    :func:`key_uses`)."""

    #: The instance names, in the decorator's order.
    names: tuple[str, ...]
    #: The decorator's ``key=`` when it is a spec string (``"user"``, ``"ip"``, ...); None when each instance's
    #: ``key`` option decides; ``"<callable>"`` for a callable ``key=`` (none of the built-in specs).
    key: str | None


def _marks(fn: object, prefix: str) -> Iterator[tuple[str, object]]:
    """``(suffix, value)`` of every attribute named ``prefix + suffix`` on ``fn`` and on what it wraps (followed
    through ``__wrapped__``: decorators that do not copy ``__dict__``; 32 levels at most)."""
    seen = 0
    while fn is not None and seen < 32:
        attrs = getattr(fn, "__dict__", None)
        if isinstance(attrs, dict):
            for attr, value in attrs.items():
                if isinstance(attr, str) and attr.startswith(prefix):
                    yield attr[len(prefix) :], value
        fn = getattr(fn, "__wrapped__", None)
        seen += 1


def referenced_names(fn: object) -> set[tuple[str, str]]:
    """``(section, name)`` of every instance the decorators on ``fn`` use (read by ``manage.py check``).

    ``section`` is the ``RATELIMIT_R4`` section the name comes from (``"ratelimiters"``, ``"bulkheads"``, ...).
    """
    found: set[tuple[str, str]] = set()
    for mark, _ in _marks(fn, _USES_PREFIX):
        section, _, name = mark.partition(":")
        found.add((section, name))
    return found


def decision_groups(fn: object) -> set[DecisionGroup]:
    """Every :class:`DecisionGroup` the decorators on ``fn`` decide (for checks)."""
    return {value for _, value in _marks(fn, _GROUP_PREFIX) if isinstance(value, DecisionGroup)}


def permit_demands(fn: object) -> set[tuple[str, int]]:
    """``(rate limiter name, permits)`` of every decorator on ``fn`` that asks for more than 1 permit (for checks)."""
    found: set[tuple[str, int]] = set()
    for mark, _ in _marks(fn, _PERMITS_PREFIX):
        name, _, permits = mark.rpartition(":")
        found.add((name, int(permits)))
    return found


def key_uses(fn: object) -> set[KeyUse]:
    """Every :class:`KeyUse` of the rate-limiting decorators on ``fn`` (for checks)."""
    return {value for _, value in _marks(fn, _KEY_USE_PREFIX) if isinstance(value, KeyUse)}


def key_paths(fn: object) -> set[str]:
    """The dotted-path ``key=`` of every decorator on ``fn`` (for checks)."""
    return {mark for mark, _ in _marks(fn, _KEY_PATH_PREFIX)}


# ---------------------------------------------------------------------------------------------- the stack


#: ``_Resilience.instances()`` while ``RATELIMIT_R4["enabled"]`` is False: nothing wraps the function.
_DISABLED: tuple[Any, ...] = (None, None, None, None, 0, None)


class _Resilience:
    """One decorator: which instances, in Resilience4j's order, and one fallback.

    Created once per decorator expression (so ``method_decorator``, which re-applies the decorator on
    every request, reuses the resolved instances). Order: Retry(AdaptiveThrottler(CircuitBreaker(RateLimiter(
    TimeLimiter(Bulkhead(fn)))))).
    """

    def __init__(
        self,
        *,
        retry: str | None = None,
        adaptivethrottler: str | None = None,
        circuitbreaker: str | None = None,
        ratelimiter: str | Sequence[str] | None = None,
        timelimiter: str | None = None,
        bulkhead: str | None = None,
        fallback: Callable[..., Any] | None = None,
        key: KeySpec = None,
        permits: int = 1,
        methods: str | Collection[str] | None = None,
    ) -> None:
        if methods is not None and ratelimiter is None:
            raise TypeError(
                "methods= applies to the rate limiter only: give ratelimiter=... too, or drop methods="
            )
        for label, value in (
            ("retry", retry),
            ("adaptivethrottler", adaptivethrottler),
            ("circuitbreaker", circuitbreaker),
            ("timelimiter", timelimiter),
            ("bulkhead", bulkhead),
        ):
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{label} must be an instance name (a non-empty string), got {value!r}")
        if fallback is not None and not callable(fallback):
            raise TypeError(f"fallback must be callable, got {fallback!r}")
        self.retry = retry
        self.adaptivethrottler = adaptivethrottler
        self.circuitbreaker = circuitbreaker
        self.timelimiter = timelimiter
        self.bulkhead = bulkhead
        self.gate = (
            RateLimitGate(ratelimiter, key=key, permits=permits, methods=methods) if ratelimiter is not None else None
        )
        self.fallback = fallback
        self.fallback_types = fallback_exceptions(fallback) if fallback is not None else ()
        self.catch: tuple[type[BaseException], ...] = tuple(
            dict.fromkeys((*HANDLED_EXCEPTIONS, *self.fallback_types))
        )
        self._state: tuple[int, tuple[Any, ...]] = (-1, ())
        self._lock = threading.Lock()
        uses = [
            ("retries", retry),
            ("adaptivethrottlers", adaptivethrottler),
            ("circuitbreakers", circuitbreaker),
            ("timelimiters", timelimiter),
            ("bulkheads", bulkhead),
            *(("ratelimiters", n) for n in (self.gate.names if self.gate is not None else ())),
        ]
        self.uses = tuple(f"{_USES_PREFIX}{section}:{name}" for section, name in uses if name)
        if self.gate is not None and permits > 1:  # what manage.py check compares with limit_for_period
            self.uses += tuple(f"{_PERMITS_PREFIX}{name}:{permits}" for name in self.gate.names)
        if self.gate is not None and isinstance(key, str) and key not in BUILTIN_KEYS and not key.startswith(HEADER_PREFIX):
            self.uses += (f"{_KEY_PATH_PREFIX}{key}",)  # a dotted path (the gate checked the rest): key_paths
        # Every mark in one dict: method_decorator re-applies the decorator on every request, so __call__ puts
        # them on the wrapper with one update. Besides the flags above: the DecisionGroup of a gate deciding
        # several names (decision_groups, ratelimit_r4.E035) and the KeyUse of any gate (key_uses, W007/W009).
        self._wrapper_marks: dict[str, object] = dict.fromkeys(self.uses, True)
        if self.gate is not None:
            names = self.gate.names
            if len(names) > 1:
                self._wrapper_marks[f"{_GROUP_PREFIX}{names!r}:{key is not None}"] = DecisionGroup(names, key is not None)
            use = KeyUse(names, key if key is None or isinstance(key, str) else "<callable>")
            self._wrapper_marks[f"{_KEY_USE_PREFIX}{use.names!r}:{use.key!r}"] = use

    def instances(self) -> tuple[Any, Any, Any, Any, int, Any]:
        """``(retry, circuit breaker, time limiter, bulkhead, bulkhead retry_after ns, adaptive throttler)`` now."""
        generation, found = self._state
        if generation != registry.generation:
            found = self._resolve()
        return found

    def _resolve(self) -> tuple[Any, ...]:
        with self._lock:
            generation = registry.generation
            if not conf.get_options().enabled:  # pass-through: no instance is resolved or used
                self._state = (generation, _DISABLED)
                return _DISABLED
            found = (
                registry.get_retry(self.retry) if self.retry else None,
                registry.get_circuit_breaker(self.circuitbreaker) if self.circuitbreaker else None,
                registry.get_time_limiter(self.timelimiter) if self.timelimiter else None,
                registry.get_bulkhead(self.bulkhead) if self.bulkhead else None,
                bulkhead_retry_after_ns(self.bulkhead) if self.bulkhead else 0,
                registry.get_adaptive_throttler(self.adaptivethrottler) if self.adaptivethrottler else None,
            )
            self._state = (generation, found)
            return found

    def owns(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a rejection by one of this decorator's instances."""
        if isinstance(exc, RequestNotPermitted):
            return self.gate is not None and exc.name in self.gate.names
        if isinstance(exc, CallThrottled):  # a CallNotPermitted too: tell it from the breaker's first
            return exc.name == self.adaptivethrottler
        if isinstance(exc, CallNotPermitted):
            return exc.name == self.circuitbreaker
        if isinstance(exc, BulkheadFull):
            return exc.name == self.bulkhead
        return False

    def respond(self, exc: ResilienceError, request: Any) -> Any:
        """The 429/503 for an owned rejection on a view."""
        if isinstance(exc, RequestNotPermitted) and self.gate is not None:
            return self.gate.rejected_response(request, exc)
        retry_after = self.instances()[4] if isinstance(exc, BulkheadFull) else None
        return rejection_response(request, exc, bulkhead_retry_after=retry_after)

    def handle(
        self, fn: Callable[..., Any], exc: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Fallback, own 429/503 on a view, or ``_RERAISE``. May return an awaitable (async fallback)."""
        if isinstance(exc, ImproperlyConfigured):  # an unknown or broken name: never a fallback's business
            return _RERAISE
        if self.fallback is not None and isinstance(exc, self.fallback_types):
            fb_args, fb_kwargs = fallback_args(fn, args, kwargs)
            return self.fallback(*fb_args, exc, **fb_kwargs)
        if self.owns(exc):
            request = request_of(args)
            if request is not None:
                return self.respond(exc, request)  # type: ignore[arg-type]
        return _RERAISE

    async def ahandle(
        self, fn: Callable[..., Any], exc: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Async twin of :meth:`handle`: awaits an async fallback and builds the 429 without blocking."""
        if isinstance(exc, ImproperlyConfigured):
            return _RERAISE
        if self.fallback is not None and isinstance(exc, self.fallback_types):
            fb_args, fb_kwargs = fallback_args(fn, args, kwargs)
            outcome = self.fallback(*fb_args, exc, **fb_kwargs)
            return await outcome if inspect.isawaitable(outcome) else outcome
        if self.owns(exc):
            request = request_of(args)
            if request is not None:
                if isinstance(exc, RequestNotPermitted) and self.gate is not None:
                    return await self.gate.arejected_response(request, exc)
                return self.respond(exc, request)  # type: ignore[arg-type]
        return _RERAISE

    # -- wrapping ------------------------------------------------------------------------------------

    def __call__(self, fn: F) -> F:
        """Decorate ``fn`` (a view, a method through ``method_decorator``, or a plain function)."""
        async_fn = is_async(fn) or _dispatch_of_async_view(fn)
        if self.timelimiter is not None and not async_fn:
            raise TypeError(
                f"timelimiter {self.timelimiter!r} cannot limit the sync function "
                f"{getattr(fn, '__qualname__', fn)!s}: Python cannot stop a running thread. Use an async "
                "function (an async view), or a timeout where the blocking happens (HTTP client, database)."
            )
        only_gate = (
            self.gate is not None
            and self.retry is None
            and self.adaptivethrottler is None
            and self.circuitbreaker is None
            and self.timelimiter is None
            and self.bulkhead is None
        )
        wrapper = functools.wraps(fn)((self._async_wrapper if async_fn else self._sync_wrapper)(fn, only_gate))
        # What manage.py check reads (referenced_names, decision_groups, key_uses...); fn's own came with wraps.
        wrapper.__dict__.update(self._wrapper_marks)
        return wrapper  # type: ignore[return-value]

    def _sync_wrapper(self, fn: Callable[..., Any], only_gate: bool) -> Callable[..., Any]:
        gate = self.gate
        if only_gate and self.fallback is None:
            gate_call = gate._call  # type: ignore[union-attr]
            rejected_response = gate.rejected_response  # type: ignore[union-attr]
            names = gate.names  # type: ignore[union-attr]
            catch = self.catch

            def _ratelimited(*args: Any, **kwargs: Any) -> Any:
                try:
                    return gate_call(fn, args, kwargs)
                except RequestNotPermitted as exc:
                    # handle()'s answer without a fallback, inlined (the denied hot path): the gate's own
                    # rejection on a view is its 429; anything else is re-raised.
                    if exc.name in names:
                        request = request_of(args)
                        if request is not None:
                            return rejected_response(request, exc)
                    raise
                except catch as exc:
                    outcome = self.handle(fn, exc, args, kwargs)
                    if outcome is _RERAISE:
                        raise
                    return outcome

            return _ratelimited

        if only_gate:
            gate_call = gate._call  # type: ignore[union-attr]

            def _ratelimited(*args: Any, **kwargs: Any) -> Any:
                try:
                    return gate_call(fn, args, kwargs)
                except self.catch as exc:
                    outcome = self.handle(fn, exc, args, kwargs)
                    if outcome is _RERAISE:
                        raise
                    return outcome

            return _ratelimited

        def chain(found: tuple[Any, ...]) -> Callable[..., Any]:
            retry, breaker, _, bulkhead_, _, throttler = found
            call: Callable[..., Any] = fn
            if bulkhead_ is not None:
                call = partial(bulkhead_.call, call)
            if gate is not None:
                call = partial(gate.call, call)
            if breaker is not None:
                call = partial(breaker.call, call)
            if throttler is not None:
                call = partial(throttler.call, call)
            if retry is not None:
                call = partial(retry.call, call)
            return call

        # The stack is built once per set of instances (i.e. per registry generation), not per call; one
        # tuple holds both so a concurrent rebuild can never pair new instances with an old chain.
        cached: tuple[Any, Callable[..., Any]] = ((), fn)
        catch, handle, fallback = self.catch, self.handle, self.fallback

        def _protected(*args: Any, **kwargs: Any) -> Any:
            nonlocal cached
            generation, found = self._state  # self.instances() inlined
            if generation != registry.generation:
                found = self._resolve()
            built_for, call = cached
            if built_for is not found:
                call = chain(found)
                cached = (found, call)
            try:
                return call(*args, **kwargs)
            except catch as exc:
                # Without a fallback only a view answers a rejection: anything else re-raises here, without
                # handle()'s calls (the open-breaker path of a service function, issue 10 item 9).
                if fallback is None and (not args or request_of(args) is None):
                    raise
                outcome = handle(fn, exc, args, kwargs)
                if outcome is _RERAISE:
                    raise
                return outcome

        return _protected

    def _async_wrapper(self, fn: Callable[..., Any], only_gate: bool) -> Callable[..., Any]:
        gate = self.gate

        async def _ahandle(exc: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return await self.ahandle(fn, exc, args, kwargs)

        if only_gate and self.fallback is None:
            gate_acall = gate.acall  # type: ignore[union-attr]
            arejected_response = gate.arejected_response  # type: ignore[union-attr]
            names = gate.names  # type: ignore[union-attr]
            catch = self.catch

            async def _aratelimited(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await gate_acall(fn, *args, **kwargs)
                except RequestNotPermitted as exc:
                    # ahandle()'s answer without a fallback, inlined (as in _sync_wrapper).
                    if exc.name in names:
                        request = request_of(args)
                        if request is not None:
                            return await arejected_response(request, exc)
                    raise
                except catch as exc:
                    outcome = await _ahandle(exc, args, kwargs)
                    if outcome is _RERAISE:
                        raise
                    return outcome

            return _aratelimited

        if only_gate:
            gate_acall = gate.acall  # type: ignore[union-attr]

            async def _aratelimited(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await gate_acall(fn, *args, **kwargs)
                except self.catch as exc:
                    outcome = await _ahandle(exc, args, kwargs)
                    if outcome is _RERAISE:
                        raise
                    return outcome

            return _aratelimited

        def achain(found: tuple[Any, ...]) -> Callable[..., Any]:
            retry, breaker, timelimiter_, bulkhead_, _, throttler = found
            call: Callable[..., Any] = fn
            if bulkhead_ is not None:
                call = partial(bulkhead_.acall, call)
            if timelimiter_ is not None:
                call = partial(timelimiter_.acall, call)
            if gate is not None:
                call = partial(gate.acall, call)
            if breaker is not None:
                call = partial(breaker.acall, call)
            if throttler is not None:
                call = partial(throttler.acall, call)
            if retry is not None:
                call = partial(retry.acall, call)
            return call

        cached: tuple[Any, Callable[..., Any]] = ((), fn)  # as in _sync_wrapper: built once per generation
        catch, fallback = self.catch, self.fallback

        async def _aprotected(*args: Any, **kwargs: Any) -> Any:
            nonlocal cached
            generation, found = self._state  # as in _sync_wrapper: self.instances() inlined
            if generation != registry.generation:
                found = self._resolve()
            built_for, call = cached
            if built_for is not found:
                call = achain(found)
                cached = (found, call)
            try:
                return await call(*args, **kwargs)
            except catch as exc:
                if fallback is None and (not args or request_of(args) is None):  # as in _sync_wrapper
                    raise
                outcome = await _ahandle(exc, args, kwargs)
                if outcome is _RERAISE:
                    raise
                return outcome

        return _aprotected


# -------------------------------------------------------------------------------------------- public API

#: decorator -> the RATELIMIT_R4 section its names come from (for the error of a bare ``@decorator``).
_SECTIONS = {
    "ratelimit": "ratelimiters",
    "bulkhead": "bulkheads",
    "circuitbreaker": "circuitbreakers",
    "retry": "retries",
    "timelimiter": "timelimiters",
}


def _bare(decorator: str, fn: Any) -> TypeError:
    """The error for ``@decorator`` written without its arguments: Python passed the function as the name."""
    target = getattr(fn, "__qualname__", None) or repr(fn)
    if decorator == "resilient":
        fix = (
            '@resilient(circuitbreaker="name", ...) with the instances to stack (retry=, circuitbreaker=, '
            "ratelimiter=, timelimiter=, bulkhead=, adaptivethrottler=)"
        )
    else:
        fix = f'@{decorator}("name") with a name from RATELIMIT_R4["{_SECTIONS[decorator]}"]["instances"]'
    return TypeError(f"@{decorator} was used without arguments on {target}(); write {fix}")



def ratelimit(
    name: str | Sequence[str],
    key: KeySpec = None,
    permits: int = 1,
    *,
    methods: str | Collection[str] | None = None,
    fallback: Callable[..., Any] | None = None,
) -> Callable[[F], F]:
    """Rate-limit a view or function with the named limiter(s) from ``RATELIMIT_R4["ratelimiters"]``.

    On a view a rejection is a 429 with ``Retry-After`` for the limiter (and key) that rejected, and
    RateLimit header fields go on allowed and rejected responses. Several names are all-or-nothing:
    a rejection by one consumes nothing from the others, and ``Retry-After`` is the largest wait.
    ``key`` overrides the instances' ``key`` spec; a key function returning None exempts the request.
    ``methods``: ``None`` counts every method, ``OPTIONS`` included (Django runs a function view for it); a
    method or a collection (``["POST"]``, :data:`UNSAFE_METHODS`) counts only those; other requests pass
    untouched.
    Elsewhere :class:`~django_ratelimit_r4.exceptions.RequestNotPermitted` is raised.
    """
    if callable(name):
        raise _bare("ratelimit", name)
    return _Resilience(ratelimiter=name, key=key, permits=permits, methods=methods, fallback=fallback)


def bulkhead(name: str, *, fallback: Callable[..., Any] | None = None) -> Callable[[F], F]:
    """At most ``max_concurrent_calls`` concurrent calls through bulkhead ``name``.

    A view answers 503 with the instance's ``retry_after`` when full; elsewhere ``BulkheadFull`` is raised.
    Async functions wait (up to ``max_wait_duration``) with asyncio, never blocking the loop.
    """
    if callable(name):
        raise _bare("bulkhead", name)
    return _Resilience(bulkhead=name, fallback=fallback)


def circuitbreaker(name: str, fallback: Callable[..., Any] | None = None) -> Callable[[F], F]:
    """Run through circuit breaker ``name``; OPEN / FORCED_OPEN answers 503 with the remaining open time."""
    if callable(name):
        raise _bare("circuitbreaker", name)
    return _Resilience(circuitbreaker=name, fallback=fallback)


def retry(name: str, fallback: Callable[..., Any] | None = None) -> Callable[[F], F]:
    """Retry per ``RATELIMIT_R4["retries"][name]``; the fallback sees the last exception."""
    if callable(name):
        raise _bare("retry", name)
    return _Resilience(retry=name, fallback=fallback)


def timelimiter(name: str, fallback: Callable[..., Any] | None = None) -> Callable[[F], F]:
    """Bound an ``async`` function's duration (``TimeLimitExceeded`` on timeout); sync functions are refused."""
    if callable(name):
        raise _bare("timelimiter", name)
    return _Resilience(timelimiter=name, fallback=fallback)


def resilient(
    _fn: Callable[..., Any] | None = None,
    /,
    *,
    retry: str | None = None,
    circuitbreaker: str | None = None,
    ratelimiter: str | Sequence[str] | None = None,
    timelimiter: str | None = None,
    bulkhead: str | None = None,
    adaptivethrottler: str | None = None,
    fallback: Callable[..., Any] | None = None,
    key: KeySpec = None,
    permits: int = 1,
    methods: str | Collection[str] | None = None,
) -> Callable[[F], F]:
    """Stack several in Resilience4j's order, Retry(CircuitBreaker(RateLimiter(TimeLimiter(Bulkhead(fn))))),
    with one fallback around the whole stack (so an inner rejection can still be retried).

    ``adaptivethrottler`` (client-side adaptive throttling, not in Resilience4j) goes right outside the
    breaker: Retry(AdaptiveThrottler(CircuitBreaker(...))); its local rejection is a ``CallThrottled`` (503).
    ``key``, ``permits`` and ``methods`` apply to the rate limiter (see :func:`ratelimit`)."""
    if _fn is not None:
        raise _bare("resilient", _fn)
    if not any((retry, circuitbreaker, ratelimiter, timelimiter, bulkhead, adaptivethrottler)):
        raise TypeError(
            "resilient() needs at least one of retry, circuitbreaker, ratelimiter, timelimiter, bulkhead, "
            "adaptivethrottler"
        )
    return _Resilience(
        retry=retry,
        adaptivethrottler=adaptivethrottler,
        circuitbreaker=circuitbreaker,
        ratelimiter=ratelimiter,
        timelimiter=timelimiter,
        bulkhead=bulkhead,
        fallback=fallback,
        key=key,
        permits=permits,
        methods=methods,
    )
