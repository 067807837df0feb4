"""What Prometheus metrics cost a decision, and what the multiprocess syncer costs, measured in one run.

Target (issue 4): metrics add at most 10 % to a decision's cost in the single-process case. The design
adds nothing to the hot path (a collector reads the primitives' counters at scrape time), so the rows
compare ``acquire_permission()`` with metrics installed and scraped against the same call without them.

Multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) runs in a child process, because prometheus_client
picks its file-backed values when it is first imported. Its rows: a decision while the per-worker
syncer thread runs (default 1 s interval), and the cost of one sync over the benchmark's instances
(informational; divide by the interval for the share of one core it uses).

Run: ``python benchmarks/bench_metrics.py`` or ``python benchmarks/run.py metrics``. Each figure is the
best of several timeit repeats; subject and baseline repeats are interleaved where they can be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:  # python -m benchmarks.bench_x
    from ._timing import print_rows
except ImportError:  # benchmarks/run.py, or run as a script
    from _timing import print_rows  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(ROOT))

__all__ = ["BENCH_SETTING", "run"]

TARGET_RATIO = 1.10
NUMBER = 100_000
REPEAT = 7
SCRAPES = 200

#: A realistic service: a dozen limiters and a few of every other kind, all exported.
BENCH_SETTING: dict[str, Any] = {
    "ratelimiters": {
        "configs": {
            "default": {"limit_for_period": 10**15, "limit_refresh_period": "1h", "timeout_duration": "0s"}
        },
        "instances": {f"rl{i}": {} for i in range(12)},
    },
    "bulkheads": {"instances": {f"bh{i}": {"max_concurrent_calls": 10} for i in range(3)}},
    "circuitbreakers": {"instances": {f"cb{i}": {} for i in range(3)}},
    "retries": {"instances": {f"rt{i}": {} for i in range(2)}},
    "timelimiters": {"instances": {f"tl{i}": {} for i in range(2)}},
}


def _setup_django() -> None:
    """Use the caller's settings if they load, else a minimal configuration (the benchmark's own)."""
    import django
    from django.conf import settings

    if not settings.configured:
        try:
            settings.INSTALLED_APPS  # noqa: B018 - loads DJANGO_SETTINGS_MODULE if there is one
        except Exception:
            settings.configure(INSTALLED_APPS=["django_ratelimit_r4"], RATELIMIT_R4=BENCH_SETTING)
    django.setup()


@contextmanager
def _bench_setting() -> Iterator[None]:
    from django.test import override_settings

    with override_settings(RATELIMIT_R4=BENCH_SETTING):
        yield


def _best(fn: Callable[[], Any], number: int) -> float:
    return timeit.Timer("f()", globals={"f": fn}).timeit(number) / number * 1e9


def _row(name: str, ns: float, base: float | None, target: float | None) -> dict[str, Any]:
    return {
        "name": name,
        "ns_per_op": round(ns, 1),
        "baseline_ns": None if base is None else round(base, 1),
        "ratio": None if base is None else round(ns / base, 3),
        "target": target,
    }


def _single_process(number: int, repeat: int) -> list[dict[str, Any]]:
    from prometheus_client import REGISTRY, generate_latest

    import django_ratelimit_r4 as r4
    from django_ratelimit_r4.contrib import prometheus

    decide = r4.get_rate_limiter("rl0").acquire_permission
    was_installed = prometheus.installed_mode() is not None  # e.g. by AppConfig.ready()
    best_with = best_without = float("inf")
    try:
        for _ in range(repeat):
            # Interleaved: without metrics, then installed and scraped, so noise hurts both alike.
            prometheus.uninstall()
            best_without = min(best_without, _best(decide, number))
            prometheus.install(multiprocess=False)
            generate_latest(REGISTRY)
            best_with = min(best_with, _best(decide, number))
    finally:
        if not was_installed:
            prometheus.uninstall()
    rows = [
        _row("decision with metrics installed vs none (1 process)", best_with, best_without, TARGET_RATIO)
    ]

    collect = prometheus.collector.collect
    scrape = min(_best(lambda: list(collect()), SCRAPES) for _ in range(3))
    rows.append(_row("info: one scrape of r4's collector (22 instances)", scrape, None, None))
    return rows


def _multiprocess_child(number: int, repeat: int) -> list[dict[str, Any]]:
    """Runs with PROMETHEUS_MULTIPROC_DIR set, in its own process."""
    import django_ratelimit_r4 as r4
    from django_ratelimit_r4.contrib import prometheus

    assert prometheus.install() == prometheus.MULTIPROCESS
    decide = r4.get_rate_limiter("rl0").acquire_permission
    best_without = min(_best(decide, number) for _ in range(repeat))  # syncer not started yet
    prometheus.sync_now()  # starts the 1 s syncer thread
    best_with = min(_best(decide, number) for _ in range(repeat))
    sync = min(_best(prometheus.sync_now, SCRAPES) for _ in range(3))
    return [
        _row("decision with multiprocess syncer running vs not", best_with, best_without, TARGET_RATIO),
        _row("info: one multiprocess sync (22 instances)", sync, None, None),
    ]


def _run_multiprocess_child(number: int, repeat: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="r4-bench-multiproc-") as directory:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
        env.pop("DJANGO_SETTINGS_MODULE", None)  # the child configures its own settings
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--multiprocess-child", str(number), str(repeat)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"multiprocess benchmark child failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run(number: int = NUMBER, repeat: int = REPEAT) -> list[dict[str, Any]]:
    """Measure every row; each is ``{name, ns_per_op, baseline_ns, ratio, target}`` (target None = info)."""
    _setup_django()
    with _bench_setting():
        rows = _single_process(number, repeat)
    return rows + _run_multiprocess_child(number, repeat)


def main() -> int:
    """Print the rows; exit status 1 if a targeted row misses its target."""
    return print_rows(run())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--multiprocess-child":
        _setup_django()
        with _bench_setting():
            print(json.dumps(_multiprocess_child(int(sys.argv[2]), int(sys.argv[3]))))
        raise SystemExit(0)
    raise SystemExit(main())
