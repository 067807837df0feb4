"""A/B of the rate-limiter scripts' Redis CPU: this checkout's Lua against another git revision's, interleaved.

The decisions' arguments are taken from this checkout's real clients (one call per row, captured where the
``EVALSHA`` is packed), the deadline set far ahead (never LATE, the same path as a live decision), then the
same ``EVALSHA`` is replayed against both versions of the script on one dedicated ``redis-server``: old, new,
old, new, ... (``REPEAT`` rounds of ``NUMBER`` calls each; the best round is kept). The figure is the
script command's ``usec`` per call from ``INFO commandstats`` (what ``bench_redis_server.py`` counts), next to
limits' fixed window (``FixedWindowRateLimiter.hit``: one ``EVALSHA`` of its ``incr_expire.lua``) measured in
the same rounds. Valid while the argument layout of the scripts is the same in both revisions, with one
translation: a cycle script older than the ops ``"A"``/``"Q"`` (one permit, no wait, 8 arguments) is sent the
same decision as ``"a"``/``"q"`` with permits ``1`` and timeout ``0`` (10 arguments), as its clients sent it.

Run: ``python benchmarks/ab_redis_script_cpu.py [REV] [N]`` (REV default ``main``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from benchmarks._timing import dedicated_redis
from benchmarks.bench_redis_server import PATIENT, _server_version

NUMBER = 3000
REPEAT = 7
ROOT = Path(__file__).resolve().parent.parent
_LUA = "django_ratelimit_r4/backends/lua/"
FAR = b"9999999999999999"  # a deadline (server µs) that never passes


# The cycle script's ops of one permit without waiting, and what a script older than them was sent instead.
_ONE_OPS = {b"A": b"a", b"Q": b"q"}


def _as_old(source: str, numkeys: int, args: list[bytes]) -> list[bytes]:
    """``args`` as the cycle script ``source`` takes them: an "A"/"Q" call becomes "a"/"q" with permits 1 and
    timeout 0 when that script does not know the op (its clients sent that)."""
    op = args[numkeys]
    if op not in _ONE_OPS or "op == 'A'" in source:
        return args
    at = numkeys + 7  # the deadline slot of "A"/"Q"; "a"/"q" have permits and timeout before it
    return [*args[:numkeys], _ONE_OPS[op], *args[numkeys + 1 : at], b"1", b"0", *args[at:]]


def _old_scripts(rev: str) -> dict[str, str]:
    def show(name: str) -> str:
        return subprocess.run(
            ["git", "show", f"{rev}:{_LUA}{name}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout

    from django_ratelimit_r4.backends.redis_mixed import CYCLE_FILES

    return {
        "cycle": "\n".join(show(n) for n in CYCLE_FILES),
        "gcra": show("gcra.lua"),
        "sliding_window": show("sliding_window.lua"),
    }


def _capture(fn: Callable[[], Any]) -> tuple[str, int, list[bytes]]:
    """(sha, numkeys, args) of the EVALSHA ``fn`` sends (its last)."""
    from django_ratelimit_r4.backends import redis as rb

    seen: list[tuple[str, int, list[bytes]]] = []
    real = rb._pack_evalsha

    def plain(args: Any) -> list[bytes]:
        out: list[bytes] = []
        for a in args:
            if isinstance(a, rb._Packed):  # a packed run of arguments (redis.packed_args): its own
                out += plain(a.args)
            else:
                out.append(a.encode() if isinstance(a, str) else b"%d" % a if isinstance(a, int) else a)
        return out

    def spy(sha: str, numkeys: int, args: Any, utf8: bool) -> Any:
        seen.append((sha, numkeys, plain(args)))
        return real(sha, numkeys, args, utf8)

    rb._pack_evalsha = spy  # type: ignore[assignment]
    try:
        with contextlib.suppress(Exception):
            fn()
    finally:
        rb._pack_evalsha = real  # type: ignore[assignment]
    return seen[-1]


def _rows(url: str) -> list[tuple[str, str, Callable[[], Any]]]:
    """(row, algorithm, one decision through the library)."""
    from django_ratelimit_r4.backends.redis import RedisKeyedRateLimiter, redis_backend
    from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
    from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig

    factory = redis_backend(url, prefix="r4ab", connection_options=PATIENT)

    def limiter(name: str, limit: int, period: str, algorithm: str = "cycle") -> RateLimiter:
        config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm)
        return RateLimiter(name, config, clock=SYSTEM_CLOCK, backend=factory)

    rows: list[tuple[str, str, Callable[[], Any]]] = []
    allowed, denied = limiter("a", 10**12, "1h"), limiter("d", 1, "1h")
    denied.acquire_permission()
    big = RateLimiterConfig(limit_for_period=10**12, limit_refresh_period="1h")
    keyed = RedisKeyedRateLimiter("k", big, url=url, prefix="r4ab", connection_options=PATIENT)
    rows += [
        ("cycle unkeyed allowed", "cycle", allowed.acquire_permission),
        ("cycle unkeyed denied", "cycle", denied.acquire_permission),
        ("cycle keyed allowed", "cycle", lambda: keyed.acquire_permission("203.0.113.7")),
        ("cycle unkeyed allowed + header figures", "cycle", allowed.acquire_quota),
    ]
    for algorithm, period in (("gcra", "1h"), ("sliding_window", "1ms")):
        limit = 10**12 if algorithm == "gcra" else 100
        a = limiter(f"{algorithm}-a", limit, period, algorithm)
        d = limiter(f"{algorithm}-d", 100, "1h", algorithm)
        while d.acquire_permission():
            pass
        rows += [
            (f"{algorithm} unkeyed allowed", algorithm, a.acquire_permission),
            (f"{algorithm} unkeyed denied", algorithm, d.acquire_permission),
            (f"{algorithm} unkeyed allowed + header figures", algorithm, a.acquire_quota),
        ]
    return rows


def _deadline_index(algorithm: str, numkeys: int, args: list[bytes]) -> int:
    """Index in ``args`` (keys then ARGV) of a one-limiter call's deadline."""
    argv = numkeys
    if algorithm == "cycle":
        return argv + (7 if args[argv] in _ONE_OPS else 9)  # ARGV[8] ("A", "Q") or ARGV[10]
    n = int(args[argv + 3])
    per = 4 if algorithm == "gcra" else 3
    return argv + 4 + per * n  # ARGV[5 + per * n]


