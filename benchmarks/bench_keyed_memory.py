"""Memory of one in-memory keyed rate limiter full of clients: bytes per live key, and the total at ``max_keys``.

Fills a ``KeyedRateLimiter`` with N distinct clients, each of which took one permit (so each holds state and
none is dropped as full), with the keys the HTTP layer stores (``ip:<IPv4>`` or ``ip:<IPv6 /64>``, built
inside the measured region as a request's key function would build them). Two figures per row:

* ``tracemalloc``: bytes Python allocated for the store, key strings included (exact, allocator-level);
* RSS: growth of the process's resident set (Linux ``/proc/self/statm``), what the worker really costs,
  allocator slack and the dict's table included. Measured in a fresh child process per row, so one row's
  freed-but-kept memory does not hide the next one's.

This is what sizes the default ``max_keys`` (``conf.DEFAULT_MAX_KEYS``): one keyed limiter per worker must stay
in tens of MB at its cap. Run:

    python benchmarks/bench_keyed_memory.py                    # the default max_keys, and 1,000,000
    python benchmarks/bench_keyed_memory.py 100000 1000000     # chosen sizes
    python benchmarks/run.py keyed_memory                      # the default max_keys only
    python benchmarks/bench_keyed_memory.py --algorithm sliding_window --limit 100 10000
                                                               # another algorithm (and limit_for_period)
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_ratelimit_r4.conf import DEFAULT_MAX_KEYS
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiterConfig
from django_ratelimit_r4.keyed import KeyedRateLimiter

__all__ = ["measure", "run"]

_KINDS = ("ipv4", "ipv6")
_MB = 1_000_000


def _key(kind: str, i: int) -> str:
    if kind == "ipv4":
        return f"ip:10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
    return f"ip:2001:db8:{i >> 16 & 0xFFFF:x}:{i & 0xFFFF:x}::/64"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(n: int, kind: str, how: str, algorithm: str = "cycle", limit: int = 10) -> float:
    """Bytes per key for ``n`` live keys of ``kind`` in this process, by ``how``: "tracemalloc" or "rss"; each
    key took one permit of a ``limit`` per hour ``algorithm`` limiter.

    The two are separate runs: tracemalloc's own bookkeeping would inflate the RSS figure.
    """
    limiter = KeyedRateLimiter(
        "mem",
        RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1h", algorithm=algorithm),
        clock=FakeClock(),
        max_keys=n,
    )
    gc.collect()
    if how == "rss":
        before = _rss_bytes()
        for i in range(n):
            limiter.acquire_permission(_key(kind, i))
        gc.collect()
        used = _rss_bytes() - before
    else:
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            for i in range(n):
                limiter.acquire_permission(_key(kind, i))
            used = tracemalloc.get_traced_memory()[0] - start
        finally:
            tracemalloc.stop()
    assert len(limiter) == n
    return used / n


def _child(n: int, kind: str, how: str, algorithm: str = "cycle", limit: int = 10) -> float:
    """:func:`measure` in a fresh interpreter (figures do not carry over between rows)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[4]); import bench_keyed_memory as b; "
        "print(b.measure(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[5], int(sys.argv[6])))"
    )
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code, str(n), kind, how, str(here), algorithm, str(limit)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return float(out.strip().splitlines()[-1])


def run(
    sizes: tuple[int, ...] = (DEFAULT_MAX_KEYS,), algorithm: str = "cycle", limit: int = 10
) -> list[dict[str, Any]]:
    """Rows for ``benchmarks/run.py``: bytes per key and the total at each size (no timing)."""
    rows = []
    what = "" if algorithm == "cycle" else f" {algorithm} (limit {limit})"
    for n in sizes:
        for kind in _KINDS:
            traced = _child(n, kind, "tracemalloc", algorithm, limit)
            text = f"tracemalloc {traced:.0f} B/key = {traced * n / _MB:.0f} MB"
            if sys.platform == "linux":
                rss = _child(n, kind, "rss", algorithm, limit)
                text += f"; RSS {rss:.0f} B/key = {rss * n / _MB:.0f} MB"
            rows.append({"name": f"memory: KeyedRateLimiter{what}, {n:,} live {kind} keys", "target": text})
    return rows


def main(argv: list[str]) -> int:
    algorithm, limit = "cycle", 10
    if "--algorithm" in argv:
        at = argv.index("--algorithm")
        algorithm = argv[at + 1]
        del argv[at : at + 2]
    if "--limit" in argv:
        at = argv.index("--limit")
        limit = int(argv[at + 1])
        del argv[at : at + 2]
    sizes = tuple(int(a) for a in argv) or (DEFAULT_MAX_KEYS, 1_000_000)
    print(f"python {sys.version.split()[0]}, default max_keys {DEFAULT_MAX_KEYS:,}")
    for row in run(sizes, algorithm, limit):
        print(f"{row['name']:52}  {row['target']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
