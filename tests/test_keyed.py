"""KeyedRateLimiter: per-key budgets, exactness against decide(), bounded memory, concurrency."""

from __future__ import annotations

import gc
import threading
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.backends.base import decide
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import RateLimiterConfig, most_grantable
from django_ratelimit_r4.keyed import KeyedRateLimiter, KeyedRateLimiterView

S = 1_000_000_000


def make(
    limit: int = 3, period: str = "1s", timeout: str | int = 0, **kwargs
) -> tuple[KeyedRateLimiter, FakeClock]:
    clock = FakeClock()
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, timeout_duration=timeout)
    return KeyedRateLimiter("api", config, clock=clock, **kwargs), clock


class TestBudgets:
    def test_each_key_has_its_own_budget(self):
        limiter, _ = make(limit=3)
        assert [limiter.acquire_permission("a") for _ in range(4)] == [True, True, True, False]
        assert [limiter.acquire_permission("b") for _ in range(4)] == [True, True, True, False]
        assert limiter.successful_calls == 6
        assert limiter.failed_calls == 2

    def test_next_cycle_refills(self):
        limiter, clock = make(limit=2)
        limiter.acquire_permission("a")
        limiter.acquire_permission("a")
        assert not limiter.acquire_permission("a")
        clock.advance(1)
        assert limiter.acquire_permission("a")

    def test_cycle_boundary_refreshes_a_partly_used_key(self):
        limiter, clock = make(limit=2)
        assert limiter.acquire_permission("a")
        clock.advance(1)  # exactly the boundary: a new cycle, a full budget again
        assert [limiter.acquire_permission("a") for _ in range(3)] == [True, True, False]
        clock.advance_ns(S - 1)  # last nanosecond of that cycle: still empty
        assert not limiter.acquire_permission("a")

    def test_rejection_carries_wait_to_next_cycle(self):
        limiter, clock = make(limit=10, period="60s")
        for _ in range(10):
            limiter.acquire_or_raise("203.0.113.7")
        clock.advance(10)
        with pytest.raises(RequestNotPermitted) as info:
            limiter.acquire_or_raise("203.0.113.7")
        assert info.value.wait_ns == 50 * S
        assert info.value.retry_after == 50
        assert info.value.name == "api"
        assert info.value.key == "203.0.113.7"
        assert "203.0.113.7" not in str(info.value)

    def test_multiple_permits(self):
        limiter, _ = make(limit=5)
        assert limiter.acquire_permission("a", 4)
        assert not limiter.acquire_permission("a", 2)
        assert limiter.acquire_permission("a", 1)

    def test_more_permits_than_limit_are_an_error_and_store_nothing(self):
        limiter, _ = make(limit=5)
        with pytest.raises(ValueError, match="can never grant 6 permits in one call: it allows 5 per 1s"):
            limiter.acquire_permission("a", 6)
        assert len(limiter) == 0

    @pytest.mark.parametrize("permits", [0, -1])
    def test_non_positive_permits(self, permits):
        limiter, _ = make()
        with pytest.raises(ValueError, match="permits"):
            limiter.acquire_permission("a", permits)

    def test_waits_within_timeout(self):
        limiter, clock = make(limit=1, timeout="2s")
        start = clock.now_ns()
        assert limiter.acquire_permission("a")
        assert limiter.acquire_permission("a")  # reserved in the next cycle, FakeClock advances
        assert clock.now_ns() - start == S
        assert limiter.metrics.number_of_waiting_threads == 0

    async def test_async_variants(self):
        limiter, clock = make(limit=1, timeout="1s")
        assert await limiter.aacquire_permission("a")
        start = clock.now_ns()
        await limiter.aacquire_or_raise("a")  # waits one cycle on the fake clock
        assert clock.now_ns() - start == S
        limiter2, _ = make(limit=1)
        await limiter2.aacquire_or_raise("a")
        assert not await limiter2.aacquire_permission("a")
        with pytest.raises(RequestNotPermitted):
            await limiter2.aacquire_or_raise("a")

    def test_reserve(self):
        limiter, _ = make(limit=1, timeout="10s")
        assert limiter.reserve_permission("a") == 0
        assert limiter.reserve_permission("a") == S
        assert limiter.reserve_permission("a") == 2 * S
        assert limiter.state("a")[1] == -2
        limiter2, _ = make(limit=1)
        limiter2.reserve_permission("a")
        assert limiter2.reserve_permission("a") == -1

    def test_events(self):
        limiter, _ = make(limit=1)
        seen = []
        limiter.events.on_failed_acquire(seen.append)
        limiter.acquire_permission("a")
        limiter.acquire_permission("a")
        assert [(e.event_type, e.name) for e in seen] == [("FAILED_ACQUIRE", "api")]


