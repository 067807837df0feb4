"""Exceptions raised by the primitives. Each carries its instance so a response can compute Retry-After.

They share :class:`ResilienceError`. ``wait_ns`` is the state-derived wait at the moment of rejection
(nanoseconds to the next permit, or remaining open time); :attr:`ResilienceError.retry_after` turns
it into HTTP delay-seconds: rounded up, never 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .bulkhead import Bulkhead
    from .circuitbreaker import CircuitBreaker
    from .ratelimiter import RateLimiter
    from .retry import Retry
    from .timelimiter import TimeLimiter

__all__ = [
    "BulkheadFull",
    "CallNotPermitted",
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
        state = {k: (None if k in _INSTANCE_ATTRS else v) for k, v in self.__dict__.items()}
        return (_restore, (type(self), state))


_INSTANCE_ATTRS = frozenset({"rate_limiter", "bulkhead", "circuit_breaker", "retry", "time_limiter"})


def _restore(cls: type[ResilienceError], state: dict[str, Any]) -> ResilienceError:
    exc = cls.__new__(cls)
    exc.__dict__.update(state)
    return exc


class RequestNotPermitted(ResilienceError):
    """A rate limiter refused a permit (Resilience4j's ``RequestNotPermitted``)."""

    def __init__(self, rate_limiter: RateLimiter, wait_ns: int = 0) -> None:
        self.rate_limiter = rate_limiter
        self.name = rate_limiter.name
        self.wait_ns = wait_ns

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
    """A circuit breaker is OPEN or FORCED_OPEN (``CallNotPermittedException``)."""

    def __init__(self, circuit_breaker: CircuitBreaker, state: Any = None, wait_ns: int = 0) -> None:
        self.circuit_breaker = circuit_breaker
        self.name = circuit_breaker.name
        self.state = state
        self.wait_ns = wait_ns

    def __str__(self) -> str:
        return f"CircuitBreaker '{self.name}' is {getattr(self.state, 'name', self.state)} and does not permit further calls"


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
