"""CircuitBreaker hot paths, as ratios measured in one run (not a timed test).

Run: ``python benchmarks/bench_circuitbreaker.py``. Targets (issue 2): ``call`` on a CLOSED breaker at
most +300 ns over a bare call; rejection when OPEN under 800 ns with no memory growth. The "floor"
rows measure, in the same run, the irreducible parts (two clock reads + one lock round trip for a
recorded call; building and raising one exception for a rejection) so a miss can be explained.
"""

from __future__ import annotations

import sys
import threading
import time
import timeit
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_ratelimit_r4.core.circuitbreaker import CircuitBreaker, CircuitBreakerConfig
from django_ratelimit_r4.core.exceptions import CallNotPermitted

N = 200_000
REPEAT = 7


def _best_ns(stmt: object, number: int = N) -> float:
    """Best-of-REPEAT nanoseconds per call of ``stmt`` (a no-argument callable)."""
    return min(timeit.repeat(stmt, number=number, repeat=REPEAT)) / number * 1e9  # type: ignore[arg-type]


def _work() -> int:
    return 1


def _row(
    name: str, ns: float, baseline: float | None, target: str, ok: bool, **extra: object
) -> dict[str, object]:
    row: dict[str, object] = {"name": name, "ns_per_op": round(ns, 1)}
    if baseline is not None:
        row["baseline_ns"] = round(baseline, 1)
        row["overhead_ns"] = round(ns - baseline, 1)
    row.update(extra)
    row["target"] = target
    row["ok"] = ok
    return row


def run() -> list[dict[str, object]]:
    """Measure and return one row per scenario."""
    rows: list[dict[str, object]] = []

    # Both sides run inside a lambda, so the same frame cost is on each side of the comparison.
    bare = _best_ns(lambda: _work())
    closed = CircuitBreaker("bench-closed", CircuitBreakerConfig(sliding_window_size=100))
    call = closed.call
    for _ in range(200):  # fill the ring: the steady state of a healthy breaker
        call(_work)
    closed_ns = _best_ns(lambda: call(_work))
    rows.append(
        _row("call() on a CLOSED breaker", closed_ns, bare, "overhead <= 300 ns", closed_ns - bare <= 300)
    )

    lock = threading.Lock()
    now = time.monotonic_ns

    def floor_closed() -> int:
        start = now()
        _work()
        lock.acquire()
        lock.release()
        return now() - start

    floor = _best_ns(floor_closed)
    rows.append(_row("floor: bare call + 2 clock reads + 1 lock round trip", floor, bare, "-", True))

    opened = CircuitBreaker("bench-open", CircuitBreakerConfig(wait_duration_in_open_state="1h"))
    opened.transition_to_open_state()
    ocall = opened.call

    def rejected() -> None:
        try:  # noqa: SIM105 - what a caller writes; contextlib.suppress would add its own cost
            ocall(_work)
        except CallNotPermitted:
            pass

    rejected_ns = _best_ns(rejected)
    rows.append(_row("call() rejected by an OPEN breaker", rejected_ns, bare, "< 800 ns", rejected_ns < 800))

    class _Plain(Exception):
        pass

    def floor_raise() -> None:
        try:
            raise _Plain("x")
        except _Plain:
            pass

    def floor_reject() -> None:
        try:
            raise CallNotPermitted(opened, None, 0)
        except CallNotPermitted:
            pass

    rows.append(_row("floor: raise + catch a plain exception", _best_ns(floor_raise), None, "-", True))
    rows.append(
        _row(
            "floor: CallNotPermitted(...) via __init__, raise + catch",
            _best_ns(floor_reject),
            None,
            "-",
            True,
        )
    )

    rejected()  # warm up before measuring memory
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(100_000):
        rejected()
    growth = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    rows.append(
        {
            "name": "memory growth over 100k rejections (tracemalloc)",
            "bytes": growth,
            "target": "< 1 KiB in total (no per-rejection growth)",
            "ok": growth < 1024,
        }
    )
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
