"""What an async view's Redis decision costs under WSGI, where Django runs it in a loop of its own per request.

Starts its own ``redis-server`` (nothing else talks to it) and times, per call, best of ROUNDS x N:

- a sync decision (the baseline a sync view pays);
- ``async_to_sync`` of an empty coroutine (what any async view under WSGI pays: a thread and a loop per call);
- ``async_to_sync`` of an async decision, as this checkout decides it (in the request's thread, on the sync
  pool: ``call_thread_submit``);
- the same, forced through the loop's own asyncio client (the way before 2026-12-06: a client, a connection
  and its handshake per request).

Each row also shows the connections the server accepted per call (``INFO stats``) and the sockets left in
``TIME_WAIT`` towards it afterwards (``ss``, Linux). Run: ``python benchmarks/redis_wsgi_async.py [N] [ROUNDS]``
(needs ``redis-server`` and the ``redis`` extra).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _timing import dedicated_redis  # benchmarks/ is sys.path[0] when run as a script

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _time_wait(port: int) -> int | None:
    if shutil.which("ss") is None:
        return None
    out = subprocess.run(["ss", "-tan", "state", "time-wait", "dport", "=", f":{port}"],
                         capture_output=True, text=True, check=False).stdout
    return max(len(out.splitlines()) - 1, 0)


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 1000
    rounds = int(argv[1]) if len(argv) > 1 else 3
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import asyncio

    import redis
    from asgiref.sync import async_to_sync

    import django_ratelimit_r4.backends.redis as rb
    from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
    from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig

    with tempfile.TemporaryDirectory(prefix="r4-wsgi-") as tmp, dedicated_redis(tmp) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        raw = redis.Redis.from_url(url)
        config = RateLimiterConfig(limit_for_period=10**9, limit_refresh_period="1h")
        limiter = RateLimiter("wsgi", config, clock=SYSTEM_CLOCK, backend=rb.redis_backend(url, prefix="bench"))
        call_loops = rb._CALL_LOOPS

        async def nothing() -> bool:
            return True

        async def decide() -> bool:
            return await limiter.aacquire_permission()

        def asyncio_client() -> bool:
            rb._CALL_LOOPS = {}  # as before: the call loop's own client
            try:
                return bool(async_to_sync(decide)())
            finally:
                rb._CALL_LOOPS = call_loops

        rows: list[tuple[str, Callable[[], Any]]] = [
            ("sync decision", limiter.acquire_permission),
            ("async_to_sync(empty coroutine)", async_to_sync(nothing)),
            ("async_to_sync(async decision)", async_to_sync(decide)),
            ("  the same on the loop's own client (before)", asyncio_client),
        ]
        print(f"{'per call':46} {'µs':>9} {'connections':>12} {'TIME_WAIT after':>16}")
        for label, fn in rows:
            for _ in range(50):
                fn()
            best = float("inf")
            accepted = int(raw.info("stats")["total_connections_received"])
            for _ in range(rounds):
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                best = min(best, (time.perf_counter() - start) / n * 1e6)
            per_call = (int(raw.info("stats")["total_connections_received"]) - accepted) / (n * rounds)
            waiting = _time_wait(port)
            print(f"{label:46} {best:9.1f} {per_call:12.3f} {'n/a' if waiting is None else waiting:>16}")
        asyncio.run(asyncio.sleep(0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
