"""What the Little's-law box needs from this worker: calls per second to the partner and calls in flight.

Little's law: in-flight = throughput x latency. The dashboard computes the right-hand side from the
partner's latency and the measured rate, and compares it with the measured in-flight peak and the
bulkhead size. Counts are per process (each gunicorn worker has its own meter, like its own bulkhead).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["CallMeter"]


class CallMeter:
    """Counts calls that reach the partner, per whole second, and the peak number in flight.

    :param seconds: how many past seconds to keep.
    :param clock: seconds since an arbitrary origin (``time.monotonic`` by default; tests pass a fake).
    """

    def __init__(self, seconds: int = 10, clock: Callable[[], float] = time.monotonic) -> None:
        self._size = seconds
        self._clock = clock
        self._lock = threading.Lock()  # held for a few integer operations only, never while waiting
        self._second = int(clock())
        self._calls = [0] * seconds
        self._peaks = [0] * seconds
        self.in_flight = 0

    def _roll(self, second: int) -> int:
        """Zero the slots of the seconds that passed since the last call; return the current slot."""
        gap = second - self._second
        if gap > 0:
            for i in range(1, min(gap, self._size) + 1):
                slot = (self._second + i) % self._size
                self._calls[slot] = 0
                self._peaks[slot] = self.in_flight  # calls still running count in the new second
            self._second = second
        return second % self._size

    def enter(self) -> None:
        """A call to the partner starts."""
        with self._lock:
            slot = self._roll(int(self._clock()))
            self.in_flight += 1
            self._calls[slot] += 1
            if self.in_flight > self._peaks[slot]:
                self._peaks[slot] = self.in_flight

    def leave(self) -> None:
        """A call to the partner ended (answer or exception)."""
        with self._lock:
            self._roll(int(self._clock()))
            self.in_flight -= 1

    def snapshot(self, window: int = 3) -> dict[str, float]:
        """Rate over the last ``window`` complete seconds, and the peak in flight over them.

        ``{"calls_per_s": float, "peak_in_flight": int, "in_flight": int, "window_s": int}``.
        """
        window = max(1, min(window, self._size - 1))
        with self._lock:
            now = self._roll(int(self._clock()))
            slots = [(now - i) % self._size for i in range(1, window + 1)]
            calls = sum(self._calls[s] for s in slots)
            peak = max(self._peaks[s] for s in slots)
            return {"calls_per_s": calls / window, "peak_in_flight": peak, "in_flight": self.in_flight,
                    "window_s": window}
