"""Semaphore bulkhead usable from threads and from the event loop at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import Validator

__all__ = ["BulkheadConfig"]


@dataclass(frozen=True, slots=True)
class BulkheadConfig:
    """Configuration of a :class:`Bulkhead` (Resilience4j's semaphore ``BulkheadConfig``)."""

    max_concurrent_calls: int = 25
    max_wait_duration: Any = 0
    fair_call_handling: bool = True
    writable_stack_trace_enabled: bool = True

    def __post_init__(self) -> None:
        v = Validator(self)
        v.integer("max_concurrent_calls", minimum=0)
        v.duration("max_wait_duration")
        v.boolean("fair_call_handling")
        v.boolean("writable_stack_trace_enabled")
        v.done()
