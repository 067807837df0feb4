"""How fast a cluster-wide circuit breaker's transition reaches the other workers, and what CLOSED costs.

Three follower processes (forked, each with its own ``RedisCircuitBreaker``: listener thread, connections)
record the wall-clock time at which their breaker publishes STATE_TRANSITION; the leader process opens the
breaker by failures (the transition is written by its sender thread with a compare-and-set, then published)
or by a manual ``transition_to_closed_state()``. The delay is follower time minus the leader's time just
before the call that crossed the threshold (or the manual call): local detection + the sender's script +
pub/sub + the follower's adoption. Target: <= 100 ms (issue 11); each row's ``ns_per_op`` is that percentile
of all follower observations, ``baseline_ns`` a ``PING`` round trip.

The last rows compare a CLOSED call (no round trip) through the shared breaker with the in-process one.

Run: ``python benchmarks/bench_breaker_propagation.py`` (needs Redis at ``R4_REDIS_URL``, default
redis://127.0.0.1:6379/15; keys under a random ``r4bench:`` prefix, deleted afterwards).
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

try:  # python -m benchmarks.bench_breaker_propagation
    from ._timing import best_pair, print_rows
except ImportError:  # benchmarks/run.py, or run as a script
    from _timing import best_pair, print_rows  # type: ignore[no-redef]

from django_ratelimit_r4.backends.redis_breaker import RedisCircuitBreaker
from django_ratelimit_r4.core.circuitbreaker import CircuitBreaker, CircuitBreakerConfig, State

URL = os.environ.get("R4_REDIS_URL", "redis://127.0.0.1:6379/15")
FOLLOWERS = 3
ROUNDS = 30
TARGET_NS = 100_000_000
CONFIG = CircuitBreakerConfig(sliding_window_size=10, minimum_number_of_calls=10, wait_duration_in_open_state="60s")


def _boom() -> None:
    raise ConnectionError("partner down")


def _follower(prefix: str, ready: Any, out: Any, stop: Any) -> None:
    b = RedisCircuitBreaker("partner", CONFIG, url=URL, prefix=prefix)
    b.events.on_state_transition(lambda e: out.put((e.to_state.name, time.time_ns())))
    assert b.wait_listening(30) and b.state is State.CLOSED
    ready.wait()
    stop.wait()
    b.close()


def _percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))])


def _ping_ns(client: redis.Redis) -> float:
    best = float("inf")
    for _ in range(200):
        t = time.perf_counter_ns()
        client.ping()
        best = min(best, time.perf_counter_ns() - t)
    return best


def _propagation(prefix: str) -> tuple[list[int], list[int]]:
    ctx = multiprocessing.get_context("fork")
    ready, stop, out = ctx.Barrier(FOLLOWERS + 1), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_follower, args=(prefix, ready, out, stop)) for _ in range(FOLLOWERS)]
    for p in procs:
        p.start()
    leader = RedisCircuitBreaker("partner", CONFIG, url=URL, prefix=prefix)
    opened: list[int] = []
    closed: list[int] = []
    try:
        assert leader.state is State.CLOSED
        ready.wait(60)
        for _ in range(ROUNDS):
            for _ in range(CONFIG.minimum_number_of_calls - 1):
                with contextlib.suppress(ConnectionError):
                    leader.call(_boom)
            t0 = time.time_ns()
            with contextlib.suppress(ConnectionError):
                leader.call(_boom)
            for _ in procs:
                state, at = out.get(timeout=30)
                assert state == "OPEN", state
                opened.append(at - t0)
            t0 = time.time_ns()
            leader.transition_to_closed_state()
            for _ in procs:
                state, at = out.get(timeout=30)
                assert state == "CLOSED", state
                closed.append(at - t0)
    finally:
        stop.set()
        for p in procs:
            p.join(30)
        leader.close()
    return opened, closed


def run() -> list[dict[str, Any]]:
    """Measure every row; each is ``{name, ns_per_op, baseline_ns, ratio, target}``."""
    prefix = f"r4bench:{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(URL)
    rows: list[dict[str, Any]] = []
    try:
        ping = _ping_ns(client)
        opened, closed = _propagation(prefix)
        for label, values in (("opened by failures", opened), ("manual transition_to_closed", closed)):
            for q, name in ((0.5, "p50"), (0.95, "p95"), (1.0, "max")):
                ns = _percentile(values, q)
                rows.append(
                    {
                        "name": f"breaker propagation, {label}, {name} ({len(values)} obs.)",
                        "ns_per_op": round(ns, 1),
                        "baseline_ns": round(ping, 1),
                        "ratio": round(ns / ping, 2),
                        "target": "<= 100 ms" if ns <= TARGET_NS else "<= 100 ms MISSED",
                    }
                )
        shared = RedisCircuitBreaker("closed-path", CONFIG, url=URL, prefix=prefix)
        assert shared.state is State.CLOSED
        local = CircuitBreaker("closed-path", CONFIG)
        # Interleaved best-of (benchmarks/_timing.py), so a busy neighbour slows both alike.
        s_ns, l_ns = best_pair(functools.partial(shared.call, int), functools.partial(local.call, int), 200_000, 5)
        shared.close()
        rows.append(
            {
                "name": "CLOSED call, shared breaker (no round trip)",
                "ns_per_op": round(s_ns, 1),
                "baseline_ns": round(l_ns, 1),
                "ratio": round(s_ns / l_ns, 2),
                "target": "vs in-process CircuitBreaker",
            }
        )
    finally:
        keys = list(client.scan_iter(match=prefix + ":*"))
        if keys:
            client.delete(*keys)
        client.close()
    return rows


def main() -> int:
    """Print the rows."""
    rows = run()
    print_rows(rows, baseline_label="PING ns")
    return 0


if __name__ == "__main__":
    threading.excepthook = lambda args: None  # the followers' daemon threads end with the processes
    raise SystemExit(main())
