"""Circuit breaker events and their publisher (Resilience4j's ``CircuitBreakerEvent`` family)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..events import Event, EventPublisher
from .config import State

if TYPE_CHECKING:
    from .breaker import CircuitBreaker

__all__ = [
    "CircuitBreakerEvents",
    "CircuitBreakerOnCallNotPermittedEvent",
    "CircuitBreakerOnErrorEvent",
    "CircuitBreakerOnFailureRateExceededEvent",
    "CircuitBreakerOnIgnoredErrorEvent",
    "CircuitBreakerOnResetEvent",
    "CircuitBreakerOnSlowCallRateExceededEvent",
    "CircuitBreakerOnStateTransitionEvent",
    "CircuitBreakerOnSuccessEvent",
]

# Resilience4j's State.allowPublish: DISABLED and FORCED_OPEN publish only STATE_TRANSITION and RESET.
ALLOW_PUBLISH = {State.DISABLED: False, State.FORCED_OPEN: False}
FORCE_PUBLISH = frozenset({"STATE_TRANSITION", "RESET"})


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


PER_CALL_EVENTS = ("SUCCESS", "ERROR", "IGNORED_ERROR", "NOT_PERMITTED")


class CircuitBreakerEvents(EventPublisher[Any]):
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

    def _listeners_changed(self) -> None:
        # The one hook of EventPublisher: refresh the hot-path flag, then let the breaker re-derive its
        # fast-path threshold.
        self.wants_calls = any(self.wants(t) for t in PER_CALL_EVENTS)
        if self._owner is not None:
            self._owner._listeners_changed()

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
