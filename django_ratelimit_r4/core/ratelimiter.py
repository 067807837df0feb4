"""Rate limiter: Resilience4j's AtomicRateLimiter algorithm, with a fail-fast default."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import Validator

__all__ = ["RateLimiterConfig"]


@dataclass(frozen=True, slots=True)
class RateLimiterConfig:
    """Configuration of a :class:`RateLimiter` (Resilience4j's ``RateLimiterConfig``).

    Durations accept ``timedelta`` or strings with a unit and are stored as integer nanoseconds.
    ``timeout_duration`` defaults to 0 (Resilience4j: 5 s): a web request must fail fast.
    """

    limit_for_period: int = 50
    limit_refresh_period: Any = "500ns"
    timeout_duration: Any = 0
    #: Called with the call's outcome (result or exception); True drains the limiter (upstream 429s).
    drain_permissions_on_result: Callable[[Any], bool] | str | None = None
    writable_stack_trace_enabled: bool = True

    def __post_init__(self) -> None:
        v = Validator(self)
        v.integer("limit_for_period", minimum=1)
        v.duration("limit_refresh_period", min_ns=1)
        v.duration("timeout_duration")
        v.callable_or_path("drain_permissions_on_result")
        v.boolean("writable_stack_trace_enabled")
        v.done()
