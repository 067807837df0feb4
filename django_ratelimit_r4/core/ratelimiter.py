"""Rate limiter: Resilience4j's AtomicRateLimiter algorithm, with a fail-fast default."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, ParamSpec, TypeVar

from .backend import (
    ALGORITHMS,
    CYCLE,
    GCRA,
    MAX_SLIDING_WINDOW_LIMIT,
    SLIDING_WINDOW,
    BackendFactory,
    RateLimiterBackend,
    RemoteRateLimiterBackend,
    as_remote,
    memory_backends,
)
from .clock import SYSTEM_CLOCK, Clock
from .config import Validator
from .coroutines import twin_wrapper
from .durations import MAX_PERIOD_NS, format_duration
from .events import Event, EventPublisher
from .exceptions import RequestNotPermitted
from .waiting import Waiters

__all__ = [
    "DRAINED",
    "FAILED_ACQUIRE",
    "MAX_LIMIT_FOR_PERIOD",
    "SUCCESSFUL_ACQUIRE",
    "RateLimiter",
    "RateLimiterConfig",
    "RateLimiterEvent",
    "RateLimiterEvents",
    "RateLimiterMetrics",
    "aacquire_all",
    "acquire_all",
    "most_grantable",
    "refuse_never_grantable",
]

P = ParamSpec("P")
R = TypeVar("R")

#: Event types, Resilience4j's names.
SUCCESSFUL_ACQUIRE = "SUCCESSFUL_ACQUIRE"
FAILED_ACQUIRE = "FAILED_ACQUIRE"
DRAINED = "DRAINED"


#: Largest ``limit_for_period``: RFC 9651's largest integer (15 digits, sent exactly as ``RateLimit-Policy``'s
#: ``q``), and below 2**53, so every backend holds it exactly (Redis scripts compute in doubles).
MAX_LIMIT_FOR_PERIOD = 999_999_999_999_999


@dataclass(frozen=True, slots=True)
class RateLimiterConfig:
    """Configuration of a :class:`RateLimiter` (Resilience4j's ``RateLimiterConfig``).

    Durations accept ``timedelta`` or strings with a unit and are stored as integer nanoseconds.
    ``timeout_duration`` defaults to 0 (Resilience4j: 5 s): a web request must fail fast.

    ``algorithm`` (not in Resilience4j) picks how the budget refills: ``"cycle"`` (Resilience4j's fixed cycles,
    the default), ``"gcra"`` (smooth, at most ``burst`` at once, ``burst`` defaulting to ``limit_for_period``)
    or ``"sliding_window"`` (exact: never more than ``limit_for_period`` in any ``limit_refresh_period``); see
    :mod:`django_ratelimit_r4.backends.algorithms` for the guarantees.
    """

    limit_for_period: int = 50
    limit_refresh_period: Any = "500ns"
    timeout_duration: Any = 0
    #: Called with the call's outcome (result or exception); True drains the limiter (upstream 429s).
    drain_permissions_on_result: Callable[[Any], bool] | str | None = None
    writable_stack_trace_enabled: bool = True
    algorithm: str = CYCLE
    burst: int | None = None

    def __post_init__(self) -> None:
        v = Validator(self)
        v.integer("limit_for_period", minimum=1, maximum=MAX_LIMIT_FOR_PERIOD)
        algorithm = self.algorithm
        if isinstance(algorithm, str) and algorithm.lower() in ALGORITHMS:
            object.__setattr__(self, "algorithm", algorithm.lower())
        else:
            v.error(
                "algorithm",
                f"must be one of {', '.join(repr(a) for a in ALGORITHMS)}, got {algorithm!r}",
                "'cycle' is Resilience4j's limiter; 'gcra' and 'sliding_window' have no boundary bursts.",
            )
        if self.burst is not None:
            v.integer("burst", minimum=1, maximum=MAX_LIMIT_FOR_PERIOD)
            if self.algorithm != GCRA:
                v.error(
                    "burst",
                    f"applies only to algorithm 'gcra', but algorithm is {self.algorithm!r}",
                    "Remove burst, or set algorithm to 'gcra'.",
                )
        limit = self.limit_for_period
        if self.algorithm == SLIDING_WINDOW and isinstance(limit, int) and limit > MAX_SLIDING_WINDOW_LIMIT:
            v.error(
                "limit_for_period",
                f"is at most {MAX_SLIDING_WINDOW_LIMIT} with algorithm 'sliding_window' (its log keeps one "
                f"time per permit), got {limit}",
                "Use algorithm 'gcra' for large limits: one integer of state whatever the limit.",
            )
        v.duration("limit_refresh_period", min_ns=1, max_ns=MAX_PERIOD_NS)
        v.duration("timeout_duration", max_ns=MAX_PERIOD_NS)
        v.callable_or_path("drain_permissions_on_result")
        v.boolean("writable_stack_trace_enabled")
        v.done()


def most_grantable(config: RateLimiterConfig, timeout_ns: int) -> int:
    """The most permits one call can ever be granted by a limiter with ``config`` waiting at most ``timeout_ns``.

    Without a timeout that is ``limit_for_period``: a cycle never holds more. With one, a call may reserve
    permits of later cycles (Resilience4j's semantics) when the wait fits: at best, a full limiter 1 ns before
    a cycle boundary needs ``1 + div_ceil(permits - 2 * limit, limit) * period``. GCRA never grants more than
    ``burst`` at once, the sliding window never more than ``limit_for_period``, whatever the timeout.
    """
    limit = int(config.limit_for_period)
    if config.algorithm == GCRA:
        return limit if config.burst is None else int(config.burst)
    if config.algorithm == SLIDING_WINDOW:
        return limit
    if timeout_ns <= 0:
        return limit
    return limit * (2 + (timeout_ns - 1) // int(config.limit_refresh_period))


def refuse_never_grantable(limiter: Any, permits: int, timeout_ns: int) -> None:
    """Raise ``ValueError`` if no state of ``limiter`` could ever grant ``permits`` in one call.

    Called on the rejection path only (free for granted calls): such a request would otherwise be rejected
    forever with a wait (a ``Retry-After``) that is a lie. ``limiter`` has ``name`` and ``config``.
    """
    most = most_grantable(limiter.config, timeout_ns)
    if permits > most:
        config = limiter.config
        raise ValueError(
            f"rate limiter {limiter.name!r} can never grant {permits} permits in one call: it allows "
            f"{config.limit_for_period} per {format_duration(config.limit_refresh_period)}"
            + (f" and waits at most {format_duration(timeout_ns)}" if timeout_ns > 0 else " without waiting")
            + f", so at most {most}; ask for fewer permits or raise limit_for_period"
        )


# --------------------------------------------------------------------------------------------------------------
# Events


@dataclass(frozen=True, slots=True)
class RateLimiterEvent(Event):
    """A rate-limiter event: ``SUCCESSFUL_ACQUIRE``, ``FAILED_ACQUIRE`` or ``DRAINED``.

    ``number_of_permits`` is the permits asked for, or for ``DRAINED`` the number actually drained.
    """

    number_of_permits: int = 1


class RateLimiterEvents(EventPublisher[RateLimiterEvent]):
    """Listeners of one :class:`RateLimiter`. A listener that raises is logged and never breaks a call."""

    EVENT_TYPES: ClassVar[tuple[str, ...]] = (SUCCESSFUL_ACQUIRE, FAILED_ACQUIRE, DRAINED)

    __slots__ = ("wants_drained", "wants_failed", "wants_successful")

    def __init__(self) -> None:
        super().__init__()
        self._listeners_changed()

    def _listeners_changed(self) -> None:
        # Per-type flags so a listener of one type costs the other paths nothing (one attribute read).
        self.wants_successful = self.wants(SUCCESSFUL_ACQUIRE)
        self.wants_failed = self.wants(FAILED_ACQUIRE)
        self.wants_drained = self.wants(DRAINED)

    def on_successful_acquire(
        self, listener: Callable[[RateLimiterEvent], object]
    ) -> Callable[[RateLimiterEvent], object]:
        """Call ``listener`` for every granted acquisition or reservation. Usable as a decorator."""
        return self._on(SUCCESSFUL_ACQUIRE, listener)

    def on_failed_acquire(
        self, listener: Callable[[RateLimiterEvent], object]
    ) -> Callable[[RateLimiterEvent], object]:
        """Call ``listener`` for every rejected acquisition or reservation. Usable as a decorator."""
        return self._on(FAILED_ACQUIRE, listener)

    def on_drained(
        self, listener: Callable[[RateLimiterEvent], object]
    ) -> Callable[[RateLimiterEvent], object]:
        """Call ``listener`` after :meth:`RateLimiter.drain_permissions`. Usable as a decorator."""
        return self._on(DRAINED, listener)


# --------------------------------------------------------------------------------------------------------------
# Metrics


class RateLimiterMetrics:
    """Live figures of one :class:`RateLimiter`, computed when read; reading never changes the limiter."""

    __slots__ = ("_limiter",)

    def __init__(self, limiter: RateLimiter) -> None:
        self._limiter = limiter

    @property
    def available_permissions(self) -> int:
        """Permissions available now after the lazy refresh; negative while reservations are outstanding."""
        return self._limiter._backend.state()[1]

    @property
    def nanos_to_wait(self) -> int:
        """Nanoseconds until one permit is available (0 if one is available now)."""
        return self._limiter._backend.state()[2]

    @property
    def cycle(self) -> int:
        """The current cycle number, counted from the limiter's creation (or last ``reset``/``set_clock``)."""
        return self._limiter._backend.state()[0]

    @property
    def number_of_waiting_threads(self) -> int:
        """Callers (threads or tasks) currently waiting for a reserved permit."""
        return self._limiter._waiters.count

    @property
    def successful_calls(self) -> int:
        """Acquisitions and reservations granted since the last reset (a monotonic counter)."""
        return self._limiter._backend.successful_calls

    @property
    def failed_calls(self) -> int:
        """Acquisitions and reservations rejected since the last reset (a monotonic counter)."""
        return self._limiter._backend.failed_calls

    def __repr__(self) -> str:
        cycle, available, wait = self._limiter._backend.state()
        return (
            f"RateLimiterMetrics(available_permissions={available}, nanos_to_wait={wait}, cycle={cycle}, "
            f"number_of_waiting_threads={self.number_of_waiting_threads}, "
            f"successful_calls={self.successful_calls}, failed_calls={self.failed_calls})"
        )


# --------------------------------------------------------------------------------------------------------------
# The limiter


class RateLimiter:
    """Resilience4j's ``AtomicRateLimiter``: ``limit_for_period`` permits per ``limit_refresh_period``.

    Cycles are counted from the limiter's creation (or its last :meth:`reset` / :meth:`set_clock`), and
    permissions refresh lazily on the next decision: ``min(left + elapsed_cycles * limit, limit)``. It is a
    fixed window: up to ``2 * limit`` calls can pass within a moment around a cycle boundary, and an idle
    limiter never banks more than one period's worth. Reservations (``reserve_permission``, or an acquire
    that waits within ``timeout_duration``) may drive the permissions negative; later cycles repay the debt.

    Differences from Resilience4j, all deliberate: ``timeout_duration`` defaults to 0; a caller whose wait
    exceeds the timeout is rejected at once instead of sleeping the whole timeout; ``drain_permissions`` drains
    the refreshed permissions and keeps debt; rejections carry the wait for ``Retry-After``.

    Every decision is one call into the backend (default :class:`~django_ratelimit_r4.backends.memory.MemoryBackend`,
    two ints behind one lock held only for the arithmetic), so it is exact under concurrency and O(1).
    """

    def __init__(
        self,
        name: str,
        config: RateLimiterConfig | None = None,
        *,
        clock: Clock | None = None,
        backend: BackendFactory | None = None,
    ) -> None:
        """Build a limiter, full, whose first cycle starts at ``clock``'s current time.

        ``backend`` builds the state holder; it defaults to the in-process ``MemoryBackend``.
        """
        self.name = name
        self.config: RateLimiterConfig = config if config is not None else RateLimiterConfig()
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self.events = RateLimiterEvents()
        self.metrics = RateLimiterMetrics(self)
        factory: BackendFactory
        default, for_config = memory_backends()  # the in-process backends, injected (see core.backend)
        if self.config.algorithm == CYCLE:
            factory = backend if backend is not None else default
        elif backend is None or backend is default:
            factory = for_config(self.config)
        elif callable(getattr(backend, "for_config", None)):  # a backend with algorithms of its own (Redis)
            factory = backend.for_config(self.config)  # type: ignore[attr-defined]
        else:
            raise ValueError(
                f"rate limiter {name!r}: algorithm {self.config.algorithm!r} needs the memory backend "
                f"(the {getattr(backend, '__name__', type(backend).__name__)} backend implements 'cycle' only)"
            )
        self._backend: RateLimiterBackend = factory(
            name, self.config.limit_for_period, int(self.config.limit_refresh_period), self.clock
        )
        # Bound once: the hot path is one call into the backend and a couple of attribute reads.
        self._acquire = self._backend.acquire
        # A backend doing I/O (Redis) is a RemoteRateLimiterBackend: its async twins keep the async path off the
        # blocking calls. An in-process one is not (its decision is a few integer operations under a lock).
        self._remote = as_remote(self._backend)
        self._aacquire: Callable[[int, int], Awaitable[int]] | None = (
            self._remote.aacquire if self._remote is not None else None
        )
        self._timeout_ns: int = int(self.config.timeout_duration)
        self._waiters = Waiters()

    @property
    def backend(self) -> RateLimiterBackend:
        """The object holding this limiter's state."""
        return self._backend

    @property
    def remote_backend(self) -> RemoteRateLimiterBackend | None:
        """:attr:`backend` when it does I/O (its async twins are awaited by the async paths), else None."""
        return self._remote

    # -- acquiring ------------------------------------------------------------------------------------------

    def acquire_permission(self, permits: int = 1) -> bool:
        """Take ``permits``; True if granted.

        Waits (``clock.sleep``) only when the needed wait fits in ``timeout_duration``, having reserved the
        permits first; otherwise returns False at once and reserves nothing. Blocks the thread while waiting:
        from async code use :meth:`aacquire_permission`.

        Resilience4j's naming, kept, and it surprises: here ``acquire_permission`` answers a bool (the raising
        form is :meth:`acquire_or_raise`), while ``CircuitBreaker.acquire_permission`` and
        ``Bulkhead.acquire_permission`` raise (their bool form is ``try_acquire_permission``).
        """
        wait = self._acquire(permits, self._timeout_ns)
        if wait == 0:
            if self.events.wants_successful:
                self._publish(SUCCESSFUL_ACQUIRE, permits)
            return True
        if wait < 0:
            refuse_never_grantable(self, permits, self._timeout_ns)
            if self.events.wants_failed:
                self._publish(FAILED_ACQUIRE, permits)
            return False
        self._waiters.sleep(self.clock, wait)
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)
        return True

    async def aacquire_permission(self, permits: int = 1) -> bool:
        """Async twin of :meth:`acquire_permission`: waits with ``await clock.asleep``, never blocking the loop.

        If the waiting task is cancelled the reserved permits are not given back (as in Resilience4j).
        """
        aacquire = self._aacquire
        if aacquire is None:
            wait = self._acquire(permits, self._timeout_ns)
        else:
            wait = await aacquire(permits, self._timeout_ns)
        if wait == 0:
            if self.events.wants_successful:
                self._publish(SUCCESSFUL_ACQUIRE, permits)
            return True
        if wait < 0:
            refuse_never_grantable(self, permits, self._timeout_ns)
            if self.events.wants_failed:
                self._publish(FAILED_ACQUIRE, permits)
            return False
        await self._waiters.asleep(self.clock, wait)
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)
        return True

    def acquire_or_raise(self, permits: int = 1) -> None:
        """Like :meth:`acquire_permission`, but raise :class:`RequestNotPermitted` on rejection.

        The exception's ``wait_ns`` is the wait computed in the same critical section as the decision.
        """
        wait = self._acquire(permits, self._timeout_ns)
        if wait < 0:
            refuse_never_grantable(self, permits, self._timeout_ns)
            if self.events.wants_failed:
                self._publish(FAILED_ACQUIRE, permits)
            raise RequestNotPermitted(self, -wait)
        if wait > 0:
            self._waiters.sleep(self.clock, wait)
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)

    async def aacquire_or_raise(self, permits: int = 1) -> None:
        """Async twin of :meth:`acquire_or_raise`."""
        aacquire = self._aacquire
        if aacquire is None:
            wait = self._acquire(permits, self._timeout_ns)
        else:
            wait = await aacquire(permits, self._timeout_ns)
        if wait < 0:
            refuse_never_grantable(self, permits, self._timeout_ns)
            if self.events.wants_failed:
                self._publish(FAILED_ACQUIRE, permits)
            raise RequestNotPermitted(self, -wait)
        if wait > 0:
            await self._waiters.asleep(self.clock, wait)
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)

    def acquire_quota(self, permits: int = 1) -> tuple[int, int]:
        """:meth:`acquire_or_raise`, returning ``(remaining, reset_ns)`` as ``backend.quota()`` reads them when
        the permits are handed over (right after the decision, or after the wait for a reserved permit).

        A :class:`~django_ratelimit_r4.core.backend.RemoteRateLimiterBackend` (Redis) decides and reads them in
        one round trip (``acquire_quota``), and a rejection carries them in ``RequestNotPermitted.quotas``; an
        in-process backend is asked ``quota()`` after the decision.
        """
        backend = self._remote
        if backend is None:
            self.acquire_or_raise(permits)
            return self._backend.quota()
        wait, remaining, reset_ns = backend.acquire_quota(permits, self._timeout_ns)
        if wait < 0:
            if permits > 1:  # one permit is always grantable (a limit and a burst are >= 1)
                refuse_never_grantable(self, permits, self._timeout_ns)
            if self.events.wants_failed:
                self._publish(FAILED_ACQUIRE, permits)
            raise RequestNotPermitted(self, -wait, quotas=((remaining, reset_ns),))
        if wait > 0:
            self._waiters.sleep(self.clock, wait)
            remaining, reset_ns = backend.quota()
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)
        return remaining, reset_ns

    async def aacquire_quota(self, permits: int = 1) -> tuple[int, int]:
        """Async twin of :meth:`acquire_quota` (``aacquire_quota``/``aquota`` of a backend doing I/O)."""
        backend = self._remote
        if backend is None:
            await self.aacquire_or_raise(permits)
            return self._backend.quota()
        wait, remaining, reset_ns = await backend.aacquire_quota(permits, self._timeout_ns)
        if wait < 0:
            if permits > 1:  # one permit is always grantable (a limit and a burst are >= 1)
                refuse_never_grantable(self, permits, self._timeout_ns)
            if self.events.wants_failed:
                self._publish(FAILED_ACQUIRE, permits)
            raise RequestNotPermitted(self, -wait, quotas=((remaining, reset_ns),))
        if wait > 0:
            await self._waiters.asleep(self.clock, wait)
            remaining, reset_ns = await backend.aquota()
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)
        return remaining, reset_ns

    def reserve_permission(self, permits: int = 1) -> int:
        """Reserve ``permits`` without waiting: 0 (use them now), nanoseconds the caller must wait before
        using them (reserved), or -1 when the wait would exceed ``timeout_duration`` (nothing reserved)."""
        wait = self._acquire(permits, self._timeout_ns)
        if wait >= 0:
            if self.events.wants_successful:
                self._publish(SUCCESSFUL_ACQUIRE, permits)
            return wait
        refuse_never_grantable(self, permits, self._timeout_ns)
        if self.events.wants_failed:
            self._publish(FAILED_ACQUIRE, permits)
        return -1

    def drain_permissions(self) -> int:
        """Set the current (refreshed) permissions to 0 and return how many were drained.

        Outstanding reservations (negative permissions) are kept. Resilience4j drains the stale count from the
        last call instead, and forgives debt; this does neither.
        """
        drained = self._backend.drain()
        if self.events.wants_drained:
            self._publish(DRAINED, drained)
        return drained

    # -- protecting calls -----------------------------------------------------------------------------------

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Acquire one permit (or raise :class:`RequestNotPermitted`), then return ``fn(*args, **kwargs)``.

        The outcome (result or exception) goes to ``config.drain_permissions_on_result``; True drains.
        """
        self.acquire_or_raise()
        # The config stores the predicate already imported when it was given as a dotted path.
        drain_if: Callable[[Any], bool] | None = self.config.drain_permissions_on_result  # type: ignore[assignment]
        if drain_if is None:
            return fn(*args, **kwargs)
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            if drain_if(exc):
                self.drain_permissions()
            raise
        if drain_if(result):
            self.drain_permissions()
        return result

    async def acall(self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Async twin of :meth:`call` for a coroutine function."""
        await self.aacquire_or_raise()
        # The config stores the predicate already imported when it was given as a dotted path.
        drain_if: Callable[[Any], bool] | None = self.config.drain_permissions_on_result  # type: ignore[assignment]
        if drain_if is None:
            return await fn(*args, **kwargs)
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            if drain_if(exc):
                self.drain_permissions()
            raise
        if drain_if(result):
            self.drain_permissions()
        return result

    def decorate(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Wrap ``fn`` (sync or ``async def``) so each call goes through :meth:`call` / :meth:`acall`."""
        return twin_wrapper(fn, self.call, self.acall)

    # -- runtime changes ------------------------------------------------------------------------------------

    def change_limit_for_period(self, limit_for_period: int) -> None:
        """Use a new limit at once in wait calculations; current permissions are capped at the next cycle.

        As in Resilience4j the cycle and permissions are kept; invalid values raise ``ConfigurationError``.
        """
        config = dataclasses.replace(self.config, limit_for_period=limit_for_period)
        self._backend.change_limit(config.limit_for_period)
        self.config = config

    def change_timeout_duration(self, timeout_duration: Any) -> None:
        """Use a new timeout (``timedelta``, ``"200ms"``, ``Nanos`` or 0) for later calls; waiters are unaffected."""
        config = dataclasses.replace(self.config, timeout_duration=timeout_duration)
        self._timeout_ns = int(config.timeout_duration)
        self.config = config

    def set_clock(self, clock: Clock) -> None:
        """Read time from ``clock`` and reset, so the first cycle starts at ``clock``'s current time."""
        self.clock = clock
        self._backend.reset(clock)

    def reset(self) -> None:
        """Return to the freshly built state: full, cycle 0 from now, counters at 0 (config and clock kept)."""
        self._backend.reset(self.clock)

    # -- internals ------------------------------------------------------------------------------------------

    def _publish(self, event_type: str, permits: int) -> None:
        self.events.publish(RateLimiterEvent(event_type, self.name, number_of_permits=permits))

    def __repr__(self) -> str:
        c = self.config
        return (
            f"RateLimiter({self.name!r}, limit_for_period={c.limit_for_period}, "
            f"limit_refresh_period={format_duration(c.limit_refresh_period)}, "
            f"timeout_duration={format_duration(c.timeout_duration)})"
        )


def acquire_all(limiters: Sequence[RateLimiter], permits: int = 1) -> tuple[RateLimiter, int] | None:
    """All-or-nothing: take ``permits`` from every limiter, or from none.

    Each limiter decides with timeout 0 while all of them are locked (in a fixed order, so overlapping calls
    cannot deadlock). Returns None when all granted. Otherwise nothing is consumed anywhere and the result is
    ``(the rejecting limiter with the largest wait, that wait in ns)``; every rejecting limiter counts a failed
    call, and the returned one publishes ``FAILED_ACQUIRE``. All limiters must share one backend type.
    """
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits}")
    if not limiters:
        return None
    backends = [limiter._backend for limiter in limiters]
    outcome = backends[0].acquire_many(backends, permits)
    return _all_outcome(limiters, outcome, permits)


