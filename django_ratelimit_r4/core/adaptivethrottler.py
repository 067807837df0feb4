"""Client-side adaptive throttling (Google SRE book, "Handling Overload").

Each client keeps, over a sliding ``window`` (two minutes in the book), the number of **requests** it
attempted and the number of **accepts** (calls the backend accepted). While the backend accepts everything
nothing is throttled; once it starts rejecting, the client rejects new calls itself, before sending them, with
probability::

    max(0, (requests - k * accepts) / (requests + 1))

so the backend receives about ``k`` times what it accepts and no longer spends its capacity refusing calls.
Locally rejected calls count as requests (they were attempted), which is what makes the probability climb
while the backend stays sick and fall again as it accepts. ``k`` = 2 is the book's value: lower is more
aggressive, higher lets more doomed calls through.

What a rejection by the backend is: an exception in ``reject_exceptions`` or for which ``reject_on_exception``
is true (neither set: every ``Exception``), or a result for which ``reject_on_result`` is true (an HTTP 429 or
503 answer, say). Any other outcome is an accept. The random draw comes from the injected ``random`` and time
from the injected clock, so tests are deterministic.
"""

from __future__ import annotations

import random as _random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from .clock import SYSTEM_CLOCK, Clock
from .config import Validator
from .coroutines import twin_wrapper
from .exceptions import CallThrottled

