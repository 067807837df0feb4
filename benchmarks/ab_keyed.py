"""Compare two checkouts on the keyed rate limiter's decisions, interleaved, in thread CPU time.

    python benchmarks/ab_keyed.py /path/to/before /path/to/after [alternations] [redis://127.0.0.1:6379/15]

Not collected by ``run.py`` (no ``bench_`` prefix). Like :mod:`ab_paths`: each alternation runs one process per
checkout (before, then after) that times every case in-process; the best of all runs counts. The memory cases are
the keyed ``@ratelimit`` fast path (``acquire_quota``) and the plain decisions, granted and denied; the Redis cases
(skipped when no Redis answers) are one keyed decision each, a round trip, timed in this thread's CPU time (the
client's share: what the keyed limiter's code costs; the server's time is not in it). Used for issue 9's
"one KeyedRateLimiter for every store" before/after.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CASES = r'''
import sys, time, timeit, uuid
root, url = sys.argv[1], sys.argv[2]
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


def main(argv: list[str]) -> int:
    before, after = (str(Path(p).resolve()) for p in argv[:2])
    alternations = int(argv[2]) if len(argv) > 2 else 6
    url = argv[3] if len(argv) > 3 else "redis://127.0.0.1:6379/15"
    best: dict[tuple[str, str], float] = {}
    order: list[str] = []
    for _ in range(alternations):
        for side, root in (("before", before), ("after", after)):
            out = subprocess.run(
                [sys.executable, "-c", CASES, root, url], capture_output=True, text=True, check=True
            ).stdout
            for line in out.splitlines():
                name, ns = line.rsplit("|", 1)
                if name not in order:
                    order.append(name)
                best[(side, name)] = min(best.get((side, name), float("inf")), float(ns))
    print(f"{'case':54} {'before':>8} {'after':>8} {'after/before':>12}")
    for name in order:
        b, a = best[("before", name)], best[("after", name)]
        print(f"{name:54} {b:8.0f} {a:8.0f} {a / b:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
