"""CircuitBreaker hot paths, as ratios measured in one run (not a timed test).

Run: ``python benchmarks/bench_circuitbreaker.py``. Targets (issue 2): ``call`` on a CLOSED breaker at
most +300 ns over a bare call; rejection when OPEN under 800 ns with no memory growth.
"""

from __future__ import annotations

import sys
import timeit
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from django_ratelimit_r4.core.circuitbreaker import CircuitBreaker, CircuitBreakerConfig
from django_ratelimit_r4.core.exceptions import CallNotPermitted

N = 200_000
REPEAT = 7


def _best_ns(stmt: object, number: int = N) -> float:
    """Best-of-REPEAT nanoseconds per call of ``stmt`` (a no-argument callable)."""
    return min(timeit.repeat(stmt, number=number, repeat=REPEAT)) / number * 1e9  # type: ignore[arg-type]


def _work() -> int:
    return 1


def run() -> list[dict[str, object]]:
    """Measure and return one row per scenario."""
    rows: list[dict[str, object]] = []

    bare = _best_ns(_work)
    closed = CircuitBreaker("bench-closed", CircuitBreakerConfig(sliding_window_size=100))
    call = closed.call
    closed_ns = _best_ns(lambda: call(_work)) - _best_ns(lambda: None) + _best_ns(lambda: None)
    # The lambda adds the same frame to both sides; compare call(_work) against a lambda calling _work.
    bare_in_lambda = _best_ns(lambda: _work())
    closed_in_lambda = _best_ns(lambda: call(_work))
    rows.append(
        {
            "name": "call() on a CLOSED breaker",
            "ns_per_op": round(closed_in_lambda, 1),
            "baseline_ns": round(bare_in_lambda, 1),
            "overhead_ns": round(closed_in_lambda - bare_in_lambda, 1),
            "target": "overhead <= 300 ns",
            "ok": closed_in_lambda - bare_in_lambda <= 300,
        }
    )
    del closed_ns, bare

    opened = CircuitBreaker("bench-open", CircuitBreakerConfig(wait_duration_in_open_state="1h"))
    opened.transition_to_open_state()
    ocall = opened.call

    def rejected() -> None:
        with contextlib.suppress(CallNotPermitted):
            ocall(_work)

    rejected_ns = _best_ns(rejected)
    rows.append(
        {
            "name": "call() rejected by an OPEN breaker",
            "ns_per_op": round(rejected_ns, 1),
            "baseline_ns": round(bare_in_lambda, 1),
            "overhead_ns": round(rejected_ns - bare_in_lambda, 1),
            "target": "< 800 ns",
            "ok": rejected_ns < 800,
        }
    )

    rejected()  # warm up caches before measuring memory
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(100_000):
        rejected()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    growth = after - before
    rows.append(
        {
            "name": "memory growth over 100k rejections",
            "ns_per_op": None,
            "baseline_ns": None,
            "bytes": growth,
            "target": "< 1 KiB total (no per-rejection growth)",
            "ok": growth < 1024,
        }
    )
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
