"""Time limiter for async callables. Python cannot kill a thread, so sync callables are refused."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, ParamSpec, TypeVar

from .clock import SYSTEM_CLOCK, Clock
from .config import Validator
from .coroutines import is_async
from .durations import format_duration
from .events import Event, EventPublisher
from .exceptions import TimeLimitExceeded

__all__ = ["TimeLimiter", "TimeLimiterConfig", "TimeLimiterEvent", "TimeLimiterEvents", "TimeLimiterMetrics"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class TimeLimiterConfig:
    """Configuration of a :class:`TimeLimiter` (Resilience4j's ``TimeLimiterConfig``)."""

    timeout_duration: Any = "1s"
    cancel_running_future: bool = True

    def __post_init__(self) -> None:
        v = Validator(self)
        v.duration("timeout_duration", min_ns=1)
        v.boolean("cancel_running_future")
        v.done()


#: Event types of a :class:`TimeLimiter`, as Resilience4j names them.
SUCCESS, TIMEOUT, ERROR = "SUCCESS", "TIMEOUT", "ERROR"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeLimiterEvent(Event):
    """A time limiter event. ``exception`` is set for ERROR (the call's exception) and TIMEOUT."""

    exception: BaseException | None = None


class TimeLimiterEvents(EventPublisher[TimeLimiterEvent]):
    """Listeners of one :class:`TimeLimiter`: SUCCESS, TIMEOUT and ERROR (Resilience4j's types)."""

    __slots__ = ()
    EVENT_TYPES = (SUCCESS, TIMEOUT, ERROR)

    def on_success(self, listener: Callable[[TimeLimiterEvent], object]) -> Callable[[TimeLimiterEvent], object]:
        """Call ``listener`` when a call finishes in time."""
        return self._on(SUCCESS, listener)

    def on_timeout(self, listener: Callable[[TimeLimiterEvent], object]) -> Callable[[TimeLimiterEvent], object]:
        """Call ``listener`` when a call runs past the timeout."""
        return self._on(TIMEOUT, listener)

    def on_error(self, listener: Callable[[TimeLimiterEvent], object]) -> Callable[[TimeLimiterEvent], object]:
        """Call ``listener`` when a call raises in time."""
        return self._on(ERROR, listener)


class TimeLimiterMetrics:
    """Cumulative counters of one :class:`TimeLimiter`, read by exporters at scrape time."""

    __slots__ = ("number_of_failed_calls", "number_of_successful_calls", "number_of_timeout_calls")

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        #: Calls that returned within the timeout.
        self.number_of_successful_calls = 0
        #: Calls that raised within the timeout.
        self.number_of_failed_calls = 0
        #: Calls still running when the timeout passed.
        self.number_of_timeout_calls = 0

    def __repr__(self) -> str:
        return (
            f"TimeLimiterMetrics(successful={self.number_of_successful_calls}, "
            f"failed={self.number_of_failed_calls}, timeout={self.number_of_timeout_calls})"
        )


def _sync_refusal(limiter_name: str, fn: object) -> TypeError:
    what = getattr(fn, "__qualname__", None) or repr(fn)
    return TypeError(
        f"TimeLimiter '{limiter_name}' cannot limit the sync callable {what}: Python cannot stop a running "
        "thread, so a timeout could only abandon the work while it keeps running. Put the timeout where the "
        "blocking happens instead (e.g. requests.get(url, timeout=2), a socket or database statement "
        "timeout), or make the code async (an async view) and use TimeLimiter.acall / decorate on an "
        "async function."
    )


def _retrieve(task: asyncio.Future[Any]) -> None:
    # A call left running after its timeout has nobody awaiting it: consume its outcome so asyncio
    # does not log "exception was never retrieved".
    if not task.cancelled():
        task.exception()


class TimeLimiter:
    """Bounds how long an *async* call may take (Resilience4j's ``TimeLimiter``).

    ``await acall(async_fn, *args, **kwargs)`` runs the call as a task and waits at most
    ``timeout_duration`` (on the event loop's clock, which is what can wake the waiting coroutine).
    On timeout it raises :class:`TimeLimitExceeded` (also a :class:`TimeoutError`); with
    ``cancel_running_future`` (the default) the task is cancelled and its cancellation awaited, else
    the task runs on unobserved. Like ``asyncio.wait_for``, cancelling the caller cancels the call too
    (unless ``cancel_running_future`` is false), and the call runs in a copy of the caller's context.

    Sync callables are refused with a :class:`TypeError`: Python cannot kill a thread.
    """

    def __init__(self, name: str, config: TimeLimiterConfig | None = None, *, clock: Clock | None = None) -> None:
        self.name = name
        self.config = config if config is not None else TimeLimiterConfig()
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self.metrics = TimeLimiterMetrics()
        self.events = TimeLimiterEvents()
        self._timeout_s: float = int(self.config.timeout_duration) / 1e9
        self._cancel: bool = self.config.cancel_running_future
        self._lock = threading.Lock()
        # Strong references to calls left running after a timeout (asyncio keeps only weak ones).
        self._abandoned: set[asyncio.Future[Any]] = set()

    def reset(self) -> None:
        """Zero the metrics. Config, clock and event listeners stay."""
        with self._lock:
            self.metrics._clear()

    def set_clock(self, clock: Clock) -> None:
        """Swap the clock. There is no time-anchored state: deadlines use the event loop's time."""
        self.clock = clock

    def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> NoReturn:
        """Always raises :class:`TypeError`: sync calls cannot be time-limited (see the message)."""
        if is_async(fn):
            raise TypeError(
                f"TimeLimiter '{self.name}': {getattr(fn, '__qualname__', fn)!s} is async; "
                "use 'await time_limiter.acall(fn, ...)'"
            )
        raise _sync_refusal(self.name, fn)

    async def acall(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` for at most ``timeout_duration``.

        Returns its result or re-raises its exception; raises :class:`TimeLimitExceeded` on timeout.
        """
        awaitable = fn(*args, **kwargs)
        if not inspect.isawaitable(awaitable):
            raise _sync_refusal(self.name, fn)
        task = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait((task,), timeout=self._timeout_s)
        except asyncio.CancelledError:
            # The caller was cancelled: take the call down with it, as asyncio.wait_for does.
            if self._cancel:
                task.cancel()
            else:
                self._abandon(task)
            raise
        if task.done():
            if task.cancelled():
                # Cancelled by someone else: not a failure of the call, report it as wait_for would.
                raise asyncio.CancelledError
            exc = task.exception()
            if exc is None:
                with self._lock:
                    self.metrics.number_of_successful_calls += 1
                if self.events.has_listeners:
                    self.events.publish(TimeLimiterEvent(SUCCESS, self.name))
                return task.result()
            if isinstance(exc, Exception):
                with self._lock:
                    self.metrics.number_of_failed_calls += 1
                if self.events.has_listeners:
                    self.events.publish(TimeLimiterEvent(ERROR, self.name, exception=exc))
            del task, awaitable  # the traceback will hold this frame: keep it free of the task
            try:
                raise exc
            finally:
                del exc  # break the frame <-> traceback cycle
        with self._lock:
            self.metrics.number_of_timeout_calls += 1
        error = TimeLimitExceeded(self)
        if self.events.has_listeners:
            self.events.publish(TimeLimiterEvent(TIMEOUT, self.name, exception=error))
        if self._cancel:
            task.cancel()
            # Wait for the cancellation to land, so nothing of the call outlives acall().
            await asyncio.wait((task,))
            if not task.cancelled():
                _retrieve(task)
        else:
            self._abandon(task)
        # The traceback keeps this frame alive (users log and keep exceptions): drop the task so
        # an abandoned call is freed as soon as it ends.
        del task, awaitable
        raise error

    def _abandon(self, task: asyncio.Future[Any]) -> None:
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)
        task.add_done_callback(_retrieve)

    def decorate(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        """Wrap an async ``fn`` so each call goes through :meth:`acall`; refuses sync functions."""
        if not is_async(fn):
            raise _sync_refusal(self.name, fn)
        acall = self.acall

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            return await acall(fn, *args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        return (
            f"TimeLimiter({self.name!r}, timeout={format_duration(int(self.config.timeout_duration))}, "
            f"cancel_running_future={self._cancel})"
        )
