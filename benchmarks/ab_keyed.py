"""Compare two checkouts on the keyed rate limiter's decisions, interleaved, in thread CPU time.

    python benchmarks/ab_keyed.py /path/to/before /path/to/after [alternations]

Not collected by ``run.py`` (no ``bench_`` prefix). :mod:`ab_paths`'s driver with these cases: each alternation
runs one process per checkout (before, then after) that times every case in-process; the best of all runs
counts. Redis: ``R4_AB_REDIS_URL`` (default ``redis://127.0.0.1:6379/15``). The memory cases are
the keyed ``@ratelimit`` fast path (``acquire_quota``) and the plain decisions, granted and denied; the Redis cases
(skipped when no Redis answers) are one keyed decision each, a round trip, timed in this thread's CPU time (the
client's share: what the keyed limiter's code costs; the server's time is not in it). Used for issue 9's
"one KeyedRateLimiter for every store" before/after.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab_paths

CASES = r'''
import os, sys, time, timeit, uuid
root, url = sys.argv[1], os.environ.get("R4_AB_REDIS_URL", "redis://127.0.0.1:6379/15")
sys.path.insert(0, root)
import django_ratelimit_r4
assert django_ratelimit_r4.__file__.startswith(root), django_ratelimit_r4.__file__
from django_ratelimit_r4.core.ratelimiter import RateLimiterConfig
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.keyed import KeyedRateLimiter

big = RateLimiterConfig(limit_for_period=10**12, limit_refresh_period="1h")
small = RateLimiterConfig(limit_for_period=1, limit_refresh_period="1h")
gcra = RateLimiterConfig(limit_for_period=10**9, limit_refresh_period="1s", algorithm="gcra")
KEY = "203.0.113.7"
allowed = KeyedRateLimiter("a", big)
denied = KeyedRateLimiter("d", small)
denied.acquire_permission(KEY)
smooth = KeyedRateLimiter("g", gcra)
quota, permission, deny = allowed.acquire_quota, allowed.acquire_permission, denied.acquire_permission
smooth_quota = smooth.acquire_quota
def raise_denied():
    try:
        denied.acquire_or_raise(KEY)
    except RequestNotPermitted:
        pass
cases = {
    "memory acquire_quota, hot key (keyed @ratelimit path)": lambda: quota(KEY),
    "memory acquire_permission allowed": lambda: permission(KEY),
    "memory acquire_permission denied": lambda: deny(KEY),
    "memory acquire_or_raise denied": raise_denied,
    "memory gcra acquire_quota": lambda: smooth_quota(KEY),
}
try:
    import redis
    redis.Redis.from_url(url, socket_timeout=0.5).ping()
except Exception:
    redis = None
if redis is not None:
    from django_ratelimit_r4.backends.redis import RedisKeyedRateLimiter
    prefix = "r4ab" + uuid.uuid4().hex[:8]
    r_allowed = RedisKeyedRateLimiter("ra", big, url=url, prefix=prefix)
    r_denied = RedisKeyedRateLimiter("rd", small, url=url, prefix=prefix)
    r_denied.acquire_permission(KEY)
    r_quota, r_perm, r_deny = r_allowed.acquire_quota, r_allowed.acquire_permission, r_denied.acquire_permission
    r_quota(KEY)
    cases["redis acquire_quota allowed (client CPU)"] = lambda: r_quota(KEY)
    cases["redis acquire_permission allowed (client CPU)"] = lambda: r_perm(KEY)
    cases["redis acquire_permission denied (client CPU)"] = lambda: r_deny(KEY)
best = dict.fromkeys(cases, float("inf"))
for _ in range(3):
    for name, fn in cases.items():
        n = 300 if name.startswith("redis") else 20000
        best[name] = min(best[name], timeit.Timer(fn, timer=time.thread_time).timeit(n) / n * 1e9)
if redis is not None:
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(match=prefix + ":*", count=1000):
        client.delete(key)
for name, ns in best.items():
    print(f"{name}|{ns:.0f}")
'''


if __name__ == "__main__":
    ab_paths.CASES = CASES
    os.environ.setdefault("R4_AB_REDIS_URL", "redis://127.0.0.1:6379/15")
    raise SystemExit(ab_paths.main(sys.argv[1:]))
