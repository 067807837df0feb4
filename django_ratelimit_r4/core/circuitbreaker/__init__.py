"""Circuit breaker: Resilience4j's state machine with count- and time-based sliding windows.

The package is split the way Resilience4j and Polly split theirs; every name is importable from
here, as it was when this was one module:

* :mod:`.config` — :class:`State`, :class:`SlidingWindowType`, :class:`CircuitBreakerConfig`,
  :data:`STATE_TRANSITIONS`.
* :mod:`.events` — the ``CircuitBreakerOn*Event`` classes and :class:`CircuitBreakerEvents`.
* :mod:`.windows` — the outcome codes and the count / time sliding windows (no breaker logic).
* :mod:`.metrics` — :class:`CircuitBreakerMetrics` and the threshold verdict flags.
* :mod:`.breaker` — the state machine, :class:`CircuitBreaker` (with its inlined ``call``/``acall``).
"""

from __future__ import annotations

from .breaker import CircuitBreaker, ResultRecordedAsFailure
from .config import MAX_SLIDING_WINDOW_SIZE, STATE_TRANSITIONS, CircuitBreakerConfig, SlidingWindowType, State
from .events import (
    CircuitBreakerEvents,
    CircuitBreakerOnCallNotPermittedEvent,
    CircuitBreakerOnErrorEvent,
    CircuitBreakerOnFailureRateExceededEvent,
    CircuitBreakerOnIgnoredErrorEvent,
    CircuitBreakerOnResetEvent,
    CircuitBreakerOnSlowCallRateExceededEvent,
    CircuitBreakerOnStateTransitionEvent,
    CircuitBreakerOnSuccessEvent,
)
from .metrics import CircuitBreakerMetrics

__all__ = [
    "MAX_SLIDING_WINDOW_SIZE",
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