class TestView:
    def test_view_is_rate_limiter_like(self):
        limiter, clock = make(limit=3)
        view = limiter.get("k")
        assert isinstance(view, KeyedRateLimiterView)
        assert (view.name, view.config, view.clock) == ("api", limiter.config, clock)
        assert view.metrics.available_permissions == 3
        assert view.metrics.nanos_to_wait == 0
        assert len(limiter) == 0  # reading creates nothing
        assert view.acquire_permission()
        view.acquire_or_raise()
        assert view.metrics.available_permissions == 1
        assert view.drain_permissions() == 1
        assert view.metrics.available_permissions == 0
        assert view.metrics.nanos_to_wait == S
        assert not view.acquire_permission()
        assert view.reserve_permission() == -1
        with pytest.raises(RequestNotPermitted):
            view.acquire_or_raise()
        view.reset()
        assert view.metrics.available_permissions == 3
        assert limiter.get("k") == view and limiter.get("j") != view

    def test_drain_keeps_debt(self):
        limiter, _ = make(limit=1, timeout="5s")
        limiter.reserve_permission("a")
        limiter.reserve_permission("a")
        assert limiter.drain_permissions("a") == 0
        assert limiter.state("a")[1] == -1


class TestMemoryBound:
    def test_full_key_is_not_stored(self):
        limiter, clock = make(limit=2)
        limiter.acquire_permission("a")
        assert "a" in limiter
        clock.advance(1)
        assert limiter.purge() == 1
        assert len(limiter) == 0
        # A purged key behaves exactly as before: full.
        assert [limiter.acquire_permission("a") for _ in range(3)] == [True, True, False]

    def test_full_entries_swept_on_insertion(self):
        limiter, clock = make(limit=2)
        for key in "abcd":
            limiter.acquire_permission(key)
        clock.advance(1)  # a..d are full again
        limiter.acquire_permission("e")
        limiter.acquire_permission("f")
        assert len(limiter) <= 3  # each insertion drops up to two full entries from the front
        for key in "ghij":
            limiter.acquire_permission(key)
        assert set(limiter.store._states) == set("efghij")

    def test_lru_eviction_at_max_keys(self):
        limiter, clock = make(limit=2, max_keys=3)
        limiter.acquire_permission("a")
        clock.advance(1)
        limiter.acquire_permission("b")
        limiter.acquire_permission("c")
        limiter.acquire_permission("a")  # a used again in the new cycle: moves to the back
        limiter.acquire_permission("d")  # evicts b (oldest by last use), not a
        assert set(limiter.store._states) == {"a", "c", "d"}
        assert limiter.lossy_evictions == 1
        assert limiter.metrics.lossy_evictions == 1

    def test_lossless_eviction_not_counted(self):
        limiter, clock = make(limit=2, max_keys=1)
        limiter.acquire_permission("a")
        clock.advance(5)
        limiter.acquire_permission("b")
        assert limiter.lossy_evictions == 0
        assert len(limiter) == 1

    def test_idle_timeout_drops_keys_in_debt(self):
        limiter, clock = make(limit=1, timeout="100s", idle_timeout_ns=3 * S)
        for _ in range(20):
            limiter.reserve_permission("debtor")  # deep debt: not full for ~20 cycles
        clock.advance(10)
        limiter.acquire_permission("x")
        assert "debtor" not in limiter

    def test_without_idle_timeout_debt_is_kept(self):
        limiter, clock = make(limit=1, timeout="100s")
        for _ in range(20):
            limiter.reserve_permission("debtor")
        clock.advance(10)
        limiter.acquire_permission("x")
        assert "debtor" in limiter
        assert limiter.state("debtor")[1] == -9

    def test_bytes_per_live_key(self):
        """100k live keys, key strings included (built inside the traced region, as requests do)."""
        limiter, _ = make(limit=10, max_keys=200_000)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(100_000):
                limiter.acquire_permission(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
            used = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len(limiter) == 100_000
        assert used / 100_000 <= 250, f"{used / 100_000:.0f} bytes per key"

    def test_max_keys_bounds_memory(self):
        limiter, _ = make(limit=10, max_keys=1000)
        for i in range(5000):
            limiter.acquire_permission(str(i))
        assert len(limiter) == 1000
        assert limiter.lossy_evictions == 4000

    @pytest.mark.parametrize(
        ("kwargs", "match"), [({"max_keys": 0}, "max_keys"), ({"idle_timeout_ns": -1}, "idle")]
    )
    def test_bad_arguments(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            KeyedRateLimiter("x", **kwargs)


class TestResetAndClock:
    def test_reset_one_key(self):
        limiter, _ = make(limit=1)
        limiter.acquire_permission("a")
        limiter.acquire_permission("b")
        limiter.reset("a")
        assert limiter.acquire_permission("a")
        assert not limiter.acquire_permission("b")

    def test_reset_all(self):
        limiter, _ = make(limit=1)
        limiter.acquire_permission("a")
        limiter.acquire_permission("a")
        limiter.reset()
        assert len(limiter) == 0
        assert (limiter.successful_calls, limiter.failed_calls) == (0, 0)

    def test_set_clock_anchors_cycles(self):
        limiter, _ = make(limit=1, period="10s")
        clock = FakeClock(start_ns=5 * S + 123)
        limiter.set_clock(clock)
        assert limiter.clock is clock
        limiter.acquire_permission("a")
        clock.advance(9.9)
        assert limiter.state("a")[2] == 100_000_000  # the cycle started at set_clock time
        clock.advance(0.1)
        assert limiter.acquire_permission("a")


# A reference model: unbounded dict of (cycle, permissions) driven by decide() alone.
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from("abc"), st.integers(1, 4)),
        st.tuples(st.just("advance"), st.one_of(st.integers(0, 2500), st.just(1000))),  # milliseconds
        st.tuples(st.just("drain"), st.sampled_from("abc")),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, limit=st.integers(1, 3), timeout_ms=st.sampled_from([0, 500, 3000]))
