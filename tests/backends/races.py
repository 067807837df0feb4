"""Shared races for the Redis algorithm tests: processes released together, and grants bracketed by server time.

Each algorithm's test module asks the same two questions of its own limiter: does one Redis budget hold across
processes, and does no window of server time hold more grants than the algorithm's bound.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent(
    """
    import sys, threading, time
    sys.path.insert(0, {root!r})
    from django_ratelimit_r4.backends.redis import redis_backend
    from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig
    rl = RateLimiter({name!r}, RateLimiterConfig(limit_for_period={limit}, limit_refresh_period="60s",
                     algorithm={algorithm!r}), backend=redis_backend({url!r}, prefix={prefix!r}))
    barrier = threading.Barrier({threads})
    results = []
    def work():
        barrier.wait()
        results.append(rl.acquire_permission())
    threads = [threading.Thread(target=work) for _ in range({threads})]
    rl.backend.state()  # connect first, so the race is about the decision
    while time.time() < {start!r}:
        time.sleep(0.001)
    for t in threads: t.start()
    for t in threads: t.join()
    print(sum(results))
    """
)


def granted_across_processes(
    url: str,
    prefix: str,
    name: str,
    *,
    algorithm: str,
    processes: int,
    limit: int = 5,
    threads: int = 10,
    start_in: float = 1.5,
    timeout: float = 60,
) -> list[int]:
    """Each process's grants when ``processes`` processes x ``threads`` threads, all connected first, ask one
    ``limit``-per-60 s limiter named ``name`` at the same wall-clock instant."""
    code = _CHILD.format(
        root=str(ROOT), name=name, url=url, prefix=prefix, start=time.time() + start_in,
        limit=limit, algorithm=algorithm, threads=threads,
    )  # fmt: skip
    return [int(out) for out in run_children(code, processes, timeout)]


def run_children(code: str, processes: int, timeout: float, env: dict[str, str] | None = None) -> list[str]:
    """Run ``processes`` copies of ``python -c code`` and return each one's stdout; each must exit 0 within
    ``timeout``. On any failure (a timeout, a test interrupted) every child still running is killed: a child
    left looping against Redis outlived its test run and slowed every later one on the machine."""
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(processes)
    ]
    try:
        outs = []
        for proc in procs:
            out = proc.communicate(timeout=timeout)[0]
            assert proc.returncode == 0, (proc.returncode, out)
            outs.append(out)
        return outs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def grants_on_server_time(url: str, acquire: Callable[[], bool], seed: int) -> tuple[list[int], list[int]]:
    """Random idle gaps, then bursts of ``acquire()`` that run across period and window edges; for each grant,
    the server time (µs) read just before and just after its decision.

    Redis runs commands one at a time, so a grant happened at a server time between its two readings, however
    long this process was descheduled in between."""
    client = redis.Redis.from_url(url)
    rng = random.Random(seed)
    before: list[int] = []
    after: list[int] = []

    def server_us() -> int:
        seconds, micros = client.time()
        return int(seconds) * 1_000_000 + int(micros)

    try:
        for _ in range(8):
            time.sleep(rng.uniform(0.05, 0.25))  # shaping the arrivals, not waiting for a decision
            until = time.monotonic() + rng.uniform(0.1, 0.3)
            while time.monotonic() < until:
                start = server_us()
                if acquire():
                    before.append(start)
                    after.append(server_us() + 1)  # + 1: TIME truncates to whole microseconds
    finally:
        client.close()
    return before, after


def assert_no_window_holds_more(before: list[int], after: list[int], window_us: int, bound: int) -> None:
    """Grants i..j surely lie in one window when ``after[j] - before[i] < window_us``: no more than ``bound``
    of them may."""
    for i in range(len(before)):
        for j in range(i + bound, len(after)):
            if after[j] - before[i] >= window_us:
                break
            raise AssertionError(f"grants {i}..{j} ({j - i + 1} > {bound}) within one {window_us // 1000} ms window")