__all__ = ["AdaptiveThrottler", "AdaptiveThrottlerConfig", "AdaptiveThrottlerMetrics"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

_NS_PER_S = 1_000_000_000
#: Slices of the sliding window: the window moves in steps of ``window / 20`` (6 s for the book's 2 minutes).
_SLICES = 20


@dataclass(frozen=True, slots=True)
class AdaptiveThrottlerConfig:
    """Configuration of an :class:`AdaptiveThrottler`.

    ``k`` (>= 1: below 1 a healthy backend would be throttled) multiplies the accepts; ``window`` is how far back
    requests and accepts are counted (1 s to 1 h). Predicates may be dotted paths.
    """

    k: float = 2.0
    window: Any = "2m"
    reject_exceptions: Any = ()
    reject_on_exception: Callable[[BaseException], bool] | str | None = None
    reject_on_result: Callable[[Any], bool] | str | None = None

    def __post_init__(self) -> None:
        v = Validator(self)
        v.number("k", ge=1)
        v.duration("window", min_ns=_NS_PER_S, max_ns=3600 * _NS_PER_S)
        v.exception_classes("reject_exceptions")
        v.callable_or_path("reject_on_exception")
        v.callable_or_path("reject_on_result")
        v.done()


class AdaptiveThrottlerMetrics:
    """Counters of one :class:`AdaptiveThrottler`: the window's two numbers and cumulative outcomes."""

    __slots__ = ("_throttler", "number_of_accepted_calls", "number_of_rejected_calls", "number_of_throttled_calls")

    def __init__(self, throttler: AdaptiveThrottler) -> None:
        self._throttler = throttler
        self._clear()

    def _clear(self) -> None:
        #: Calls the backend accepted (cumulative).
        self.number_of_accepted_calls = 0
        #: Calls the backend rejected: a rejecting exception or result (cumulative).
        self.number_of_rejected_calls = 0
        #: Calls rejected locally, never sent (cumulative).
        self.number_of_throttled_calls = 0

    @property
    def requests(self) -> int:
        """Requests attempted in the current window (locally rejected ones included)."""
        return self._throttler._window()[0]

    @property
    def accepts(self) -> int:
        """Requests the backend accepted in the current window."""
        return self._throttler._window()[1]

    @property
    def rejection_probability(self) -> float:
        """The probability the next call is rejected locally: ``max(0, (requests - k*accepts) / (requests + 1))``."""
        requests, accepts = self._throttler._window()
        return self._throttler._probability(requests, accepts)

    def __repr__(self) -> str:
        return (
            f"AdaptiveThrottlerMetrics(requests={self.requests}, accepts={self.accepts}, "
            f"accepted={self.number_of_accepted_calls}, rejected={self.number_of_rejected_calls}, "
            f"throttled={self.number_of_throttled_calls})"
        )


class AdaptiveThrottler:
    """Rejects calls locally while the backend keeps rejecting them (Google SRE's adaptive throttling).

    ``call(fn, ...)`` / ``await acall(fn, ...)`` / ``decorate(fn)``; a local rejection raises
    :class:`~django_ratelimit_r4.core.exceptions.CallThrottled` (a ``CallNotPermitted``: 503 on the HTTP edge).
    Thread- and asyncio-safe: each call takes a short lock twice (before and after), never across the call.
    Exceptions that are not :class:`Exception` (cancellation) count as neither accept nor rejection.
    """

    def __init__(
        self,
        name: str,
        config: AdaptiveThrottlerConfig | None = None,
        *,
        clock: Clock | None = None,
        random: _random.Random | None = None,
    ) -> None:
        self.name = name
        self.config = config if config is not None else AdaptiveThrottlerConfig()
        cfg = self.config
        self._k = float(cfg.k)
        self._slice_ns = max(1, int(cfg.window) // _SLICES)
        self._reject_on: tuple[type[BaseException], ...] = cfg.reject_exceptions or (
            () if cfg.reject_on_exception is not None else (Exception,)
        )
        self._reject_pred: Callable[[BaseException], bool] | None = cfg.reject_on_exception  # type: ignore[assignment]
        self._reject_result: Callable[[Any], bool] | None = cfg.reject_on_result  # type: ignore[assignment]
        self._random = random if random is not None else _random.Random()
        self._lock = threading.Lock()
        self.metrics = AdaptiveThrottlerMetrics(self)
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._clear_window()

    def _clear_window(self) -> None:
        self._requests = [0] * _SLICES
        self._accepts = [0] * _SLICES
        self._total_requests = 0
        self._total_accepts = 0
        self._current = self.clock.now_ns() // self._slice_ns

    # -- lifecycle ---------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the window and zero the counters (nothing is throttled until the backend rejects again)."""
        with self._lock:
            self._clear_window()
            self.metrics._clear()

    def set_clock(self, clock: Clock) -> None:
        """Use ``clock``; the window restarts at its current time."""
        with self._lock:
            self.clock = clock
            self._clear_window()

    # -- the window (call under the lock) ------------------------------------------------------------

    def _advance(self) -> int:
        now = self.clock.now_ns() // self._slice_ns
        gone = now - self._current
        if gone > 0:
            if gone >= _SLICES:
                self._requests[:] = [0] * _SLICES
                self._accepts[:] = [0] * _SLICES
                self._total_requests = self._total_accepts = 0
            else:
                for step in range(1, gone + 1):
                    i = (self._current + step) % _SLICES
                    self._total_requests -= self._requests[i]
                    self._total_accepts -= self._accepts[i]
                    self._requests[i] = self._accepts[i] = 0
            self._current = now
        return now % _SLICES

    def _window(self) -> tuple[int, int]:
        with self._lock:
            self._advance()
            return self._total_requests, self._total_accepts

    def _probability(self, requests: int, accepts: int) -> float:
        return max(0.0, (requests - self._k * accepts) / (requests + 1))

    # -- one call ----------------------------------------------------------------------------------

    def _admit(self) -> None:
        """Count the request, and reject it locally with the current probability."""
        with self._lock:
            i = self._advance()
            requests = self._total_requests
            probability = self._probability(requests, self._total_accepts)
            self._requests[i] += 1
            self._total_requests = requests + 1
            if probability > 0.0 and self._random.random() < probability:
                self.metrics.number_of_throttled_calls += 1
                raise CallThrottled(self, probability)

    def _accepted(self) -> None:
        with self._lock:
            i = self._advance()
            self._accepts[i] += 1
            self._total_accepts += 1
            self.metrics.number_of_accepted_calls += 1

    def _rejected(self) -> None:
        with self._lock:
            self.metrics.number_of_rejected_calls += 1

    def _is_rejection(self, exc: Exception) -> bool:
        predicate = self._reject_pred
        return isinstance(exc, self._reject_on) or (predicate is not None and bool(predicate(exc)))

    def _after_result(self, result: Any) -> None:
        predicate = self._reject_result
        if predicate is not None and predicate(result):
            self._rejected()
        else:
            self._accepted()

    def _after_exception(self, exc: Exception) -> None:
        if self._is_rejection(exc):
            self._rejected()
        else:
            self._accepted()  # the backend answered: an application error is still an accept

    def try_acquire(self) -> bool:
        """For code that calls the backend itself: False (counted as throttled) means do not send it.

        After a True, report the outcome with :meth:`on_accepted` or :meth:`on_rejected`.
        """
        try:
            self._admit()
        except CallThrottled:
            return False
        return True

    def on_accepted(self) -> None:
        """The backend accepted a call admitted by :meth:`try_acquire`."""
        self._accepted()

    def on_rejected(self) -> None:
        """The backend rejected a call admitted by :meth:`try_acquire` (overloaded, 429, 503...)."""
        self._rejected()

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call ``fn(*args, **kwargs)`` unless throttled (:class:`CallThrottled`); record whether it was accepted."""
        self._admit()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            self._after_exception(exc)
            raise
        self._after_result(result)
        return result

    async def acall(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Async twin of :meth:`call`."""
        self._admit()
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            self._after_exception(exc)
            raise
        self._after_result(result)
        return result

    def decorate(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Wrap ``fn`` so each call goes through :meth:`acall` (async ``fn``) or :meth:`call`."""
        return twin_wrapper(fn, self.call, self.acall)

    def __repr__(self) -> str:
        return f"AdaptiveThrottler({self.name!r}, k={self._k:g})"
