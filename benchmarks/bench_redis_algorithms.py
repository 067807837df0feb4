"""GCRA and the sliding window on Redis against one bare round trip (issue 13), measured in one run.

Target: a ``gcra`` or ``sliding_window`` decision on Redis is ONE round trip (an ``EVALSHA`` of its own script),
so it should cost at most 1.10x one bare ``EVALSHA`` of a trivial script (``return 1``) on the same client
(``_timing.bare_evalsha``). Rows: unkeyed allowed and denied, keyed,
the decision with the RateLimit header figures (what ``@ratelimit`` runs), an all-or-nothing decision over 3
limits, and the async path against an async bare ``EVALSHA``; the cycle limiter's row for context, and an
all-or-nothing decision over the three algorithms (one run of the mixed script), granted and refused, beside the
old split of the same decisions (one call per algorithm pipelined, a give-back round trip when refused). Informational rows
put the peers' Redis limiters beside them (limits' moving window and sliding-window counter, pyrate-limiter's
GCRA and sliding log), each against the same bare ``EVALSHA``, when they are installed (the ``bench`` extra).

Run: ``python benchmarks/bench_redis_algorithms.py`` (needs Redis at ``R4_REDIS_URL``, default
redis://127.0.0.1:6379/15; keys go under a random ``r4bench:`` prefix and are deleted afterwards). Subject and
baseline alternate call by call so a noisy neighbour hurts both alike; each figure is the median call.
``R4_BENCH_MIXED_ONLY=1``: only the cycle row and the all-or-nothing rows over the three algorithms.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

try:  # python -m benchmarks.bench_redis_algorithms
    from ._timing import abare_evalsha, bare_evalsha, print_rows
    from ._timing import median_pair as _best_pair
    from .bench_redis import _abest_pair
except ImportError:  # benchmarks/run.py, or run as a script
    from _timing import abare_evalsha, bare_evalsha, print_rows  # type: ignore[no-redef]
    from _timing import median_pair as _best_pair  # type: ignore[no-redef]
    from bench_redis import _abest_pair  # type: ignore[no-redef]

from django_ratelimit_r4.backends.redis import (
    RedisKeyedRateLimiter,
    aacquire_all_quotas,
    acquire_all_quotas,
    connection,
    redis_backend,
)
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, aacquire_all, acquire_all

__all__ = ["run"]

TARGET_RATIO = 1.10
NUMBER = 2_000
REPEAT = 7
URL = os.environ.get("R4_REDIS_URL", "redis://127.0.0.1:6379/15")
IP = "203.0.113.7"


def _peers(url: str, prefix: str) -> list[tuple[str, Callable[[], Any]]]:
    """The peers' Redis limiters, each allowed (limits far above what the loop reaches)."""
    rows: list[tuple[str, Callable[[], Any]]] = []
    try:
        import limits
        import limits.storage
        import limits.strategies
    except ImportError:
        pass
    else:
        storage = limits.storage.RedisStorage(url)
        moving = limits.strategies.MovingWindowRateLimiter(storage)
        counter = limits.strategies.SlidingWindowCounterRateLimiter(storage)
        thousand = limits.parse("1000/hour")
        big = limits.parse("1000000000/hour")
        for _ in range(1000):  # a full moving window: its script scans 1000 entries per hit
            moving.hit(thousand, prefix, "moving-full")
        rows += [
            ("info: limits MovingWindow.hit (RedisStorage)", lambda: moving.hit(big, prefix, "moving")),
            ("info: limits MovingWindow.hit denied, 1000 in window", lambda: moving.hit(thousand, prefix, "moving-full")),
            ("info: limits SlidingWindowCounter.hit (RedisStorage)", lambda: counter.hit(big, prefix, "counter")),
        ]
    try:
        from pyrate_limiter import (
            GCRA,
            Limiter,
            Rate,
            RedisBucket,
            RedisStateStore,
            SlidingWindowLog,
            StateBucket,
        )
    except ImportError:
        return rows
    client = redis.Redis.from_url(url)
    rate = [Rate(10**9, 3_600_000)]
    gcra = Limiter(StateBucket(rate, algorithm=GCRA(), store=RedisStateStore(client, prefix + ":pyrate-gcra")))
    holder: dict[str, Any] = {}

    def new_log() -> None:  # RedisBucket.init loads its script once; a SCRIPT FLUSH elsewhere drops it
        holder["log"] = Limiter(
            RedisBucket.init([Rate(10**6, 3_600_000)], client, prefix + ":pyrate-log", algorithm=SlidingWindowLog())
        )

    def log() -> Any:
        try:
            return holder["log"].try_acquire(IP, blocking=False)
        except redis.exceptions.NoScriptError:
            new_log()
            return holder["log"].try_acquire(IP, blocking=False)

    new_log()
    rows += [
        ("info: pyrate-limiter GCRA try_acquire (RedisStateStore)", lambda: gcra.try_acquire(IP, blocking=False)),
        ("info: pyrate-limiter SlidingWindowLog try_acquire (RedisBucket)", log),
    ]
    return rows


