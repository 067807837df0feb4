"""Async Redis decisions of one checkout against an async bare ``EVALSHA`` (issues 9 and 13: at most 1.10x).

For each algorithm (``cycle``, ``gcra``, ``sliding_window`` 100 per 1 ms as in ``bench_redis_algorithms``):
``aacquire_permission`` and ``aacquire_quota`` (the decision with the RateLimit header figures) against an
async bare ``EVALSHA`` of ``return 1`` on the same ``redis.asyncio`` client, alternated call by call, medians.
Run it once per checkout, the checkouts alternated, for a before/after:

``R4_REDIS_URL=redis://127.0.0.1:6394/0 python benchmarks/ab_redis_async.py CHECKOUT [N]`` (a private
``redis-server`` for clean figures; keys under a random prefix, deleted afterwards).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any


def main() -> None:
    """Print one row per algorithm and call: the decision's median, the bare ``EVALSHA``'s, their ratio."""
    sys.path.insert(0, sys.argv[1])
    import redis
    from _timing import abare_evalsha  # benchmarks/ is on sys.path when run as a script

    from django_ratelimit_r4.backends.redis import connection, redis_backend
    from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
    from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig

    url = os.environ.get("R4_REDIS_URL", "redis://127.0.0.1:6379/15")
    number = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    prefix = f"r4ab:{uuid.uuid4().hex[:6]}"
    factory = redis_backend(url, prefix=prefix)

    def limiter(name: str, algorithm: str) -> RateLimiter:
        limit, period = (100, "1ms") if algorithm == "sliding_window" else (10**12, "1h")
        config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm)
        return RateLimiter(name + algorithm, config, clock=SYSTEM_CLOCK, backend=factory)

    async def rows() -> None:
        bare = await abare_evalsha(connection(url).aio())

        print(f"load {os.getloadavg()[0]:.2f}, {number} calls per row, medians")
        for algorithm in ("cycle", "gcra", "sliding_window"):
            calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
                ("aacquire_permission", limiter("a", algorithm).aacquire_permission),
                ("aacquire_quota", limiter("q", algorithm).aacquire_quota),
            ]
            for name, call in calls:
                await call()
                await bare()
                subject: list[int] = []
                baseline: list[int] = []
                clock = time.perf_counter_ns
                for _ in range(number):
                    started = clock()
                    await bare()
                    between = clock()
                    await call()
                    subject.append(clock() - between)
                    baseline.append(between - started)
                ours, base = statistics.median(subject), statistics.median(baseline)
                print(f"{algorithm + ' ' + name:<36} {ours / 1000:9.1f} µs {base / 1000:9.1f} µs {ours / base:6.3f}")
        plain = redis.Redis.from_url(url)
        keys = list(plain.scan_iter(match=prefix + ":*"))
        if keys:
            plain.delete(*keys)
        plain.close()

    asyncio.run(rows())


if __name__ == "__main__":
    main()
