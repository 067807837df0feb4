"""Compare two checkouts' keyed in-memory sliding window in ONE process, steady state, thread CPU time.

    python benchmarks/ab_keyed_sliding.py /path/to/before /path/to/after [rounds]

Not collected by ``run.py`` (no ``bench_`` prefix). As ``ab_keyed.py``: both packages are copied to a temporary
folder as ``r4before`` / ``r4after`` and imported side by side, each round times every case on both sides, each
side first in half the rounds, and the best of all rounds counts; run it with one checkout twice for the noise
floor. 1000 clients in turn, as ``bench_algorithms``' keyed rows, with their logs warmed before timing (no log
grows while timed): a log of 1000 filled by one call of 520 permits ("full ring") or by 520 one-permit grants
in turn ("grown by use": a growing log is copied at each doubling), a limit of 20 000 with 300 held ("light":
the log is below its limit), and clients at their limit of 10 ("denied"). Used for the growing log (2026-12-05).
"""

from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

KEYS = [f"client-{i}" for i in range(1000)]


def _cases(package: str) -> dict[str, Callable[[], Any]]:
    keyed = importlib.import_module(package + ".keyed")
    config = importlib.import_module(package + ".core.ratelimiter").RateLimiterConfig
    rejected = importlib.import_module(package + ".core.exceptions").RequestNotPermitted

    def limiter(limit: int, permits: int = 0, denied: bool = False) -> Any:
        built = keyed.KeyedRateLimiter(
            "ab", config(limit_for_period=limit, limit_refresh_period="1h", algorithm="sliding_window"), max_keys=2000
        )
        for key in KEYS:
            while denied and built.acquire_permission(key):
                pass
            if permits:
                assert built.acquire_permission(key, permits)
        return built

    def in_turn(method: Callable[[str], Any]) -> Callable[[], Any]:
        at = [0]

        def call() -> Any:
            i = at[0] = (at[0] + 1) % 1000
            try:
                return method(KEYS[i])
            except rejected:
                return None

        return call

    full_p, full_q = limiter(1000, 520), limiter(1000, 520)
    grown_p, grown_q = limiter(1000), limiter(1000)
    for _ in range(520):
        for key in KEYS:
            assert grown_p.acquire_permission(key) and grown_q.acquire_permission(key)
    light_p, light_q = limiter(20_000, 300), limiter(20_000, 300)
    denied_p, denied_q = limiter(10, denied=True), limiter(10, denied=True)
    cases = {
        "full ring (limit 1000, 520 held) acquire_permission": in_turn(full_p.acquire_permission),
        "full ring (limit 1000, 520 held) acquire_quota": in_turn(full_q.acquire_quota),
        "grown by use (limit 1000, 520 held) acquire_permission": in_turn(grown_p.acquire_permission),
        "grown by use (limit 1000, 520 held) acquire_quota": in_turn(grown_q.acquire_quota),
        "light (limit 20000, 300 held) acquire_permission": in_turn(light_p.acquire_permission),
        "light (limit 20000, 300 held) acquire_quota": in_turn(light_q.acquire_quota),
        "denied (limit 10) acquire_permission": in_turn(denied_p.acquire_permission),
        "denied (limit 10) acquire_quota": in_turn(denied_q.acquire_quota),
    }
    for case in cases.values():  # two calls per client untimed: the figures' hint known, as in a steady state
        for _ in range(2000):
            case()
    return cases


def main(argv: list[str]) -> int:
    before, after = (Path(p).resolve() for p in argv[:2])
    rounds = int(argv[2]) if len(argv) > 2 else 20
    number = 10_000
    folder = Path(tempfile.mkdtemp(prefix="r4ab"))
    try:
        for name, root in (("r4before", before), ("r4after", after)):
            shutil.copytree(root / "django_ratelimit_r4", folder / name)
        sys.path.insert(0, str(folder))
        sides = {"before": _cases("r4before"), "after": _cases("r4after")}
        best = {(side, case): float("inf") for side in sides for case in sides["after"]}
        for r in range(rounds):
            for case in sides["after"]:
                for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                    ns = timeit.Timer(sides[side][case], timer=time.thread_time).timeit(number) / number * 1e9
                    best[(side, case)] = min(best[(side, case)], ns)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{'case (thread CPU ns per call, best of rounds)':56} {'before':>8} {'after':>8} {'after/before':>12}")
    for case in sides["after"]:
        b, a = best[("before", case)], best[("after", case)]
        print(f"{case:56} {b:8.0f} {a:8.0f} {a / b:12.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
