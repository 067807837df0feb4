"""Property tests of the pure give-backs (``gcra_give_back``, ``sliding_give_back``): undoing a grant of an
all-or-nothing decision that another part rejected, after other decisions may have come in between.

Safety: the state after the give-back is never more permissive than the state had the grant never happened
(the same later grants applied to the state before it). Exactness: GCRA's when nothing came in between; the
sliding window's whenever no later grant could have overwritten the grant's times.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.backends.algorithms import (
    gcra_decide,
    gcra_give_back,
    sliding_decide,
    sliding_give_back,
    sliding_initial,
)
from django_ratelimit_r4.backends.memory import SlidingWindowBackend
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiterConfig
from django_ratelimit_r4.keyed import KeyedRateLimiter

SETTINGS = settings(max_examples=400, deadline=None)

limits = st.integers(min_value=1, max_value=8)
periods = st.integers(min_value=1, max_value=3_000)
# (time step, permits, timeout): the traffic before the grant, and the other decisions after it
traffic = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=1_500),
        st.integers(min_value=1, max_value=9),
        st.sampled_from([0, 0, 0, 1, 700, 5_000]),
    ),
    max_size=25,
)
later = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=400),
        st.integers(min_value=1, max_value=9),
        st.sampled_from([0, 0, 1, 700, 5_000]),
    ),
    max_size=8,
)


@SETTINGS
@given(
    limits, periods, st.integers(min_value=1, max_value=10), traffic, st.integers(min_value=1, max_value=9),
    later, st.integers(min_value=0, max_value=600),
)
def test_gcra_give_back_is_never_more_permissive_than_no_grant(
    limit: int, period: int, burst: int, before: list, permits: int, after: list, tail: int
) -> None:
    tat, now = 0, 0
    for step, k, timeout in before:
        now += step
        tat = gcra_decide(tat, k, timeout, now, period, limit, burst)[0]
    without = tat
    tat, _, granted = gcra_decide(tat, permits, 0, now, period, limit, burst)
    assume(granted)
    granted_tat = tat
    for step, k, timeout in after:
        now += step
        tat, _, ok = gcra_decide(tat, k, timeout, now, period, limit, burst)
        if ok:  # granted with the grant in place, so granted without it too (same arrival, a tat no later)
            without = gcra_decide(without, k, 10**18, now, period, limit, burst)[0]
    now += tail
    back = gcra_give_back(tat, permits, granted_tat, now, period, limit)
    assert back <= tat
    assert max(back, now * limit) >= max(without, now * limit)  # never more permissive
    if not after:
        assert max(back, now * limit) == max(without, now * limit)  # exact


def test_gcra_give_back_of_a_grant_absorbed_while_idle_gives_nothing() -> None:
    # 1 per 10 ns, burst 1: a grant at 0 (tat 10); at 50 the limiter is full again and another grant takes
    # it (tat 60). Giving back "one permit" then would leave tat 50 and let a second permit through at 50.
    limit, period = 1, 10
    granted = gcra_decide(0, 1, 0, 0, period, limit, 1)[0]
    tat = gcra_decide(granted, 1, 0, 50, period, limit, 1)[0]
    assert tat == 60
    assert gcra_give_back(tat, 1, granted, 50, period, limit) == 60


def _waits(times: tuple[int, ...], now: int, period: int) -> list[int]:
    """When each request of k = 1..limit permits arriving at one of several instants from ``now`` on would be
    handed over: how the log decides from now on."""
    return [
        at + sliding_decide(times, k, -1, at, period)[1]
        for at in (now, now + period // 3, now + period // 2, now + period - 1, now + period, now + 2 * period)
        for k in range(1, len(times) + 1)
    ]


@SETTINGS
@given(limits, periods, traffic, st.integers(min_value=1, max_value=9), later, st.integers(min_value=0, max_value=600))
def test_sliding_give_back_is_never_more_permissive_than_no_grant(
    limit: int, period: int, before: list, permits: int, after: list, tail: int
) -> None:
    times, now = sliding_initial(limit, period), 0
    handed: list[int] = []  # every permit's hand-over time but the grant's
    for step, k, timeout in before:
        now += step
        times, wait, ok = sliding_decide(times, k, timeout, now, period)
        if ok:
            handed += [now + wait] * k
    times, _, granted = sliding_decide(times, permits, 0, now, period)
    assume(granted)
    taken_at = now
    for step, k, timeout in after:
        now += step
        times, wait, ok = sliding_decide(times, k, timeout, now, period)
        if ok:
            handed += [now + wait] * k
    now += tail
    back = sliding_give_back(times, permits, taken_at, now, period)
    assert list(back) == sorted(back)
    without = tuple(sorted([-period - 1] * limit + handed)[-limit:])
    got, ideal = _waits(back, now, period), _waits(without, now, period)
    assert all(g >= i for g, i in zip(got, ideal, strict=True))  # never more permissive
    if all(t < taken_at + period for t in handed):
        assert got == ideal  # exact


def test_sliding_give_back_after_the_grant_left_the_log_gives_nothing() -> None:
    # 2 per 10 ns: a grant at 0, then two at 10 overwrite its time; nothing of it is left to give back.
    times = sliding_initial(2, 10)
    times = sliding_decide(times, 1, 0, 0, 10)[0]
    times = sliding_decide(times, 2, 0, 10, 10)[0]
    assert times == (10, 10)
    assert sliding_give_back(times, 1, 0, 10, 10) == (10, 10)


# ------------------------------------------------------------------- the in-memory backends' give-backs

S, MS = 1_000_000_000, 1_000_000


def _memory_sliding(keyed: bool, limit: int, period: int, clock: Any) -> tuple[Any, Any, Any]:
    """``(acquire(k, timeout), give_back(k, since), log())`` of an in-memory sliding window of ``limit`` per
    ``period`` ns, keyed or not; ``log()`` is its logged times, oldest first."""
    if keyed:
        config = RateLimiterConfig(
            limit_for_period=limit, limit_refresh_period=f"{period}ns", algorithm="sliding_window"
        )
        store = KeyedRateLimiter(
            "k", config,
            clock=clock,
        ).store

        def keyed_log() -> tuple[int, ...]:
            state = store._states.get("x")
            if state is None:  # full: absent
                return (-(10**18),) * limit
            head, ring = state.head, state.ring
            logged = tuple(ring[head:] + ring[:head])
            # The slots known out of the window (up to edge; none right after a give-back) have left it.
            assert all(t <= clock.now_ns() - period for t in logged[: (state.edge - head) % len(ring)])
            return (-(10**18),) * state.spare + logged  # the ring holds the newest; the older ones are free

        return (lambda k, t: store.decide("x", k, t)), (lambda k, s: store.give_back("x", k, s)), keyed_log
    backend = SlidingWindowBackend("s", limit, period, clock)
    return backend.acquire, backend.give_back, lambda: tuple(backend._ring[backend._head :] + backend._ring[: backend._head])


@pytest.mark.parametrize("keyed", [False, True])
def test_memory_sliding_give_back_keeps_a_later_grant(keyed: bool) -> None:
    """A grant of another caller logged between the take and its give-back (a memory + Redis gate gives back
    after the Redis round trip) stays logged: the give-back frees the take's own time. It used to free the
    newest time (the later grant's, 5 ms) and keep the take's (0), and a second later let 2 more through
    while the 5 ms permit was still in the window: 3 in one second with a limit of 2."""
    clock = FakeClock(start_ns=0)
    acquire, give_back, _ = _memory_sliding(keyed, 2, 10 * S, clock)
    since = clock.now_ns()
    assert acquire(1, 0) == 0  # the take of an all-or-nothing decision, at 0
    clock.advance_ns(5 * MS)
    assert acquire(1, 0) == 0  # another caller's permit, at 5 ms
    clock.advance_ns(1 * MS)
    give_back(1, since)  # the Redis part rejected: the take comes back
    clock.advance_ns(10 * S - 6 * MS + 1 * MS)  # 10.001 s: the window (0.001 s, 10.001 s] holds the 5 ms permit
    assert acquire(1, 0) == 0
    assert acquire(1, 0) < 0


@pytest.mark.parametrize("keyed", [False, True])
@settings(max_examples=150, deadline=None)
@given(limits, st.integers(min_value=1, max_value=3_000), traffic, st.integers(min_value=1, max_value=9), later,
       st.integers(min_value=0, max_value=600))
def test_memory_sliding_give_back_is_never_more_permissive_than_no_grant(
    keyed: bool, limit: int, period: int, before: list, permits: int, after: list, tail: int
) -> None:
    """The in-memory backends (clock read right before the take: ``since`` is its time on a FakeClock) against
    the model of the pure test above: never more permissive than without the take, exact when no later grant
    could have overwritten it."""
    clock = FakeClock(start_ns=0)
    acquire, give_back, log = _memory_sliding(keyed, limit, period, clock)
    handed: list[int] = []
    for step, k, timeout in before:
        clock.advance_ns(step)
        wait = acquire(k, timeout) if k <= limit else -1
        if wait >= 0:
            handed += [clock.now_ns() + wait] * k
    if permits > limit:
        return
    since = clock.now_ns()
    assume(acquire(permits, 0) >= 0)
    for step, k, timeout in after:
        clock.advance_ns(step)
        wait = acquire(k, timeout) if k <= limit else -1
        if wait >= 0:
            handed += [clock.now_ns() + wait] * k
    clock.advance_ns(tail)
    now = clock.now_ns()
    give_back(permits, since)
    without = tuple(sorted([-period - 1] * limit + handed)[-limit:])
    got, ideal = _waits(log(), now, period), _waits(without, now, period)
    assert all(g >= i for g, i in zip(got, ideal, strict=True))  # never more permissive
    if all(t < since + period for t in handed):
        assert got == ideal  # exact


def _memory_gcra(keyed: bool, limit: int, period: int, burst: int, clock: Any) -> tuple[Any, Any, Any, Any]:
    """``(acquire(k, timeout), take(k) -> since | None, give_back(k, since), tat())`` of an in-memory GCRA limit
    of ``limit`` per ``period`` ns, keyed or not. ``take`` and ``give_back`` are the in-memory halves of a mixed
    (memory + Redis) all-or-nothing decision whose Redis part then rejects; ``tat()`` is the state scaled by
    ``limit`` as :func:`gcra_decide` keeps it (0: full)."""
    from django_ratelimit_r4.core.ratelimiter import RateLimiter
    from django_ratelimit_r4.keyed import _mixed_first_half, _mixed_second_half

    config = RateLimiterConfig(
        limit_for_period=limit, limit_refresh_period=f"{period}ns", algorithm="gcra", burst=burst
    )
    limiter: Any = KeyedRateLimiter("k", config, clock=clock) if keyed else RateLimiter("g", config, clock=clock)
    entry = (limiter, "x" if keyed else None)

    def take(k: int) -> Any:
        worst, local_entries, since = _mixed_first_half([entry], [0], k)
        return None if worst is not None else (local_entries, since)

    def give_back(k: int, taken: Any) -> None:
        local_entries, since = taken
        assert _mixed_second_half([entry, None], local_entries, since, [1], (0, 1), k) == (1, 1)

    if keyed:
        store = limiter.store
        return (
            (lambda k, t: store.decide("x", k, t)), take, give_back, (lambda: store._states.get("x") or 0)
        )
    backend = limiter.backend
    return backend.acquire, take, give_back, (lambda: backend._tat * (limit // backend._scale))


@pytest.mark.parametrize("keyed", [False, True])
def test_memory_gcra_give_back_after_the_limiter_was_full_again_gives_nothing(keyed: bool) -> None:
    """1 per 10 ms, burst 1: the all-or-nothing take at 0; at 50 ms the limiter is full again and another
    caller takes the permit; the Redis part then rejects and the take is given back. It used to move tat back
    by one interval (the other caller's permit) and grant a second permit at 50 ms: more than the limit."""
    clock = FakeClock(start_ns=0)
    acquire, take, give_back, _ = _memory_gcra(keyed, 1, 10 * MS, 1, clock)
    taken = take(1)
    assert taken is not None
    clock.advance_ns(50 * MS)
    assert acquire(1, 0) == 0  # another caller's permit
    give_back(1, taken)
    assert acquire(1, 0) < 0  # still one permit per 10 ms


@pytest.mark.parametrize("keyed", [False, True])
def test_memory_gcra_give_back_is_exact_when_nothing_came_in_between(keyed: bool) -> None:
    """1 per 10 ms, burst 2, one permit already reserved ahead (tat 10 ms): the take at 0 (tat 20 ms), given
    back 5 ms later, leaves tat at 10 ms, as if never taken (a bound from the take's clock reading alone would
    keep 5 ms of it)."""
    clock = FakeClock(start_ns=0)
    acquire, take, give_back, tat = _memory_gcra(keyed, 1, 10 * MS, 2, clock)
    assert acquire(1, 0) == 0
    before = tat()
    taken = take(1)
    assert taken is not None
    clock.advance_ns(5 * MS)
    give_back(1, taken)
    assert tat() == before


@pytest.mark.parametrize("keyed", [False, True])
@settings(max_examples=150, deadline=None)
@given(limits, periods, st.integers(min_value=1, max_value=10), traffic, st.integers(min_value=1, max_value=9),
       later, st.integers(min_value=0, max_value=600))
def test_memory_gcra_give_back_matches_the_reference(
    keyed: bool, limit: int, period: int, burst: int, before: list, permits: int, after: list, tail: int
) -> None:
    """The in-memory GCRA backends (unkeyed and keyed) through the mixed all-or-nothing path give back exactly
    what :func:`gcra_give_back` does with the tat their take wrote, whatever came in between."""
    clock = FakeClock(start_ns=0)
    acquire, take, give_back, tat_of = _memory_gcra(keyed, limit, period, burst, clock)
    tat = 0

    def same(now: int) -> bool:
        return max(tat_of(), now * limit) == max(tat, now * limit)

    for step, k, timeout in before:
        clock.advance_ns(step)
        tat = gcra_decide(tat, k, timeout, clock.now_ns(), period, limit, burst)[0]
        acquire(k, timeout)
    assert same(clock.now_ns())
    if permits > burst:
        return  # never grantable: refused with an error, nothing taken
    granted_tat, _, granted = gcra_decide(tat, permits, 0, clock.now_ns(), period, limit, burst)
    taken = take(permits)
    assert (taken is not None) == granted
    assume(granted)
    tat = granted_tat
    for step, k, timeout in after:
        clock.advance_ns(step)
        tat = gcra_decide(tat, k, timeout, clock.now_ns(), period, limit, burst)[0]
        acquire(k, timeout)
    clock.advance_ns(tail)
    now = clock.now_ns()
    give_back(permits, taken)
    tat = gcra_give_back(tat, permits, granted_tat, now, period, limit)
    assert same(now)