def test_matches_decide_step_by_step(ops, limit, timeout_ms):
    period = S
    limiter, clock = make(limit=limit, timeout=f"{timeout_ms}ms", max_keys=10)
    anchor = clock.now_ns()
    model: dict[str, tuple[int, int]] = {}
    timeout_ns = timeout_ms * 1_000_000
    for op in ops:
        if op[0] == "advance":
            clock.advance_ns(op[1] * 1_000_000)
            continue
        key = op[1]
        cycle, permissions = model.get(key, (0, limit))
        now = clock.now_ns() - anchor
        if op[0] == "drain":
            cycle, permissions, _, _ = decide(cycle, permissions, 1, -1, now, period, limit)
            model[key] = (cycle, permissions - max(permissions, 0))
            limiter.drain_permissions(key)
            continue
        cycle, permissions, wait, granted = decide(cycle, permissions, op[2], timeout_ns, now, period, limit)
        if granted:
            model[key] = (cycle, permissions)
        if not granted and op[2] > most_grantable(limiter.config, timeout_ns):
            with pytest.raises(ValueError, match="can never grant"):
                limiter.reserve_permission(key, op[2])
            continue
        got = limiter.reserve_permission(key, op[2])
        assert got == (wait if granted else -1)
        for k in "abc":
            c, p = model.get(k, (0, limit))
            _, expected, expected_wait, _ = decide(c, p, 1, -1, clock.now_ns() - anchor, period, limit)
            _, available, to_wait = limiter.state(k)
            assert (available, to_wait) == (expected, expected_wait)


@pytest.mark.parametrize("trial", range(15))
def test_per_key_budgets_exact_under_threads(trial, fast_switching):
    limit, keys, threads = 50, 4, 8
    limiter, _ = make(limit=limit, period="1h")
    barrier = threading.Barrier(threads)
    granted = [[0] * keys for _ in range(threads)]

    def worker(index: int) -> None:
        barrier.wait()
        for i in range(limit * keys // 2):  # 8 threads x 100 tries on 4 keys: 4x oversubscribed
            key = i % keys
            if limiter.acquire_permission(f"k{key}"):
                granted[index][key] += 1

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert [sum(row[k] for row in granted) for k in range(keys)] == [limit] * keys
    assert limiter.successful_calls == limit * keys
    assert limiter.failed_calls == threads * (limit * keys // 2) - limit * keys


@pytest.mark.parametrize("trial", range(5))
def test_insertions_and_evictions_under_threads(trial, fast_switching):
    """Many new keys racing at max_keys: the store stays bounded and consistent, nothing raises."""
    limiter, clock = make(limit=2, max_keys=64)
    threads = 6
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        barrier.wait()
        try:
            for i in range(400):
                limiter.acquire_permission(f"{index}-{i % 150}")
                if i % 100 == 0 and index == 0:
                    clock.advance(0.5)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
    assert len(limiter) <= 64
    assert limiter.successful_calls + limiter.failed_calls == threads * 400
    cycles = [packed >> 64 for packed in limiter.store._states.values()]
    assert cycles == sorted(cycles)  # the store stays ordered by cycle of last use
