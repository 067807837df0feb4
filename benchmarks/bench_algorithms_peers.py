"""The smooth algorithms (issue 13) side by side with the peers' smooth limiters, in process, one methodology.

Peers (the ``bench`` extra: ``pip install -e ".[bench]"``): limits 5.x (``MovingWindowRateLimiter``, an exact
log, and ``SlidingWindowCounterRateLimiter``, the weighted two-window approximation) on ``MemoryStorage``, and
pyrate-limiter 4.x (``GCRA`` on a ``StateBucket``, ``SlidingWindowLog`` on an ``InMemoryBucket``) through its
``Limiter.try_acquire(name, blocking=False)``. A peer that is not installed gets one "skipped" row.

Method: ``bench_peers``'s (calibrated ``timeit`` loops, best of interleaved repeats), timed in CPU time of the
benchmarking thread like ``bench_algorithms`` (pyrate-limiter's in-memory log trims in a background thread,
not counted). ``baseline_ns`` is OURS
with the same algorithm and the same shape (keyed, as limits' API is, against ``KeyedRateLimiter``; unkeyed,
as a pyrate ``Limiter`` over one bucket is, against ``RateLimiter``) and ``ratio = peer / ours``. Denied rows
hold an exhausted limit (5 per hour); allowed rows use limits no loop reaches (pyrate GCRA, ours) or a window
the loop keeps full by reuse (ours: 1000 per µs).

Run: ``python benchmarks/run.py algorithms_peers`` (or ``python benchmarks/bench_algorithms_peers.py``).
"""

from __future__ import annotations

import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:  # python -m benchmarks.bench_algorithms_peers
    from .bench_peers import IP, MIN_REPEAT_S, Row, _exhaust, _optional, _row, _skipped, limits
except ImportError:  # benchmarks/run.py, or run as a script
    from bench_peers import IP, MIN_REPEAT_S, Row, _exhaust, _optional, _row, _skipped, limits  # type: ignore[no-redef]

from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig
from django_ratelimit_r4.keyed import KeyedRateLimiter

__all__ = ["run"]

pyrate: Any = _optional("pyrate_limiter")
REPEAT = 15


def _measure(cases: dict[str, Callable[[], Any]], repeat: int = REPEAT) -> dict[str, float]:
    """Best ns per call of every case in thread CPU time (``time.thread_time``: preemption on a loaded machine
    does not count), loop counts calibrated to about ``MIN_REPEAT_S``, the repeats of all cases interleaved."""
    timers: dict[str, tuple[timeit.Timer, int]] = {}
    for name, fn in cases.items():
        timer = timeit.Timer("f()", globals={"f": fn}, timer=time.thread_time)
        number = 1
        while (elapsed := timer.timeit(number)) < MIN_REPEAT_S / 10:
            number *= 10
        timers[name] = (timer, max(1, int(number * MIN_REPEAT_S / elapsed)))
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(repeat):
        for name, (timer, number) in timers.items():
            best[name] = min(best[name], timer.timeit(number) / number * 1e9)
    return best


def _config(algorithm: str, limit: int, period: str) -> RateLimiterConfig:
    return RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm)


def _ours(algorithm: str, limit: int, period: str) -> Callable[[], bool]:
    return RateLimiter("bench-algorithms-peers", _config(algorithm, limit, period)).acquire_permission


def _ours_keyed(algorithm: str, limit: int, period: str) -> Callable[[], bool]:
    keyed = KeyedRateLimiter("bench-algorithms-peers", _config(algorithm, limit, period))
    return lambda: keyed.acquire_permission(IP)


