"""Retry with constant, exponential and randomized backoff; the sleep is injectable."""

from __future__ import annotations

import inspect
import random as _random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from .clock import SYSTEM_CLOCK, Clock
from .config import Validator
from .coroutines import twin_wrapper
from .durations import DurationError, format_duration, parse_duration
from .events import Event, EventPublisher
from .exceptions import MaxRetriesExceeded
from .retrybudget import RetryBudget

__all__ = ["Retry", "RetryConfig", "RetryEvent", "RetryEvents", "RetryMetrics"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """Configuration of a :class:`Retry` (Resilience4j's ``RetryConfig``).

    ``max_attempts`` includes the first call. Which exceptions are retried: ``retry_exceptions`` (classes)
    OR ``retry_on_exception`` (a predicate on the exception); neither means every ``Exception``;
    ``ignore_exceptions`` always wins. ``retry_on_result`` is a predicate on the return value.
    ``interval_function`` replaces the built-in waits: ``f(attempt)`` or ``f(attempt, outcome)`` (the
    exception or the retried result, Resilience4j's ``IntervalBiFunction``) returning a ``timedelta`` or a
    duration string. Predicates and the function may be given as dotted paths.
    """

    max_attempts: int = 3
    wait_duration: Any = "500ms"
    enable_exponential_backoff: bool = False
    exponential_backoff_multiplier: float = 1.5
    exponential_max_wait_duration: Any = None
    enable_randomized_wait: bool = False
    randomized_wait_factor: float = 0.5
    retry_exceptions: Any = ()
    ignore_exceptions: Any = ()
    retry_on_result: Callable[[Any], bool] | str | None = None
    retry_on_exception: Callable[[BaseException], bool] | str | None = None
    interval_function: Callable[..., Any] | str | None = None
    fail_after_max_attempts: bool = False

    def __post_init__(self) -> None:
        v = Validator(self)
        v.integer("max_attempts", minimum=1)
        v.duration("wait_duration")
        v.boolean("enable_exponential_backoff")
        v.number("exponential_backoff_multiplier", ge=1)
        v.duration("exponential_max_wait_duration", allow_none=True)
        v.boolean("enable_randomized_wait")
        v.number("randomized_wait_factor", ge=0, le=1)
        v.exception_classes("retry_exceptions")
        v.exception_classes("ignore_exceptions")
        v.callable_or_path("retry_on_result")
        v.callable_or_path("retry_on_exception")
        v.callable_or_path("interval_function")
        v.check(
            "interval_function",
            self.interval_function is None
            or not (self.enable_exponential_backoff is True or self.enable_randomized_wait is True),
            "cannot be combined with enable_exponential_backoff or enable_randomized_wait (Resilience4j refuses "
            "an interval configured twice)",
            "Compute the backoff in the function, or drop it and use the built-in options.",
        )
        v.boolean("fail_after_max_attempts")
        # Resilience4j's interval functions refuse intervals below 1 ms (IntervalFunction.checkInterval): the
        # grown or jittered wait is computed in whole milliseconds, so a shorter one would be 0.
        wait = self.wait_duration
        backoff = self.enable_exponential_backoff is True or self.enable_randomized_wait is True
        if backoff and isinstance(wait, int) and wait < _MS:
            v.error(
                "wait_duration",
                f"must be at least 1ms with exponential or randomized backoff, got {format_duration(wait)}",
                "Resilience4j's interval functions work in whole milliseconds and refuse shorter intervals.",
            )
        cap = self.exponential_max_wait_duration
        if isinstance(cap, int) and cap < _MS:
            v.error(
                "exponential_max_wait_duration",
                f"must be at least 1ms, got {format_duration(cap)}",
                "Resilience4j refuses a maximum interval below 1 ms; leave it None for no cap.",
            )
        v.done()


_MS = 1_000_000
# Java's Long.MAX_VALUE: where Resilience4j's long arithmetic (in milliseconds) stops; keeps huge backoffs finite.
_MAX_WAIT_MS = 2**63 - 1

#: Event types of a :class:`Retry`, as Resilience4j names them.
RETRY, ERROR, SUCCESS, IGNORED_ERROR = "RETRY", "ERROR", "SUCCESS", "IGNORED_ERROR"


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryEvent(Event):
    """A retry event (Resilience4j's ``RetryOnRetryEvent``, ``RetryOnErrorEvent``, ...).

    ``number_of_attempts`` is Resilience4j's ``numberOfAttempts``: the failed attempts so far (for
    RETRY and ERROR it includes the attempt that just failed; for SUCCESS it counts the retries that
    preceded the success). ``wait_ns`` is the wait before the next attempt (RETRY only).
    """

    number_of_attempts: int = 0
    last_exception: BaseException | None = None
    wait_ns: int = 0


class RetryEvents(EventPublisher[RetryEvent]):
    """Listeners of one :class:`Retry`. Each ``on_<type>`` returns the listener (decorator-friendly).

    - RETRY: an attempt failed (exception or ``retry_on_result``) and another one follows after ``wait_ns``.
    - ERROR: attempts are exhausted; carries the last exception (or :class:`MaxRetriesExceeded`).
    - SUCCESS: a call succeeded *after* at least one retry (a first-try success publishes nothing).
    - IGNORED_ERROR: an exception that is not retried (ignored, or not in ``retry_exceptions``).
    """

    __slots__ = ()
    EVENT_TYPES = (RETRY, ERROR, SUCCESS, IGNORED_ERROR)

    def on_retry(self, listener: Callable[[RetryEvent], object]) -> Callable[[RetryEvent], object]:
        """Call ``listener`` before each wait between attempts."""
        return self._on(RETRY, listener)

    def on_error(self, listener: Callable[[RetryEvent], object]) -> Callable[[RetryEvent], object]:
        """Call ``listener`` when a call fails after exhausting its attempts."""
        return self._on(ERROR, listener)

    def on_success(self, listener: Callable[[RetryEvent], object]) -> Callable[[RetryEvent], object]:
        """Call ``listener`` when a call succeeds after at least one retry."""
        return self._on(SUCCESS, listener)

    def on_ignored_error(self, listener: Callable[[RetryEvent], object]) -> Callable[[RetryEvent], object]:
        """Call ``listener`` when an exception is raised without being retried."""
        return self._on(IGNORED_ERROR, listener)


class RetryMetrics:
    """Cumulative counters of one :class:`Retry`, read by exporters at scrape time.

    A call counts "with retry attempt" when it made more than one attempt. ``number_of_total_calls``
    counts every attempt, like Resilience4j's ``getNumberOfTotalCalls``.
    """

    __slots__ = (
        "number_of_budget_exhausted_calls",
        "number_of_failed_calls_with_retry_attempt",
        "number_of_failed_calls_without_retry_attempt",
        "number_of_successful_calls_with_retry_attempt",
        "number_of_successful_calls_without_retry_attempt",
        "number_of_total_calls",
    )

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        #: Calls that succeeded on the first attempt.
        self.number_of_successful_calls_without_retry_attempt = 0
        #: Calls that succeeded after one or more retries.
        self.number_of_successful_calls_with_retry_attempt = 0
        #: Calls that failed on their only attempt (a non-retried exception, or ``max_attempts=1``).
        self.number_of_failed_calls_without_retry_attempt = 0
        #: Calls that failed after one or more retries.
        self.number_of_failed_calls_with_retry_attempt = 0
        #: Attempts made, over all calls.
        self.number_of_total_calls = 0
        #: Failed calls (also counted above) that stopped early because the retry budget refused a retry.
        self.number_of_budget_exhausted_calls = 0

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)}" for n in self.__slots__)
        return f"RetryMetrics({fields})"


