"""Time sources. Every primitive reads time through a :class:`Clock` so tests can drive it.

Durations inside the core are integer nanoseconds of a monotonic clock; wall-clock time is never
used for deadlines (Resilience4j mixes ``nanoTime`` with ``java.time.Clock``; we do not).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["SYSTEM_CLOCK", "Clock", "FakeClock", "MonotonicClock"]


@runtime_checkable
class Clock(Protocol):
    """A monotonic nanosecond clock with matching sync and async sleeps."""

    def now_ns(self) -> int:
        """Return the current monotonic time in nanoseconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Suspend the calling coroutine for ``seconds`` without blocking the event loop."""
        ...


class MonotonicClock:
    """The real clock: :func:`time.monotonic_ns`, :func:`time.sleep` and :func:`asyncio.sleep`."""

    __slots__ = ()

    # Plain attribute lookups of builtins: primitives bind ``clock.now_ns`` once and call it directly.
    now_ns = staticmethod(time.monotonic_ns)
    sleep = staticmethod(time.sleep)

    async def asleep(self, seconds: float) -> None:
        """Suspend with :func:`asyncio.sleep`."""
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "MonotonicClock()"


SYSTEM_CLOCK: Clock = MonotonicClock()


class FakeClock:
    """A clock that only moves when told to, for tests that must not sleep.

    ``sleep`` and ``asleep`` advance the clock instead of waiting, so code that waits for a permit
    finishes at once with the time it would have waited accounted for. Thread-safe.
    """

    __slots__ = ("_lock", "_now_ns")

    def __init__(self, start_ns: int = 1_000_000_000_000) -> None:
        # A large non-zero start catches code that confuses "0" with "unset".
        self._now_ns = int(start_ns)
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        """Return the fake current time in nanoseconds."""
        return self._now_ns

    def advance(self, seconds: float) -> int:
        """Move the clock forward by ``seconds`` (a float or int) and return the new time in ns."""
        return self.advance_ns(round(seconds * 1_000_000_000))

    def advance_ns(self, nanos: int) -> int:
        """Move the clock forward by ``nanos`` nanoseconds and return the new time."""
        if nanos < 0:
            raise ValueError("a monotonic clock cannot go backwards")
        with self._lock:
            self._now_ns += int(nanos)
            return self._now_ns

    def sleep(self, seconds: float) -> None:
        """Advance the clock instead of blocking."""
        if seconds > 0:
            self.advance(seconds)

    async def asleep(self, seconds: float) -> None:
        """Advance the clock, then yield once to the event loop."""
        if seconds > 0:
            self.advance(seconds)
        await asyncio.sleep(0)

    def __repr__(self) -> str:
        return f"FakeClock(now_ns={self._now_ns})"