def _split(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` with the all-or-nothing decision over several algorithms split as before the mixed script."""
    from django_ratelimit_r4.backends import redis as rb

    def call() -> Any:
        saved = rb._one_slot
        rb._one_slot = lambda conn, members, groups: False  # type: ignore[assignment]
        try:
            return fn()
        finally:
            rb._one_slot = saved  # type: ignore[assignment]

    return call


def run(number: int = NUMBER, repeat: int = REPEAT) -> list[dict[str, Any]]:
    """Measure every row; each is ``{name, ns_per_op, baseline_ns, ratio, target}`` (target None = info)."""
    prefix = f"r4bench:{uuid.uuid4().hex[:8]}"
    rows: list[dict[str, Any]] = []

    def add(name: str, ns: float, base: float, target: float | None) -> None:
        rows.append(
            {"name": name, "ns_per_op": round(ns, 1), "baseline_ns": round(base, 1), "ratio": round(ns / base, 3), "target": target}
        )

    conn = connection(URL)
    bare = bare_evalsha(conn.sync)
    factory = redis_backend(URL, prefix=prefix)

    def config(algorithm: str, limit: int) -> RateLimiterConfig:
        return RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1h", algorithm=algorithm)

    def limiter(name: str, algorithm: str, limit: int) -> RateLimiter:
        return RateLimiter(name, config(algorithm, limit), clock=SYSTEM_CLOCK, backend=factory)

    # Allowed: the GCRA limit is never reached; the sliding window's log of 100 is reused every 1 ms period.
    allowed_limits = {"cycle": (10**12, "1h"), "gcra": (10**12, "1h"), "sliding_window": (100, "1ms")}
    def rows_of(algorithm: str) -> None:
        limit, period = allowed_limits[algorithm]
        cfg = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm)
        allowed = RateLimiter(f"{algorithm}-allowed", cfg, clock=SYSTEM_CLOCK, backend=factory)
        denied = limiter(f"{algorithm}-denied", algorithm, 1)
        denied.acquire_permission()
        assert allowed.acquire_permission() and not denied.acquire_permission()
        keyed = RedisKeyedRateLimiter(f"{algorithm}-keyed", cfg, url=URL, prefix=prefix)
        trio = [RateLimiter(f"{algorithm}-m{i}", cfg, clock=SYSTEM_CLOCK, backend=factory) for i in range(3)]
        entries = [(r, None) for r in trio]
        cases: list[tuple[str, Callable[[], Any], float | None]] = [
            ("acquire_permission allowed", allowed.acquire_permission, TARGET_RATIO),
            ("acquire_permission denied", denied.acquire_permission, TARGET_RATIO),
            ("keyed acquire_permission", lambda: keyed.acquire_permission(IP), TARGET_RATIO),
            ("acquire_quota (+ header figures)", allowed.acquire_quota, TARGET_RATIO),
            ("acquire_all over 3 limits", lambda: acquire_all(trio), TARGET_RATIO),
            ("acquire_all_quotas over 3 (+ figures)", lambda: acquire_all_quotas(entries), None),
        ]
        for name, fn, target in cases:
            label = f"redis {algorithm} {name}" if target else f"info: redis {algorithm} {name}"
            add(label, *_best_pair(fn, bare, number, repeat), target)

        async def async_row() -> None:
            abare = await abare_evalsha(conn.aio())
            await abare()
            await allowed.aacquire_permission()
            add(
                f"redis {algorithm} aacquire_permission (redis.asyncio)",
                *await _abest_pair(allowed.aacquire_permission, abare, number, repeat),
                TARGET_RATIO,
            )
            add(
                f"info: redis {algorithm} aacquire_all over 3 limits (redis.asyncio)",
                *await _abest_pair(lambda: aacquire_all(trio), abare, number, repeat),
                None,
            )
            add(
                f"info: redis {algorithm} aacquire_all_quotas over 3 (+ figures, redis.asyncio)",
                *await _abest_pair(lambda: aacquire_all_quotas(entries), abare, number, repeat),
                None,
            )

        asyncio.run(async_row())

    try:
        for algorithm in ("gcra", "sliding_window"):
            if not os.environ.get("R4_BENCH_MIXED_ONLY"):
                rows_of(algorithm)
        cycle = limiter("cycle-allowed", "cycle", 10**12)
        add("info: redis cycle acquire_permission allowed", *_best_pair(cycle.acquire_permission, bare, number, repeat), None)
        # All-or-nothing over three algorithms in one slot: ONE run of the mixed script (redis_mixed.py), whether
        # granted or refused (the give-backs run inside it). For comparison, the same decisions through the old
        # split (one call per algorithm pipelined, and a second round trip for the give-back when refused): what
        # cross-slot decisions on a cluster still do.
        gcra_big, sliding_big = (
            RateLimiter(f"mixed-{a}", RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period,
                                                         algorithm=a), clock=SYSTEM_CLOCK, backend=factory)
            for a, (limit, period) in (("gcra", allowed_limits["gcra"]), ("sliding_window", allowed_limits["sliding_window"]))
        )
        mixed = [cycle, gcra_big, sliding_big]
        spent = limiter("mixed-cycle-spent", "cycle", 1)
        spent.acquire_permission()
        refused = [spent, gcra_big, sliding_big]
        assert acquire_all(mixed) is None and acquire_all(refused) is not None
        mixed_rows: list[tuple[str, Callable[[], Any]]] = [
            ("redis acquire_all over cycle + gcra + sliding_window (one script)", lambda: acquire_all(mixed)),
            ("redis acquire_all over the three, refused by cycle (one script, give-backs inside)",
             lambda: acquire_all(refused)),
            ("redis acquire_all_quotas over the three (+ figures, one script)",
             lambda: acquire_all_quotas([(r, None) for r in mixed])),
            ("old split: acquire_all over the three (3 calls pipelined)", _split(lambda: acquire_all(mixed))),
            ("old split: refused by cycle (+ give-back round trip)", _split(lambda: acquire_all(refused))),
        ]
        for name, fn in mixed_rows:
            add(f"info: {name}", *_best_pair(fn, bare, number, repeat), None)

        async def mixed_async() -> None:
            abare = await abare_evalsha(conn.aio())
            await abare()
            await aacquire_all(mixed)
            add(
                "info: redis aacquire_all over cycle + gcra + sliding_window (one script, redis.asyncio)",
                *await _abest_pair(lambda: aacquire_all(mixed), abare, number, repeat),
                None,
            )

        asyncio.run(mixed_async())
        if os.environ.get("R4_BENCH_MIXED_ONLY"):
            return rows
        for name, fn in _peers(URL, prefix):
            fn()
            add(name, *_best_pair(fn, bare, number, repeat), None)
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
