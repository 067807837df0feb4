"""A keyed in-memory sliding window's memory grows with a client's use, not with its limit.

Each key's log holds the times of the permits it handed over (an ``array('q')`` ring, 8 bytes a slot). It used
to be allocated at ``limit_for_period`` slots at the key's first request: 800 KB for one request at a limit of
100 000, 8 GB for 10 000 such clients. A log now starts small and doubles (up to the limit) only when every
slot it holds is still in the window: its slots are at most twice the most permits the key held in one window
(or its first size). The slots it does not hold are the log's oldest, free ones (outside every window).

The growth moments (a one-permit grant that finds every slot in the window, a reservation, several permits at
once, a drain, a new key taking several permits, a give-back after a growth, a ring whose head had wrapped)
are checked against the pure reference (:mod:`django_ratelimit_r4.backends.algorithms`) step by step.
"""

from __future__ import annotations

import sys
import tracemalloc
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

S = 1_000_000_000
T = 1_000  # the period of the property tests, in ns


def _limiter(limit: int, period: str = "1h", **kw: Any) -> tuple[KeyedRateLimiter, FakeClock]:
    clock = FakeClock(start_ns=0)
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm="sliding_window")
    return KeyedRateLimiter("m", config, clock=clock, **kw), clock


def _ring_bytes(limiter: KeyedRateLimiter, key: str) -> int:
    return sys.getsizeof(limiter.store._states[key].ring)


# ------------------------------------------------------------------------------------------- the footprint


def test_a_client_that_sent_one_request_holds_a_few_slots_not_the_limit() -> None:
    """One request at a limit of 100 000 used to allocate an 800 KB ring (8 bytes x the limit)."""
    limiter, _ = _limiter(100_000)
    assert limiter.acquire_permission("one")
    assert _ring_bytes(limiter, "one") < 256


