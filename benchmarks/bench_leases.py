"""Permit leases (``"lease": N``): Redis commands and decision cost per 1000 decisions, and the under-use.

Starts its own ``redis-server`` on a free loopback port (nothing else runs commands on it), so ``INFO
commandstats`` counts this benchmark's commands only (no MONITOR). Rows:

* per 1000 allowed decisions of one process on an unkeyed limiter that never runs out: round trips
  (``EVALSHA`` + ``EVAL`` calls), Redis commands (those plus the ones run inside the scripts: ``TIME``,
  ``GET``, ``SET``) and the decision's cost (µs per 1000 decisions, best of REPEAT),
  without a lease and with leases of 5, 20 and 100;
* the same near exhaustion (the shrinking batch: ``min(lease, left // 2 + 1)``): a 1000-per-10-min limit
  spent to the last permit, commands per 1000 decisions;
* 4 processes on one limit with a clock in shared memory (every cycle boundary exact), 200 cycles of a load
  1.5x the limit: the largest under-use seen in a cycle with a rejection (permits the cluster could still
  have admitted, held in other processes' leases), against the documented bound (processes - 1) * (lease -
  1), and the most admitted in a cycle (never above the limit).

Run: ``python benchmarks/bench_leases.py`` (needs ``redis-server``); ``benchmarks/run.py leases`` prints the
cost rows with the no-lease decision as the baseline.
"""

from __future__ import annotations

import multiprocessing
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _timing import dedicated_redis

from django_ratelimit_r4.backends import redis as rb
from django_ratelimit_r4.backends import redis_lease as rl
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK

__all__ = ["run", "under_use"]

S = 1_000_000_000
N = 1000
REPEAT = 5
LEASES = (None, 5, 20, 100)


def _commands(client: redis.Redis) -> tuple[int, int]:
    """(round trips: EVALSHA + EVAL calls, every command counted including those run inside scripts)."""
    stats = client.info("commandstats")
    trips = sum(int(stats.get(k, {}).get("calls", 0)) for k in ("cmdstat_evalsha", "cmdstat_eval"))
    return trips, sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def _backend(url: str, lease: int | None, limit: int, prefix: str) -> Any:
    name = uuid.uuid4().hex[:8]
    if lease is None:
        return rb.RedisBackend(name, limit, 600 * S, SYSTEM_CLOCK, url=url, prefix=prefix)
    return rl.RedisLeaseBackend(name, limit, 600 * S, SYSTEM_CLOCK, lease=lease, url=url, prefix=prefix)


def _per_1000(url: str, lease: int | None, limit: int) -> tuple[float, float, float]:
    """(round trips, commands, µs) per 1000 decisions, best of REPEAT fresh limiters."""
    client = redis.Redis.from_url(url)
    best_trips = best_cmds = best_us = float("inf")
    for _ in range(REPEAT):
        b = _backend(url, lease, limit, "bench")
        b.acquire(1, 0)  # connection opened, script loaded, server time learned
        before = _commands(client)
        start = time.perf_counter_ns()
        for _ in range(N):
            b.acquire(1, 0)
        elapsed = time.perf_counter_ns() - start
        after = _commands(client)
        best_trips = min(best_trips, (after[0] - before[0]) * 1000 / N)
        best_cmds = min(best_cmds, (after[1] - before[1]) * 1000 / N)
        best_us = min(best_us, elapsed / 1000 * 1000 / N)
    client.close()
    return best_trips, best_cmds, best_us


class _SharedClock:
    def __init__(self, value: Any) -> None:
        self.value = value

    def now_ns(self) -> int:
        return int(self.value.value)

    def sleep(self, seconds: float) -> None:  # pragma: no cover - never waits
        raise AssertionError

    async def asleep(self, seconds: float) -> None:  # pragma: no cover
        raise AssertionError


