"""Circuit breaker configuration: the states, the window types, Resilience4j's defaults and transitions."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import Validator
from ..durations import MAX_PERIOD_NS

__all__ = ["MAX_SLIDING_WINDOW_SIZE", "STATE_TRANSITIONS", "CircuitBreakerConfig", "SlidingWindowType", "State"]

#: Largest ``sliding_window_size``: the window's slots are allocated when the breaker is built (8 bytes a call
#: COUNT_BASED, 32 bytes a second TIME_BASED: 8 MB / 32 MB, 11.5 days, at this size), per breaker and per worker.
MAX_SLIDING_WINDOW_SIZE = 1_000_000


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
        v.integer("sliding_window_size", minimum=1, maximum=MAX_SLIDING_WINDOW_SIZE)
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
