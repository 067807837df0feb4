"""Issue 12's deterministic simulation harness: adaptive bulkhead limits and retry budgets on the fake clock.

    python benchmarks/sim_adaptive.py                          # the tables (markdown)
    python benchmarks/sim_adaptive.py --plot docs/img/adaptive-limits.png   # and the plot (needs matplotlib:
                                                               # pip install 'django-ratelimit-r4[sim]')

Bulkheads: calls arrive every 1/200 s at a bulkhead in front of a partner with ``WORKERS`` = 20 workers (a FIFO
queue beyond them). The partner takes 50 ms per call for 30 s, then 500 ms for 30 s (it slows down), then 50 ms
again. Little's law gives the concurrency the partner can use in each phase: throughput x latency = 200/s x
50 ms = 10 when healthy, 40/s x 500 ms = 20 when slow (it cannot do more than 20 / 0.5 s = 40 calls/s; more
in flight only queue). For each variant (fixed bulkheads sized by hand, each adaptive algorithm) the harness
reports goodput, the p50/p99 latency of admitted calls, rejections, and how long after each step the limit
took to settle within 20 % of the Little's-law value (and stay there to the end of the phase). A few variants
run again with each service time jittered by ± 40 % (seeded, so still deterministic).

Retry budgets: 100 failing calls/s for 60 s through a retry of 3 attempts, with and without a budget; the
dependency's load amplification is the attempts it received per logical call.

Everything runs on :class:`~django_ratelimit_r4.core.clock.FakeClock`: the numbers are the same on every
machine and every run. ``tests/core/test_adaptive_sim.py`` runs the same functions and asserts the targets.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_ratelimit_r4.core.bulkhead import Bulkhead, BulkheadConfig
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.retry import Retry, RetryConfig
from django_ratelimit_r4.core.retrybudget import RetryBudget, RetryBudgetConfig

S = 1_000_000_000
#: (seconds, partner latency in s): healthy, slow, healthy again.
PHASES: list[tuple[int, float]] = [(30, 0.05), (30, 0.5), (30, 0.05)]
RATE = 200  # calls offered per second
WORKERS = 20  # the partner's capacity: calls it serves at once (FIFO queue beyond)
SAMPLE_S = 0.1  # the limit and the calls in flight are sampled this often
TOLERANCE = 0.2  # "converged": within 20 % of the Little's-law value

_ADAPTIVE = {"min_limit": 5, "max_limit": 500}
#: (name, max_concurrent_calls, adaptive options or None): the harness's variants.
VARIANTS: list[tuple[str, int, dict[str, Any] | None]] = [
    ("fixed 10 (Little's law, healthy: 200/s x 50 ms)", 10, None),
    ("fixed 20 (the partner's 20 workers, if you know them)", 20, None),
    ("fixed 100 (Little's law on the offered load, slow: 200/s x 500 ms)", 100, None),
    ("gradient2", 20, {"algorithm": "gradient2", **_ADAPTIVE}),
    ("gradient2, windowed", 20, {"algorithm": "gradient2", "windowed": True, **_ADAPTIVE}),
    ("aimd (timeout 750 ms)", 20, {"algorithm": "aimd", "timeout": "750ms", **_ADAPTIVE}),
    ("aimd (timeout 750 ms), windowed", 20, {"algorithm": "aimd", "timeout": "750ms", "windowed": True, **_ADAPTIVE}),
    ("vegas", 20, {"algorithm": "vegas", **_ADAPTIVE}),
    ("vegas, windowed", 20, {"algorithm": "vegas", "windowed": True, **_ADAPTIVE}),
    ("littles_law", 20, {"algorithm": "littles_law", **_ADAPTIVE}),
]


def littles_law_value(service_s: float, *, rate: int = RATE, workers: int = WORKERS) -> float:
    """The concurrency the partner can use: its throughput (offered, at most ``workers / service_s``) x latency."""
    return min(rate, workers / service_s) * service_s


@dataclass
class Phase:
    """What one phase of a run measured."""

    seconds: int
    service_s: float
    littles_law: float
    latencies: list[float] = field(default_factory=list)  # of admitted calls that completed, in s
    rejected_at: list[float] = field(default_factory=list)  # s into the phase
    completed: int = 0
    limits: list[int] = field(default_factory=list)  # every SAMPLE_S
    in_flight: list[int] = field(default_factory=list)  # every SAMPLE_S

    @property
    def goodput(self) -> float:
        """Completed calls per second."""
        return self.completed / self.seconds

    def latency(self, q: float) -> float:
        """The ``q`` quantile of the admitted calls' latency (s)."""
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    def convergence_s(self, tolerance: float = TOLERANCE) -> float | None:
        """Seconds into the phase after which the limit stays within ``tolerance`` of the Little's-law value;
        None if it never settles there."""
        low, high = self.littles_law * (1 - tolerance), self.littles_law * (1 + tolerance)
        settled = None
        for i, limit in enumerate(self.limits):
            if low <= limit <= high:
                if settled is None:
                    settled = i
            else:
                settled = None
        return None if settled is None else settled * SAMPLE_S


