"""Exceptions raised by the primitives. Each carries its instance so a response can compute Retry-After.

They share :class:`ResilienceError`. ``wait_ns`` is the state-derived wait at the moment of rejection
(nanoseconds to the next permit, or remaining open time); :attr:`ResilienceError.retry_after` turns
it into HTTP delay-seconds: rounded up, never 0.

A :class:`RequestNotPermitted` or :class:`CallNotPermitted` built without a wait (raised by your own
code: ``if not limiter.acquire_permission(): raise RequestNotPermitted(limiter)``) reads it from its
instance when ``wait_ns`` is read, i.e. when the response is built: the limiter's (or the client
view's) ``nanos_to_wait``, the breaker's remaining open time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .adaptivethrottler import AdaptiveThrottler
    from .bulkhead import Bulkhead
    from .circuitbreaker import CircuitBreaker
    from .ratelimiter import RateLimiter
    from .retry import Retry
    from .timelimiter import TimeLimiter

__all__ = [
    "BulkheadFull",
    "CallNotPermitted",
    "CallThrottled",
    "ConfigurationError",
    "FieldError",
    "IllegalStateTransition",
    "MaxRetriesExceeded",
    "RequestNotPermitted",
    "ResilienceError",
    "TimeLimitExceeded",
]

_NS_PER_S = 1_000_000_000


def retry_after_seconds(wait_ns: int) -> int:
    """Round a wait in nanoseconds up to whole seconds, at least 1 (RFC 9110 delay-seconds)."""
    if wait_ns <= 0:
        return 1
    return max(1, -(-wait_ns // _NS_PER_S))


class ResilienceError(Exception):
    """Base class of every rejection raised by django-ratelimit-r4.

    Messages are built lazily in ``__str__``: a rejection is a hot path, and most are turned into an HTTP
    response without ever being printed.
    """

    #: Name of the instance that raised.
    name: str
    #: State-derived wait in nanoseconds at the moment of rejection (0 when unknown).
    wait_ns: int = 0

    @property
    def retry_after(self) -> int:
        """Seconds a client should wait: ``ceil(wait_ns / 1e9)``, at least 1."""
        return retry_after_seconds(self.wait_ns)

    def __reduce__(self) -> tuple[Any, ...]:
        # The live instance (locks, clients) cannot cross a process boundary: a pickled rejection keeps
        # its name, wait and message but carries None in place of the instance.
        state = {k: (None if k in _INSTANCE_ATTRS else v) for k, v in self._settled().items()}
        return (_restore, (type(self), state))

    def _settled(self) -> dict[str, Any]:
        """The attributes to pickle, with anything read lazily from the instance read now."""
        return dict(self.__dict__)


_INSTANCE_ATTRS = frozenset(
    {"rate_limiter", "bulkhead", "circuit_breaker", "retry", "time_limiter", "adaptive_throttler"}
)


def _restore(cls: type[ResilienceError], state: dict[str, Any]) -> ResilienceError:
    exc = cls.__new__(cls)
    exc.__dict__.update(state)
    return exc


class RequestNotPermitted(ResilienceError):
    """A rate limiter refused a permit (Resilience4j's ``RequestNotPermitted``).

    ``rate_limiter`` is a ``RateLimiter``, a client's view (``get_rate_limiter(name, key=...)``) or a
    keyed store. Without ``wait_ns`` the wait is read from it whenever :attr:`wait_ns` is read. ``key`` is the
    client key a per-key limiter refused (for logs; responses never echo it), None for a shared limiter.
    """

    #: The refused client's key (None: a shared limiter); a class default so rejections pickled without one load.
    key: str | None = None
    #: ``(remaining, reset_ns)`` of each limit the decision read (a Redis decision reads them in its own
    #: round trip, so the 429's RateLimit fields need no second one); None when not read.
    quotas: tuple[tuple[int, int], ...] | None = None

    def __init__(
        self,
        rate_limiter: RateLimiter,
        wait_ns: int | None = None,
        *,
        key: str | None = None,
        quotas: tuple[tuple[int, int], ...] | None = None,
    ) -> None:
        self.rate_limiter = rate_limiter
        self.name = rate_limiter.name
        self._wait_ns = wait_ns
        if key is not None:
            self.key = key
        if quotas is not None:
            self.quotas = quotas

    @property
    def wait_ns(self) -> int:
        """The wait given at construction, else the limiter's wait now (see :func:`rate_limiter_wait_ns`)."""
        wait = self._wait_ns
        if wait is None:
            return rate_limiter_wait_ns(self.rate_limiter, self.key)
        return wait

    @wait_ns.setter
    def wait_ns(self, value: int) -> None:
        self._wait_ns = value

    async def await_wait_ns(self) -> int:
        """:attr:`wait_ns` for async code: a Redis-backed limiter's state is read with redis.asyncio.

        The value read is kept, so a response built afterwards reads no state again.
        """
        wait = self._wait_ns
        if wait is None:
            wait = self._wait_ns = await arate_limiter_wait_ns(self.rate_limiter, self.key)
        return wait

    def _settled(self) -> dict[str, Any]:
        state = super()._settled()
        state["_wait_ns"] = self.wait_ns
        return state

    def __str__(self) -> str:
        return f"RateLimiter '{self.name}' does not permit further calls"


class BulkheadFull(ResilienceError):
    """A bulkhead had no free slot within its wait budget (``BulkheadFullException``)."""

    def __init__(self, bulkhead: Bulkhead, wait_ns: int = 0) -> None:
        self.bulkhead = bulkhead
        self.name = bulkhead.name
        self.wait_ns = wait_ns

    def __str__(self) -> str:
        return f"Bulkhead '{self.name}' is full and does not permit further calls"


class CallNotPermitted(ResilienceError):
    """A circuit breaker is OPEN or FORCED_OPEN (``CallNotPermittedException``).

    Without ``state`` / ``wait_ns`` (raised by your own code) they are read from the breaker when read:
    its state and its remaining open time (``remaining_open_ns()``).
    """

    def __init__(self, circuit_breaker: CircuitBreaker, state: Any = None, wait_ns: int | None = None) -> None:
        self.circuit_breaker = circuit_breaker
        self.name = circuit_breaker.name
        self._state = state
        self._wait_ns = wait_ns

    @property
    def state(self) -> Any:
        """The state given at construction, else the breaker's state now."""
        state = self._state
        return getattr(self.circuit_breaker, "state", None) if state is None else state

    @state.setter
    def state(self, value: Any) -> None:
        self._state = value

    @property
    def wait_ns(self) -> int:
        """The wait given at construction, else the breaker's remaining open time now."""
        wait = self._wait_ns
        if wait is None:
            remaining = getattr(self.circuit_breaker, "remaining_open_ns", None)
            return int(remaining()) if callable(remaining) else 0
        return wait

    @wait_ns.setter
    def wait_ns(self, value: int) -> None:
        self._wait_ns = value

    def _settled(self) -> dict[str, Any]:
        state = super()._settled()
        state["_state"] = self.state
        state["_wait_ns"] = self.wait_ns
        return state

    def __str__(self) -> str:
        state = self.state
        return f"CircuitBreaker '{self.name}' is {getattr(state, 'name', state)} and does not permit further calls"


class CallThrottled(CallNotPermitted):
    """An adaptive throttler refused a call locally (Google SRE's client-side throttling).

    A :class:`CallNotPermitted` (the dependency was not called, a 503 on the HTTP edge), so code and
    fallbacks that handle an open breaker handle it too. ``probability`` is the rejection probability
    the call drew against; ``wait_ns`` is 1 s (the throttle has no open time to report).
    """

    def __init__(self, throttler: AdaptiveThrottler, probability: float, wait_ns: int = _NS_PER_S) -> None:
        super().__init__(throttler, None, wait_ns)  # type: ignore[arg-type]
        self.adaptive_throttler = throttler
        self.probability = probability

    def __str__(self) -> str:
        return (
            f"AdaptiveThrottler '{self.name}' rejected the call locally "
            f"(rejection probability {self.probability:.2f}: the dependency keeps rejecting)"
        )


def rate_limiter_wait_ns(limiter: Any, key: Any = None) -> int:
    """Nanoseconds until ``limiter`` admits one call now, for :class:`RequestNotPermitted` built without a wait.

    ``limiter`` is a ``RateLimiter`` or a client's view (their ``metrics.nanos_to_wait``), or a keyed
    store with ``key`` (``state(key)``). A keyed store without a key cannot know which client was
    refused: it answers one ``limit_refresh_period``, the longest wait of a client without
    reservations. 0 when nothing is known (a pickled copy has no instance).
    """
    if key is not None:
        state = getattr(limiter, "state", None)
        if callable(state):  # a keyed store
            return int(state(key)[2])
    wait = getattr(getattr(limiter, "metrics", None), "nanos_to_wait", None)
    if isinstance(wait, int):
        return wait
    period = getattr(getattr(limiter, "config", None), "limit_refresh_period", None)
    return int(period) if isinstance(period, int) else 0


async def arate_limiter_wait_ns(limiter: Any, key: Any = None) -> int:
    """:func:`rate_limiter_wait_ns` without blocking the event loop: a remote store or backend (Redis) is awaited
    (``aquota``, declared by their protocols); an in-memory one is a few integer operations under a lock, read
    directly."""
    parent = getattr(limiter, "parent", None)
    if parent is not None and key is None:  # a client's view: that key in its store
        limiter, key = parent, getattr(limiter, "key", None)
    if key is not None:
        store = getattr(limiter, "store", None)  # a keyed limiter's KeyedBackend (core.backend)
        if store is not None and store.remote:
            remaining, reset_ns = await store.aquota(key)
            return 0 if remaining >= 1 else int(reset_ns)
    else:
        remote = getattr(limiter, "remote_backend", None)  # a RateLimiter's (None in memory, or a pickled copy)
        if remote is not None:
            remaining, reset_ns = await remote.aquota()
            return 0 if remaining >= 1 else int(reset_ns)
    return rate_limiter_wait_ns(limiter, key)


class MaxRetriesExceeded(ResilienceError):
    """Retry exhausted its attempts on results it was told to retry (``fail_after_max_attempts``)."""

    def __init__(self, retry: Retry, attempts: int) -> None:
        self.retry = retry
        self.name = retry.name
        self.attempts = attempts
        super().__init__(f"Retry '{self.name}' has exhausted all attempts ({attempts})")


class TimeLimitExceeded(ResilienceError, TimeoutError):
    """A time limiter's deadline passed before the call finished. Also a :class:`TimeoutError`."""

    def __init__(self, time_limiter: TimeLimiter) -> None:
        self.time_limiter = time_limiter
        self.name = time_limiter.name
        super().__init__(f"TimeLimiter '{self.name}' recorded a timeout exception.")


class IllegalStateTransition(ResilienceError):
    """A circuit breaker was asked for a transition Resilience4j does not allow."""

    def __init__(self, name: str, from_state: Any, to_state: Any) -> None:
        self.name = name
        self.from_state = from_state
        self.to_state = to_state
        super().__init__(
            f"CircuitBreaker '{name}' tried an illegal state transition from "
            f"{getattr(from_state, 'name', from_state)} to {getattr(to_state, 'name', to_state)}"
        )


class FieldError:
    """One invalid configuration field: which field, what is wrong, and how to fix it."""

    __slots__ = ("field", "hint", "message")

    def __init__(self, field: str, message: str, hint: str | None = None) -> None:
        self.field = field
        self.message = message
        self.hint = hint

    def __repr__(self) -> str:
        return f"FieldError({self.field!r}, {self.message!r})"


class ConfigurationError(ValueError):
    """A config object was given invalid values. ``errors`` lists every bad field, not only the first."""

    def __init__(self, config_name: str, errors: list[FieldError]) -> None:
        self.config_name = config_name
        self.errors = errors
        details = "; ".join(f"{e.field}: {e.message}" for e in errors)
        super().__init__(f"invalid {config_name}: {details}")
