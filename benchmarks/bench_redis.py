"""Cost of a Redis-backed rate-limit decision against one bare ``EVALSHA`` round trip, measured in one run.

Target (issues 9 and 13): a decision is ONE round trip (an ``EVALSHA`` of the Lua script), so it should cost at
most 1.10x a bare ``EVALSHA`` of a trivial script (``return 1``, no keys) on the same client: the rest is the
script's work on the server and this library's work around the round trip. Rows cover the unkeyed limiter
(allowed and denied), a keyed limiter (hashing the client key), the decisions with the RateLimit header figures
(what ``@ratelimit`` runs), an all-or-nothing decision over three limits (still one round trip), and the async
path against an async bare ``EVALSHA``; one informational row puts a ``PING`` against the same baseline.

Run: ``python benchmarks/bench_redis.py`` (needs Redis at ``R4_REDIS_URL``, default redis://127.0.0.1:6379/15;
keys go under a random ``r4bench:`` prefix and are deleted afterwards). Subject and baseline alternate call by
call so a noisy neighbour hurts both alike; each figure is the median call. A Redis that other work
shares (a test suite's ``SCRIPT FLUSH``) costs the baseline a reload now and then: give the benchmark a
server of its own for clean figures.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

try:  # python -m benchmarks.bench_redis
    from ._timing import TRIVIAL, abare_evalsha, bare_evalsha, print_rows
    from ._timing import median_pair as _best_pair
except ImportError:  # benchmarks/run.py, or run as a script
    from _timing import TRIVIAL, abare_evalsha, bare_evalsha, print_rows  # type: ignore[no-redef]
    from _timing import median_pair as _best_pair  # type: ignore[no-redef]

from django_ratelimit_r4.backends.redis import (
    RedisKeyedRateLimiter,
    aacquire_all_quotas,
    acquire_all_quotas,
    connection,
    redis_backend,
)
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, aacquire_all, acquire_all

__all__ = ["TRIVIAL", "abare_evalsha", "bare_evalsha", "run"]

TARGET_RATIO = 1.10
NUMBER = 1_000
REPEAT = 15
URL = os.environ.get("R4_REDIS_URL", "redis://127.0.0.1:6379/15")
async def _abest_pair(
    subject: Callable[[], Any], baseline: Callable[[], Any], number: int, repeat: int
) -> tuple[float, float]:
    """Async twin of ``_timing.median_pair``: medians of awaited calls, alternated call by call."""
    import statistics

    clock = time.perf_counter_ns
    subject_ns: list[int] = []
    baseline_ns: list[int] = []
    for _ in range(number * repeat):
        started = clock()
        await baseline()
        between = clock()
        await subject()
        subject_ns.append(clock() - between)
        baseline_ns.append(between - started)
    return float(statistics.median(subject_ns)), float(statistics.median(baseline_ns))


def run(number: int = NUMBER, repeat: int = REPEAT) -> list[dict[str, Any]]:
    """Measure every row; each is ``{name, ns_per_op, baseline_ns, ratio, target}``."""
    prefix = f"r4bench:{uuid.uuid4().hex[:8]}"
    rows: list[dict[str, Any]] = []

    def add(name: str, ns: float, base: float, target: float | None) -> None:
        rows.append(
            {
                "name": name,
                "ns_per_op": round(ns, 1),
                "baseline_ns": round(base, 1),
                "ratio": round(ns / base, 3),
                "target": target,
            }
        )

    conn = connection(URL)
    bare = bare_evalsha(conn.sync)
    factory = redis_backend(URL, prefix=prefix)

    def limiter(name: str, limit: int) -> RateLimiter:
        config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1h")
        return RateLimiter(name, config, clock=SYSTEM_CLOCK, backend=factory)

    try:
        allowed = limiter("allowed", 10**12)
        denied = limiter("denied", 1)
        denied.acquire_permission()
        assert allowed.acquire_permission() and not denied.acquire_permission()
        add("info: PING", *_best_pair(conn.sync.ping, bare, number, repeat), None)
        add(
            "redis acquire_permission allowed",
            *_best_pair(allowed.acquire_permission, bare, number, repeat),
            TARGET_RATIO,
        )
        add(
            "redis acquire_permission denied",
            *_best_pair(denied.acquire_permission, bare, number, repeat),
            TARGET_RATIO,
        )

        keyed = RedisKeyedRateLimiter(
            "keyed",
            RateLimiterConfig(limit_for_period=10**12, limit_refresh_period="1h"),
            url=URL,
            prefix=prefix,
        )
        add(
            "redis keyed acquire_permission('203.0.113.7')",
            *_best_pair(lambda: keyed.acquire_permission("203.0.113.7"), bare, number, repeat),
            TARGET_RATIO,
        )
        trio = [limiter(f"multi{i}", 10**12) for i in range(3)]
        add(
            "info: redis acquire_all over 3 limits",
            *_best_pair(lambda: acquire_all(trio), bare, number, repeat),
            None,
        )
        # What @ratelimit / RateLimiterThrottle run with RateLimit headers on: the decision and the header
        # figures in the same round trip.
        add(
            "redis acquire_quota allowed (+ header figures)",
            *_best_pair(allowed.acquire_quota, bare, number, repeat),
            TARGET_RATIO,
        )
        add(
            "redis keyed acquire_quota (+ header figures)",
            *_best_pair(lambda: keyed.acquire_quota("203.0.113.7"), bare, number, repeat),
            TARGET_RATIO,
        )
        entries = [(r, None) for r in trio]
        add(
            "info: redis acquire_all_quotas over 3 limits (+ figures)",
            *_best_pair(lambda: acquire_all_quotas(entries), bare, number, repeat),
            None,
        )

        async def async_rows() -> None:
            abare = await abare_evalsha(conn.aio())
            await abare()
            await allowed.aacquire_permission()
            add(
                "redis aacquire_permission (redis.asyncio)",
                *await _abest_pair(allowed.aacquire_permission, abare, number, repeat),
                TARGET_RATIO,
            )
            add(
                "info: redis aacquire_all over 3 limits (redis.asyncio)",
                *await _abest_pair(lambda: aacquire_all(trio), abare, number, repeat),
                None,
            )
            add(
                "info: redis aacquire_all_quotas over 3 limits (+ figures, redis.asyncio)",
                *await _abest_pair(lambda: aacquire_all_quotas(entries), abare, number, repeat),
                None,
            )

        asyncio.run(async_rows())
    finally:
        client = redis.Redis.from_url(URL)
        keys = list(client.scan_iter(match=prefix + ":*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    return rows


def main() -> int:
    """Print the rows; exit status 1 if a targeted row misses its target."""
    return print_rows(run(), baseline_label="EVALSHA ns")


if __name__ == "__main__":
    raise SystemExit(main())
