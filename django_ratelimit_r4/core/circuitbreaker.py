"""Circuit breaker: Resilience4j's state machine with count- and time-based sliding windows."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import Validator

__all__ = ["CircuitBreakerConfig", "SlidingWindowType", "State"]


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
    ``Exception`` is recorded. ``record_result`` is a predicate on the return value (or a dotted path).
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
    enable_exponential_backoff: bool = False
    exponential_backoff_multiplier: float = 1.5
    exponential_max_wait_duration_in_open_state: Any = None
    enable_randomized_wait: bool = False
    randomized_wait_factor: float = 0.5
    automatic_transition_from_open_to_half_open_enabled: bool = False
    record_exceptions: Any = ()
    ignore_exceptions: Any = ()
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
        v.duration("wait_duration_in_open_state", min_ns=1_000_000)
        v.boolean("enable_exponential_backoff")
        v.number("exponential_backoff_multiplier", ge=1)
        v.duration("exponential_max_wait_duration_in_open_state", min_ns=1_000_000, allow_none=True)
        v.boolean("enable_randomized_wait")
        v.number("randomized_wait_factor", ge=0, le=1)
        v.boolean("automatic_transition_from_open_to_half_open_enabled")
        v.exception_classes("record_exceptions")
        v.exception_classes("ignore_exceptions")
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
