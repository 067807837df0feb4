"""Waiting for a reserved permit while counting the waiters (``number_of_waiting_threads``)."""

from __future__ import annotations

import threading

from .clock import Clock

__all__ = ["Waiters"]

_NS_PER_S = 1_000_000_000


class Waiters:
    """Sleeps on a clock for a reserved permit and counts the callers (threads or tasks) doing so.

    Shared by every rate limiter that reserves ahead (in memory, keyed, Redis). The lock is held only for an
    increment or decrement, never while sleeping, so taking it on the event loop cannot stall the loop.
    """

    __slots__ = ("_lock", "count")

    def __init__(self) -> None:
        #: Callers waiting now; read without the lock (an int read is atomic).
        self.count = 0
        self._lock = threading.Lock()

    def sleep(self, clock: Clock, wait_ns: int) -> None:
        """Block the calling thread for ``wait_ns`` on ``clock`` (FakeClock advances), counted as waiting."""
        with self._lock:
            self.count += 1
        try:
            clock.sleep(wait_ns / _NS_PER_S)
        finally:
            with self._lock:
                self.count -= 1

    async def asleep(self, clock: Clock, wait_ns: int) -> None:
        """Async twin of :meth:`sleep`: ``await clock.asleep``, never blocking the loop."""
        with self._lock:
            self.count += 1
        try:
            await clock.asleep(wait_ns / _NS_PER_S)
        finally:
            with self._lock:
                self.count -= 1

    def __repr__(self) -> str:
        return f"Waiters(count={self.count})"
