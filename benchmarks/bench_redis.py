"""Cost of a Redis-backed rate-limit decision against a bare Redis ``PING`` round trip, measured in one run.

Target: a decision is ONE round trip (an ``EVALSHA`` of the Lua script), so its cost should be close to a
``PING`` on the same client: ratio near 1-1.5 (the rest is the script's work on the server and the longer
reply/argument encoding). Rows cover the unkeyed limiter (allowed and denied), a keyed limiter (hashing the
client key), an all-or-nothing decision over three limits (still one round trip), and the async path against
an async ``PING``.

Run: ``python benchmarks/bench_redis.py`` (needs Redis at ``R4_REDIS_URL``, default redis://127.0.0.1:6379/15;
keys go under a random ``r4bench:`` prefix and are deleted afterwards). Subject and baseline repeats are
interleaved so a noisy neighbour hurts both alike; each figure is the best repeat.
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
    from ._timing import best_pair as _best_pair
    from ._timing import print_rows
except ImportError:  # benchmarks/run.py, or run as a script
    from _timing import best_pair as _best_pair  # type: ignore[no-redef]
    from _timing import print_rows

from django_ratelimit_r4.backends.redis import (
    RedisKeyedRateLimiter,
    acquire_all_quotas,
    connection,
    redis_backend,
)
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, acquire_all

__all__ = ["run"]

TARGET_RATIO = 1.5
NUMBER = 2_000
REPEAT = 5
URL = os.environ.get("R4_REDIS_URL", "redis://127.0.0.1:6379/15")



async def _abest_pair(
    subject: Callable[[], Any], baseline: Callable[[], Any], number: int, repeat: int
) -> tuple[float, float]:
    best_s = best_b = float("inf")
    for _ in range(repeat):
        for fn, is_subject in ((baseline, False), (subject, True)):
            started = time.perf_counter_ns()
            for _ in range(number):
                await fn()
            ns = (time.perf_counter_ns() - started) / number
            if is_subject:
                best_s = min(best_s, ns)
            else:
                best_b = min(best_b, ns)
    return best_s, best_b


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
    ping = conn.sync.ping
    factory = redis_backend(URL, prefix=prefix)

    def limiter(name: str, limit: int) -> RateLimiter:
        config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1h")
        return RateLimiter(name, config, clock=SYSTEM_CLOCK, backend=factory)

    try:
        allowed = limiter("allowed", 10**12)
        denied = limiter("denied", 1)
        denied.acquire_permission()
        assert allowed.acquire_permission() and not denied.acquire_permission()
        add(
            "redis acquire_permission allowed",
            *_best_pair(allowed.acquire_permission, ping, number, repeat),
            TARGET_RATIO,
        )
        add(
            "redis acquire_permission denied",
            *_best_pair(denied.acquire_permission, ping, number, repeat),
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
            *_best_pair(lambda: keyed.acquire_permission("203.0.113.7"), ping, number, repeat),
            TARGET_RATIO,
        )
        trio = [limiter(f"multi{i}", 10**12) for i in range(3)]
        add(
            "redis acquire_all over 3 limits",
            *_best_pair(lambda: acquire_all(trio), ping, number, repeat),
            TARGET_RATIO,
        )
        # What @ratelimit / RateLimiterThrottle run with RateLimit headers on: the decision and the header
        # figures in the same round trip.
        add(
            "redis acquire_quota allowed (+ header figures)",
            *_best_pair(allowed.acquire_quota, ping, number, repeat),
            TARGET_RATIO,
        )
        add(
            "redis keyed acquire_quota (+ header figures)",
            *_best_pair(lambda: keyed.acquire_quota("203.0.113.7"), ping, number, repeat),
            TARGET_RATIO,
        )
        entries = [(r, None) for r in trio]
        add(
            "redis acquire_all_quotas over 3 limits (+ figures)",
            *_best_pair(lambda: acquire_all_quotas(entries), ping, number, repeat),
            TARGET_RATIO,
        )

        async def async_rows() -> None:
            aping = conn.aio().ping
            await aping()
            await allowed.aacquire_permission()
            add(
                "redis aacquire_permission (redis.asyncio)",
                *await _abest_pair(allowed.aacquire_permission, aping, number, repeat),
                TARGET_RATIO,
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
    return print_rows(run(), baseline_label="PING ns")


if __name__ == "__main__":
    raise SystemExit(main())
