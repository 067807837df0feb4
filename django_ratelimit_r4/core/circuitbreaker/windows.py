"""Sliding windows of call outcomes: Resilience4j's fixed-size (count) and sliding-time metrics.

Nothing here knows about states: a window takes outcome codes (:data:`SUCCESS`, :data:`ERROR`,
:data:`SLOW_SUCCESS`, :data:`SLOW_ERROR`) and keeps the counts a rate is computed from, in O(1) per
record. Not thread-safe on purpose: the owner serialises access (the breaker records under its lock).
"""

from __future__ import annotations

__all__ = [
    "EMPTY",
    "ERROR",
    "FAILED",
    "SLOW",
    "SLOW_ERROR",
    "SLOW_SUCCESS",
    "SUCCESS",
    "CountWindow",
    "TimeWindow",
    "Window",
]

# Outcome codes, one small int per call (stored as is in the count ring): bit 0 = present,
# bit 1 = failed, bit 2 = slow. Named here once; everything else uses the names.
EMPTY = 0  # a ring slot that never held a call
FAILED = 2  # bit: the call failed
SLOW = 4  # bit: the call was slower than the slow-call threshold
SUCCESS = 1
ERROR = SUCCESS | FAILED  # 3
SLOW_SUCCESS = SUCCESS | SLOW  # 5
SLOW_ERROR = SUCCESS | FAILED | SLOW  # 7

_NS_PER_S = 1_000_000_000


class CountWindow:
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
        self.ring = [EMPTY] * size
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
            if old != SUCCESS:
                if old & FAILED:
                    self.failed -= 1
                if old & SLOW:
                    self.slow -= 1
                    if old == SLOW_ERROR:
                        self.slow_failed -= 1
        else:
            self.calls += 1
        if code != SUCCESS:
            if code & FAILED:
                self.failed += 1
            if code & SLOW:
                self.slow += 1
                if code == SLOW_ERROR:
                    self.slow_failed += 1

    def refresh(self, now_ns: int) -> None:
        """Count-based windows do not age."""


class TimeWindow:
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
        if code & FAILED:
            self.b_failed[head] += 1
            self.failed += 1
        if code & SLOW:
            self.b_slow[head] += 1
            self.slow += 1
            if code == SLOW_ERROR:
                self.b_slow_failed[head] += 1
                self.slow_failed += 1


Window = CountWindow | TimeWindow
