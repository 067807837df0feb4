"""The in-memory keyed sliding window (``keyed_smooth.SlidingWindowKeyedStore``) against the pure reference.

The store keeps each key's log as a ring in an ``array('q')`` with its head, its newest time and a hint for the
header figures (how many logged permits are known to have left the window, and the time of the next slot),
all mutated in place under the lock. These properties drive it through every path that writes the state (a
one-permit grant, a reservation, several permits, a drain, a give-back, a new key, a dropped full key) with
larger logs than the generic tests, and check each answer against :mod:`django_ratelimit_r4.backends.algorithms`
step by step, and the state's own invariants after every step.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.backends.algorithms import (
    sliding_available,
    sliding_decide,
    sliding_quota,
)
from django_ratelimit_r4.backends.memory import _INDEXES
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import RateLimiterConfig
from django_ratelimit_r4.keyed import KeyedRateLimiter
from django_ratelimit_r4.keyed_smooth import SlidingWindowKeyedStore
from tests.sliding_replay import replay_store_op

T = 1_000  # the period in ns: the steps below cross it often

_quota1 = st.tuples(st.just("quota1"), st.sampled_from("ab"), st.sampled_from([0, 0, 0, 300, 5_000]))
_small_step = st.tuples(st.just("advance"), st.integers(0, 60))
_ops = st.lists(
    st.one_of(
        # One-permit grants with their figures, a few ns apart: the hint's common paths (weighted up).
        _quota1,
        _small_step,
        st.tuples(st.just("acquire_quota"), st.sampled_from("ab")),  # the limiter's, written out by the store
        _small_step,
        st.tuples(st.just("acquire_permission"), st.sampled_from("ab")),
        st.tuples(st.just("decide"), st.sampled_from("ab"), st.integers(1, 14), st.sampled_from([0, 0, 400])),
        st.tuples(st.just("advance"), st.one_of(st.integers(0, 1_200), st.just(T))),
        st.tuples(st.just("drain"), st.sampled_from("ab")),
        st.tuples(st.just("give_back"), st.sampled_from("ab"), st.integers(1, 4), st.integers(0, 700)),
        st.tuples(st.just("reset"), st.sampled_from("ab")),
    ),
    max_size=120,
)


def _check_state(store: SlidingWindowKeyedStore, now: int) -> None:
    """Every stored key's invariants: the slots from the head up to ``edge`` have left the window (always: a
    one-permit grant takes one of them without reading the ring, so no reservation may be pending then),
    ``after`` (when known) is the time the slot at ``edge`` leaves it, and ``head`` and ``edge`` are the shared
    index objects. The ring holds the log's newest ``len(ring)`` times, the ``spare`` older ones are free (not
    held: tests/test_keyed_sliding_memory.py checks the growth)."""
    limit = store._limit
    for state in store._states.values():
        head, edge, ring, after = state.head, state.edge, state.ring, state.after
        size = len(ring)
        assert size + state.spare == limit and 0 <= head < size and 0 <= edge < size
        assert head is _INDEXES[head] and edge is _INDEXES[edge]
        logged = ring[head:] + ring[:head]
        assert list(logged) == sorted(logged)
        newest = logged[-1]
        out = (edge - head) % size
        assert all(t <= now - T for t in logged[:out])
        assert not out or newest <= now  # so a grant from the known-out slots is never a reservation
        if after is not None:
            assert after == logged[out] + T  # when the slot at edge leaves the window


@settings(max_examples=400, deadline=None)
@given(limit=st.integers(1, 12), ops=_ops)
@example(
    limit=3, ops=[("quota1", "a", 0), ("advance", 1), ("quota1", "a", 0), ("advance", 1), ("quota1", "a", 0)]
)
@example(limit=4, ops=[("acquire_quota", "a"), ("advance", 1)] * 6)
def test_the_store_answers_as_the_reference_step_by_step(limit: int, ops: list[Any]) -> None:
    clock = FakeClock(start_ns=0)
    config = RateLimiterConfig(
        limit_for_period=limit, limit_refresh_period=f"{T}ns", algorithm="sliding_window"
    )
    limiter = KeyedRateLimiter("s", config, clock=clock, max_keys=10)
    store = limiter.store
    assert isinstance(store, SlidingWindowKeyedStore)
    fresh = (-T,) * limit
    logs = {"a": fresh, "b": fresh}
    for op in ops:
        now = clock.now_ns()
        if replay_store_op(store, clock, logs, op, fresh, T):
            pass  # advance, reset, drain or give_back: replayed and checked there
        elif op[0] == "acquire_permission":
            times, wait, granted = sliding_decide(logs[op[1]], 1, 0, now, T)
            if granted:
                logs[op[1]] = times
            assert limiter.acquire_permission(op[1]) is granted
        elif op[0] == "acquire_quota":
            key = op[1]
            times, wait, granted = sliding_decide(logs[key], 1, 0, now, T)
            try:
                got: Any = limiter.acquire_quota(key)
            except RequestNotPermitted as exc:
                got = ("rejected", exc.wait_ns, exc.quotas)
            if granted:
                logs[key] = times
                assert got == sliding_quota(times, now, T)
            else:
                assert got == ("rejected", wait, (sliding_quota(times, now, T),))
        else:
            key = op[1]
            permits, timeout = (1, op[2]) if op[0] == "quota1" else (op[2], op[3])
            before = logs[key]
            times, wait, granted = sliding_decide(before, permits, timeout, now, T)
            if granted:
                logs[key] = times
            if op[0] == "quota1":
                figures = sliding_quota(times if granted else before, now, T)
                assert store.decide_quota(key, 1, timeout) == ((wait if granted else -wait), *figures)
            else:
                assert store.decide(key, permits, timeout) == (wait if granted else -wait)
        now = clock.now_ns()
        _check_state(store, now)
        for key, times in logs.items():
            assert store.quota(key) == sliding_quota(times, now, T)
            assert store.state(key)[1] == sliding_available(times, now, T)
    assert store.lossy_evictions == 0


def _sliding(limit: int = 5, period: str = "1s", **kw: Any) -> tuple[KeyedRateLimiter, FakeClock]:
    clock = FakeClock(start_ns=0)
    config = RateLimiterConfig(
        limit_for_period=limit, limit_refresh_period=period, algorithm="sliding_window"
    )
    return KeyedRateLimiter("s", config, clock=clock, **kw), clock


def test_keys_are_ordered_by_the_period_of_their_last_grant() -> None:
    """An entry moves to the end at its key's first grant in a period (every way a grant is decided), so the
    front holds the keys unused the longest, by period; grants within the period leave the order alone."""
    limiter, clock = _sliding()
    for key in "abcd":
        limiter.acquire_permission(key)
    limiter.acquire_quota("a")  # same period: no move
    assert limiter.keys() == list("abcd")
    clock.advance_ns(1_000_000_000)  # the next period (from the store's anchor)
    limiter.acquire_quota("b")  # new period: the first grant (decide_quota) moves it
    limiter.acquire_quota("b")  # the written-out path, now that the figures' hint is known
    limiter.acquire_permission("a")  # decide
    limiter.store.decide_quota("c", 2, 0)  # several permits: the general path
    assert limiter.keys() == ["d", "b", "a", "c"]
    clock.advance_ns(1_000_000_000)
    limiter.acquire_quota("d")
    assert limiter.keys() == ["b", "a", "c", "d"]
    clock.advance_ns(1_000_000_000)  # every key full again: the next new key sweeps the two oldest
    limiter.acquire_permission("e")
    assert limiter.keys() == ["c", "d", "e"]


def test_the_written_out_acquire_quota_publishes_and_rejects_like_the_protocol() -> None:
    limiter, _ = _sliding(limit=4)
    seen: list[str] = []
    limiter.events.on_event(lambda event: seen.append(event.event_type))
    assert [limiter.acquire_quota("k") for _ in range(4)] == [(3, 10**9), (2, 10**9), (1, 10**9), (0, 10**9)]
    with pytest.raises(ValueError):
        limiter.acquire_quota("k", 0)
    with pytest.raises(ValueError):
        limiter.store.decide_quota("k", 0, 0)
    with pytest.raises(RequestNotPermitted) as info:
        limiter.acquire_quota("k")
    assert info.value.quotas == ((0, 10**9),)
    assert seen == ["SUCCESSFUL_ACQUIRE"] * 4 + ["FAILED_ACQUIRE"]