def main(argv: list[str]) -> int:
    rev = argv[0] if argv else "main"
    number = int(argv[1]) if len(argv) > 1 else NUMBER
    old = _old_scripts(rev)
    load = os.getloadavg()[0]
    with dedicated_redis() as url:
        c = redis.Redis.from_url(url)
        old_sha = {k: c.script_load(v) for k, v in old.items()}
        calls: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = []
        for name, algorithm, fn in _rows(url):
            for _ in range(5):
                with contextlib.suppress(Exception):
                    fn()
            sha, numkeys, args = _capture(fn)
            args[_deadline_index(algorithm, numkeys, args)] = FAR
            new = (sha, numkeys, *args)
            before = (old_sha[algorithm], numkeys, *_as_old(old[algorithm], numkeys, args))
            assert hashlib.sha1(old[algorithm].encode()).hexdigest() == old_sha[algorithm]

            def run(cmd: tuple[Any, ...] = new) -> Any:
                return c.execute_command("EVALSHA", *cmd)

            def run_old(cmd: tuple[Any, ...] = before) -> Any:
                return c.execute_command("EVALSHA", *cmd)

            a, b = run(), run_old()  # (waits and resets move with time: compare the shape)
            if type(a) is not type(b) or (isinstance(a, list) and len(a) != len(b)):
                print(f"note: {name}: the two versions reply in different shapes: {b!r} -> {a!r}", file=sys.stderr)
            calls.append((name, run_old, run))
        fixed: Callable[[], Any] | None = None
        try:
            import limits
            import limits.storage
            import limits.strategies

            strategy = limits.strategies.FixedWindowRateLimiter(limits.storage.RedisStorage(url))
            item = limits.parse("1000000000/hour")

            def fixed() -> Any:
                return strategy.hit(item, "r4ab", "fixed")

        except ImportError:
            pass

        def usec(fn: Callable[[], Any]) -> float:
            c.config_resetstat()
            for _ in range(number):
                fn()
            return float(c.info("commandstats")["cmdstat_evalsha"]["usec"]) / number

        best: dict[tuple[str, str], float] = {}
        for _ in range(REPEAT):
            if fixed is not None:
                best[("fixed", "")] = min(best.get(("fixed", ""), float("inf")), usec(fixed))
            for name, run_old, run in calls:
                for version, fn in (("old", run_old), ("new", run)):
                    key = (name, version)
                    best[key] = min(best.get(key, float("inf")), usec(fn))
        c.close()
    ref = best.get(("fixed", ""))
    print(
        f"redis-server {_server_version()}; old = {rev}, new = this checkout; µs per call (commandstats), best of "
        f"{REPEAT} x {number}, interleaved; load {load:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    if ref:
        print(f"limits fixed window (hit): {ref:.2f} µs")
    width = max(len(n) for n, _, _ in calls)
    print(f"{'row':<{width}}  {'old':>6}  {'new':>6}  new/old  old/limits  new/limits")
    for name, _, _ in calls:
        o, n = best[(name, "old")], best[(name, "new")]
        vs = f"  {o / ref:>9.2f}x  {n / ref:>9.2f}x" if ref else ""
        print(f"{name:<{width}}  {o:>6.2f}  {n:>6.2f}  {n / o:>6.2f}x{vs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