def simulate(
    config: BulkheadConfig,
    *,
    rate: int = RATE,
    workers: int = WORKERS,
    phases: list[tuple[int, float]] = PHASES,
    jitter: float = 0.0,
) -> list[Phase]:
    """Drive a bulkhead built from ``config`` on a FakeClock through ``phases``; one :class:`Phase` each.

    Calls arrive every ``1 / rate`` s. An admitted call goes to the first free worker (or waits for one, FIFO)
    and takes the phase's latency there (times a uniform factor in ``1 ± jitter``, from a generator seeded with
    1: runs repeat); its completion is the bulkhead sample (``on_complete(start_ns=...)``).
    """
    rng = random.Random(1)
    clock = FakeClock()
    bulkhead = Bulkhead("acquirer", config, clock=clock)
    t0 = clock.now_ns()
    out = [Phase(seconds, service, littles_law_value(service, rate=rate, workers=workers)) for seconds, service in phases]
    bounds, end = [], 0
    for seconds, _ in phases:
        bounds.append((end, end + seconds * S))
        end += seconds * S
    done: list[tuple[int, int, int, int]] = []  # (finish, seq, start_ns, phase)
    free_at = [0] * workers
    step, next_arrival, next_sample, seq = S // rate, 0, 0, 0
    sample_ns = int(SAMPLE_S * S)
    metrics = bulkhead.metrics

    def phase_of(t: int) -> int:
        return next(i for i, (a, z) in enumerate(bounds) if a <= t < z)

    while True:
        t = min(next_arrival, done[0][0] if done else end)
        if t >= end:
            return out
        clock.advance_ns(t0 + t - clock.now_ns())
        while next_sample <= t:
            p = out[phase_of(next_sample)]
            p.limits.append(metrics.max_allowed_concurrent_calls)
            p.in_flight.append(metrics.concurrent_calls)
            next_sample += sample_ns
        if done and done[0][0] == t:
            finish, _, start, i = heapq.heappop(done)
            bulkhead.on_complete(start_ns=start)
            out[i].latencies.append((finish - (start - t0)) / S)
            out[i].completed += 1
            continue
        i = phase_of(t)
        if bulkhead.try_acquire_permission():
            begin = max(heapq.heappop(free_at), t)
            service = phases[i][1] * (rng.uniform(1 - jitter, 1 + jitter) if jitter else 1)
            finish = begin + int(service * S)
            heapq.heappush(free_at, finish)
            seq += 1
            heapq.heappush(done, (finish, seq, clock.now_ns(), i))
        else:
            out[i].rejected_at.append((t - bounds[i][0]) / S)
        next_arrival += step


#: Variants run again with every service time jittered by ± 40 % (a real partner's latency varies).
JITTERED: list[tuple[str, int, dict[str, Any] | None]] = [
    (f"{name}, latency ± 40 %", initial, adaptive)
    for name, initial, adaptive in VARIANTS
    if name in ("fixed 20 (the partner's 20 workers, if you know them)", "aimd (timeout 750 ms), windowed", "littles_law")
]


def run_variant(initial: int, adaptive: dict[str, Any] | None, jitter: float = 0.0) -> list[Phase]:
    """:func:`simulate` one of :data:`VARIANTS`."""
    return simulate(BulkheadConfig(max_concurrent_calls=initial, adaptive=adaptive), jitter=jitter)


