"""Cost of ``RateLimiter.acquire_permission()`` against a bare fixed-window counter, measured in one run.

Target (issue 2): an unkeyed in-memory limiter within 1.5x of a ``threading.Lock`` + ``time.monotonic_ns()``
fixed-window counter, allowed and denied, and flat whatever the limit (10/s or 10000/h).

The baseline uses ``with lock:``, the idiom (that is the ~214 ns of the issue). The backend itself uses
``lock.acquire()``/``try``/``finally``, about 40 ns cheaper; an informational row compares against a baseline
written that way too.

Run: ``python -m benchmarks.bench_ratelimiter`` (or ``python benchmarks/bench_ratelimiter.py``). Each figure is
the best of several repeats of a timeit loop; subject and baseline repeats are interleaved so a noisy
neighbour on a shared machine hurts both alike. Rows without a target are informational.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from time import monotonic_ns
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:  # python -m benchmarks.bench_ratelimiter
    from ._timing import best_pair as _best_pair
    from ._timing import exhaust as _exhaust
    from ._timing import print_rows
except ImportError:  # benchmarks/run.py, or run as a script
    from _timing import best_pair as _best_pair  # type: ignore[no-redef]
    from _timing import exhaust as _exhaust
    from _timing import print_rows

from django_ratelimit_r4.backends.base import decide
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig

__all__ = ["FixedWindowCounter", "run"]

TARGET_RATIO = 1.5
NUMBER = 100_000
REPEAT = 7
HOUR_NS = 3_600_000_000_000
SECOND_NS = 1_000_000_000


class FixedWindowCounter:
    """The baseline: the simplest correct thread-safe limiter (one lock, one clock read, one window)."""

    def __init__(self, limit: int, period_ns: int) -> None:
        self.lock = threading.Lock()
        self.limit = limit
        self.period = period_ns
        self.window = 0
        self.count = 0

    def acquire(self) -> bool:
        """Count one call in the current window; False when the window is full."""
        with self.lock:
            window = monotonic_ns() // self.period
            if window != self.window:
                self.window = window
                self.count = 0
            if self.count < self.limit:
                self.count += 1
                return True
            return False


class _TryFinallyFixedWindow(FixedWindowCounter):
    """Informational: the baseline with ``lock.acquire()``/``try``/``finally`` instead of ``with``."""

    def acquire(self) -> bool:
        lock = self.lock
        lock.acquire()
        try:
            window = monotonic_ns() // self.period
            if window != self.window:
                self.window = window
                self.count = 0
            if self.count < self.limit:
                self.count += 1
                return True
            return False
        finally:
            lock.release()


class _PureDecideLimiter:
    """Informational variant: the backend calling the pure ``decide`` instead of inlining it."""

    def __init__(self, limit: int, period_ns: int) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._period = period_ns
        self._cycle = 0
        self._permissions = limit
        self._now = monotonic_ns
        self._anchor = monotonic_ns()

    def acquire(self) -> bool:
        with self._lock:
            cycle, permissions, _wait, granted = decide(
                self._cycle, self._permissions, 1, 0, self._now() - self._anchor, self._period, self._limit
            )
            self._cycle = cycle
            self._permissions = permissions
            return granted


def _limiter(limit: int, period: str) -> RateLimiter:
    return RateLimiter("bench", RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period))




def run(number: int = NUMBER, repeat: int = REPEAT) -> list[dict[str, Any]]:
    """Measure every row; each is ``{name, ns_per_op, baseline_ns, ratio, target}`` (target None = info)."""
    rows: list[dict[str, Any]] = []

    def row(name: str, subject: Callable[[], Any], baseline: Callable[[], Any], target: float | None) -> None:
        ns, base = _best_pair(subject, baseline, number, repeat)
        rows.append(
            {
                "name": name,
                "ns_per_op": round(ns, 1),
                "baseline_ns": round(base, 1),
                "ratio": round(ns / base, 3),
                "target": target,
            }
        )

    allowed_base = FixedWindowCounter(10**15, HOUR_NS).acquire
    denied_base = _exhaust(FixedWindowCounter(10_000, HOUR_NS).acquire)
    assert allowed_base() and not denied_base()

    allowed_h = _limiter(10**15, "1h").acquire_permission
    allowed_s = _limiter(10**15, "1s").acquire_permission
    denied_s = _exhaust(_limiter(10, "1s").acquire_permission)
    denied_h = _exhaust(_limiter(10_000, "1h").acquire_permission)
    assert allowed_h() and allowed_s() and not denied_h()

    row("acquire_permission allowed (limit 1e15/h)", allowed_h, allowed_base, TARGET_RATIO)
    row("acquire_permission allowed (limit 1e15/s)", allowed_s, allowed_base, TARGET_RATIO)
    row("acquire_permission denied (limit 10/s)", denied_s, denied_base, TARGET_RATIO)
    row("acquire_permission denied (limit 10000/h)", denied_h, denied_base, TARGET_RATIO)

    # Informational: where the time goes. The limiter's backend uses acquire()/try/finally (cheaper than
    # ``with``); the first row compares it with a baseline written the same way.
    row(
        "info: allowed vs try/finally baseline",
        allowed_h,
        _TryFinallyFixedWindow(10**15, HOUR_NS).acquire,
        None,
    )
    backend = _limiter(10**15, "1h").backend
    row(
        "info: MemoryBackend.acquire(1, 0) alone",
        functools.partial(backend.acquire, 1, 0),
        allowed_base,
        None,
    )
    row(
        "info: backend calling pure decide()", _PureDecideLimiter(10**15, HOUR_NS).acquire, allowed_base, None
    )
    listened = _limiter(10**15, "1h")
    listened.events.on_failed_acquire(lambda event: None)  # listeners of another type: no event built
    row("info: allowed with an on_failed_acquire listener", listened.acquire_permission, allowed_base, None)
    return rows


def main() -> int:
    """Print the rows; exit status 1 if a targeted row misses its target."""
    return print_rows(run())


if __name__ == "__main__":
    raise SystemExit(main())
