"""Time limiter for async callables. Python cannot kill a thread, so sync callables are refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import Validator

__all__ = ["TimeLimiterConfig"]


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
