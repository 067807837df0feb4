"""A/B of ``lua/sliding_window.lua``'s Redis CPU per decision: another version of the script against this checkout's.

One private ``redis-server`` (``_timing.dedicated_redis``), the same limiters built twice (one set
per script, the script swapped on ``_Sliding``), rows alternated old/new, ``usec_per_call`` of ``EVALSHA`` from
``INFO commandstats``, best of REPEAT; and the commands each script ran per decision (its ``redis.call``s,
counted in the same table: a figure a busy machine does not disturb). Layouts may differ between the
versions: each has its own keys.

Run: ``git show <commit>:django_ratelimit_r4/backends/lua/sliding_window.lua > /tmp/old.lua`` then
``python benchmarks/ab_sliding_script.py /tmp/old.lua [N] [REPEAT] [NEW.lua]`` (NEW defaults to this checkout's).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import redis
from _timing import dedicated_redis
from bench_redis_server import _server_us

from django_ratelimit_r4.backends import redis_scripted as scripted
from django_ratelimit_r4.backends import redis_sliding as rs
from django_ratelimit_r4.backends.redis import RedisStore, acquire_all_quotas
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, acquire_all
from django_ratelimit_r4.keyed import KeyedRateLimiter


def _script(path: str) -> scripted.Script:
    text = Path(path).read_text(encoding="utf-8")
    script = scripted.Script.__new__(scripted.Script)
    script.text, script.sha, script.label = text, hashlib.sha1(text.encode()).hexdigest(), "sliding-window"
    return script


def _rows(url: str, prefix: str) -> list[tuple[str, Callable[[], Any]]]:
    store = RedisStore("bench", url, {"key_prefix": prefix})
    factory = store.backend_factory("allow")
    out: list[tuple[str, Callable[[], Any]]] = []
    for limit in (100, 10_000):
        cfg = RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1ms", algorithm="sliding_window")
        allowed = RateLimiter(f"a{limit}", cfg, clock=SYSTEM_CLOCK, backend=factory)
        out += [(f"allowed, log of {limit}", allowed.acquire_permission), (f"allowed + figures, log of {limit}", allowed.acquire_quota)]
    denied = RateLimiter(
        "d", RateLimiterConfig(limit_for_period=100, limit_refresh_period="1h", algorithm="sliding_window"),
        clock=SYSTEM_CLOCK, backend=factory,
    )
    while denied.acquire_permission():
        pass

    def denied_quota() -> None:
        with contextlib.suppress(RequestNotPermitted):
            denied.acquire_quota()

    out += [("denied, log of 100", denied.acquire_permission), ("denied + figures, log of 100", denied_quota)]
    cfg = RateLimiterConfig(limit_for_period=100, limit_refresh_period="1ms", algorithm="sliding_window")
    keyed = KeyedRateLimiter(
        "k", cfg, clock=SYSTEM_CLOCK,
        store=store.keyed_store("k", cfg, clock=SYSTEM_CLOCK, max_keys=1, idle_timeout_ns=None, on_error="allow"),
    )
    out.append(("keyed allowed, log of 100", lambda: keyed.acquire_permission("203.0.113.7")))
    trio = [RateLimiter(f"m{i}", cfg, clock=SYSTEM_CLOCK, backend=factory) for i in range(3)]
    entries = [(r, None) for r in trio]
    out += [
        ("all-or-nothing over 3, log of 100", lambda: acquire_all(trio)),
        ("all-or-nothing over 3 + figures", lambda: acquire_all_quotas(entries)),
    ]
    return out


def _calls_per_run(client: redis.Redis, fn: Callable[[], Any], number: int) -> float:
    """Commands the script runs per call of ``fn`` (``redis.call``s: every command but the script's own),
    from ``INFO commandstats``: a count, so the same on a busy machine as on a quiet one."""
    client.config_resetstat()
    for _ in range(number):
        fn()
    stats = client.info("commandstats")
    outside = {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_config", "cmdstat_info", "cmdstat_script"}
    return sum(v["calls"] for k, v in stats.items() if k not in outside) / number


def main() -> None:
    old = _script(sys.argv[1])
    number = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    new = _script(sys.argv[4]) if len(sys.argv) > 4 else rs.SLIDING
    variants = {"old": old, "new": new}
    with dedicated_redis() as url:
        client = redis.Redis.from_url(url)
        rows: dict[str, list[tuple[str, Callable[[], Any]]]] = {}
        for name, script in variants.items():
            rs._Sliding._script = script
            rows[name] = _rows(url, f"ab{name}{uuid.uuid4().hex[:6]}")
            for _, fn in rows[name]:
                for _ in range(20):
                    fn()
        best: dict[tuple[str, str], float] = {}
        for _ in range(repeat):
            for i in range(len(rows["old"])):
                for name, script in variants.items():
                    rs._Sliding._script = script
                    row, fn = rows[name][i]
                    us = _server_us(client, fn, number)[0]
                    best[(name, row)] = min(best.get((name, row), float("inf")), us)
        calls: dict[tuple[str, str], float] = {}
        for name, script in variants.items():
            rs._Sliding._script = script
            for row, fn in rows[name]:
                calls[(name, row)] = _calls_per_run(client, fn, min(number, 2000))
        print(
            f"load {os.getloadavg()[0]:.2f}, {number} decisions per row, best of {repeat} "
            "(µs of script time; commands the script ran per decision)"
        )
        for row, _ in rows["old"]:
            print(
                f"{row:36} old {best[('old', row)]:6.2f}  new {best[('new', row)]:6.2f}"
                f"   calls old {calls[('old', row)]:5.2f}  new {calls[('new', row)]:5.2f}"
            )


if __name__ == "__main__":
    main()
