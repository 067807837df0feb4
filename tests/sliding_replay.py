"""The store operations both keyed sliding-window property tests replay against the pure reference."""

from __future__ import annotations

from typing import Any

from django_ratelimit_r4.backends.algorithms import sliding_available, sliding_decide, sliding_give_back
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.keyed_smooth import SlidingWindowKeyedStore


def replay_store_op(
    store: SlidingWindowKeyedStore,
    clock: FakeClock,
    logs: dict[str, tuple[int, ...]],
    op: tuple[Any, ...],
    fresh: tuple[int, ...],
    period: int,
) -> bool:
    """Apply ``op`` ("advance", "reset", "drain" or "give_back") to ``store`` and to ``logs`` (each key's
    reference log of grant times), asserting the store answers as the reference; False for any other op,
    which the caller replays itself."""
    now = clock.now_ns()
    if op[0] == "advance":
        clock.advance_ns(op[1])
    elif op[0] == "reset":
        store.reset(op[1])
        logs[op[1]] = fresh
    elif op[0] == "drain":
        times = logs[op[1]]
        drained = sliding_available(times, now, period)
        if drained:
            logs[op[1]] = sliding_decide(times, drained, 0, now, period)[0]
        assert store.drain(op[1]) == drained
    elif op[0] == "give_back":
        _, key, permits, delay = op
        times, wait, granted = sliding_decide(logs[key], permits, 0, now, period)
        assert store.decide(key, permits, 0) == (wait if granted else -wait)
        if granted:
            clock.advance_ns(delay)
            store.give_back(key, permits, now)
            logs[key] = sliding_give_back(times, permits, now, clock.now_ns(), period)
    else:
        return False
    return True
