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


def exhaust(fn: Callable[[], bool]) -> Callable[[], bool]:
    """Call ``fn`` until it says no (a limiter out of permits), then return it for timing denials."""
    for _ in range(20_000):
        if not fn():
            break
    return fn
