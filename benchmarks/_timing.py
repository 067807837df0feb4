"""Timing helpers shared by the ``bench_*`` modules (not a benchmark itself: run.py skips ``_`` files)."""

from __future__ import annotations

import timeit
from collections.abc import Callable
from typing import Any


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
