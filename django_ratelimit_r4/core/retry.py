"""Retry with constant, exponential and randomized backoff; the sleep is injectable."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import Validator

__all__ = ["RetryConfig"]


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """Configuration of a :class:`Retry` (Resilience4j's ``RetryConfig``).

    ``max_attempts`` includes the first call. ``retry_exceptions`` empty means every ``Exception``;
    ``ignore_exceptions`` always wins. ``retry_on_result`` is a predicate on the return value.
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
        v.boolean("fail_after_max_attempts")
        v.done()
