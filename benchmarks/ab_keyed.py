"""Compare two checkouts on the keyed rate limiter's decisions, interleaved in ONE process, in thread CPU time.

    python benchmarks/ab_keyed.py /path/to/before /path/to/after [rounds] [redis://127.0.0.1:6379/15]

Not collected by ``run.py`` (no ``bench_`` prefix). The two checkouts' packages are copied to a temporary folder as
``r4before`` and ``r4after`` (the package imports itself relatively) and imported side by side, so both run in the
same process, on the same core, at the same moment: each round times every case on both sides, each side first in
half the rounds (the second of two runs is measured a little slower), and the best of all rounds counts. Run it
with the same checkout twice for the noise floor (an A/A comparison). Without a Redis URL: the in-memory cases --
the keyed ``@ratelimit`` path (``acquire_quota``) and the plain decisions, granted and denied, for the three
algorithms. With one: a keyed Redis decision each (client CPU of a round trip: what the limiter's code costs; the
server's time is not in it). Used for issue 9's "one KeyedRateLimiter for every store" before/after.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import sys
import tempfile
import time
import timeit
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

KEY = "203.0.113.7"


def _cases(package: str, url: str | None) -> dict[str, Callable[[], Any]]:
    keyed = importlib.import_module(package + ".keyed")
    config = importlib.import_module(package + ".core.ratelimiter").RateLimiterConfig
    rejected = importlib.import_module(package + ".core.exceptions").RequestNotPermitted
    big = config(limit_for_period=10**12, limit_refresh_period="1h")
    small = config(limit_for_period=1, limit_refresh_period="1h")
    if url is not None:
        redis = importlib.import_module(package + ".backends.redis")
        prefix = "r4ab" + uuid.uuid4().hex[:8]
        allowed = redis.RedisKeyedRateLimiter("allowed", big, url=url, prefix=prefix)
        denied = redis.RedisKeyedRateLimiter("denied", small, url=url, prefix=prefix)
        kind = "redis"
    else:
        allowed, denied = keyed.KeyedRateLimiter("allowed", big), keyed.KeyedRateLimiter("denied", small)
        kind = "memory"
    denied.acquire_permission(KEY)

    def raising(method: Callable[[str], Any]) -> Callable[[], None]:
        def call() -> None:
            with contextlib.suppress(rejected):
                method(KEY)

        return call

    cases = {
        f"{kind} acquire_quota allowed (keyed @ratelimit)": lambda: allowed.acquire_quota(KEY),
        f"{kind} acquire_permission allowed": lambda: allowed.acquire_permission(KEY),
        f"{kind} acquire_permission denied": lambda: denied.acquire_permission(KEY),
        f"{kind} acquire_or_raise denied": raising(denied.acquire_or_raise),
        f"{kind} acquire_quota denied": raising(denied.acquire_quota),
    }
    if url is None:
        gcra = keyed.KeyedRateLimiter("g", config(limit_for_period=10**9, limit_refresh_period="1s", algorithm="gcra"))
        sliding = keyed.KeyedRateLimiter(
            "s", config(limit_for_period=10**5, limit_refresh_period="1ms", algorithm="sliding_window")
        )
        cases["memory gcra acquire_quota allowed"] = lambda: gcra.acquire_quota(KEY)
        cases["memory sliding window acquire_quota allowed"] = lambda: sliding.acquire_quota(KEY)
    return cases


def main(argv: list[str]) -> int:
    before, after = (Path(p).resolve() for p in argv[:2])
    rounds = int(argv[2]) if len(argv) > 2 else 30
    url = argv[3] if len(argv) > 3 else None
    folder = Path(tempfile.mkdtemp(prefix="r4ab"))
    try:
        for name, root in (("r4before", before), ("r4after", after)):
            shutil.copytree(root / "django_ratelimit_r4", folder / name)
        sys.path.insert(0, str(folder))
        sides = {"before": _cases("r4before", url), "after": _cases("r4after", url)}
        best = {(side, case): float("inf") for side in sides for case in sides["after"]}
        number = 400 if url else 20_000
        for r in range(rounds):
            for case in sides["after"]:
                for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                    ns = timeit.Timer(sides[side][case], timer=time.thread_time).timeit(number) / number * 1e9
                    best[(side, case)] = min(best[(side, case)], ns)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{'case (thread CPU ns per call)':48} {'before':>8} {'after':>8} {'after/before':>12}")
    for case in sides["after"]:
        b, a = best[("before", case)], best[("after", case)]
        print(f"{case:48} {b:8.0f} {a:8.0f} {a / b:12.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
