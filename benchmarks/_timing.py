"""Timing helpers shared by the ``bench_*`` modules (not a benchmark itself: run.py skips ``_`` files)."""

from __future__ import annotations

import contextlib
import timeit
from collections.abc import Callable, Iterator
from typing import Any

#: The bare round trip's script: a trivial one, so the baseline is the round trip itself through redis-py.
TRIVIAL = "return 1"


def best_pair(
    subject: Callable[[], Any], baseline: Callable[[], Any], number: int, repeat: int
) -> tuple[float, float]:
    """Best ns/op of ``subject`` and ``baseline``, their repeats interleaved so drift hits both alike."""
    t_subject = timeit.Timer("f()", globals={"f": subject})
    t_baseline = timeit.Timer("f()", globals={"f": baseline})
    best_s = best_b = float("inf")
    for _ in range(repeat):
        best_b = min(best_b, t_baseline.timeit(number) / number * 1e9)
        best_s = min(best_s, t_subject.timeit(number) / number * 1e9)
    return best_s, best_b


def median_pair(
    subject: Callable[[], Any], baseline: Callable[[], Any], number: int, repeat: int = 1
) -> tuple[float, float]:
    """Median ns per call of ``subject`` and ``baseline``, alternated call by call (``number * repeat`` each).

    For calls that wait on another process (a Redis round trip): on a shared machine a block of calls is
    often hit by a neighbour as a whole, while alternating single calls puts both sides under the same
    conditions, and the median ignores the calls that waited for a CPU.
    """
    import statistics
    import time

    clock = time.perf_counter_ns
    subject_ns: list[int] = []
    baseline_ns: list[int] = []
    for _ in range(number * repeat):
        started = clock()
        baseline()
        between = clock()
        subject()
        subject_ns.append(clock() - between)
        baseline_ns.append(between - started)
    return float(statistics.median(subject_ns)), float(statistics.median(baseline_ns))


def exhaust(fn: Callable[[], bool]) -> Callable[[], bool]:
    """Call ``fn`` until it says no (a limiter out of permits), then return it for timing denials."""
    for _ in range(20_000):
        if not fn():
            break
    return fn


def print_rows(rows: list[dict[str, Any]], baseline_label: str = "baseline") -> int:
    """Print ``run()`` rows as a table; return 1 if a row with a numeric ratio target misses it, else 0."""
    width = max(len(r["name"]) for r in rows)
    print(f"{'benchmark':<{width}}  {'ns/op':>10}  {baseline_label:>10}  {'ratio':>6}  target")
    missed = False
    for r in rows:
        target = r.get("target")
        ratio = r.get("ratio")
        flag = ""
        if isinstance(target, (int, float)) and ratio is not None and ratio > target:
            flag, missed = "  MISSED", True
        cells = [
            "" if r.get(k) is None else f"{r[k]:.1f}" for k in ("ns_per_op", "baseline_ns")
        ]
        shown_ratio = "" if ratio is None else f"{ratio:6.2f}"
        shown_target = "" if target is None else (f"<= {target}x" if isinstance(target, (int, float)) else str(target))
        print(f"{r['name']:<{width}}  {cells[0]:>10}  {cells[1]:>10}  {shown_ratio:>6}  {shown_target}{flag}")
    return 1 if missed else 0


def bare_evalsha(client: Any) -> Callable[[], Any]:
    """``client.evalsha`` of :data:`TRIVIAL` with no keys or arguments (reloaded if the server forgot it): the
    one round trip every Redis benchmark compares with."""
    import redis

    sha = [client.script_load(TRIVIAL)]

    def call() -> Any:
        try:
            return client.evalsha(sha[0], 0)
        except redis.exceptions.NoScriptError:
            sha[0] = client.script_load(TRIVIAL)
            return client.evalsha(sha[0], 0)

    return call


async def abare_evalsha(client: Any) -> Callable[[], Any]:
    """Async twin of :func:`bare_evalsha` on a ``redis.asyncio`` client."""
    import redis

    sha = [await client.script_load(TRIVIAL)]

    async def call() -> Any:
        try:
            return await client.evalsha(sha[0], 0)
        except redis.exceptions.NoScriptError:
            sha[0] = await client.script_load(TRIVIAL)
            return await client.evalsha(sha[0], 0)

    return call


def free_port() -> int:
    """A free loopback TCP port (free when asked: the caller binds it soon after)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def dedicated_redis(workdir: str | None = None) -> Iterator[str]:
    """Start a private ``redis-server`` on a free loopback port (no persistence; its files in ``workdir``, else
    a temporary directory); yield its URL once it answers; stop it."""
    import shutil
    import subprocess
    import tempfile
    import time

    import redis

    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not on the PATH")
    port = free_port()
    own = workdir is None
    folder = tempfile.mkdtemp(prefix="r4bench-redis-") if workdir is None else workdir
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", folder],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.02)
        client.close()
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        if own:
            shutil.rmtree(folder, ignore_errors=True)
