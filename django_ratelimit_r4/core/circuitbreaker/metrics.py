"""The read-only metrics view of a circuit breaker, and the verdict flags of a threshold check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .windows import Window

if TYPE_CHECKING:
    from .breaker import CircuitBreaker

__all__ = ["FAILURE_EXCEEDED", "SLOW_EXCEEDED", "CircuitBreakerMetrics"]

# Resilience4j's CircuitBreakerMetrics.Result as bit flags (0 = below both thresholds; below the
# minimum number of calls is answered before any rate is computed).
FAILURE_EXCEEDED = 1
SLOW_EXCEEDED = 2


class CircuitBreakerMetrics:
    """Read-only view of a breaker's numbers.

    The window figures (rates, buffered, failed, slow, not permitted) belong to the current state
    object, as in Resilience4j, so they restart on most transitions. The ``total_*`` figures are
    cumulative for the breaker's lifetime (``reset()`` does not clear them) for exporters that read
    them at scrape time.
    """

    __slots__ = ("_cb",)

    def __init__(self, circuit_breaker: CircuitBreaker) -> None:
        self._cb = circuit_breaker

    def _window(self) -> Window:
        cb = self._cb
        with cb._lock:
            window = cb._st.window
            window.refresh(cb._now())
            return window

    @property
    def failure_rate(self) -> float:
        """Failed calls in percent of buffered calls; ``-1.0`` below the minimum number of calls."""
        w = self._window()
        n = w.calls
        return -1.0 if n == 0 or n < w.min_calls else w.failed * 100.0 / n

    @property
    def slow_call_rate(self) -> float:
        """Slow calls in percent of buffered calls; ``-1.0`` below the minimum number of calls."""
        w = self._window()
        n = w.calls
        return -1.0 if n == 0 or n < w.min_calls else w.slow * 100.0 / n

    @property
    def number_of_buffered_calls(self) -> int:
        """Calls currently in the sliding window."""
        return self._window().calls

    @property
    def number_of_failed_calls(self) -> int:
        """Failed calls in the window (slow or not)."""
        return self._window().failed

    @property
    def number_of_successful_calls(self) -> int:
        """Successful calls in the window (slow or not)."""
        w = self._window()
        return w.calls - w.failed

    @property
    def number_of_slow_calls(self) -> int:
        """Calls in the window slower than ``slow_call_duration_threshold``."""
        return self._window().slow

    @property
    def number_of_slow_successful_calls(self) -> int:
        """Slow successful calls in the window."""
        w = self._window()
        return w.slow - w.slow_failed

    @property
    def number_of_slow_failed_calls(self) -> int:
        """Slow failed calls in the window."""
        return self._window().slow_failed

    @property
    def number_of_not_permitted_calls(self) -> int:
        """Rejections counted by the current state object (carried into OPEN, like Resilience4j)."""
        return self._cb._st.window.not_permitted

    @property
    def total_successful_calls(self) -> int:
        """Cumulative successful calls (including exceptions that are not recorded)."""
        return self._cb._tot_success

    @property
    def total_successful_duration_ns(self) -> int:
        """Summed duration of :attr:`total_successful_calls`, in nanoseconds."""
        return self._cb._tot_success_ns

    @property
    def total_failed_calls(self) -> int:
        """Cumulative recorded failures (exceptions and ``record_result`` matches)."""
        return self._cb._tot_failed

    @property
    def total_failed_duration_ns(self) -> int:
        """Summed duration of :attr:`total_failed_calls`, in nanoseconds."""
        return self._cb._tot_failed_ns

    @property
    def total_ignored_calls(self) -> int:
        """Cumulative calls that raised an ignored exception."""
        return self._cb._tot_ignored

    @property
    def total_ignored_duration_ns(self) -> int:
        """Summed duration of :attr:`total_ignored_calls`, in nanoseconds."""
        return self._cb._tot_ignored_ns

    @property
    def total_not_permitted_calls(self) -> int:
        """Cumulative rejected calls."""
        cb = self._cb
        with cb._lock:
            return cb._retired_not_permitted + cb._st.window.not_permitted

    def __repr__(self) -> str:
        return (
            f"CircuitBreakerMetrics(failure_rate={self.failure_rate}, slow_call_rate={self.slow_call_rate}, "
            f"buffered={self.number_of_buffered_calls}, failed={self.number_of_failed_calls}, "
            f"not_permitted={self.number_of_not_permitted_calls})"
        )