def test_the_log_doubles_only_while_every_slot_holds_a_permit_in_the_window() -> None:
    limiter, clock = _limiter(100_000)
    sizes = []
    for _ in range(1000):  # 1000 permits within one window: the log must hold 1000 times
        assert limiter.acquire_permission("k")
        sizes.append(len(limiter.store._states["k"].ring))
        clock.advance_ns(1000)
    assert 1000 <= sizes[-1] <= 2000  # at most twice what the window holds
    assert len(set(sizes)) <= 12  # doubled: a handful of sizes (amortised O(1) copying), not one per grant
    assert _ring_bytes(limiter, "k") < 2000 * 8 + 100
    # The window moves on: the same rate reuses the slots whose permits left it, so the log stops growing.
    clock.advance_ns(3600 * S)
    for _ in range(3000):
        assert limiter.acquire_permission("k")
        clock.advance_ns(3600 * S // 1000)  # 1000 permits per window at most
    assert len(limiter.store._states["k"].ring) == sizes[-1]


def test_a_client_at_its_limit_holds_exactly_the_limit() -> None:
    limiter, _ = _limiter(1000)
    for _ in range(1000):
        assert limiter.acquire_permission("k")
    assert not limiter.acquire_permission("k")
    assert len(limiter.store._states["k"].ring) == 1000


def test_many_one_request_clients_cost_bytes_per_client_not_per_permit() -> None:
    """tracemalloc over 200 clients of one request each at a limit of 10 000: 16 MB of rings before (80 KB
    each), a few hundred bytes each now (the key, its entry and a log of a few slots)."""
    limiter, _ = _limiter(10_000, max_keys=1000)
    keys = [f"ip:10.0.{i >> 8}.{i & 255}" for i in range(200)]
    limiter.acquire_permission("warm")  # the store's one-off structures are not the clients'
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for key in keys:
            assert limiter.acquire_permission(key)
        used = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert used / len(keys) < 600, used / len(keys)


# --------------------------------------------------- growth boundaries against the reference, step by step


def _logical(store: SlidingWindowKeyedStore, state: Any, now: int) -> tuple[int, ...]:
    """A key's log as the reference holds it, from the state's invariants: the ``spare`` slots the ring does not
    hold are the oldest (free: outside every window), then the ring from its head; checks the invariants."""
    limit = store._limit
    ring, head, edge, after, spare = state.ring, state.head, state.edge, state.after, state.spare
    cap = len(ring)
    assert 1 <= cap <= limit and spare == limit - cap and len(state.next) == cap
    assert state.next == [*range(1, cap), 0]
    assert 0 <= head < cap and 0 <= edge < cap
    assert head is _INDEXES[head] and edge is _INDEXES[edge]
    held = tuple(ring[head:] + ring[:head])
    assert list(held) == sorted(held)
    out = (edge - head) % cap
    assert all(t <= now - T for t in held[:out])  # the known-out slots have left the window
    assert not out or held[-1] <= now  # so a grant from them is never a reservation
    assert not spare or held[-1] <= now  # no reservation pending below the limit (growth leaves slots known out)
    if after is not None:
        assert after == held[out] + T
    return (-(10**15),) * spare + held


_burst = st.tuples(st.just("burst"), st.sampled_from("ab"), st.integers(1, 20), st.integers(0, 30))
_ops = st.lists(
    st.one_of(
        _burst,  # many one-permit grants close together: the log fills and must grow
        st.tuples(st.just("quota1"), st.sampled_from("ab"), st.sampled_from([0, 0, 300, 5_000])),
        st.tuples(st.just("acquire_quota"), st.sampled_from("ab")),
        st.tuples(st.just("decide"), st.sampled_from("ab"), st.integers(1, 40), st.sampled_from([0, 0, 400])),
        st.tuples(st.just("advance"), st.one_of(st.integers(0, 1_200), st.just(T))),
        st.tuples(st.just("drain"), st.sampled_from("ab")),
        st.tuples(st.just("give_back"), st.sampled_from("ab"), st.integers(1, 6), st.integers(0, 700)),
        st.tuples(st.just("reset"), st.sampled_from("ab")),
    ),
    max_size=60,
)


def _run(limit: int, first: int, ops: list[Any], monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Drive a store whose logs start at ``first`` slots through ``ops``, each answer against the reference;
    returns the ring sizes seen (a growth is a new size)."""
    monkeypatch.setattr(SlidingWindowKeyedStore, "first_slots", first)
    clock = FakeClock(start_ns=0)
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=f"{T}ns", algorithm="sliding_window")
    limiter = KeyedRateLimiter("g", config, clock=clock, max_keys=10)
    store = limiter.store
    assert isinstance(store, SlidingWindowKeyedStore)
    fresh = (-T,) * limit
    logs = {"a": fresh, "b": fresh}
    sizes = []

    def one(key: str, how: str, timeout: int = 0) -> None:
        now = clock.now_ns()
        before = logs[key]
        times, wait, granted = sliding_decide(before, 1, timeout, now, T)
        if granted:
            logs[key] = times
        if how == "decide":
            assert store.decide(key, 1, timeout) == (wait if granted else -wait)
        elif how == "quota1":
            figures = sliding_quota(times if granted else before, now, T)
            assert store.decide_quota(key, 1, timeout) == ((wait if granted else -wait), *figures)
        else:
            try:
                got: Any = limiter.acquire_quota(key)
            except RequestNotPermitted as exc:
                got = ("rejected", exc.wait_ns, exc.quotas)
            if granted:
                assert got == sliding_quota(times, now, T)
            else:
                assert got == ("rejected", wait, (sliding_quota(times, now, T),))

    for op in ops:
        now = clock.now_ns()
        if replay_store_op(store, clock, logs, op, fresh, T):
            pass  # advance, reset, drain or give_back: replayed and checked there
        elif op[0] == "burst":
            _, key, count, gap = op
            for i in range(count):
                one(key, ("decide", "quota1", "acquire_quota")[i % 3])
                clock.advance_ns(gap)
        elif op[0] == "quota1":
            one(op[1], "quota1", op[2])
        elif op[0] == "acquire_quota":
            one(op[1], "acquire_quota")
        else:
            _, key, permits, timeout = op
            times, wait, granted = sliding_decide(logs[key], permits, timeout, now, T)
            if granted:
                logs[key] = times
            assert store.decide(key, permits, timeout) == (wait if granted else -wait)
        now = clock.now_ns()
        for key, times in logs.items():
            state = store._states.get(key)
            if state is not None:
                sizes.append(len(state.ring))
                logical = _logical(store, state, now)
                # Equal to the reference but for times outside every window (free slots, or times the
                # reference still holds that left it): the same answers from now on.
                assert [max(t, now - T) for t in logical] == [max(t, now - T) for t in times]
            assert store.quota(key) == sliding_quota(times, now, T)
            assert store.state(key)[1] == sliding_available(times, now, T)
    assert store.lossy_evictions == 0
    return sizes


@settings(max_examples=400, deadline=None)
@given(limit=st.integers(1, 40), first=st.integers(1, 5), ops=_ops)
@example(limit=5, first=1, ops=[("burst", "a", 5, 0), ("decide", "a", 1, 400)])  # 1 -> 2 -> 4 -> 5 slots
@example(limit=8, first=2, ops=[("decide", "a", 7, 0)])  # a new key taking 7: 8 slots at once
@example(limit=9, first=2, ops=[("burst", "a", 3, 10), ("advance", T), ("burst", "a", 4, 10)])  # wrapped, then grown
@example(limit=6, first=2, ops=[("burst", "a", 2, 0), ("decide", "a", 3, 0), ("give_back", "a", 1, 0)])
@example(limit=4, first=1, ops=[("burst", "a", 2, 0), ("decide", "a", 1, 400), ("burst", "a", 2, 0)])
def test_growth_keeps_every_answer_the_references(limit: int, first: int, ops: list[Any]) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        _run(limit, first, ops, monkeypatch)


def test_a_ring_that_wrapped_grows_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its head mid-ring (older slots reused after the window moved on), then every slot in the window: the
    grown log keeps the times oldest first, the free slots before them, and wraps again later."""
    ops: list[Any] = [
        ("burst", "a", 3, 100),  # 4 slots: 3 used
        ("advance", T),  # all out of the window
        ("burst", "a", 6, 10),  # reuses 4 (head wraps), then every slot is in the window: grows to 8
        ("advance", T),
        ("burst", "a", 11, 10),  # wraps the 8, then grows to 16
        ("decide", "a", 5, 0),  # several permits across the wrap
        ("give_back", "a", 2, 0),
        ("advance", T + 5),
        ("burst", "a", 30, 0),  # up to the limit (20): the last 10 rejected
    ]
    sizes = _run(20, 4, ops, monkeypatch)
    assert sizes[0] == 4 and 8 in sizes and 16 in sizes and sizes[-1] == 20
