"""Where a decision script's Redis CPU goes: each piece of it measured alone (issue 9, "cheap for the server").

Every row is one ``EVALSHA`` (or ``FCALL``) of a throwaway micro-script with the cycle script's own keys and
arguments (``2`` keys, ``10`` ARGV: what an ``"a"`` decision sends), doing one thing: nothing, ``TIME``,
``GET``, ``SET ... KEEPTTL``, ``SET ... PX``, a hash, ``string.match`` of a state, ``string.format``, a
``struct`` / ``cmsgpack`` encoding, converting ARGV strings to numbers, ... Subtract the ``empty`` row of the
same arguments to get a piece's own cost. The last rows are whole decisions through the library (and limits'
fixed window, the bare ``INCR`` + ``PEXPIRE`` script) for scale.

Two measures:

- default: ``INFO commandstats`` µs per call of the script command on a dedicated ``redis-server`` (as
  ``bench_redis_server.py``), best of ``REPEAT``, rows interleaved. Depends on the machine's load.
- ``--instructions``: instructions the server executes per call inside ``evalShaCommand`` / ``fcallCommand``
  (``valgrind --tool=callgrind --toggle-collect``), from two runs of N1 and N2 calls on fresh servers (the
  difference over N2 - N1: script loading and first-call effects cancel). Independent of the load; slow.

Run: ``python benchmarks/bench_redis_script_parts.py [--instructions] [ROW-SUBSTRING ...]``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from benchmarks._timing import dedicated_redis, free_port
from benchmarks.bench_redis_server import _INCR_PEXPIRE, _server_version

NUMBER = 3000
REPEAT = 5
#: Calls of the two callgrind runs per row (their difference is measured).
N1, N2 = 200, 1200

STATE = "0 999999999996 1796405203 75202000"
KEYS = ["r4p:rl:{allowed}:anchor", "r4p:rl:{allowed}:state"]
# An "a" decision's ARGV: op, token, base, K, limit, period, m, permits, timeout, deadline.
ARGV = ["a", "1796405203 75202000", "1796405203075202", "0", "1000000000000", "3600000000000", "1000", "1", "0", ""]
_MATCH = "'^(%-?%d+) (%-?%d+) (.*)$'"
_ZEROS = "\\0" * 16

#: (row, script body, numkeys or None for the cycle script's keys and args).
PIECES: list[tuple[str, str, bool]] = [
    ("empty script, 1 key + 1 arg of 1 byte", "return 0", False),
    ("empty script, the decision's 2 keys + 10 args", "return 0", True),
    ("empty script, 2 keys + 3 args", "return 0", True),
    ("empty script, 2 keys + 8 args (an \"A\" call's)", "return 0", True),
    ("empty body the size of the cycle script (early return)", "<SCRIPT>", True),
    ("TIME", "redis.call('TIME') return 0", True),
    ("GET", "redis.call('GET', KEYS[2]) return 0", True),
    ("SET KEEPTTL", f"redis.call('SET', KEYS[2], '{STATE}', 'KEEPTTL') return 0", True),
    ("SET PX (a Lua number)", f"redis.call('SET', KEYS[2], '{STATE}', 'PX', 3600000) return 0", True),
    ("SET PX (a string)", f"redis.call('SET', KEYS[2], '{STATE}', 'PX', '3600000') return 0", True),
    (
        "SET PX (string.format('%d', a Lua number))",
        f"redis.call('SET', KEYS[2], '{STATE}', 'PX', string.format('%d', 3600000)) return 0",
        True,
    ),
    ("GETRANGE, offsets Lua numbers", "local a, b = 0, 47 redis.call('GETRANGE', KEYS[2], a, b) return 0", True),
    ("GETRANGE, offsets strings", "redis.call('GETRANGE', KEYS[2], '0', '47') return 0", True),
    ("INCRBY", "redis.call('INCRBY', 'r4p:ctr', 1) return 0", True),
    ("HGET 1 field", "redis.call('HGET', 'r4p:h', 'p') return 0", True),
    ("HMGET 2 fields", "redis.call('HMGET', 'r4p:h', 'c', 'p') return 0", True),
    ("HSET 1 field", "redis.call('HSET', 'r4p:h', 'p', '999999999996') return 0", True),
    (
        "TIME + GET + SET KEEPTTL (the floor of a decision)",
        f"redis.call('TIME') redis.call('GET', KEYS[2]) redis.call('SET', KEYS[2], '{STATE}', 'KEEPTTL') return 0",
        True,
    ),
    ("string.match of a state (3 captures)", f"local c, p, a = string.match('{STATE}', {_MATCH}) return 0", True),
    ("string.format('%d %d ', c, p) .. token", "local v = string.format('%d %d ', 0, 999999999996) .. ARGV[2] return 0", True),
    ("string.format('%d %d %s', c, p, token)", "local v = string.format('%d %d %s', 0, 999999999996, ARGV[2]) return 0", True),
    ("c .. ' ' .. p .. ' ' .. token (tostring %.14g)", "local v = 0 .. ' ' .. 999999999996 .. ' ' .. ARGV[2] return 0", True),
    ("struct.pack('dd', c, p)", "local v = struct.pack('dd', 0, 999999999996) return 0", True),
    ("struct.unpack('dd', 16 bytes)", f"local a, b = struct.unpack('dd', '{_ZEROS}') return 0", True),
    ("cmsgpack.pack(3 numbers)", "local v = cmsgpack.pack(0, 999999999996, 5) return 0", True),
    ("7 ARGV strings to numbers (x + 0)", "local x = ARGV[3] + ARGV[4] + ARGV[5] + ARGV[6] + ARGV[7] + ARGV[8] + ARGV[9] + 0 return 0", True),
    ("7 ARGV compared to interned strings (== '1')", "local x = ARGV[3] == '1' or ARGV[4] == '1' or ARGV[5] == '1' or ARGV[6] == '1' or ARGV[7] == '1' or ARGV[8] == '1' or ARGV[9] == '1' return 0", True),
    ("5 local functions (closures made per call)", "local function a() end local function b() end local function c() end local function d() end local function e() end return 0", True),
    ("return {1, 2, 3}", "return {1, 2, 3}", True),
]

_FUNCTIONS = (
    "#!lua name=r4parts\n"
    "redis.register_function('empty', function(keys, args) return 0 end)\n"
    "redis.register_function('floor', function(keys, args) redis.call('TIME') redis.call('GET', keys[2]) "
    f"redis.call('SET', keys[2], '{STATE}', 'KEEPTTL') return 0 end)\n"
)


def _pieces() -> dict[str, Callable[[redis.Redis, str], Callable[[], Any]]]:
    from django_ratelimit_r4.backends.redis import SCRIPT

    rows: dict[str, Callable[[redis.Redis, str], Callable[[], Any]]] = {}
    for name, body, ours in PIECES:
        src = ("do return 0 end\n" + SCRIPT) if body == "<SCRIPT>" else body
        keys, args = (KEYS, ARGV) if ours else (["k"], ["x"])
        if name.endswith("2 keys + 3 args"):
            args = ARGV[:3]
        elif "8 args" in name:
            args = ARGV[:8]

        def setup(c: redis.Redis, url: str, src: str = src, keys: list[str] = keys, args: list[str] = args) -> Any:
            c.set(KEYS[1], STATE, px=3_600_000)
            c.hset("r4p:h", mapping={"c": 0, "p": 999999999996})
            sha = c.script_load(src)
            return lambda: c.execute_command("EVALSHA", sha, len(keys), *keys, *args)

        rows[name] = setup
    for name, function in (("FCALL: empty function, same keys + args", "empty"), ("FCALL: TIME + GET + SET KEEPTTL", "floor")):

        def fsetup(c: redis.Redis, url: str, function: str = function) -> Any:
            c.set(KEYS[1], STATE, px=3_600_000)
            c.function_load(_FUNCTIONS, replace=True)
            return lambda: c.execute_command("FCALL", function, 2, *KEYS, *ARGV)

        rows[name] = fsetup
    for name, algorithm, limit, period, quota in (
        ("decision: cycle allowed", "cycle", 10**12, "1h", False),
        ("decision: cycle denied", "cycle", 1, "1h", False),
        ("decision: cycle allowed + header figures", "cycle", 10**12, "1h", True),
        ("decision: gcra allowed", "gcra", 10**12, "1h", False),
        ("decision: gcra denied", "gcra", 1, "1h", False),
        ("decision: sliding_window allowed (log of 100)", "sliding_window", 100, "1ms", False),
    ):

        def lsetup(
            c: redis.Redis, url: str, algorithm: str = algorithm, limit: int = limit, period: str = period, quota: bool = quota
        ) -> Any:
            from django_ratelimit_r4.backends.redis import redis_backend
            from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
            from django_ratelimit_r4.core.exceptions import RequestNotPermitted
            from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig

            factory = redis_backend(url, prefix="r4p", connection_options={"socket_timeout": 30.0})
            config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm)
            limiter = RateLimiter(f"parts-{algorithm}-{limit}", config, clock=SYSTEM_CLOCK, backend=factory)
            fn = limiter.acquire_quota if quota else limiter.acquire_permission

            def call() -> Any:
                try:
                    return fn()
                except RequestNotPermitted:
                    return None

            return call

        rows[name] = lsetup

    for name, algorithm, limit, period, quota in (
        ("decision: gcra all-or-nothing over 3", "gcra", 10**12, "1h", False),
        ("decision: gcra all-or-nothing over 3 + header figures", "gcra", 10**12, "1h", True),
        ("decision: sliding_window all-or-nothing over 3 (logs of 100)", "sliding_window", 100, "1ms", False),
        ("decision: sliding_window all-or-nothing over 3 + header figures", "sliding_window", 100, "1ms", True),
    ):

        def tsetup(
            c: redis.Redis, url: str, algorithm: str = algorithm, limit: int = limit, period: str = period, quota: bool = quota
        ) -> Any:
            from django_ratelimit_r4.backends.redis import acquire_all_quotas, redis_backend
            from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
            from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, acquire_all

            factory = redis_backend(url, prefix="r4p", connection_options={"socket_timeout": 30.0})
            config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm)
            trio = [RateLimiter(f"parts-{algorithm}-trio{i}", config, clock=SYSTEM_CLOCK, backend=factory) for i in range(3)]
            entries = [(r, None) for r in trio]
            return (lambda: acquire_all_quotas(entries)) if quota else (lambda: acquire_all(trio))

        rows[name] = tsetup

    for name, row in (
        ("decision: mixed cycle + gcra + sliding_window granted, one script", "ours mixed cycle + gcra + sliding granted (one script)"),
        ("decision: the same, old split (three scripts)", "old split: mixed granted (three scripts)"),
    ):

        def msetup(c: redis.Redis, url: str, row: str = row) -> Any:
            from benchmarks.bench_redis_server import _mixed_rows

            return next(fn for n, fn, _ in _mixed_rows(url, "r4p") if n == row)

        rows[name] = msetup

    def incr(c: redis.Redis, url: str) -> Any:
        script = c.register_script(_INCR_PEXPIRE)
        return lambda: script(keys=["r4p:incr"], args=[3_600_000])

    rows["bare INCR + PEXPIRE script"] = incr
    try:
        import limits
        import limits.storage
        import limits.strategies
    except ImportError:
        return rows

    def fixed(c: redis.Redis, url: str) -> Any:
        limiter = limits.strategies.FixedWindowRateLimiter(limits.storage.RedisStorage(url))
        item = limits.parse("1000000000/hour")
        return lambda: limiter.hit(item, "r4p", "fixed")

    rows["limits fixed window (hit)"] = fixed

    def fixed_raw(c: redis.Redis, url: str) -> Any:
        # The same script with the same arguments, sent like the micro-scripts (no limits / redis-py Script
        # layer between calls): the server's time per call depends on how warm its caches are, so on how
        # long the client takes between calls.
        sha = c.script_load(limits.storage.RedisStorage.SCRIPT_INCR_EXPIRE)
        key = "LIMITS:LIMITER/r4p/fixed-raw/1000000000/1/hour"
        return lambda: c.execute_command("EVALSHA", sha, 1, key, 3600, 1)

    rows["limits fixed window's script, sent like the rows above"] = fixed_raw
    return rows


def _script_usec(c: redis.Redis) -> int:
    stats = c.info("commandstats")
    return sum(int(stats[k]["usec"]) for k in ("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_eval") if k in stats)


def measure_us(rows: dict[str, Callable[[redis.Redis, str], Callable[[], Any]]]) -> dict[str, float]:
    """µs per call of the script command (commandstats), best of REPEAT, rows interleaved."""
    best: dict[str, float] = {}
    with dedicated_redis() as url:
        c = redis.Redis.from_url(url)
        calls = {name: setup(c, url) for name, setup in rows.items()}
        for fn in calls.values():
            for _ in range(20):
                fn()
        for _ in range(REPEAT):
            for name, fn in calls.items():
                c.config_resetstat()
                for _ in range(NUMBER):
                    fn()
                best[name] = min(best.get(name, float("inf")), _script_usec(c) / NUMBER)
        c.close()
    return best


def _callgrind(setup: Callable[[redis.Redis, str], Callable[[], Any]], calls: int) -> int:
    """Instructions executed inside the script commands while making ``calls`` calls on a fresh server."""
    workdir = tempfile.mkdtemp(prefix="r4parts-")
    port = free_port()
    out = f"{workdir}/callgrind.out"
    proc = subprocess.Popen(
        [
            "valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=evalShaCommand",
            "--toggle-collect=fcallCommand", f"--callgrind-out-file={out}", shutil.which("redis-server") or "redis-server",
            "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        c = redis.Redis(port=port)
        deadline = time.monotonic() + 60
        while True:
            try:
                c.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        fn = setup(c, f"redis://127.0.0.1:{port}/0")
        for _ in range(calls):
            fn()
        with contextlib.suppress(redis.exceptions.ConnectionError):
            c.execute_command("SHUTDOWN", "NOSAVE")
        proc.wait(120)
        for line in Path(out).read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError("no callgrind summary")
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def measure_instructions(rows: dict[str, Callable[[redis.Redis, str], Callable[[], Any]]]) -> dict[str, float]:
    """Instructions per call: (run of N2 calls - run of N1 calls) / (N2 - N1), each on a fresh server."""
    return {name: (_callgrind(setup, N2) - _callgrind(setup, N1)) / (N2 - N1) for name, setup in rows.items()}


def main(argv: list[str]) -> int:
    instructions = "--instructions" in argv
    wanted = [a for a in argv if not a.startswith("--")]
    rows = {name: setup for name, setup in _pieces().items() if not wanted or any(w in name for w in wanted)}
    load = os.getloadavg()[0]
    figures = measure_instructions(rows) if instructions else measure_us(rows)
    width = max(len(n) for n in rows)
    unit = "instructions per call (callgrind)" if instructions else f"µs per call (commandstats, best of {REPEAT} x {NUMBER})"
    print(f"redis-server {_server_version()}; {unit}; load {load:.2f} -> {os.getloadavg()[0]:.2f}")
    for name in rows:
        print(f"{name:<{width}}  {figures[name]:>9.{0 if instructions else 2}f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
