"""Issue 12's deterministic simulations, as tables: adaptive bulkhead limits and retry budgets on the fake clock.

    python benchmarks/sim_adaptive.py

Bulkheads: 200 calls/s offered to a partner that serves 20 at a time (FIFO queue beyond) and takes 50 ms for
30 s, 500 ms for 30 s, then 50 ms again (the model of ``tests/core/test_adaptive_bulkhead.py``, imported from
there so the table and the tests cannot disagree). Retry budgets: 100 failing calls/s for 60 s through a retry
of 3 attempts, with and without a 10 % budget (the model of ``tests/core/test_retrybudget.py``).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_ratelimit_r4.core.bulkhead import BulkheadConfig
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.retry import Retry, RetryConfig
from django_ratelimit_r4.core.retrybudget import RetryBudget, RetryBudgetConfig
from tests.core.test_adaptive_bulkhead import _run
from tests.core.test_retrybudget import outage

VARIANTS: list[tuple[str, int, dict[str, object] | None]] = [
    ("fixed 20 (the partner's workers)", 20, None),
    ("fixed 100 (Little's law, offered x 500 ms)", 100, None),
    ("gradient2", 20, {"algorithm": "gradient2", "min_limit": 5, "max_limit": 500}),
    ("aimd (timeout 750 ms)", 20, {"algorithm": "aimd", "min_limit": 5, "max_limit": 500, "timeout": "750ms"}),
    ("aimd, windowed", 20, {"algorithm": "aimd", "min_limit": 5, "max_limit": 500, "timeout": "750ms", "windowed": True}),
    ("gradient2, windowed", 20, {"algorithm": "gradient2", "min_limit": 5, "max_limit": 500, "windowed": True}),
]


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bulkheads() -> None:
    """Print one row per bulkhead variant."""
    print(f"{'bulkhead':44} {'ok/s slow':>9} {'p50':>6} {'p99':>6} {'refused':>17} {'limit (slow, last 20 s)':>24}")
    for name, initial, adaptive in VARIANTS:
        healthy, sick, back = _run(BulkheadConfig(max_concurrent_calls=initial, adaptive=adaptive))
        limits = sick["limits"][100:]
        refused = f"{len(healthy['rejected_at'])}/{len(sick['rejected_at'])}/{len(back['rejected_at'])}"
        print(
            f"{name:44} {sick['completed'] / 30:9.1f} {statistics.median(sick['latencies']):6.2f} "
            f"{_p(sick['latencies'], 0.99):6.2f} {refused:>17} "
            f"{min(limits):>8}..{max(limits):<4} median {statistics.median(limits):g}"
        )
    print("refused = healthy/slow/back; Little's-law value: 10 in flight healthy, 20 slow (the partner's workers)")


def retry_budgets() -> None:
    """Print the dependency's load amplification during an outage, with and without a budget."""
    cfg = RetryConfig(max_attempts=3, wait_duration="0s")
    for name, budget_cfg in (
        ("no budget", None),
        ("percent_can_retry 0.1, no floor", RetryBudgetConfig(percent_can_retry=0.1, min_retries_per_second=0)),
        ("Finagle's defaults (0.2, 10/s)", RetryBudgetConfig()),
    ):
        clock = FakeClock()
        budget = RetryBudget("dep", budget_cfg, clock=clock) if budget_cfg is not None else None
        calls, received = outage(Retry("r", cfg, clock=clock, budget=budget), clock, calls_per_second=100, seconds=60)
        print(f"retry, 3 attempts, {name:34} load x{received / calls:.3f}")


if __name__ == "__main__":
    bulkheads()
    print()
    retry_budgets()
