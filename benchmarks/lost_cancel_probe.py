"""How often does an async Redis call return its reply to a task that was cancelled during it (a lost
cancellation)? docs/redis.md, "Cancellation during a Redis call".

Each trial starts one call of ``return 1``, lets it run 0-11 loop turns or 0-400 µs (half the trials each), and
cancels it if it has not finished; a cancelled call that then returns a result lost the cancellation. Rows:
redis-py's ``client.evalsha``, ``RedisConnection.arun_script``, and (where the checkout has it)
``RedisConnection.areply`` around ``client.evalsha``. Run it per checkout for a before/after:

``R4_REDIS_URL=redis://127.0.0.1:6394/13 python benchmarks/lost_cancel_probe.py CHECKOUT [TRIALS]`` (a private
``redis-server``; it writes no key).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import Awaitable, Callable
from typing import Any


def main() -> None:
    """Print, per row: trials, calls done before the cancel, calls cancelled, calls whose cancellation was lost."""
    sys.path.insert(0, sys.argv[1])
    from django_ratelimit_r4.backends import redis as rb

    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    url = os.environ.get("R4_REDIS_URL", "redis://127.0.0.1:6379/15")

    async def rows() -> None:
        conn = rb.connection(url, {"socket_timeout": 5.0})
        client = conn.aio()
        sha = await client.script_load("return 1")
        paths: dict[str, Callable[[], Awaitable[Any]]] = {
            "redis-py client.evalsha": lambda: client.evalsha(sha, 0),
            "RedisConnection.arun_script": lambda: conn.arun_script(sha, "return 1", 0, []),
        }
        if hasattr(conn, "areply"):

            async def wrapped() -> Any:  # the inner call made inside the task (a task cancelled before its
                return await conn.areply(client.evalsha(sha, 0))  # first step never awaits it)

            paths["areply(client.evalsha)"] = wrapped
        print(f"load {os.getloadavg()[0]:.2f}, {trials} trials per row")
        rnd = random.Random(1)
        for name, make in paths.items():
            done = cancelled = lost = 0
            for _ in range(trials):
                task = asyncio.ensure_future(make())
                if rnd.random() < 0.5:
                    for _ in range(rnd.randrange(12)):
                        await asyncio.sleep(0)
                else:
                    await asyncio.sleep(rnd.uniform(0, 0.0004))
                if task.done():
                    done += 1
                    await asyncio.wait([task])
                    continue
                task.cancel()
                await asyncio.wait([task])
                if task.cancelled() or isinstance(task.exception(), asyncio.CancelledError):
                    cancelled += 1
                elif task.exception() is None:
                    lost += 1
            print(f"{name:30} done before the cancel {done:5}  cancelled {cancelled:5}  LOST {lost:5}")
        await conn.aclose()

    asyncio.run(rows())


if __name__ == "__main__":
    main()