def _worker(url: str, prefix: str, limit: int, lease: int, value: Any, steps: int, attempts: int,
            barrier: Any, out: Any, seed: int) -> None:
    b = rl.RedisLeaseBackend("u", limit, 10 * S, _SharedClock(value), lease=lease, url=url, prefix=prefix)
    barrier.wait(60)
    rng = random.Random(seed)
    rows = []
    for _ in range(steps):
        barrier.wait(60)
        granted = rejected = 0
        for _ in range(rng.randint(0, attempts)):
            if b.acquire(1, 0) >= 0:
                granted += 1
            else:
                rejected += 1
        rows.append((granted, rejected))
        barrier.wait(60)
    out.put(rows)


def under_use(url: str, limit: int = 100, lease: int = 20, cycles: int = 200, processes: int = 4) -> dict[str, int]:
    """The 4-process run: ``{"max_under_use", "bound", "max_admitted", "limit", "cycles_with_rejections"}``."""
    per_cycle = 4
    ctx = multiprocessing.get_context("fork")
    value = ctx.Value("q", 10**12, lock=False)
    barrier, out = ctx.Barrier(processes + 1), ctx.Queue()
    steps = per_cycle * cycles
    attempts = 2 * int(1.5 * limit / processes / per_cycle)  # uniform 0..attempts: 1.5x the limit on average
    prefix = f"bench-lease-{uuid.uuid4().hex[:6]}"
    procs = [
        ctx.Process(target=_worker, args=(url, prefix, limit, lease, value, steps, attempts, barrier, out, i))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    barrier.wait(60)
    for step in range(steps):
        value.value = 10**12 + step * (10 * S // per_cycle)
        barrier.wait(60)
        barrier.wait(60)
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    admitted, rejected = [0] * cycles, [0] * cycles
    for rows in results:
        for step, (g, r) in enumerate(rows):
            admitted[step // per_cycle] += g
            rejected[step // per_cycle] += r
    under = [limit - a for a, r in zip(admitted, rejected, strict=True) if r]
    return {
        "max_under_use": max(under, default=0),
        "bound": (processes - 1) * (lease - 1),
        "max_admitted": max(admitted),
        "limit": limit,
        "cycles_with_rejections": len(under),
    }


def run() -> list[dict[str, Any]]:
    """Rows for benchmarks/run.py: µs per 1000 allowed decisions, the no-lease decision as the baseline."""
    rows: list[dict[str, Any]] = []
    with dedicated_redis() as url:
        _, _, base_us = _per_1000(url, None, 10**9)
        for lease in LEASES[1:]:
            trips, _, us = _per_1000(url, lease, 10**9)
            rows.append({
                "name": f"leases: lease {lease}, per 1000 decisions ({trips:.0f} round trips)",
                "ns_per_op": us * 1000 / N,
                "baseline_ns": base_us * 1000 / N,
                "ratio": us / base_us,
                "target": "< 1",
            })
    return rows


def main() -> int:
    with dedicated_redis() as url:
        print("per 1000 allowed decisions, one process, unkeyed (budget never runs out):")
        print(f"{'lease':>8} {'round trips':>12} {'commands':>9} {'µs / 1000':>10}")
        for lease in LEASES:
            trips, cmds, us = _per_1000(url, lease, 10**9)
            print(f"{lease or '-':>8} {trips:>12.0f} {cmds:>9.0f} {us:>10.0f}")
        print("near exhaustion: a limit of 1000 spent to the last permit (then 1 rejection):")
        client = redis.Redis.from_url(url)
        for lease in LEASES:
            b = _backend(url, lease, 1000, "bench-x")
            before = _commands(client)
            granted = sum(b.acquire(1, 0) >= 0 for _ in range(1001))
            after = _commands(client)
            print(f"{lease or '-':>8} {after[0] - before[0]:>12} {after[1] - before[1]:>9}  "
                  f"for {granted} granted + 1 rejected")
        client.close()
        for lease in (5, 20):
            result = under_use(url, lease=lease)
            print(f"4 processes, limit {result['limit']}, lease {lease}, 200 cycles at 1.5x the limit: "
                  f"largest under-use {result['max_under_use']} (bound {result['bound']}), most admitted in a "
                  f"cycle {result['max_admitted']}, {result['cycles_with_rejections']} cycles with rejections")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
