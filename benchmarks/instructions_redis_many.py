"""Client instructions per all-or-nothing decision on Redis, one limit against three, counted by valgrind.

    R4_REDIS_URL=redis://127.0.0.1:6379/15 python benchmarks/instructions_redis_many.py [N] [ROW ...]

Not collected by ``run.py`` (no ``bench_`` prefix). Each row runs in two processes under ``valgrind
--tool=cachegrind --cache-sim=no`` (``PYTHONHASHSEED=0``): one makes the row's warm-up calls and then ``N`` more
(default 300), the other only the warm-up; the difference over ``N`` is the client's user-space instructions
per decision (packing, settling, the limiter's bookkeeping; the wait for Redis and the server's work are not in
it): a count, not a time, so a busy machine does not move it. Rows: ``bare`` (one bare ``EVALSHA`` of ``return
1`` through redis-py, the round trip every ratio is taken against), ``<algorithm>-one`` (``acquire_permission``
of one limit), ``<algorithm>-three`` (``acquire_all`` over three), ``<algorithm>-three-quotas``
(``acquire_all_quotas`` over three), the same ``a...`` on ``redis.asyncio`` (``aacquire_all`` against an async
bare ``EVALSHA``), and ``mixed`` / ``mixed-quotas`` (a cycle, a GCRA and a sliding-window limit in one run of
the mixed script); algorithms ``cycle``, ``gcra``, ``sliding``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import asyncio, sys, os, uuid
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from _timing import abare_evalsha, bare_evalsha
from django_ratelimit_r4.backends.redis import acquire_all_quotas, connection, redis_backend
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, aacquire_all, acquire_all
url = os.environ.get("R4_REDIS_URL", "redis://127.0.0.1:6379/15")
row, number = sys.argv[2], int(sys.argv[3])
factory = redis_backend(url, prefix="r4icount")
ALGORITHMS = {"cycle": "cycle", "gcra": "gcra", "sliding": "sliding_window"}

def limiter(name, algorithm):
    limit, period = (100, "1ms") if algorithm == "sliding_window" else (10**12, "1h")
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm)
    return RateLimiter(name, config, clock=SYSTEM_CLOCK, backend=factory)

name = row[1:] if row.startswith("a") and row not in ("abare",) and row[1:].split("-")[0] in ALGORITHMS else row
asynchronous = name != row or row == "abare"
if row in ("bare", "abare"):
    call = None
elif name.startswith("mixed"):
    trio = [limiter("icount-mixed-" + a, a) for a in ("cycle", "gcra", "sliding_window")]
else:
    algorithm = ALGORITHMS[name.split("-")[0]]
    trio = [limiter(f"icount-{name}-{i}", algorithm) for i in range(3)]
if row == "bare":
    call = bare_evalsha(connection(url).sync)
elif row == "abare":
    pass
elif name.endswith("-one"):
    call = trio[0].acquire_permission if not asynchronous else trio[0].aacquire_permission
elif name.endswith("quotas"):
    entries = [(r, None) for r in trio]
    call = lambda: acquire_all_quotas(entries)
else:
    call = (lambda: acquire_all(trio)) if not asynchronous else (lambda: aacquire_all(trio))

if asynchronous:
    async def main():
        fn = (await abare_evalsha(connection(url).aio())) if row == "abare" else call
        for _ in range(50):
            await fn()
        for _ in range(number):
            await fn()
    asyncio.run(main())
else:
    for _ in range(50):
        call()
    for _ in range(number):
        call()
print("ok")
"""

DEFAULT_ROWS = [
    "bare",
    "cycle-one",
    "cycle-three",
    "cycle-three-quotas",
    "gcra-one",
    "gcra-three",
    "gcra-three-quotas",
    "sliding-one",
    "sliding-three",
    "sliding-three-quotas",
    "mixed",
    "mixed-quotas",
    "abare",
    "acycle-three",
    "agcra-three",
    "asliding-three",
]


def instructions(row: str, number: int) -> int:
    """Instructions of a whole child process making the warm-up and ``number`` calls of ``row``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(
            ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
             sys.executable, "-c", CHILD, str(HERE), row, str(number)],
            capture_output=True, text=True, env=env, check=True,
        )
        match = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
        assert match is not None, done.stderr[-2000:]
        return int(match.group(1).replace(",", ""))


def main(argv: list[str]) -> int:
    number = int(argv[0]) if argv and argv[0].isdigit() else 300
    rows = [a for a in argv if not a.isdigit()] or DEFAULT_ROWS
    print(f"load {os.getloadavg()[0]:.2f}; {number} calls per row")
    print(f"{'row':24} {'instructions/decision':>22}")
    for row in rows:
        full = instructions(row, number)
        base = instructions(row, 0)
        print(f"{row:24} {(full - base) / number:22,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