def _conv(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def bulkhead_table() -> tuple[str, dict[str, list[Phase]]]:
    """The bulkhead table (markdown) and each variant's phases."""
    runs = {name: run_variant(initial, adaptive) for name, initial, adaptive in VARIANTS}
    runs.update({name: run_variant(initial, adaptive, 0.4) for name, initial, adaptive in JITTERED})
    lines = [
        "| Bulkhead | goodput, calls/s (healthy / slow / back) | slow: p50 / p99 | refused (healthy / slow / back) "
        "| limit in the slow phase (last 20 s) | settled within 20 % (after the slow-down / after the recovery) |",
        "|---|---|---|---|---|---|",
    ]
    for name, phases in runs.items():
        healthy, slow, back = phases
        tail = slow.limits[int(10 / SAMPLE_S) :]
        lines.append(
            f"| {name} | {healthy.goodput:.0f} / {slow.goodput:.1f} / {back.goodput:.0f} "
            f"| {slow.latency(0.5):.2f} s / {slow.latency(0.99):.2f} s "
            f"| {len(healthy.rejected_at)} / {len(slow.rejected_at)} / {len(back.rejected_at)} "
            f"| {min(tail)}..{max(tail)} | {_conv(slow.convergence_s())} / {_conv(back.convergence_s())} |"
        )
    lines.append("")
    lines.append(
        f"Little's-law value: {PHASES and littles_law_value(PHASES[0][1]):g} in flight healthy, "
        f"{littles_law_value(PHASES[1][1]):g} slow. The partner can complete at most 40 calls/s while slow."
    )
    return "\n".join(lines), runs


def retry_amplification(budget: RetryBudgetConfig | None, *, calls_per_second: int = 100, seconds: int = 60) -> float:
    """Attempts a failing dependency receives per logical call through a 3-attempt retry (with ``budget``)."""
    clock = FakeClock()
    retry = Retry(
        "r",
        RetryConfig(max_attempts=3, wait_duration="0s"),
        clock=clock,
        budget=RetryBudget("dep", budget, clock=clock) if budget is not None else None,
    )
    received = 0

    def down() -> None:
        nonlocal received
        received += 1
        raise ConnectionError("down")

    calls = calls_per_second * seconds
    for _ in range(calls):
        with contextlib.suppress(ConnectionError):
            retry.call(down)
        clock.advance(1 / calls_per_second)
    return received / calls


RETRY_VARIANTS: list[tuple[str, RetryBudgetConfig | None]] = [
    ("no budget", None),
    ("budget: percent_can_retry 0.1, min_retries_per_second 0", RetryBudgetConfig(percent_can_retry=0.1, min_retries_per_second=0)),
    ("budget: Finagle's defaults (0.2, 10/s)", RetryBudgetConfig()),
]


def retry_table() -> str:
    """The retry-budget table (markdown)."""
    lines = ["| Retry (3 attempts), 100 failing calls/s for 60 s | load on the dependency |", "|---|---|"]
    for name, budget in RETRY_VARIANTS:
        lines.append(f"| {name} | {retry_amplification(budget):.3f}x |")
    return "\n".join(lines)


def plot(runs: dict[str, list[Phase]], path: str) -> None:
    """Draw each variant's limit over time against the Little's-law value (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=100)
    shown = [
        n
        for n in runs
        if n.startswith(("fixed 10", "fixed 100", "gradient2, windowed", "aimd (timeout 750 ms), windowed", "vegas"))
        and "± 40 %" not in n
        and n != "vegas, windowed"
    ] + ["littles_law", "littles_law, latency ± 40 %"]
    for name in shown:
        limits = [v for phase in runs[name] for v in phase.limits]
        width = 2.0 if name == "littles_law" else 1.0
        ax.step([i * SAMPLE_S for i in range(len(limits))], limits, where="post", label=name, linewidth=width)
    t, xs, lo, hi, mid = 0.0, [], [], [], []
    for seconds, service in PHASES:
        value = littles_law_value(service)
        xs += [t, t + seconds]
        mid += [value, value]
        lo += [value * (1 - TOLERANCE)] * 2
        hi += [value * (1 + TOLERANCE)] * 2
        t += seconds
    ax.fill_between(xs, lo, hi, color="grey", alpha=0.25, label="Little's-law value ± 20 %")
    ax.plot(xs, mid, color="black", linewidth=1, linestyle="--")
    ax.set_ylim(0, 110)
    ax.set_xlabel("simulated time (s): partner latency 50 ms, 500 ms from 30 s, 50 ms from 60 s")
    ax.set_ylabel("bulkhead limit (calls in flight)")
    ax.set_title("Adaptive concurrency limits through a 10x latency step (FakeClock; jitter seeded)")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Print both tables; with ``--plot PATH`` also write the limit plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", metavar="PATH", help="write the limits plot (PNG) here; needs matplotlib")
    args = parser.parse_args(argv)
    table, runs = bulkhead_table()
    print(table)
    print()
    print(retry_table())
    if args.plot:
        plot(runs, args.plot)
        print(f"\nplot written to {args.plot}")


if __name__ == "__main__":
    main()
