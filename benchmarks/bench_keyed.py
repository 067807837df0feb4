"""Cost of a per-key decision (``KeyedRateLimiter``) against the unkeyed ``RateLimiter``, and bytes per key.

Target (issue 3): "a keyed limiter adds little over an unkeyed one; memory per live key at most 250
bytes". Here "little" is read as: an allowed keyed decision costs at most 2x the unkeyed one (a few
hundred ns, against a +5 us budget for a whole ``@ratelimit`` view). Memory is measured with ``tracemalloc`` over 100k live keys, key strings
included (they are built inside the traced region, as a request's key function would build them).

Run: ``python benchmarks/bench_keyed.py`` or ``python benchmarks/run.py keyed``. Each timing is the best of
several interleaved repeats of a timeit loop. Rows without a target are informational.
"""

from __future__ import annotations

import functools
import gc
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:  # python -m benchmarks.bench_keyed
    from ._timing import best_pair as _best_pair
    from ._timing import exhaust as _exhaust
    from ._timing import print_rows
except ImportError:  # benchmarks/run.py, or run as a script
    from _timing import best_pair as _best_pair  # type: ignore[no-redef]
    from _timing import exhaust as _exhaust
    from _timing import print_rows

from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig
from django_ratelimit_r4.keyed import KeyedRateLimiter

__all__ = ["bytes_per_key", "run"]

TARGET_RATIO = 2.0
TARGET_BYTES = 250
NUMBER = 100_000
REPEAT = 7
KEYS = 10_000


def _config(limit: int) -> RateLimiterConfig:
    return RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1h")




def bytes_per_key(n: int = 100_000) -> float:
    """Traced bytes per live key after ``n`` distinct IPv4-style keys each took one permit."""
    limiter = KeyedRateLimiter(
        "mem",
        RateLimiterConfig(limit_for_period=10, limit_refresh_period="1s"),
        clock=FakeClock(),
        max_keys=n,
    )
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            limiter.acquire_permission(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(limiter) == n
    return used / n


def _round_robin(limiter: KeyedRateLimiter, keys: list[str]) -> Callable[[], bool]:
    """Each call decides for the next of ``keys``: a working set larger than any cache line budget."""
    acquire = limiter.acquire_permission
    state = {"i": 0}
    count = len(keys)

    def call() -> bool:
        i = state["i"]
        state["i"] = i + 1 if i + 1 < count else 0
        return acquire(keys[i])

    return call


def _round_robin_unkeyed(limiter: RateLimiter, count: int) -> Callable[[], bool]:
    """The same loop overhead as :func:`_round_robin`, with an unkeyed limiter (a fair baseline)."""
    acquire = limiter.acquire_permission
    keys = list(range(count))
    state = {"i": 0}

    def call() -> bool:
        i = state["i"]
        state["i"] = i + 1 if i + 1 < count else 0
        keys[i]
        return acquire()

    return call


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

    big = 10**15 - 1  # the largest limit_for_period (an RFC 9651 sf-integer): never exhausted in a run
    unkeyed_allowed = RateLimiter("u", _config(big)).acquire_permission
    unkeyed_denied = _exhaust(RateLimiter("u", _config(10)).acquire_permission)
    keyed_allowed = KeyedRateLimiter("k", _config(big))
    keyed_denied = KeyedRateLimiter("k", _config(10))
    _exhaust(lambda: keyed_denied.acquire_permission("203.0.113.7"))
    assert keyed_allowed.acquire_permission("203.0.113.7")
    assert not keyed_denied.acquire_permission("203.0.113.7")

    row(
        "keyed allowed, one hot key vs unkeyed",
        functools.partial(keyed_allowed.acquire_permission, "203.0.113.7"),
        unkeyed_allowed,
        TARGET_RATIO,
    )
    # The keyed @ratelimit fast path: the decision and the RateLimit figures in one locked step,
    # against the unkeyed view path's decision plus MemoryBackend.quota() (a lock-free snapshot).
    unkeyed_headers = RateLimiter("u", _config(big))
    unkeyed_acquire, unkeyed_quota = unkeyed_headers.acquire_or_raise, unkeyed_headers.backend.quota

    def unkeyed_with_quota() -> tuple[int, int]:
        unkeyed_acquire()
        return unkeyed_quota()  # type: ignore[no-any-return]

    row(
        "keyed acquire_quota (decision + header figures) vs unkeyed acquire + quota",
        functools.partial(keyed_allowed.acquire_quota, "203.0.113.7"),
        unkeyed_with_quota,
        TARGET_RATIO,
    )
    # Informational: a rejection also computes the wait through nanos_to_wait() (for Retry-After); the
    # ~300 ns it adds sits inside the +15 us budget of a denied request, which builds a 429 anyway.
    row(
        "info: keyed denied, one hot key vs unkeyed",
        functools.partial(keyed_denied.acquire_permission, "203.0.113.7"),
        unkeyed_denied,
        None,
    )

    keys = [f"10.0.{i >> 8 & 255}.{i & 255}" for i in range(KEYS)]
    spread = KeyedRateLimiter("k", _config(big), max_keys=KEYS)
    row(
        f"keyed allowed, {KEYS} keys round-robin vs unkeyed",
        _round_robin(spread, keys),
        _round_robin_unkeyed(RateLimiter("u", _config(big)), KEYS),
        TARGET_RATIO,
    )

    # Informational: a working set larger than max_keys, so every decision inserts and evicts (worst case).
    churn = KeyedRateLimiter("k", _config(big), max_keys=KEYS // 2)
    row(
        f"info: keyed, {KEYS} keys through max_keys={KEYS // 2} (evicting)",
        _round_robin(churn, keys),
        unkeyed_allowed,
        None,
    )

    per_key = bytes_per_key()
    rows.append(
        {
            "name": f"memory per live key (100k keys): {per_key:.0f} B (target <= {TARGET_BYTES} B)",
            "ns_per_op": None,
            "baseline_ns": None,
            "ratio": round(per_key / TARGET_BYTES, 3),
            "target": 1.0,
        }
    )
    return rows


def main() -> int:
    """Print the rows; exit status 1 if a targeted row misses its target."""
    return print_rows(run())


if __name__ == "__main__":
    raise SystemExit(main())
