"""Where an all-or-nothing decision over 3 limits spends its time: this thread's CPU per decision (the client's
work) and the wall median, for one limit and for three, per algorithm, next to one bare ``EVALSHA``.

The difference of the wall medians that the client CPU does not explain is the server's (three limits' work
in one script). Run: ``R4_REDIS_URL=redis://127.0.0.1:6394/0 python benchmarks/redis_client_cpu.py [CHECKOUT] [N]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def main() -> None:
    """Print client CPU and wall median per decision for each row."""
    sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parent.parent))
    import redis
    from _timing import bare_evalsha  # benchmarks/ is on sys.path when run as a script

    from django_ratelimit_r4.backends.redis import connection, redis_backend
    from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
    from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, acquire_all

    url = os.environ.get("R4_REDIS_URL", "redis://127.0.0.1:6379/15")
    number = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    prefix = f"r4cc:{uuid.uuid4().hex[:6]}"
    factory = redis_backend(url, prefix=prefix)

    def limiter(name: str, algorithm: str) -> RateLimiter:
        limit, period = (100, "1ms") if algorithm == "sliding_window" else (10**12, "1h")
        config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm)
        return RateLimiter(name, config, clock=SYSTEM_CLOCK, backend=factory)

    rows: list[tuple[str, Callable[[], Any]]] = [("bare EVALSHA", bare_evalsha(connection(url).sync))]
    for algorithm in ("cycle", "gcra", "sliding_window"):
        one = limiter("one-" + algorithm, algorithm)
        trio = [limiter(f"trio{i}-{algorithm}", algorithm) for i in range(3)]
        rows += [
            (f"{algorithm}, one limit", one.acquire_permission),
            (f"{algorithm}, all-or-nothing over 3", lambda trio=trio: acquire_all(trio)),
        ]
    print(f"load {os.getloadavg()[0]:.2f}, {number} calls per row")
    for name, call in rows:
        for _ in range(50):
            call()
        walls: list[int] = []
        cpu_started = time.thread_time_ns()
        for _ in range(number):
            started = time.perf_counter_ns()
            call()
            walls.append(time.perf_counter_ns() - started)
        cpu = (time.thread_time_ns() - cpu_started) / number
        print(f"{name:36} client CPU {cpu / 1000:8.1f} µs   wall median {statistics.median(walls) / 1000:8.1f} µs")
    plain = redis.Redis.from_url(url)
    keys = list(plain.scan_iter(match=prefix + ":*"))
    if keys:
        plain.delete(*keys)
    plain.close()


if __name__ == "__main__":
    main()