def _interval_caller(fn: Callable[..., Any] | None) -> Callable[[int, Any], Any] | None:
    """``fn`` as ``(attempt, outcome) -> wait``, whether it takes the outcome (IntervalBiFunction) or not."""
    if fn is None:
        return None
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the one-argument form
        return lambda attempt, outcome: fn(attempt)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params):
        return fn
    return lambda attempt, outcome: fn(attempt)


def _custom_wait(name: str, fn: Callable[[int, Any], Any], attempt: int, outcome: Any) -> int:
    """The wait an ``interval_function`` returned, in ns; a bare number is refused (no unit)."""
    value = fn(attempt, outcome)
    try:
        return int(parse_duration(value))
    except DurationError as exc:
        raise ValueError(
            f"retry {name!r}: interval_function returned {value!r} for attempt {attempt}: {exc}; return a "
            "timedelta or a duration string such as '500ms' (Resilience4j's functions return milliseconds)"
        ) from None


class Retry:
    """Calls a function again when it fails, waiting between attempts (Resilience4j's ``Retry``).

    ``call(fn, *args, **kwargs)`` for sync code, ``await acall(async_fn, *args, **kwargs)`` for async
    code (waits with ``asyncio`` only, never blocking the loop), ``decorate(fn)`` for either.

    Waiting goes through ``sleep(seconds)`` / ``await asleep(seconds)``, by default ``clock.sleep`` /
    ``clock.asleep`` so a :class:`~django_ratelimit_r4.core.clock.FakeClock` advances instead of
    sleeping. ``random`` (a :class:`random.Random`) drives the jitter of randomized waits.

    ``budget`` (a :class:`~django_ratelimit_r4.core.retrybudget.RetryBudget`, possibly shared with other
    retries) caps retries at a share of recent calls: each call deposits once, each retry withdraws, and a
    refused retry ends the call as if its attempts were spent (the last error is raised, or the last
    retried result returned), counted in ``metrics.number_of_budget_exhausted_calls``.

    Exceptions that are not :class:`Exception` (``KeyboardInterrupt``, ``asyncio.CancelledError``)
    are never retried, counted or published: they propagate at once.
    """

    def __init__(
        self,
        name: str,
        config: RetryConfig | None = None,
        *,
        clock: Clock | None = None,
        sleep: Callable[[float], object] | None = None,
        asleep: Callable[[float], Awaitable[object]] | None = None,
        random: _random.Random | None = None,
        budget: RetryBudget | None = None,
    ) -> None:
        self.name = name
        self.budget = budget
        self.config = config if config is not None else RetryConfig()
        self.metrics = RetryMetrics()
        self.events = RetryEvents()
        self._custom_sleep = sleep
        self._custom_asleep = asleep
        self._random = random if random is not None else _random.Random()
        self._lock = threading.Lock()
        self.clock: Clock = SYSTEM_CLOCK
        self.set_clock(clock if clock is not None else SYSTEM_CLOCK)

        cfg = self.config
        self._max_attempts: int = cfg.max_attempts
        self._wait_ns: int = int(cfg.wait_duration)
        self._multiplier: float | None = cfg.exponential_backoff_multiplier if cfg.enable_exponential_backoff else None
        self._factor: float | None = cfg.randomized_wait_factor if cfg.enable_randomized_wait else None
        # Grown and jittered waits are whole milliseconds, as Resilience4j's Duration.toMillis() makes them.
        self._wait_ms: int = self._wait_ns // _MS
        max_wait = cfg.exponential_max_wait_duration
        self._cap_ms: int | None = (
            int(max_wait) // _MS if cfg.enable_exponential_backoff and max_wait is not None else None
        )
        # Resolved once: classes OR predicate; neither means every Exception; ignore always wins.
        self._retry_pred: Callable[[BaseException], bool] | None = cfg.retry_on_exception  # type: ignore[assignment]
        self._retry_on: tuple[type[BaseException], ...] = cfg.retry_exceptions or (
            () if self._retry_pred is not None else (Exception,)
        )
        self._ignore: tuple[type[BaseException], ...] = cfg.ignore_exceptions
        self._retry_on_result: Callable[[Any], bool] | None = cfg.retry_on_result  # type: ignore[assignment]
        self._interval_fn: Callable[[int, Any], Any] | None = _interval_caller(cfg.interval_function)  # type: ignore[arg-type]

    # -- lifecycle ---------------------------------------------------------------------------------

    def reset(self) -> None:
        """Zero the metrics. Config, clock, sleeps and event listeners stay."""
        with self._lock:
            self.metrics._clear()

    def set_clock(self, clock: Clock) -> None:
        """Use ``clock``; the default sleeps follow it (explicit ``sleep=`` / ``asleep=`` are kept)."""
        self.clock = clock
        self._sleep: Callable[[float], object] = self._custom_sleep or clock.sleep
        self._asleep: Callable[[float], Awaitable[object]] = self._custom_asleep or clock.asleep

    # -- the wait ----------------------------------------------------------------------------------

    def interval_ns(self, attempt: int) -> int:
        """The wait in nanoseconds after failed attempt number ``attempt`` (1-based; below 1 is a ``ValueError``).

        Resilience4j's ``IntervalFunction``, in its unit (whole milliseconds) so waits match it to the
        millisecond: constant (kept to the nanosecond); exponential ``wait * multiplier^(attempt-1)`` iterated
        with Java's ``(long) (x * multiplier)`` truncation after every step; randomized in
        ``[w - f*w, w + f*w + 1)`` ms, floored at 1 ms; both combined randomize first and cap at
        ``exponential_max_wait_duration`` after.
        """
        return self._interval(attempt, None)

    def _interval(self, attempt: int, outcome: Any) -> int:
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1 (attempts are 1-based, as in Resilience4j), got {attempt!r}")
        custom = self._interval_fn
        if custom is not None:
            return _custom_wait(self.name, custom, attempt, outcome)
        multiplier = self._multiplier
        factor = self._factor
        if multiplier is None and factor is None:
            return self._wait_ns
        interval = self._wait_ms
        if multiplier is not None:
            for _ in range(attempt - 1):
                interval = int(interval * multiplier)
                if interval >= _MAX_WAIT_MS:
                    interval = _MAX_WAIT_MS
                    break
        if factor is not None:
            delta = factor * interval
            low = interval - delta
            # IntervalFunctionCompanion.randomize: min + random * (max - min + 1), at least 1.0, then (long).
            interval = min(int(max(1.0, low + self._random.random() * (interval + delta - low + 1))), _MAX_WAIT_MS)
        cap = self._cap_ms
        if cap is not None and interval > cap:
            interval = cap
        return interval * _MS

    # -- outcome bookkeeping (shared by call and acall) ---------------------------------------------

    def _retryable(self, exc: Exception) -> bool:
        if isinstance(exc, self._ignore):
            return False
        predicate = self._retry_pred
        return isinstance(exc, self._retry_on) or (predicate is not None and bool(predicate(exc)))

    def _failed_attempt(self, attempt: int, exc: BaseException | None, result: Any = None) -> int:
        """Publish RETRY for a failed attempt that will be retried; return the wait in ns."""
        if self._multiplier is None and self._factor is None and self._interval_fn is None:
            wait = self._wait_ns
        else:
            wait = self._interval(attempt, exc if exc is not None else result)
        if self.events.has_listeners:
            self.events.publish(
                RetryEvent(RETRY, self.name, number_of_attempts=attempt, last_exception=exc, wait_ns=wait)
            )
        return wait

    def _count_failure(self, attempts: int) -> None:
        with self._lock:
            metrics = self.metrics
            metrics.number_of_total_calls += attempts
            if attempts > 1:
                metrics.number_of_failed_calls_with_retry_attempt += 1
            else:
                metrics.number_of_failed_calls_without_retry_attempt += 1

    def _after_exception(self, attempt: int, exc: Exception) -> int:
        """The wait in ns before the next attempt after ``exc``, or -1 when ``exc`` must propagate."""
        if not self._retryable(exc):
            self._not_retried(attempt, exc)
            return -1
        if attempt >= self._max_attempts or not self._may_retry():
            self._exhausted_exception(attempt, exc)
            return -1
        return self._failed_attempt(attempt, exc)

    def _after_retried_result(self, attempt: int, last_exc: Exception | None, result: Any = None) -> int:
        """The wait in ns before the next attempt after a result to retry, or -1 when attempts are spent.

        With ``fail_after_max_attempts`` the -1 case raises :class:`MaxRetriesExceeded` instead.
        """
        if attempt >= self._max_attempts or not self._may_retry():
            self._exhausted_result(attempt, last_exc)
            return -1
        return self._failed_attempt(attempt, None, result)

    def _may_retry(self) -> bool:
        """Whether the budget (if any) allows one more retry; a refusal is counted."""
        budget = self.budget
        if budget is None or budget.try_withdraw():
            return True
        with self._lock:
            self.metrics.number_of_budget_exhausted_calls += 1
        return False

    def _exhausted_exception(self, attempts: int, exc: Exception) -> None:
        self._count_failure(attempts)
        if self.events.has_listeners:
            self.events.publish(RetryEvent(ERROR, self.name, number_of_attempts=attempts, last_exception=exc))

    def _not_retried(self, attempts: int, exc: Exception) -> None:
        self._count_failure(attempts)
        if self.events.has_listeners:
            self.events.publish(
                RetryEvent(IGNORED_ERROR, self.name, number_of_attempts=attempts - 1, last_exception=exc)
            )

    def _exhausted_result(self, attempts: int, last_exc: Exception | None) -> None:
        self._count_failure(attempts)
        error = MaxRetriesExceeded(self, attempts) if self.config.fail_after_max_attempts else None
        if self.events.has_listeners:
            # Like Resilience4j: the last exception seen, else a MaxRetriesExceeded.
            reported = error or last_exc or MaxRetriesExceeded(self, attempts)
            self.events.publish(RetryEvent(ERROR, self.name, number_of_attempts=attempts, last_exception=reported))
        if error is not None:
            raise error

    def _succeeded(self, attempts: int, last_exc: Exception | None) -> None:
        with self._lock:
            metrics = self.metrics
            metrics.number_of_total_calls += attempts
            if attempts == 1:
                metrics.number_of_successful_calls_without_retry_attempt += 1
                return
            metrics.number_of_successful_calls_with_retry_attempt += 1
        if self.events.has_listeners:
            self.events.publish(
                RetryEvent(SUCCESS, self.name, number_of_attempts=attempts - 1, last_exception=last_exc)
            )

    # -- calling -----------------------------------------------------------------------------------

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call ``fn(*args, **kwargs)``, retrying per the config; waits with the sync ``sleep``.

        Returns the result, re-raises the last exception once attempts are exhausted, raises
        :class:`MaxRetriesExceeded` when ``fail_after_max_attempts`` and every result was retried,
        else returns the last (retried) result.
        """
        attempt = 0
        last_exc: Exception | None = None
        predicate = self._retry_on_result
        if self.budget is not None:
            self.budget.deposit()
        while True:
            attempt += 1
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                wait = self._after_exception(attempt, exc)
                if wait < 0:
                    raise
                last_exc = exc
            else:
                if predicate is None or not predicate(result):
                    self._succeeded(attempt, last_exc)
                    return result
                wait = self._after_retried_result(attempt, last_exc, result)
                if wait < 0:
                    return result
            self._sleep(wait / 1e9)

    async def acall(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Async twin of :meth:`call`: awaits ``fn(*args, **kwargs)`` and waits with ``asleep``."""
        attempt = 0
        last_exc: Exception | None = None
        predicate = self._retry_on_result
        if self.budget is not None:
            self.budget.deposit()
        while True:
            attempt += 1
            try:
                result = await fn(*args, **kwargs)
            except Exception as exc:
                wait = self._after_exception(attempt, exc)
                if wait < 0:
                    raise
                last_exc = exc
            else:
                if predicate is None or not predicate(result):
                    self._succeeded(attempt, last_exc)
                    return result
                wait = self._after_retried_result(attempt, last_exc, result)
                if wait < 0:
                    return result
            await self._asleep(wait / 1e9)

    def decorate(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Wrap ``fn`` so each call goes through :meth:`acall` (async ``fn``) or :meth:`call`."""
        return twin_wrapper(fn, self.call, self.acall)

    def __repr__(self) -> str:
        return f"Retry({self.name!r}, max_attempts={self._max_attempts}, wait={format_duration(self._wait_ns)})"
