"""Circuit breaker: Resilience4j's state machine with count- and time-based sliding windows."""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .clock import SYSTEM_CLOCK, Clock
from .config import Validator
from .durations import MAX_PERIOD_NS, format_duration, parse_duration
from .events import Event, EventPublisher
from .exceptions import CallNotPermitted, IllegalStateTransition

__all__ = [
    "STATE_TRANSITIONS",
    "CircuitBreaker",
    "CircuitBreakerConfig",
    "CircuitBreakerEvents",
    "CircuitBreakerMetrics",
    "CircuitBreakerOnCallNotPermittedEvent",
    "CircuitBreakerOnErrorEvent",
    "CircuitBreakerOnFailureRateExceededEvent",
    "CircuitBreakerOnIgnoredErrorEvent",
    "CircuitBreakerOnResetEvent",
    "CircuitBreakerOnSlowCallRateExceededEvent",
    "CircuitBreakerOnStateTransitionEvent",
    "CircuitBreakerOnSuccessEvent",
    "ResultRecordedAsFailure",
    "SlidingWindowType",
    "State",
]


class State(enum.Enum):
    """Circuit breaker states, in Resilience4j's order."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2
    DISABLED = 3
    FORCED_OPEN = 4
    METRICS_ONLY = 5


class SlidingWindowType(str, enum.Enum):
    """How the failure window is measured."""

    COUNT_BASED = "COUNT_BASED"
    TIME_BASED = "TIME_BASED"


@dataclass(frozen=True, slots=True)
class CircuitBreakerConfig:
    """Configuration of a :class:`CircuitBreaker`, with Resilience4j 2.4's defaults.

    ``sliding_window_size`` counts calls (COUNT_BASED) or seconds (TIME_BASED). For COUNT_BASED the
    effective minimum is ``min(minimum_number_of_calls, sliding_window_size)``.
    ``record_exceptions`` / ``ignore_exceptions`` take classes or dotted paths; by default every
    ``Exception`` is recorded. ``record_exception`` / ``ignore_exception`` are predicates on the exception
    (callables or dotted paths), OR-ed with the class lists as in Resilience4j: e.g. record only the
    ``HTTPError`` of a 5xx. ``record_result`` is a predicate on the return value (or a dotted path).
    ``wait_interval_function_in_open_state`` (Resilience4j's ``waitIntervalFunctionInOpenState``) computes the
    open time from the number of openings since the breaker was last CLOSED: ``f(attempts)`` returning a
    ``timedelta`` or a duration string, kept within 1 ms and 366 days.
    """

    failure_rate_threshold: float = 50.0
    slow_call_rate_threshold: float = 100.0
    slow_call_duration_threshold: Any = "60s"
    permitted_number_of_calls_in_half_open_state: int = 10
    max_wait_duration_in_half_open_state: Any = 0
    transition_to_state_after_wait_duration: str = "OPEN"
    sliding_window_type: str = "COUNT_BASED"
    sliding_window_size: int = 100
    minimum_number_of_calls: int = 100
    wait_duration_in_open_state: Any = "60s"
    wait_interval_function_in_open_state: Callable[[int], Any] | str | None = None
    enable_exponential_backoff: bool = False
    exponential_backoff_multiplier: float = 1.5
    exponential_max_wait_duration_in_open_state: Any = None
    enable_randomized_wait: bool = False
    randomized_wait_factor: float = 0.5
    automatic_transition_from_open_to_half_open_enabled: bool = False
    record_exceptions: Any = ()
    ignore_exceptions: Any = ()
    record_exception: Callable[[BaseException], bool] | str | None = None
    ignore_exception: Callable[[BaseException], bool] | str | None = None
    record_result: Callable[[Any], bool] | str | None = None
    initial_state: str = "CLOSED"
    writable_stack_trace_enabled: bool = True

    def __post_init__(self) -> None:
        v = Validator(self)
        v.number("failure_rate_threshold", gt=0, le=100)
        v.number("slow_call_rate_threshold", gt=0, le=100)
        v.duration("slow_call_duration_threshold", min_ns=1)
        v.integer("permitted_number_of_calls_in_half_open_state", minimum=1)
        v.duration("max_wait_duration_in_half_open_state")
        v.choice("transition_to_state_after_wait_duration", ("OPEN", "CLOSED"))
        v.choice("sliding_window_type", (t.value for t in SlidingWindowType))
        v.integer("sliding_window_size", minimum=1)
        v.integer("minimum_number_of_calls", minimum=1)
        v.duration("wait_duration_in_open_state", min_ns=1_000_000, max_ns=MAX_PERIOD_NS)
        v.callable_or_path("wait_interval_function_in_open_state")
        v.check(
            "wait_interval_function_in_open_state",
            self.wait_interval_function_in_open_state is None
            or not (self.enable_exponential_backoff is True or self.enable_randomized_wait is True),
            "cannot be combined with enable_exponential_backoff or enable_randomized_wait (Resilience4j refuses "
            "an open-state interval configured twice)",
            "Compute the backoff in the function, or drop it and use the built-in options.",
        )
        v.boolean("enable_exponential_backoff")
        v.number("exponential_backoff_multiplier", ge=1)
        v.duration(
            "exponential_max_wait_duration_in_open_state", min_ns=1_000_000, max_ns=MAX_PERIOD_NS, allow_none=True
        )
        v.boolean("enable_randomized_wait")
        v.number("randomized_wait_factor", ge=0, le=1)
        v.boolean("automatic_transition_from_open_to_half_open_enabled")
        v.exception_classes("record_exceptions")
        v.exception_classes("ignore_exceptions")
        v.callable_or_path("record_exception")
        v.callable_or_path("ignore_exception")
        v.callable_or_path("record_result")
        v.choice("initial_state", (s.name for s in State))
        v.boolean("writable_stack_trace_enabled")
        v.check(
            "enable_randomized_wait",
            not (self.enable_exponential_backoff is True and self.enable_randomized_wait is True),
            "cannot be combined with enable_exponential_backoff (Resilience4j refuses it too)",
            "Pick one of the two open-state backoff options.",
        )
        v.done()


# --------------------------------------------------------------------------------------------------
# Transitions, events
# --------------------------------------------------------------------------------------------------

#: Resilience4j 2.4's ``StateTransition`` enum: every allowed (from, to) pair. Anything else raises.
STATE_TRANSITIONS: frozenset[tuple[State, State]] = frozenset(
    (State[a], State[b])
    for a, b in (
        ("CLOSED", "CLOSED"),
        ("CLOSED", "OPEN"),
        ("CLOSED", "DISABLED"),
        ("CLOSED", "METRICS_ONLY"),
        ("CLOSED", "FORCED_OPEN"),
        ("HALF_OPEN", "HALF_OPEN"),
        ("HALF_OPEN", "CLOSED"),
        ("HALF_OPEN", "OPEN"),
        ("HALF_OPEN", "DISABLED"),
        ("HALF_OPEN", "METRICS_ONLY"),
        ("HALF_OPEN", "FORCED_OPEN"),
        ("OPEN", "OPEN"),
        ("OPEN", "CLOSED"),
        ("OPEN", "HALF_OPEN"),
        ("OPEN", "DISABLED"),
        ("OPEN", "METRICS_ONLY"),
        ("OPEN", "FORCED_OPEN"),
        ("FORCED_OPEN", "FORCED_OPEN"),
        ("FORCED_OPEN", "CLOSED"),
        ("FORCED_OPEN", "OPEN"),
        ("FORCED_OPEN", "DISABLED"),
        ("FORCED_OPEN", "METRICS_ONLY"),
        ("FORCED_OPEN", "HALF_OPEN"),
        ("DISABLED", "DISABLED"),
        ("DISABLED", "CLOSED"),
        ("DISABLED", "OPEN"),
        ("DISABLED", "FORCED_OPEN"),
        ("DISABLED", "HALF_OPEN"),
        ("DISABLED", "METRICS_ONLY"),
        ("METRICS_ONLY", "METRICS_ONLY"),
        ("METRICS_ONLY", "CLOSED"),
        ("METRICS_ONLY", "FORCED_OPEN"),
        ("METRICS_ONLY", "DISABLED"),
    )
)

# Resilience4j's State.allowPublish: DISABLED and FORCED_OPEN publish only STATE_TRANSITION and RESET.
_ALLOW_PUBLISH = {State.DISABLED: False, State.FORCED_OPEN: False}
_FORCE_PUBLISH = frozenset({"STATE_TRANSITION", "RESET"})


@dataclass(frozen=True, slots=True)
class CircuitBreakerOnSuccessEvent(Event):
    """A call succeeded (or raised an exception that is not recorded). ``event_type`` is ``SUCCESS``."""

    elapsed_ns: int = 0


@dataclass(frozen=True, slots=True)
class CircuitBreakerOnErrorEvent(Event):
    """A call failed and the failure was recorded. ``event_type`` is ``ERROR``."""

    elapsed_ns: int = 0
    exception: BaseException | None = None


@dataclass(frozen=True, slots=True)
class CircuitBreakerOnIgnoredErrorEvent(Event):
    """A call raised an ignored exception: nothing recorded. ``event_type`` is ``IGNORED_ERROR``."""

    elapsed_ns: int = 0
    exception: BaseException | None = None


@dataclass(frozen=True, slots=True)
class CircuitBreakerOnCallNotPermittedEvent(Event):
    """A call was rejected. ``event_type`` is ``NOT_PERMITTED``."""


@dataclass(frozen=True, slots=True)
class CircuitBreakerOnStateTransitionEvent(Event):
    """The state changed. ``event_type`` is ``STATE_TRANSITION``; published in every state."""

    from_state: State = State.CLOSED
    to_state: State = State.CLOSED

    @property
    def state_transition(self) -> str:
        """Resilience4j's ``StateTransition.toString()``."""
        return f"State transition from {self.from_state.name} to {self.to_state.name}"


@dataclass(frozen=True, slots=True)
class CircuitBreakerOnResetEvent(Event):
    """``reset()`` was called. ``event_type`` is ``RESET``; published in every state."""


@dataclass(frozen=True, slots=True)
class CircuitBreakerOnFailureRateExceededEvent(Event):
    """The failure rate reached the threshold. ``event_type`` is ``FAILURE_RATE_EXCEEDED``."""

    failure_rate: float = 0.0


@dataclass(frozen=True, slots=True)
class CircuitBreakerOnSlowCallRateExceededEvent(Event):
    """The slow-call rate reached the threshold. ``event_type`` is ``SLOW_CALL_RATE_EXCEEDED``."""

    slow_call_rate: float = 0.0


_PER_CALL_EVENTS = ("SUCCESS", "ERROR", "IGNORED_ERROR", "NOT_PERMITTED")


class CircuitBreakerEvents(EventPublisher[Event]):
    """Listeners of one circuit breaker, registered per Resilience4j event type."""

    EVENT_TYPES = (
        "SUCCESS",
        "ERROR",
        "IGNORED_ERROR",
        "NOT_PERMITTED",
        "STATE_TRANSITION",
        "RESET",
        "FAILURE_RATE_EXCEEDED",
        "SLOW_CALL_RATE_EXCEEDED",
    )
    __slots__ = ("_owner", "wants_calls")

    def __init__(self, owner: CircuitBreaker | None = None) -> None:
        super().__init__()
        self._owner = owner
        #: True when a per-call event (success, error, ignored, not permitted) has a listener. Only these
        #: cost the hot path; transition listeners (signals, metrics) leave the fast path intact.
        self.wants_calls = False

    def _notify(self) -> None:
        self.wants_calls = any(self.wants(t) for t in _PER_CALL_EVENTS)
        if self._owner is not None:
            self._owner._listeners_changed()

    def on_event(self, listener: Callable[[Event], object]) -> Callable[[Event], object]:
        """Register ``listener`` for every event type."""
        result = super().on_event(listener)
        self._notify()
        return result

    def _on(self, event_type: str, listener: Callable[[Any], object]) -> Callable[[Any], object]:
        result = super()._on(event_type, listener)
        self._notify()
        return result

    def remove_listener(self, listener: Callable[[Any], object]) -> None:
        """Unregister ``listener`` from every type it was registered for."""
        super().remove_listener(listener)
        self._notify()

    def on_success(self, listener: Callable[[CircuitBreakerOnSuccessEvent], object]) -> Any:
        """Register ``listener`` for ``SUCCESS`` events."""
        return self._on("SUCCESS", listener)

    def on_error(self, listener: Callable[[CircuitBreakerOnErrorEvent], object]) -> Any:
        """Register ``listener`` for ``ERROR`` events (recorded failures)."""
        return self._on("ERROR", listener)

    def on_ignored_error(self, listener: Callable[[CircuitBreakerOnIgnoredErrorEvent], object]) -> Any:
        """Register ``listener`` for ``IGNORED_ERROR`` events."""
        return self._on("IGNORED_ERROR", listener)

    def on_not_permitted(self, listener: Callable[[CircuitBreakerOnCallNotPermittedEvent], object]) -> Any:
        """Register ``listener`` for ``NOT_PERMITTED`` events (rejections)."""
        return self._on("NOT_PERMITTED", listener)

    def on_state_transition(self, listener: Callable[[CircuitBreakerOnStateTransitionEvent], object]) -> Any:
        """Register ``listener`` for ``STATE_TRANSITION`` events."""
        return self._on("STATE_TRANSITION", listener)

    def on_reset(self, listener: Callable[[CircuitBreakerOnResetEvent], object]) -> Any:
        """Register ``listener`` for ``RESET`` events."""
        return self._on("RESET", listener)

    def on_failure_rate_exceeded(
        self, listener: Callable[[CircuitBreakerOnFailureRateExceededEvent], object]
    ) -> Any:
        """Register ``listener`` for ``FAILURE_RATE_EXCEEDED`` events."""
        return self._on("FAILURE_RATE_EXCEEDED", listener)

    def on_slow_call_rate_exceeded(
        self, listener: Callable[[CircuitBreakerOnSlowCallRateExceededEvent], object]
    ) -> Any:
        """Register ``listener`` for ``SLOW_CALL_RATE_EXCEEDED`` events."""
        return self._on("SLOW_CALL_RATE_EXCEEDED", listener)


class ResultRecordedAsFailure(Exception):
    """Stands for a return value that ``record_result`` classified as a failure (in ERROR events).

    Never raised by :meth:`CircuitBreaker.call`: the caller still gets the result, as in Resilience4j.
    """

    def __init__(self, name: str, result: Any) -> None:
        self.name = name
        self.result = result
        super().__init__(f"CircuitBreaker '{name}' has recorded '{result!r}' as a failure")


# --------------------------------------------------------------------------------------------------
# Sliding windows
# --------------------------------------------------------------------------------------------------

# Outcome codes: bit 0 = present, bit 1 = failed, bit 2 = slow.
_SUCCESS, _ERROR, _SLOW_SUCCESS, _SLOW_ERROR = 1, 3, 5, 7
_NS_PER_S = 1_000_000_000


class _CountWindow:
    """Resilience4j's FixedSizeSlidingWindowMetrics: a ring of the last ``size`` outcomes, O(1) record.

    Also carries the per-state not-permitted counter, like CircuitBreakerMetrics. Callers hold the
    breaker's lock.
    """

    __slots__ = (
        "calls",
        "failed",
        "head",
        "min_calls",
        "not_permitted",
        "ring",
        "size",
        "slow",
        "slow_failed",
    )

    def __init__(self, size: int, min_calls: int) -> None:
        self.size = size
        self.ring = [0] * size
        self.head = 0
        self.calls = self.failed = self.slow = self.slow_failed = 0
        self.min_calls = min(min_calls, size)
        self.not_permitted = 0

    def record(self, code: int, now_ns: int) -> None:
        """Add one outcome, evicting the oldest once full."""
        size = self.size
        if not size:
            return
        head = self.head + 1
        if head == size:
            head = 0
        self.head = head
        ring = self.ring
        old = ring[head]
        ring[head] = code
        if old:
            if old != 1:
                if old & 2:
                    self.failed -= 1
                if old & 4:
                    self.slow -= 1
                    if old == 7:
                        self.slow_failed -= 1
        else:
            self.calls += 1
        if code != 1:
            if code & 2:
                self.failed += 1
            if code & 4:
                self.slow += 1
                if code == 7:
                    self.slow_failed += 1

    def refresh(self, now_ns: int) -> None:
        """Count-based windows do not age."""


class _TimeWindow:
    """Resilience4j's SlidingTimeWindowMetrics: one bucket per second of the monotonic clock.

    The window covers the current second and the ``size - 1`` before it; ``refresh`` expires older
    buckets before every record and every read. Minimum calls are NOT clamped to the size (as in
    Resilience4j). Callers hold the breaker's lock.
    """

    __slots__ = (
        "b_calls",
        "b_failed",
        "b_slow",
        "b_slow_failed",
        "calls",
        "failed",
        "head",
        "head_second",
        "min_calls",
        "not_permitted",
        "size",
        "slow",
        "slow_failed",
    )

    def __init__(self, size: int, min_calls: int, now_ns: int) -> None:
        self.size = size
        self.b_calls = [0] * size
        self.b_failed = [0] * size
        self.b_slow = [0] * size
        self.b_slow_failed = [0] * size
        self.head = 0
        self.head_second = now_ns // _NS_PER_S
        self.calls = self.failed = self.slow = self.slow_failed = 0
        self.min_calls = min_calls
        self.not_permitted = 0

    def refresh(self, now_ns: int) -> None:
        """Move the head to the current second, emptying the buckets that fell out of the window."""
        second = now_ns // _NS_PER_S
        moves = second - self.head_second
        if moves <= 0:
            return
        size = self.size
        if moves > size:
            moves = size
        head = self.head
        for _ in range(moves):
            head += 1
            if head == size:
                head = 0
            self.calls -= self.b_calls[head]
            self.failed -= self.b_failed[head]
            self.slow -= self.b_slow[head]
            self.slow_failed -= self.b_slow_failed[head]
            self.b_calls[head] = self.b_failed[head] = self.b_slow[head] = self.b_slow_failed[head] = 0
        self.head = head
        self.head_second = second

    def record(self, code: int, now_ns: int) -> None:
        """Add one outcome to the current second's bucket."""
        self.refresh(now_ns)
        head = self.head
        self.b_calls[head] += 1
        self.calls += 1
        if code & 2:
            self.b_failed[head] += 1
            self.failed += 1
        if code & 4:
            self.b_slow[head] += 1
            self.slow += 1
            if code == 7:
                self.b_slow_failed[head] += 1
                self.slow_failed += 1


_Window = _CountWindow | _TimeWindow


class _StateData:
    """One state object, as in Resilience4j: every transition installs a new one.

    ``fast`` is True when a call may proceed with no acquire logic at all (CLOSED, METRICS_ONLY,
    DISABLED). ``deadline`` is the OPEN retry deadline, or the HALF_OPEN max-wait deadline (or None);
    ``timed`` says a deadline must be checked lazily on reads (automatic transitions).
    """

    __slots__ = (
        "allow_publish",
        "attempts",
        "deadline",
        "fast",
        "max_permits",
        "permits",
        "rate_flags",
        "ring_fast",
        "state",
        "timed",
        "window",
    )

    def __init__(self, state: State, window: _Window, attempts: int) -> None:
        self.state = state
        self.window = window
        self.attempts = attempts
        self.fast = state is State.CLOSED or state is State.METRICS_ONLY or state is State.DISABLED
        self.allow_publish = _ALLOW_PUBLISH.get(state, True)
        self.deadline: int | None = None
        self.timed = False
        self.permits = 0
        self.max_permits = 0
        self.rate_flags = 0  # METRICS_ONLY: which *_RATE_EXCEEDED events were already published
        # CLOSED / METRICS_ONLY over a count ring: a plain success replacing a plain success changes
        # no counter and no verdict, so the hot path may skip everything but moving the head.
        self.ring_fast = self.fast and state is not State.DISABLED and type(window) is _CountWindow


# Results of a threshold check (CircuitBreakerMetrics.Result), as bit flags.
_BELOW_MINIMUM = -1
_BELOW_THRESHOLDS = 0
_FAILURE_EXCEEDED = 1
_SLOW_EXCEEDED = 2


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------


class CircuitBreakerMetrics:
    """Read-only view of a breaker's numbers.

    The window figures (rates, buffered, failed, slow, not permitted) belong to the current state
    object, as in Resilience4j, so they restart on most transitions. The ``total_*`` figures are
    cumulative for the breaker's lifetime (``reset()`` does not clear them) for exporters that read
    them at scrape time.
    """

    __slots__ = ("_cb",)

    def __init__(self, circuit_breaker: CircuitBreaker) -> None:
        self._cb = circuit_breaker

    def _window(self) -> _Window:
        cb = self._cb
        with cb._lock:
            window = cb._st.window
            window.refresh(cb._now())
            return window

    @property
    def failure_rate(self) -> float:
        """Failed calls in percent of buffered calls; ``-1.0`` below the minimum number of calls."""
        w = self._window()
        n = w.calls
        return -1.0 if n == 0 or n < w.min_calls else w.failed * 100.0 / n

    @property
    def slow_call_rate(self) -> float:
        """Slow calls in percent of buffered calls; ``-1.0`` below the minimum number of calls."""
        w = self._window()
        n = w.calls
        return -1.0 if n == 0 or n < w.min_calls else w.slow * 100.0 / n

    @property
    def number_of_buffered_calls(self) -> int:
        """Calls currently in the sliding window."""
        return self._window().calls

    @property
    def number_of_failed_calls(self) -> int:
        """Failed calls in the window (slow or not)."""
        return self._window().failed

    @property
    def number_of_successful_calls(self) -> int:
        """Successful calls in the window (slow or not)."""
        w = self._window()
        return w.calls - w.failed

    @property
    def number_of_slow_calls(self) -> int:
        """Calls in the window slower than ``slow_call_duration_threshold``."""
        return self._window().slow

    @property
    def number_of_slow_successful_calls(self) -> int:
        """Slow successful calls in the window."""
        w = self._window()
        return w.slow - w.slow_failed

    @property
    def number_of_slow_failed_calls(self) -> int:
        """Slow failed calls in the window."""
        return self._window().slow_failed

    @property
    def number_of_not_permitted_calls(self) -> int:
        """Rejections counted by the current state object (carried into OPEN, like Resilience4j)."""
        return self._cb._st.window.not_permitted

    @property
    def total_successful_calls(self) -> int:
        """Cumulative successful calls (including exceptions that are not recorded)."""
        return self._cb._tot_success

    @property
    def total_successful_duration_ns(self) -> int:
        """Summed duration of :attr:`total_successful_calls`, in nanoseconds."""
        return self._cb._tot_success_ns

    @property
    def total_failed_calls(self) -> int:
        """Cumulative recorded failures (exceptions and ``record_result`` matches)."""
        return self._cb._tot_failed

    @property
    def total_failed_duration_ns(self) -> int:
        """Summed duration of :attr:`total_failed_calls`, in nanoseconds."""
        return self._cb._tot_failed_ns

    @property
    def total_ignored_calls(self) -> int:
        """Cumulative calls that raised an ignored exception."""
        return self._cb._tot_ignored

    @property
    def total_ignored_duration_ns(self) -> int:
        """Summed duration of :attr:`total_ignored_calls`, in nanoseconds."""
        return self._cb._tot_ignored_ns

    @property
    def total_not_permitted_calls(self) -> int:
        """Cumulative rejected calls."""
        cb = self._cb
        with cb._lock:
            return cb._retired_not_permitted + cb._st.window.not_permitted

    def __repr__(self) -> str:
        return (
            f"CircuitBreakerMetrics(failure_rate={self.failure_rate}, slow_call_rate={self.slow_call_rate}, "
            f"buffered={self.number_of_buffered_calls}, failed={self.number_of_failed_calls}, "
            f"not_permitted={self.number_of_not_permitted_calls})"
        )


# --------------------------------------------------------------------------------------------------
# The breaker
# --------------------------------------------------------------------------------------------------

_OPEN, _HALF_OPEN, _CLOSED = State.OPEN, State.HALF_OPEN, State.CLOSED
_DISABLED, _FORCED_OPEN, _METRICS_ONLY = State.DISABLED, State.FORCED_OPEN, State.METRICS_ONLY
_NS_PER_MS = 1_000_000
_log = logging.getLogger("django_ratelimit_r4.circuitbreaker")


def _test(predicate: Callable[[BaseException], bool], exc: BaseException, if_broken: bool, name: str, what: str) -> bool:
    """``predicate(exc)``; a predicate that raises is logged and answers ``if_broken`` (the breaker must go on)."""
    try:
        return bool(predicate(exc))
    except Exception:
        _log.exception("circuit breaker %r: %s raised on %r; treated as %s", name, what, exc, if_broken)
        return if_broken
_MAX_INTERVAL_MS = 2**52  # keeps exponential backoff inside exact float range (~142 000 years)
# Automatic transitions are evaluated lazily; if a clock jump makes more than this many fall due at
# once, the rest are anchored at "now" instead of replaying every cycle one by one.
_MAX_REPLAYED_TRANSITIONS = 64

T = TypeVar("T")
_Pending = list[tuple[Any, ...]]  # events to publish once the lock is released: ("TYPE", *args)


class CircuitBreaker:
    """Resilience4j 2.4's CircuitBreakerStateMachine, for sync and async callers.

    Calls flow through :meth:`call` / :meth:`acall` / :meth:`decorate`, or through the manual protocol
    (:meth:`acquire_permission`, then :meth:`on_success` / :meth:`on_error` / :meth:`on_result`).
    One ``threading.Lock`` guards the state and the window; it is held for a few integer operations
    only, never while the protected call runs, and never while listeners run.

    Timers are lazy: there is no scheduler thread. With
    ``automatic_transition_from_open_to_half_open_enabled``, OPEN becomes HALF_OPEN on the first read
    of the state (or acquire) at or after the deadline, and the transition is dated at the deadline,
    as if a scheduler had fired on time; ``max_wait_duration_in_half_open_state`` works the same way.
    ``reset()`` therefore never leaves a stale timer behind (Resilience4j's does).

    ``BaseException`` outcomes (``KeyboardInterrupt``, ``SystemExit``, ``asyncio.CancelledError``)
    record nothing and give a half-open permit back: the call said nothing about the remote
    service, and losing the permit would leave the breaker stuck in HALF_OPEN (Resilience4j leaks it
    on ``java.lang.Error``). A permit is only given back to the state object that granted it, so a
    call admitted in CLOSED that ends during HALF_OPEN cannot inflate the number of trial calls.
    """

    __slots__ = (
        "__weakref__",
        "_after_hw",
        "_auto",
        "_count_based",
        "_exp",
        "_fast_ns",
        "_fthr",
        "_hw_ns",
        "_ignore_exc",
        "_ignore_pred",
        "_lock",
        "_max_ms",
        "_min_calls",
        "_mult",
        "_now",
        "_permitted",
        "_rand",
        "_rand_factor",
        "_record_exc",
        "_record_pred",
        "_record_result",
        "_retired_not_permitted",
        "_size",
        "_slow_ns",
        "_st",
        "_sthr",
        "_tot_failed",
        "_tot_failed_ns",
        "_tot_ignored",
        "_tot_ignored_ns",
        "_tot_success",
        "_tot_success_ns",
        "_wait_fn",
        "_wait_ns",
        "clock",
        "config",
        "events",
        "metrics",
        "name",
    )

    def __init__(
        self, name: str, config: CircuitBreakerConfig | None = None, *, clock: Clock | None = None
    ) -> None:
        self.name = name
        self.config = config if config is not None else CircuitBreakerConfig()
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._now = self.clock.now_ns
        self._lock = threading.Lock()
        self.events = CircuitBreakerEvents(self)
        self.metrics = CircuitBreakerMetrics(self)
        self._tot_success = self._tot_success_ns = 0
        self._tot_failed = self._tot_failed_ns = 0
        self._tot_ignored = self._tot_ignored_ns = 0
        # Lifetime rejections = those of retired state objects + the current one's counter (one
        # increment per rejection instead of two).
        self._retired_not_permitted = 0
        self._read_config(self.config)
        self._st = self._initial_state(self._now())

    def _read_config(self, c: CircuitBreakerConfig) -> None:
        # Copied once into slots: the hot path never touches the config object.
        self._slow_ns = int(c.slow_call_duration_threshold)
        self._fthr = float(c.failure_rate_threshold)
        self._sthr = float(c.slow_call_rate_threshold)
        self._count_based = c.sliding_window_type == SlidingWindowType.COUNT_BASED.value
        self._size = c.sliding_window_size
        self._min_calls = c.minimum_number_of_calls
        self._permitted = c.permitted_number_of_calls_in_half_open_state
        # Resilience4j: the half-open timer is on only when the duration is at least 1 ms.
        self._hw_ns = int(c.max_wait_duration_in_half_open_state)
        if self._hw_ns < _NS_PER_MS:
            self._hw_ns = 0
        self._after_hw = State[c.transition_to_state_after_wait_duration]
        self._auto = c.automatic_transition_from_open_to_half_open_enabled
        self._ignore_exc = tuple(c.ignore_exceptions) or None
        self._record_exc = tuple(c.record_exceptions) or None
        # The config stores the predicates already imported when they were given as dotted paths.
        self._ignore_pred: Callable[[BaseException], bool] | None = c.ignore_exception  # type: ignore[assignment]
        self._record_pred: Callable[[BaseException], bool] | None = c.record_exception  # type: ignore[assignment]
        self._record_result = c.record_result
        self._wait_ns = int(c.wait_duration_in_open_state)
        self._wait_fn: Callable[[int], Any] | None = c.wait_interval_function_in_open_state  # type: ignore[assignment]
        self._exp = c.enable_exponential_backoff
        self._mult = float(c.exponential_backoff_multiplier)
        max_wait = c.exponential_max_wait_duration_in_open_state
        # Without a configured cap the open time still stops growing at MAX_PERIOD_NS (366 days), so the
        # 503's Retry-After stays sane (Resilience4j lets it grow to Long.MAX_VALUE ms).
        self._max_ms = (MAX_PERIOD_NS if max_wait is None else int(max_wait)) // _NS_PER_MS
        self._rand = c.enable_randomized_wait
        self._rand_factor = float(c.randomized_wait_factor)
        self._listeners_changed()

    def _listeners_changed(self) -> None:
        # One comparison on the hot path instead of three: a success no longer than _fast_ns may take
        # the inlined path; -1 disables it (listeners to notify, or a record_result predicate to run).
        plain = self._record_result is None and not self.events.wants_calls
        self._fast_ns = self._slow_ns if plain else -1

    # ---------------------------------------------------------------- state objects

    def _closed_window(self, now: int) -> _Window:
        if self._count_based:
            return _CountWindow(self._size, self._min_calls)
        return _TimeWindow(self._size, self._min_calls, now)

    def _open_wait_ns(self, attempts: int) -> int:
        """The OPEN duration for the ``attempts``-th opening (Resilience4j's IntervalFunction, in ms)."""
        if self._wait_fn is not None:
            return self._custom_open_wait_ns(max(attempts, 1))
        if self._exp:
            interval = self._wait_ns // _NS_PER_MS
            mult, cap = self._mult, self._max_ms
            if mult > 1.0:
                for _ in range(max(attempts, 1) - 1):
                    if interval >= _MAX_INTERVAL_MS or (cap is not None and interval >= cap):
                        break
                    interval = int(interval * mult)  # Java's (long) (x * multiplier), step by step
            if cap is not None and interval > cap:
                interval = cap
            return min(interval, _MAX_INTERVAL_MS) * _NS_PER_MS
        if self._rand:
            base = self._wait_ns // _NS_PER_MS
            delta = self._rand_factor * base
            low = base - delta
            # IntervalFunctionCompanion.randomize: at least 1.0 ms (a factor of 1 could otherwise draw 0).
            return int(max(1.0, low + random.random() * (base + delta - low + 1))) * _NS_PER_MS
        return self._wait_ns

    def _custom_open_wait_ns(self, attempts: int) -> int:
        # Runs inside a state transition: a broken function is logged and the configured wait used instead,
        # and the result is kept within [1 ms, 366 days] so the 503's Retry-After stays sane.
        try:
            wait = int(parse_duration(self._wait_fn(attempts)))  # type: ignore[misc]
        except Exception:
            _log.exception(
                "circuit breaker %r: wait_interval_function_in_open_state failed for attempt %d; waiting %s "
                "(wait_duration_in_open_state) instead; return a timedelta or a duration string such as '30s'",
                self.name,
                attempts,
                format_duration(self._wait_ns),
            )
            return self._wait_ns
        return min(max(wait, _NS_PER_MS), MAX_PERIOD_NS)

    def _make_state(
        self, state: State, attempts: int, now: int, window: _Window | None = None, wait_ns: int | None = None
    ) -> _StateData:
        if state is _CLOSED or state is _METRICS_ONLY:
            return _StateData(state, self._closed_window(now), 0)
        if state is _OPEN:
            st = _StateData(state, window if window is not None else self._closed_window(now), attempts)
            st.deadline = now + (self._open_wait_ns(attempts) if wait_ns is None else wait_ns)
            st.timed = self._auto
            return st
        if state is _HALF_OPEN:
            # A fresh COUNT_BASED window of `permitted` calls; min calls = min(minimum, permitted).
            st = _StateData(state, _CountWindow(self._permitted, self._min_calls), attempts)
            st.permits = st.max_permits = self._permitted
            if self._hw_ns:
                st.deadline = now + self._hw_ns
                st.timed = True
            return st
        # DISABLED and FORCED_OPEN keep an empty window of size 0, as Resilience4j does.
        return _StateData(state, _CountWindow(0, 0), attempts if state is _FORCED_OPEN else 0)

    def _initial_state(self, now: int) -> _StateData:
        state = State[self.config.initial_state]
        return self._make_state(state, 0 if state in (_CLOSED, _DISABLED, _METRICS_ONLY) else 1, now)

    # ---------------------------------------------------------------- transitions (lock held)

    def _transition_locked(
        self, to: State, now: int, out: _Pending, *, attempts: int | None = None, wait_ns: int | None = None
    ) -> None:
        cur = self._st
        frm = cur.state
        if (frm, to) not in STATE_TRANSITIONS:
            raise IllegalStateTransition(self.name, frm, to)
        window = None
        if to is _OPEN:
            window = cur.window  # OPEN keeps the previous window and not-permitted counter
            if attempts is None:
                attempts = cur.attempts + 1
        else:
            self._retired_not_permitted += cur.window.not_permitted
        if to is _FORCED_OPEN:
            attempts = cur.attempts + 1
        elif to is _HALF_OPEN:
            attempts = cur.attempts
        self._st = self._make_state(to, attempts or 0, now, window, wait_ns)
        if frm is not to:  # Resilience4j does not publish internal (X -> X) transitions
            out.append(("STATE_TRANSITION", frm, to))

    def _poll_locked(self, now: int, out: _Pending) -> _StateData:
        """Apply the automatic transitions that fell due, each dated at its own deadline."""
        st = self._st
        replayed = 0
        while st.timed and now >= st.deadline:  # type: ignore[operator]
            at = st.deadline if replayed < _MAX_REPLAYED_TRANSITIONS else now
            replayed += 1
            self._transition_locked(_HALF_OPEN if st.state is _OPEN else self._after_hw, at, out)  # type: ignore[arg-type]
            st = self._st
        return st

    def _flush(self, out: _Pending) -> None:
        """Publish events queued under the lock, in order (listeners never run under the lock)."""
        events = self.events
        if not events.has_listeners:
            return
        name = self.name
        for item in out:
            kind = item[0]
            if kind == "STATE_TRANSITION":
                events.publish(
                    CircuitBreakerOnStateTransitionEvent(kind, name, from_state=item[1], to_state=item[2])
                )
            elif kind == "FAILURE_RATE_EXCEEDED":
                events.publish(CircuitBreakerOnFailureRateExceededEvent(kind, name, failure_rate=item[1]))
            elif kind == "SLOW_CALL_RATE_EXCEEDED":
                events.publish(CircuitBreakerOnSlowCallRateExceededEvent(kind, name, slow_call_rate=item[1]))

    def _publish(self, event: Event) -> None:
        # Resilience4j's shouldPublishEvents: DISABLED and FORCED_OPEN only let forced types through.
        if self._st.allow_publish or event.event_type in _FORCE_PUBLISH:
            self.events.publish(event)

    # ---------------------------------------------------------------- permission

    def _acquire_slow(self) -> _StateData | CallNotPermitted:
        """Acquire in a state that may reject: the granting state object, or the exception to raise."""
        lock = self._lock
        lock.acquire()
        try:
            now = self._now()
            st = self._st
            if st.state is _OPEN and not st.timed and now <= st.deadline:  # type: ignore[operator]
                # The common rejection; the first call strictly after the deadline goes HALF_OPEN.
                st.window.not_permitted += 1
                wait = st.deadline - now  # type: ignore[operator]
            else:
                wait = -1
        finally:
            lock.release()
        if wait < 0:
            return self._acquire_general()
        return self._rejection(_OPEN, wait)

    def _acquire_general(self) -> _StateData | CallNotPermitted:
        out: _Pending = []
        rejected: State | None = None
        wait = 0
        lock = self._lock
        lock.acquire()
        try:
            now = self._now()
            st = self._poll_locked(now, out) if self._st.timed else self._st
            state = st.state
            if state is _OPEN:
                if now > st.deadline:  # type: ignore[operator]  # strictly after, like Instant.isAfter
                    self._transition_locked(_HALF_OPEN, now, out)
                    st = self._st
                    state = _HALF_OPEN
                else:
                    rejected, wait = _OPEN, st.deadline - now  # type: ignore[operator]
            if state is _HALF_OPEN:
                if st.permits > 0:
                    st.permits -= 1
                else:
                    rejected = _HALF_OPEN
            elif state is _FORCED_OPEN:
                rejected, wait = _FORCED_OPEN, self._wait_ns
            if rejected is not None:
                st.window.not_permitted += 1
        finally:
            lock.release()
            if out:
                self._flush(out)
        return st if rejected is None else self._rejection(rejected, wait)

    def _rejection(self, state: State, wait_ns: int) -> CallNotPermitted:
        """Publish NOT_PERMITTED and build the exception to raise (outside the lock).

        A new instance per rejection, never a shared one whose traceback would grow; its message is
        built lazily, so construction is a few attribute stores.
        """
        if self.events.wants_calls and state is not _FORCED_OPEN:
            self.events.publish(CircuitBreakerOnCallNotPermittedEvent("NOT_PERMITTED", self.name))
        return CallNotPermitted(self, state, wait_ns)

    def try_acquire_permission(self) -> bool:
        """Take a permission without raising: False when OPEN, FORCED_OPEN or out of half-open trials.

        In HALF_OPEN a permission is one of the N trial calls: report its outcome with
        :meth:`on_success` / :meth:`on_error` / :meth:`on_result`, or give it back with
        :meth:`release_permission`.
        """
        if self._st.fast:
            return True
        return self._acquire_slow().__class__ is _StateData

    def acquire_permission(self) -> None:
        """Like :meth:`try_acquire_permission` but raises :class:`CallNotPermitted` (with ``wait_ns``)."""
        if self._st.fast:
            return
        granted: Any = self._acquire_slow()
        if granted.__class__ is not _StateData:
            try:
                raise granted
            finally:
                granted = None  # no exc -> traceback -> frame -> exc cycle

    def release_permission(self) -> None:
        """Give back a half-open trial permission taken but not used (never above the configured N)."""
        with self._lock:
            st = self._st
            if st.state is _HALF_OPEN and st.permits < st.max_permits:
                st.permits += 1

    def _release_granted(self, granted: _StateData | None) -> None:
        # Only the state object that granted the permit gets it back (see the class docstring).
        with self._lock:
            st = self._st
            if (granted is None or st is granted) and st.state is _HALF_OPEN and st.permits < st.max_permits:
                st.permits += 1

    # ---------------------------------------------------------------- outcomes

    def _record(self, code: int, end: int, out: _Pending) -> None:
        """Record an outcome into the current state and apply its consequences. Lock held."""
        st = self._st
        if st.timed:
            st = self._poll_locked(end, out)
        state = st.state
        if state is _DISABLED or state is _FORCED_OPEN:
            return
        w = st.window
        w.record(code, end)
        if state is _OPEN:
            return  # late results land in the carried-over window but never change state
        n = w.calls
        if n == 0 or n < w.min_calls:
            return  # BELOW_MINIMUM_CALLS_THRESHOLD
        failure_rate = w.failed * 100.0 / n
        slow_rate = w.slow * 100.0 / n
        verdict = (failure_rate >= self._fthr) | ((slow_rate >= self._sthr) << 1)
        if state is _CLOSED:
            if verdict:
                if verdict & _FAILURE_EXCEEDED:
                    out.append(("FAILURE_RATE_EXCEEDED", failure_rate))
                if verdict & _SLOW_EXCEEDED:
                    out.append(("SLOW_CALL_RATE_EXCEEDED", slow_rate))
                self._transition_locked(_OPEN, end, out)
        elif state is _HALF_OPEN:
            self._transition_locked(_OPEN if verdict else _CLOSED, end, out)
        elif verdict:  # METRICS_ONLY: report each kind of excess once, never transition
            if verdict & _FAILURE_EXCEEDED and not st.rate_flags & _FAILURE_EXCEEDED:
                st.rate_flags |= _FAILURE_EXCEEDED
                out.append(("FAILURE_RATE_EXCEEDED", failure_rate))
            if verdict & _SLOW_EXCEEDED and not st.rate_flags & _SLOW_EXCEEDED:
                st.rate_flags |= _SLOW_EXCEEDED
                out.append(("SLOW_CALL_RATE_EXCEEDED", slow_rate))

    def _success(self, duration_ns: int, end: int) -> None:
        if self.events.wants_calls:
            self._publish(CircuitBreakerOnSuccessEvent("SUCCESS", self.name, elapsed_ns=duration_ns))
        lock = self._lock
        lock.acquire()
        try:
            self._tot_success += 1
            self._tot_success_ns += duration_ns
            st = self._st
            if st.ring_fast and duration_ns <= self._slow_ns:
                w: Any = st.window
                head = w.head + 1
                if head == w.size:
                    head = 0
                # An occupied next slot means the ring is full (so >= minimum calls); a plain
                # success replacing a plain success cannot change any rate. (Same in call/acall.)
                if w.ring[head] == 1:
                    w.head = head
                    return
            out: _Pending = []
            self._record(_SLOW_SUCCESS if duration_ns > self._slow_ns else _SUCCESS, end, out)
        finally:
            lock.release()
        if out:
            self._flush(out)

    def _failure(self, duration_ns: int, exc: BaseException, end: int) -> None:
        if self.events.wants_calls:
            self._publish(
                CircuitBreakerOnErrorEvent("ERROR", self.name, elapsed_ns=duration_ns, exception=exc)
            )
        out: _Pending = []
        lock = self._lock
        lock.acquire()
        try:
            self._tot_failed += 1
            self._tot_failed_ns += duration_ns
            self._record(_SLOW_ERROR if duration_ns > self._slow_ns else _ERROR, end, out)
        finally:
            lock.release()
        if out:
            self._flush(out)

    def _error(self, duration_ns: int, exc: BaseException, end: int, granted: _StateData | None) -> None:
        ignore = self._ignore_exc
        ignore_pred = self._ignore_pred
        if (ignore is not None and isinstance(exc, ignore)) or (
            ignore_pred is not None and _test(ignore_pred, exc, False, self.name, "ignore_exception")
        ):
            self._release_granted(granted)
            with self._lock:
                self._tot_ignored += 1
                self._tot_ignored_ns += duration_ns
            if self.events.wants_calls:
                self._publish(
                    CircuitBreakerOnIgnoredErrorEvent(
                        "IGNORED_ERROR", self.name, elapsed_ns=duration_ns, exception=exc
                    )
                )
            return
        record = self._record_exc
        record_pred = self._record_pred
        if (
            (record is None and record_pred is None)
            or (record is not None and isinstance(exc, record))
            or (record_pred is not None and _test(record_pred, exc, True, self.name, "record_exception"))
        ):
            self._failure(duration_ns, exc, end)
        else:
            self._success(duration_ns, end)  # matched neither the record list nor the predicate: a success

    def _result(self, duration_ns: int, result: Any, end: int) -> None:
        predicate: Any = self._record_result
        if predicate is not None and predicate(result):
            self._failure(duration_ns, ResultRecordedAsFailure(self.name, result), end)
        else:
            self._success(duration_ns, end)

    def on_success(self, duration_ns: int) -> None:
        """Record a successful call that took ``duration_ns`` (manual protocol)."""
        self._success(duration_ns, self._now())

    def on_error(self, duration_ns: int, exc: BaseException) -> None:
        """Classify and record a call that raised ``exc``: ignored, failure, or success."""
        self._error(duration_ns, exc, self._now(), None)

    def on_result(self, duration_ns: int, result: Any) -> None:
        """Record a returned value: a failure if ``record_result(result)`` is true, else a success.

        Unlike Resilience4j (which skips ``null``), the predicate also sees ``None``.
        """
        self._result(duration_ns, result, self._now())

    # ---------------------------------------------------------------- protected calls

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` under the breaker; raises :class:`CallNotPermitted` if refused."""
        st: Any = self._st
        if not st.fast:
            # Inlined common case of _acquire_slow: OPEN before its deadline rejects.
            lock = self._lock
            lock.acquire()
            try:
                now_ns = self._now()
                st = self._st
                if st.state is _OPEN and not st.timed and now_ns <= st.deadline:
                    st.window.not_permitted += 1
                    wait = st.deadline - now_ns
                else:
                    wait = -1
            finally:
                lock.release()
            if wait >= 0 and not self.events.wants_calls:
                # The common rejection, inlined (no _rejection call): a fresh exception every time.
                raise CallNotPermitted(self, _OPEN, wait)
            st = self._rejection(_OPEN, wait) if wait >= 0 else self._acquire_general()
            if st.__class__ is not _StateData:
                try:
                    raise st
                finally:
                    st = None  # the traceback holds this frame: break the exc -> frame -> exc cycle
        now = self._now
        start = now()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            end = now()
            self._error(end - start, exc, end, st)
            raise
        except BaseException:
            self._release_granted(st)
            raise
        end = now()
        duration = end - start
        if duration <= self._fast_ns:
            # Inlined fast path of _success: plain (not slow) success, no listeners, no record_result,
            # CLOSED or METRICS_ONLY over a full count ring.
            lock = self._lock
            lock.acquire()
            try:
                st = self._st
                if st.ring_fast:
                    w = st.window
                    head = w.head + 1
                    if head == w.size:
                        head = 0
                    if w.ring[head] == 1:
                        w.head = head
                        self._tot_success += 1
                        self._tot_success_ns += duration
                        return result
            finally:
                lock.release()
        if self._record_result is None:
            self._success(duration, end)
        else:
            self._result(duration, result, end)
        return result

    async def acall(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` under the breaker (same rules as :meth:`call`)."""
        st: Any = self._st
        if not st.fast:
            # Inlined common case of _acquire_slow: OPEN before its deadline rejects.
            lock = self._lock
            lock.acquire()
            try:
                now_ns = self._now()
                st = self._st
                if st.state is _OPEN and not st.timed and now_ns <= st.deadline:
                    st.window.not_permitted += 1
                    wait = st.deadline - now_ns
                else:
                    wait = -1
            finally:
                lock.release()
            if wait >= 0 and not self.events.wants_calls:
                raise CallNotPermitted(self, _OPEN, wait)
            st = self._rejection(_OPEN, wait) if wait >= 0 else self._acquire_general()
            if st.__class__ is not _StateData:
                try:
                    raise st
                finally:
                    st = None  # the traceback holds this frame: break the exc -> frame -> exc cycle
        now = self._now
        start = now()
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            end = now()
            self._error(end - start, exc, end, st)
            raise
        except BaseException:  # asyncio.CancelledError among others
            self._release_granted(st)
            raise
        end = now()
        duration = end - start
        if duration <= self._fast_ns:
            # Inlined fast path of _success: plain (not slow) success, no listeners, no record_result,
            # CLOSED or METRICS_ONLY over a full count ring.
            lock = self._lock
            lock.acquire()
            try:
                st = self._st
                if st.ring_fast:
                    w = st.window
                    head = w.head + 1
                    if head == w.size:
                        head = 0
                    if w.ring[head] == 1:
                        w.head = head
                        self._tot_success += 1
                        self._tot_success_ns += duration
                        return result
            finally:
                lock.release()
        if self._record_result is None:
            self._success(duration, end)
        else:
            self._result(duration, result, end)
        return result

    def decorate(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a function or a coroutine function so that every call goes through the breaker."""
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await self.acall(fn, *args, **kwargs)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return self.call(fn, *args, **kwargs)

        return wrapper

    # ---------------------------------------------------------------- state

    @property
    def state(self) -> State:
        """The current :class:`State` (applies automatic transitions that fell due)."""
        st = self._st
        if st.timed:
            st = self._polled()
        return st.state

    def _polled(self) -> _StateData:
        out: _Pending = []
        with self._lock:
            st = self._poll_locked(self._now(), out)
        if out:
            self._flush(out)
        return st

    def remaining_open_ns(self) -> int:
        """Nanoseconds left in OPEN (0 otherwise); FORCED_OPEN answers ``wait_duration_in_open_state``.

        This is the Retry-After source for a 503 when the breaker rejects.
        """
        st = self._st
        if st.timed:
            st = self._polled()
        if st.state is _OPEN:
            return max(0, st.deadline - self._now())  # type: ignore[operator]
        if st.state is _FORCED_OPEN:
            return self._wait_ns
        return 0

    def _manual(self, to: State, **kwargs: Any) -> None:
        out: _Pending = []
        lock = self._lock
        lock.acquire()
        try:
            now = self._now()
            if self._st.timed:
                self._poll_locked(now, out)
            self._transition_locked(to, now, out, **kwargs)
        finally:
            lock.release()
            if out:
                self._flush(out)

    def transition_to_closed_state(self) -> None:
        """Force CLOSED with a fresh window."""
        self._manual(_CLOSED)

    def transition_to_open_state(self) -> None:
        """Force OPEN for the configured wait (attempts + 1, so exponential backoff grows)."""
        self._manual(_OPEN)

    def transition_to_open_state_for(self, duration: Any) -> None:
        """Force OPEN for ``duration`` (timedelta, ``"30s"`` or :class:`Nanos`); attempts unchanged."""
        wait_ns = parse_duration(duration)
        self._manual(_OPEN, attempts=self._st.attempts, wait_ns=int(wait_ns))

    def transition_to_half_open_state(self) -> None:
        """Force HALF_OPEN with a fresh set of trial permits."""
        self._manual(_HALF_OPEN)

    def transition_to_disabled_state(self) -> None:
        """Always permit and record nothing, until another transition."""
        self._manual(_DISABLED)

    def transition_to_metrics_only_state(self) -> None:
        """Always permit, record, publish rate-exceeded events once, never transition by itself."""
        self._manual(_METRICS_ONLY)

    def transition_to_forced_open_state(self) -> None:
        """Always reject, until another transition."""
        self._manual(_FORCED_OPEN)

    def reset(self) -> None:
        """Return to the freshly-built state (``initial_state``, fresh window); lifetime totals stay.

        Publishes STATE_TRANSITION (if the state changes) and then RESET, like Resilience4j.
        """
        with self._lock:
            previous = self._st.state
            self._retired_not_permitted += self._st.window.not_permitted
            self._st = self._initial_state(self._now())
            current = self._st.state
        if self.events.has_listeners:
            if previous is not current:
                self.events.publish(
                    CircuitBreakerOnStateTransitionEvent(
                        "STATE_TRANSITION", self.name, from_state=previous, to_state=current
                    )
                )
            self.events.publish(CircuitBreakerOnResetEvent("RESET", self.name))

    def set_clock(self, clock: Clock) -> None:
        """Use ``clock`` from now on and rebuild the state silently, anchored at its current time."""
        with self._lock:
            self.clock = clock
            self._now = clock.now_ns
            self._retired_not_permitted += self._st.window.not_permitted
            self._st = self._initial_state(clock.now_ns())

    def __repr__(self) -> str:
        return f"CircuitBreaker(name={self.name!r}, state={self._st.state.name})"