async def aacquire_all(limiters: Sequence[RateLimiter], permits: int = 1) -> tuple[RateLimiter, int] | None:
    """Async twin of :func:`acquire_all`: a backend doing I/O (Redis) decides without blocking the loop."""
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits}")
    if not limiters:
        return None
    backends = [limiter._backend for limiter in limiters]
    remote = limiters[0]._remote  # all limiters share one backend type
    if remote is None:
        outcome = backends[0].acquire_many(backends, permits)
    else:
        outcome = await remote.aacquire_many(backends, permits)
    return _all_outcome(limiters, outcome, permits)


def _all_outcome(
    limiters: Sequence[RateLimiter], outcome: tuple[int, int] | None, permits: int
) -> tuple[RateLimiter, int] | None:
    """Publish the events of an all-or-nothing decision and shape its result."""
    if outcome is None:
        for limiter in limiters:
            if limiter.events.wants_successful:
                limiter._publish(SUCCESSFUL_ACQUIRE, permits)
        return None
    for limiter in limiters:
        refuse_never_grantable(limiter, permits, 0)  # all-or-nothing decides with timeout 0
    index, wait = outcome
    rejecting = limiters[index]
    if rejecting.events.wants_failed:
        rejecting._publish(FAILED_ACQUIRE, permits)
    return rejecting, wait