def run() -> list[Row]:
    """Measure every group; rows as ``bench_peers`` (``target`` holds a note, never a threshold)."""
    cases: dict[str, Callable[[], Any]] = {
        "ours cycle denied": _exhaust(_ours("cycle", 5, "1h")),
        "ours gcra denied": _exhaust(_ours("gcra", 5, "1h")),
        "ours sliding denied": _exhaust(_ours("sliding_window", 5, "1h")),
        "ours keyed sliding denied": _exhaust(_ours_keyed("sliding_window", 5, "1h")),
        "ours gcra allowed": _ours("gcra", 10**9, "1h"),
        "ours sliding allowed": _ours("sliding_window", 1000, "1us"),
        "ours keyed sliding allowed": _ours_keyed("sliding_window", 1000, "1us"),
    }
    if limits is not None:
        storage = limits.storage.MemoryStorage()
        moving = limits.strategies.MovingWindowRateLimiter(storage)
        counter = limits.strategies.SlidingWindowCounterRateLimiter(storage)
        five = limits.parse("5/hour")
        cases["limits moving denied"] = _exhaust(lambda: moving.hit(five, "alg-moving", IP))
        cases["limits counter denied"] = _exhaust(lambda: counter.hit(five, "alg-counter", IP))
        big = limits.parse("1000000000/hour")
        cases["limits counter allowed"] = lambda: counter.hit(big, "alg-counter-big", IP)
    if pyrate is not None:
        hour = 3_600_000
        gcra_denied = pyrate.Limiter(pyrate.StateBucket([pyrate.Rate(5, hour)], algorithm=pyrate.GCRA()))
        gcra_allowed = pyrate.Limiter(pyrate.StateBucket([pyrate.Rate(10**9, hour)], algorithm=pyrate.GCRA()))
        log_denied = pyrate.Limiter(pyrate.InMemoryBucket([pyrate.Rate(5, hour)], algorithm=pyrate.SlidingWindowLog()))
        cases["pyrate gcra denied"] = _exhaust(lambda: gcra_denied.try_acquire(IP, blocking=False))
        cases["pyrate gcra allowed"] = lambda: gcra_allowed.try_acquire(IP, blocking=False)
        cases["pyrate log denied"] = _exhaust(lambda: log_denied.try_acquire(IP, blocking=False))
    ns = _measure(cases)
    rows = [
        _row("ours cycle RateLimiter denied (5/h)", ns["ours cycle denied"], ns["ours cycle denied"], "context"),
        _row("ours gcra RateLimiter denied (5/h)", ns["ours gcra denied"], ns["ours cycle denied"], "ratio: vs ours cycle"),
        _row("ours sliding_window RateLimiter denied (5/h)", ns["ours sliding denied"], ns["ours cycle denied"], "ratio: vs ours cycle"),
        _row("ours gcra RateLimiter allowed", ns["ours gcra allowed"], ns["ours gcra allowed"], "baseline"),
        _row("ours sliding_window RateLimiter allowed (full log of 1000)", ns["ours sliding allowed"], ns["ours sliding allowed"], "baseline"),
        _row("ours sliding_window KeyedRateLimiter denied (5/h)", ns["ours keyed sliding denied"], ns["ours keyed sliding denied"], "baseline"),
        _row("ours sliding_window KeyedRateLimiter allowed (full log)", ns["ours keyed sliding allowed"], ns["ours keyed sliding allowed"], "baseline"),
    ]
    if limits is None:
        rows.append(_skipped("limits"))
    else:
        kd = ns["ours keyed sliding denied"]
        rows += [
            _row("limits MovingWindow.hit denied (5/h; exact log)", ns["limits moving denied"], kd, "vs ours keyed sliding_window"),
            _row("limits SlidingWindowCounter.hit denied (5/h; ≈ up to 2N-1)", ns["limits counter denied"], kd, "vs ours keyed sliding_window"),
            _row(
                "limits SlidingWindowCounter.hit allowed",
                ns["limits counter allowed"],
                ns["ours keyed sliding allowed"],
                "vs ours keyed sliding_window",
            ),
        ]
    if pyrate is None:
        rows.append(_skipped("pyrate-limiter"))
    else:
        rows += [
            _row("pyrate-limiter GCRA try_acquire denied (5/h)", ns["pyrate gcra denied"], ns["ours gcra denied"], "vs ours gcra"),
            _row("pyrate-limiter GCRA try_acquire allowed", ns["pyrate gcra allowed"], ns["ours gcra allowed"], "vs ours gcra"),
            _row(
                "pyrate-limiter SlidingWindowLog try_acquire denied (5/h)",
                ns["pyrate log denied"],
                ns["ours sliding denied"],
                "vs ours sliding_window",
            ),
        ]
    return rows


def main() -> int:
    """Print the rows (informational: exit status 0)."""
    for r in run():
        shown = "" if r["ratio"] is None else f"{r['ratio']:6.2f}"
        print(f"{r['name']:<62} {r['ns_per_op'] or '':>10} {r['baseline_ns'] or '':>10} {shown:>6}  {r['target']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
