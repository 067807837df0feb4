"""RateLimiter: Resilience4j's AtomicRateLimiter semantics, its verified numbers, and our deliberate fixes.

Time is driven by a FakeClock everywhere time is the subject; concurrency claims use threading.Barrier and
many trials.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
from datetime import timedelta

import pytest

from django_ratelimit_r4.backends.base import RateLimiterBackend, decide, div_ceil
from django_ratelimit_r4.backends.memory import MemoryBackend
from django_ratelimit_r4.core import ratelimiter as ratelimiter_module
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock, MonotonicClock
from django_ratelimit_r4.core.durations import Nanos
from django_ratelimit_r4.core.exceptions import ConfigurationError, RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import (
    RateLimiter,
    RateLimiterConfig,
    RateLimiterEvent,
    acquire_all,
    most_grantable,
)

S = 1_000_000_000
MS = 1_000_000


def make(
    limit: int = 10, period: str = "1s", timeout: object = 0, clock: FakeClock | None = None, **kw: object
) -> RateLimiter:
    """A limiter on a FakeClock (``limiter.clock``)."""
    config = RateLimiterConfig(
        limit_for_period=limit, limit_refresh_period=period, timeout_duration=timeout, **kw
    )
    return RateLimiter("test", config, clock=clock if clock is not None else FakeClock())


def grant_count(limiter: RateLimiter, attempts: int) -> int:
    return sum(limiter.acquire_permission() for _ in range(attempts))


class NoSleepClock(FakeClock):
    """A FakeClock that fails the test if anyone tries to wait on it."""

    __slots__ = ()

    def sleep(self, seconds: float) -> None:
        raise AssertionError(f"sleep({seconds}) called: a rejection must be immediate")

    async def asleep(self, seconds: float) -> None:
        raise AssertionError(f"asleep({seconds}) called: a rejection must be immediate")


# ---------------------------------------------------------------------------------------------------------
# Seed 000: exact under concurrency


def _seed000_round(limiter: RateLimiter, workers: int = 20) -> list[bool]:
    barrier = threading.Barrier(workers)
    results: list[bool] = [False] * workers

    def worker(i: int) -> None:
        barrier.wait()
        results[i] = limiter.acquire_permission()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
        assert not t.is_alive(), "a worker hung"
    return results


def _seed000_trial() -> None:
    clock = FakeClock()
    limiter = make(limit=5, period="60s", timeout=0, clock=clock)
    first = _seed000_round(limiter)
    assert first.count(True) == 5
    assert first.count(False) == 15
    assert limiter.acquire_permission() is False
    assert limiter.metrics.nanos_to_wait == 60 * S
    assert limiter.metrics.available_permissions == 0
    clock.advance(60)
    second = _seed000_round(limiter)
    assert second.count(True) == 5
    assert limiter.acquire_permission() is False
    assert limiter.metrics.successful_calls == 10
    assert limiter.metrics.failed_calls == 15 + 1 + 15 + 1


def test_seed000_twenty_threads_exactly_five_granted() -> None:
    for _ in range(100):
        _seed000_trial()


def test_seed000_under_tiny_switch_interval() -> None:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(60):
            _seed000_trial()
    finally:
        sys.setswitchinterval(previous)


def test_exact_under_contention_on_the_real_clock() -> None:
    limiter = RateLimiter("real", RateLimiterConfig(limit_for_period=137, limit_refresh_period="1h"))
    workers, per_worker = 8, 200
    barrier = threading.Barrier(workers)
    granted = [0] * workers

    def worker(i: int) -> None:
        barrier.wait()
        granted[i] = sum(limiter.acquire_permission() for _ in range(per_worker))

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        sys.setswitchinterval(previous)
    assert sum(granted) == 137
    assert limiter.metrics.successful_calls == 137
    assert limiter.metrics.failed_calls == workers * per_worker - 137


# ---------------------------------------------------------------------------------------------------------
# Resilience4j's verified numbers and the fixed-window shape


def test_r4_five_reserves_limit_2_timeout_10s() -> None:
    limiter = make(limit=2, period="1s", timeout="10s")
    waits, available = [], []
    for _ in range(5):
        waits.append(limiter.reserve_permission())
        available.append(limiter.metrics.available_permissions)
    assert waits == [0, 0, 1 * S, 1 * S, 2 * S]
    assert available == [1, 0, -1, -2, -3]


def test_r4_reserve_more_than_the_limit() -> None:
    limiter = make(limit=2, period="1s", timeout="10s")
    assert limiter.reserve_permission(2) == 0
    assert limiter.reserve_permission(5) == 3 * S
    assert limiter.metrics.available_permissions == -5
    fresh = make(limit=2, period="1s", timeout="10s")
    assert fresh.reserve_permission(5) == 2 * S  # 2 now, 2 next cycle, 1 the one after
    assert fresh.metrics.available_permissions == -3


def test_reserve_beyond_timeout_returns_minus_one_and_reserves_nothing() -> None:
    limiter = make(limit=2, period="1s", timeout="1s")
    assert [limiter.reserve_permission() for _ in range(4)] == [0, 0, S, S]
    assert limiter.reserve_permission() == -1
    assert limiter.metrics.available_permissions == -2
    assert limiter.metrics.failed_calls == 1


def test_debt_is_repaid_by_later_cycles() -> None:
    limiter = make(limit=2, period="1s", timeout="10s")
    for _ in range(5):
        limiter.reserve_permission()
    assert limiter.metrics.available_permissions == -3
    seen = []
    for _ in range(4):
        limiter.clock.advance(1)
        seen.append(limiter.metrics.available_permissions)
    assert seen == [-1, 1, 2, 2]  # capped at the limit once repaid


def test_burst_across_a_cycle_boundary_is_a_fixed_window() -> None:
    # Documented behaviour (Resilience4j #1356/#2064): up to 2x the limit within a moment at a boundary.
    limiter = make(limit=10, period="1s")
    limiter.clock.advance_ns(S - MS // 2)
    assert grant_count(limiter, 11) == 10
    limiter.clock.advance_ns(MS)
    assert grant_count(limiter, 11) == 10
    assert limiter.metrics.successful_calls == 20


def test_idle_accumulation_is_capped_at_one_period() -> None:
    limiter = make(limit=10, period="1s")
    assert grant_count(limiter, 3) == 3
    limiter.clock.advance(100)
    assert limiter.metrics.available_permissions == 10
    assert grant_count(limiter, 30) == 10


def test_cycles_are_counted_from_creation_not_from_epoch() -> None:
    clock = FakeClock(start_ns=123_456_789_123)
    limiter = make(limit=1, period="1s", clock=clock)
    assert limiter.acquire_permission() is True
    assert limiter.metrics.nanos_to_wait == S
    clock.advance_ns(S - 1)
    assert limiter.metrics.cycle == 0
    assert limiter.acquire_permission() is False
    assert limiter.metrics.nanos_to_wait == 1
    clock.advance_ns(1)
    assert limiter.metrics.cycle == 1
    assert limiter.acquire_permission() is True


def test_nanos_to_wait_follows_the_cycle() -> None:
    limiter = make(limit=5, period="60s")
    assert grant_count(limiter, 5) == 5
    limiter.clock.advance(10)
    assert limiter.metrics.nanos_to_wait == 50 * S
    with pytest.raises(RequestNotPermitted) as info:
        limiter.acquire_or_raise()
    assert info.value.wait_ns == 50 * S
    assert info.value.retry_after == 50
    assert info.value.rate_limiter is limiter
    assert info.value.name == "test"


def test_metrics_are_side_effect_free() -> None:
    limiter = make(limit=3, period="1s", timeout="10s")
    limiter.reserve_permission(5)
    before = (limiter.metrics.cycle, limiter.metrics.available_permissions, limiter.metrics.nanos_to_wait)
    for _ in range(50):
        _ = limiter.metrics.available_permissions, limiter.metrics.nanos_to_wait, limiter.metrics.cycle
    assert (
        limiter.metrics.cycle,
        limiter.metrics.available_permissions,
        limiter.metrics.nanos_to_wait,
    ) == before
    assert limiter.metrics.successful_calls == 1 and limiter.metrics.failed_calls == 0
    assert "available_permissions=-2" in repr(limiter.metrics)


def test_java_truncating_div_ceil() -> None:
    # (x + y - 1) / y in Java truncates toward zero; Python's // floors. They differ at -3 / 3 ... -1 / 3.
    assert [div_ceil(x, 3) for x in (-5, -4, -3, -2, 0, 1, 3, 4)] == [-1, 0, 0, 0, 0, 1, 1, 2]


def test_pure_decide_matches_r4_numbers() -> None:
    cycle, permissions = 0, 2
    waits = []
    for _ in range(5):
        cycle, permissions, wait, granted = decide(cycle, permissions, 1, 10 * S, 0, S, 2)
        assert granted
        waits.append(wait)
    assert waits == [0, 0, S, S, 2 * S] and permissions == -3
    # A negative timeout never reserves: that is the metrics' peek.
    assert decide(0, 0, 1, -1, 0, S, 2) == (0, 0, S, False)


def test_permits_must_be_positive() -> None:
    limiter = make(limit=5)
    for bad in (0, -1, -100):
        with pytest.raises(ValueError, match="permits"):
            limiter.acquire_permission(bad)
    assert limiter.metrics.available_permissions == 5
    with pytest.raises(ValueError):
        limiter.reserve_permission(0)
    assert limiter.acquire_permission(5) is True
    assert limiter.acquire_permission(1) is False


# ---------------------------------------------------------------------------------------------------------
# Waiting within the timeout, rejecting beyond it


class RecordingClock(FakeClock):
    """Records the waiting-thread count seen while sleeping (then advances like a FakeClock)."""

    __slots__ = ("limiter", "seen")

    def sleep(self, seconds: float) -> None:
        self.seen.append(self.limiter.metrics.number_of_waiting_threads)
        super().sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        self.seen.append(self.limiter.metrics.number_of_waiting_threads)
        await super().asleep(seconds)


def test_acquire_waits_within_timeout_and_advances_fake_time() -> None:
    clock = RecordingClock()
    clock.seen = []
    limiter = make(limit=1, period="1s", timeout="2s", clock=clock)
    clock.limiter = limiter
    assert limiter.acquire_permission() is True
    clock.advance_ns(300 * MS)
    start = clock.now_ns()
    assert limiter.acquire_permission() is True
    assert clock.now_ns() - start == 700 * MS
    assert clock.seen == [1]
    assert limiter.metrics.number_of_waiting_threads == 0
    # Two permits ahead: next cycle is taken, the following one is 1 s further.
    assert limiter.acquire_permission() is True
    assert clock.now_ns() - start == 1700 * MS
    assert limiter.metrics.successful_calls == 3


def test_wait_beyond_timeout_is_rejected_at_once_without_consuming() -> None:
    # Resilience4j's verified case: limit 1 per 10 s, timeout 300 ms. R4 sleeps 300 ms; we return at once.
    clock = NoSleepClock()
    limiter = make(limit=1, period="10s", timeout="300ms", clock=clock)
    assert limiter.acquire_permission() is True
    assert limiter.acquire_permission() is False
    assert limiter.metrics.available_permissions == 0
    assert limiter.metrics.failed_calls == 1
    with pytest.raises(RequestNotPermitted) as info:
        limiter.acquire_or_raise()
    assert info.value.wait_ns == 10 * S
    clock.advance(10)
    assert limiter.metrics.available_permissions == 1  # nothing was reserved by the rejections


def test_default_timeout_is_zero_and_never_sleeps() -> None:
    limiter = RateLimiter(
        "d", RateLimiterConfig(limit_for_period=1, limit_refresh_period="1h"), clock=NoSleepClock()
    )
    assert limiter.config.timeout_duration == 0
    assert limiter.acquire_permission() is True
    assert limiter.acquire_permission() is False
    assert limiter.reserve_permission() == -1


def test_real_clock_wait_really_waits() -> None:
    t0 = SYSTEM_CLOCK.now_ns()
    limiter = RateLimiter(
        "real", RateLimiterConfig(limit_for_period=1, limit_refresh_period="50ms", timeout_duration="500ms")
    )
    assert limiter.clock is SYSTEM_CLOCK
    assert limiter.acquire_permission() is True
    assert limiter.acquire_permission() is True
    # The second permit belongs to cycle 1, so it cannot have been granted before the anchor + 50 ms.
    assert SYSTEM_CLOCK.now_ns() - t0 >= 50 * MS
    assert limiter.metrics.number_of_waiting_threads == 0


# ---------------------------------------------------------------------------------------------------------
# Async twins


async def test_aacquire_waits_with_asleep() -> None:
    clock = RecordingClock()
    clock.seen = []
    limiter = make(limit=2, period="1s", timeout="5s", clock=clock)
    clock.limiter = limiter
    assert await limiter.aacquire_permission() is True
    assert await limiter.aacquire_permission() is True
    start = clock.now_ns()
    assert await limiter.aacquire_permission() is True
    assert clock.now_ns() - start == S
    assert clock.seen == [1]
    assert limiter.metrics.number_of_waiting_threads == 0


async def test_aacquire_rejects_at_once_and_aacquire_or_raise_carries_the_wait() -> None:
    limiter = make(limit=1, period="60s", timeout="1s", clock=NoSleepClock())
    assert await limiter.aacquire_permission() is True
    assert await limiter.aacquire_permission() is False
    with pytest.raises(RequestNotPermitted) as info:
        await limiter.aacquire_or_raise()
    assert info.value.wait_ns == 60 * S
    assert limiter.metrics.failed_calls == 2


async def test_async_wait_does_not_block_the_event_loop() -> None:
    limiter = RateLimiter(
        "loop", RateLimiterConfig(limit_for_period=1, limit_refresh_period="200ms", timeout_duration="500ms")
    )
    assert isinstance(limiter.clock, MonotonicClock)
    assert await limiter.aacquire_permission() is True
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    wait_ns = limiter.metrics.nanos_to_wait
    task = asyncio.create_task(ticker())
    assert await limiter.aacquire_permission() is True  # waits up to ~200 ms on the loop
    done.set()
    await task
    if wait_ns > 50 * MS:  # practically always; a starved test process may find the cycle already over
        assert ticks >= 3


async def test_cancelled_waiter_leaves_the_waiting_count_consistent() -> None:
    limiter = RateLimiter(
        "cancel", RateLimiterConfig(limit_for_period=1, limit_refresh_period="10s", timeout_duration="20s")
    )
    assert await limiter.aacquire_permission() is True
    task = asyncio.create_task(limiter.aacquire_permission())
    for _ in range(5):
        await asyncio.sleep(0)
    assert limiter.metrics.number_of_waiting_threads == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limiter.metrics.number_of_waiting_threads == 0
    assert limiter.metrics.available_permissions == -1  # the reservation is not given back (as in R4)


# ---------------------------------------------------------------------------------------------------------
# drain_permissions: Resilience4j's cases (a)-(d) are bugs; each is fixed here


def test_drain_same_cycle() -> None:  # (a) works in R4 too
    limiter = make(limit=10)
    grant_count(limiter, 3)
    assert limiter.drain_permissions() == 7
    assert limiter.metrics.available_permissions == 0
    assert limiter.acquire_permission() is False


def test_drain_first_touch_in_new_cycle_with_stale_zero() -> None:  # (b) R4 drains nothing
    limiter = make(limit=10)
    grant_count(limiter, 10)
    limiter.clock.advance(1)
    assert limiter.drain_permissions() == 10
    assert limiter.metrics.available_permissions == 0
    assert limiter.acquire_permission() is False


def test_drain_stale_count_after_rollover() -> None:  # (c) R4 drains only the stale 2
    limiter = make(limit=10)
    grant_count(limiter, 8)
    limiter.clock.advance(1)
    assert limiter.drain_permissions() == 10
    assert grant_count(limiter, 10) == 0


def test_drain_keeps_outstanding_debt() -> None:  # (d) R4 forgives the debt
    limiter = make(limit=2, period="1s", timeout="10s")
    for _ in range(5):
        limiter.reserve_permission()
    assert limiter.drain_permissions() == 0
    assert limiter.metrics.available_permissions == -3
    limiter.clock.advance(1)
    assert limiter.metrics.available_permissions == -1


def test_drain_event_reports_the_number_drained() -> None:  # (e) R4 always reports <= 0
    limiter = make(limit=10)
    seen: list[RateLimiterEvent] = []
    limiter.events.on_drained(seen.append)
    grant_count(limiter, 4)
    limiter.drain_permissions()
    limiter.drain_permissions()
    assert [(e.event_type, e.number_of_permits) for e in seen] == [("DRAINED", 6), ("DRAINED", 0)]


# ---------------------------------------------------------------------------------------------------------
# Runtime changes, clock and reset


def test_change_limit_for_period_keeps_state_until_next_refresh() -> None:
    limiter = make(limit=10)
    grant_count(limiter, 2)
    limiter.change_limit_for_period(5)
    assert limiter.config.limit_for_period == 5
    assert limiter.metrics.available_permissions == 8  # capped only at the next refresh (R4)
    limiter.clock.advance(1)
    assert limiter.metrics.available_permissions == 5
    assert grant_count(limiter, 10) == 5
    limiter.change_limit_for_period(20)
    limiter.clock.advance(1)
    assert grant_count(limiter, 30) == 20


def test_change_limit_is_used_in_wait_calculation_at_once() -> None:
    limiter = make(limit=2, period="1s", timeout="10s")
    grant_count(limiter, 2)
    limiter.change_limit_for_period(1)
    assert limiter.reserve_permission(3) == 3 * S  # deficit 3 - (0 + 1) = 2 more whole periods


def test_change_limit_rejects_invalid_values_and_keeps_config() -> None:
    limiter = make(limit=10)
    with pytest.raises(ConfigurationError, match="limit_for_period"):
        limiter.change_limit_for_period(0)
    assert limiter.config.limit_for_period == 10
    assert grant_count(limiter, 11) == 10


@pytest.mark.parametrize("value", ["2s", timedelta(seconds=2), Nanos(2 * S)])
def test_change_timeout_duration_accepts_config_forms(value: object) -> None:
    limiter = make(limit=1, period="1s")
    assert limiter.acquire_permission() is True
    assert limiter.acquire_permission() is False
    limiter.change_timeout_duration(value)
    assert limiter.config.timeout_duration == 2 * S
    start = limiter.clock.now_ns()
    assert limiter.acquire_permission() is True
    assert limiter.clock.now_ns() - start == S


def test_change_timeout_duration_rejects_unitless() -> None:
    limiter = make(limit=1, timeout="1s")
    with pytest.raises(ConfigurationError, match="timeout_duration"):
        limiter.change_timeout_duration(5)
    assert limiter.config.timeout_duration == S


def test_set_clock_reanchors_and_reset_restores_fresh_state() -> None:
    limiter = make(limit=3, period="1s")
    limiter.clock.advance_ns(700 * MS)
    grant_count(limiter, 3)
    new_clock = FakeClock(start_ns=5 * S + 1)
    limiter.set_clock(new_clock)
    assert limiter.clock is new_clock
    assert limiter.metrics.cycle == 0
    assert limiter.metrics.available_permissions == 3
    assert grant_count(limiter, 4) == 3
    assert limiter.metrics.nanos_to_wait == S  # the first cycle starts at the new clock's time
    limiter.change_limit_for_period(4)
    limiter.reset()
    assert limiter.metrics.available_permissions == 4  # the current config is kept
    assert limiter.metrics.successful_calls == 0 and limiter.metrics.failed_calls == 0
    assert limiter.clock is new_clock


def test_defaults_and_repr() -> None:
    limiter = RateLimiter("defaults")
    assert limiter.config == RateLimiterConfig()
    assert limiter.config.limit_for_period == 50 and limiter.config.limit_refresh_period == 500
    assert limiter.name == "defaults"
    assert "limit_for_period=50" in repr(limiter) and "500ns" in repr(limiter)
    assert isinstance(limiter.backend, RateLimiterBackend)


# ---------------------------------------------------------------------------------------------------------
# Events


def test_no_event_is_built_without_listeners(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object, **kwargs: object) -> None:
        raise AssertionError("event built with nobody listening")

    monkeypatch.setattr(ratelimiter_module, "RateLimiterEvent", explode)
    limiter = make(limit=1, timeout="1s")
    limiter.acquire_permission()
    limiter.acquire_permission()  # waits
    limiter.reserve_permission(2)
    limiter.drain_permissions()
    # A listener of another type does not make the others build events.
    limiter.events.on_drained(lambda e: None)
    limiter.clock.advance(10)
    assert limiter.acquire_permission() is True
    assert limiter.acquire_permission(2) is False


def test_events_fire_for_success_failure_and_reservation() -> None:
    limiter = make(limit=2, timeout="1s")
    got: list[tuple[str, str, int]] = []
    limiter.events.on_successful_acquire(lambda e: got.append(("ok", e.event_type, e.number_of_permits)))
    limiter.events.on_failed_acquire(lambda e: got.append(("fail", e.event_type, e.number_of_permits)))
    limiter.acquire_permission(2)
    limiter.acquire_permission()  # waits 1 s, succeeds
    limiter.acquire_permission(4)  # beyond the timeout
    assert limiter.reserve_permission() == 0  # the wait moved the clock into the next cycle: -1 + 2 left
    assert limiter.reserve_permission(4) == -1
    assert got == [
        ("ok", "SUCCESSFUL_ACQUIRE", 2),
        ("ok", "SUCCESSFUL_ACQUIRE", 1),
        ("fail", "FAILED_ACQUIRE", 4),
        ("ok", "SUCCESSFUL_ACQUIRE", 1),
        ("fail", "FAILED_ACQUIRE", 4),
    ]


def test_catch_all_listener_and_removal() -> None:
    limiter = make(limit=1)
    seen: list[RateLimiterEvent] = []
    listener = limiter.events.on_event(seen.append)
    limiter.acquire_permission()
    limiter.acquire_permission()
    assert [e.event_type for e in seen] == ["SUCCESSFUL_ACQUIRE", "FAILED_ACQUIRE"]
    assert seen[0].name == "test" and seen[0].created_at > 0
    limiter.events.remove_listener(listener)
    assert not limiter.events.wants_successful and not limiter.events.wants_failed
    limiter.acquire_permission()
    assert len(seen) == 2


def test_unknown_event_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event type"):
        make().events._on("SUCCESS", lambda e: None)


def test_raising_listener_does_not_break_acquire(caplog: pytest.LogCaptureFixture) -> None:
    limiter = make(limit=1)

    def boom(event: RateLimiterEvent) -> None:
        raise RuntimeError("listener bug")

    limiter.events.on_successful_acquire(boom)
    limiter.events.on_failed_acquire(boom)
    assert limiter.acquire_permission() is True
    assert limiter.acquire_permission() is False
    with pytest.raises(RequestNotPermitted):
        limiter.acquire_or_raise()
    assert "listener bug" in caplog.text or any(r.exc_info for r in caplog.records)


# ---------------------------------------------------------------------------------------------------------
# call / acall / decorate and drain_permissions_on_result


def test_call_passes_arguments_and_rejects_without_calling() -> None:
    limiter = make(limit=1)
    calls: list[tuple[object, ...]] = []

    def fn(a: int, *, b: int) -> int:
        calls.append((a, b))
        return a + b

    assert limiter.call(fn, 1, b=2) == 3
    with pytest.raises(RequestNotPermitted):
        limiter.call(fn, 1, b=2)
    assert calls == [(1, 2)]


def test_drain_on_result_and_on_exception() -> None:
    class Upstream429(Exception):
        pass

    def should_drain(outcome: object) -> bool:
        return outcome == "429" or isinstance(outcome, Upstream429)

    limiter = make(limit=10, drain_permissions_on_result=should_drain)
    assert limiter.call(lambda: "200") == "200"
    assert limiter.metrics.available_permissions == 9
    assert limiter.call(lambda: "429") == "429"
    assert limiter.metrics.available_permissions == 0
    limiter.clock.advance(1)

    def fails() -> None:
        raise Upstream429()

    with pytest.raises(Upstream429):
        limiter.call(fails)
    assert limiter.metrics.available_permissions == 0
    limiter.clock.advance(1)
    with pytest.raises(KeyError):
        limiter.call(lambda: {}["x"])
    assert limiter.metrics.available_permissions == 9


def test_drain_predicate_as_dotted_path() -> None:
    limiter = make(limit=5, drain_permissions_on_result="builtins.bool")
    limiter.call(lambda: 0)
    assert limiter.metrics.available_permissions == 4
    limiter.call(lambda: 1)
    assert limiter.metrics.available_permissions == 0


async def test_acall_and_async_drain() -> None:
    limiter = make(limit=2, drain_permissions_on_result=lambda outcome: outcome == "stop")

    async def work(x: str) -> str:
        await asyncio.sleep(0)
        return x

    assert await limiter.acall(work, "go") == "go"
    assert await limiter.acall(work, "stop") == "stop"
    with pytest.raises(RequestNotPermitted):
        await limiter.acall(work, "go")
    assert limiter.metrics.available_permissions == 0


async def test_decorate_sync_and_async() -> None:
    limiter = make(limit=2)

    @limiter.decorate
    def sync_view(x: int) -> int:
        """Doc kept."""
        return x * 2

    @limiter.decorate
    async def async_view(x: int) -> int:
        return x * 3

    assert sync_view.__name__ == "sync_view" and sync_view.__doc__ == "Doc kept."
    assert asyncio.iscoroutinefunction(async_view)
    assert sync_view(2) == 4
    assert await async_view(2) == 6
    with pytest.raises(RequestNotPermitted):
        sync_view(1)
    with pytest.raises(RequestNotPermitted):
        await async_view(1)


# ---------------------------------------------------------------------------------------------------------
# acquire_all: all-or-nothing multi-limits


def test_acquire_all_grants_and_consumes_everywhere() -> None:
    clock = FakeClock()
    burst, sustained = make(limit=3, clock=clock), make(limit=10, period="1m", clock=clock)
    assert acquire_all([burst, sustained]) is None
    assert burst.metrics.available_permissions == 2
    assert sustained.metrics.available_permissions == 9
    assert acquire_all([]) is None


def test_acquire_all_rejection_consumes_nothing_and_reports_largest_wait() -> None:
    clock = FakeClock()
    ok = make(limit=5, period="1s", clock=clock)
    short = make(limit=1, period="1s", clock=clock)
    long = make(limit=1, period="60s", clock=clock)
    short.acquire_permission()
    long.acquire_permission()
    clock.advance_ns(100 * MS)
    failed: list[str] = []
    long.events.on_failed_acquire(lambda e: failed.append(e.name))
    for _ in range(50):
        outcome = acquire_all([ok, short, long])
        assert outcome == (long, 60 * S - 100 * MS)
    assert ok.metrics.available_permissions == 5
    assert ok.metrics.failed_calls == 0 and ok.metrics.successful_calls == 0
    assert short.metrics.failed_calls == 50 and long.metrics.failed_calls == 50
    assert len(failed) == 50
    result = acquire_all([ok, short])
    assert result is not None and result[0] is short and result[1] == 900 * MS


def test_acquire_all_argument_errors() -> None:
    limiter = make()
    with pytest.raises(ValueError, match="more than once"):
        acquire_all([limiter, limiter])
    with pytest.raises(ValueError, match="permits"):
        acquire_all([limiter], permits=0)

    stub = RateLimiter("stub", clock=FakeClock(), backend=lambda *a: _StubBackend())
    with pytest.raises(TypeError, match="cannot combine"):
        acquire_all([limiter, stub])


class _StubBackend:
    """A foreign backend type, only to check that types are not mixed silently."""

    successful_calls = failed_calls = 0

    def acquire(self, permits: int, timeout_ns: int) -> int:
        return 0


def test_custom_backend_factory_receives_config() -> None:
    got: list[tuple[object, ...]] = []

    def factory(name: str, limit: int, period_ns: int, clock: object) -> MemoryBackend:
        got.append((name, limit, period_ns, clock))
        return MemoryBackend(name, limit, period_ns, clock)  # type: ignore[arg-type]

    clock = FakeClock()
    limiter = RateLimiter(
        "custom",
        RateLimiterConfig(limit_for_period=7, limit_refresh_period="2s"),
        clock=clock,
        backend=factory,
    )
    assert got == [("custom", 7, 2 * S, clock)]
    assert grant_count(limiter, 8) == 7


def test_acquire_all_threads_no_over_admission() -> None:
    for _ in range(30):
        clock = FakeClock()
        a, b = make(limit=5, period="60s", clock=clock), make(limit=3, period="60s", clock=clock)
        workers = 12
        barrier = threading.Barrier(workers)
        outcomes: list[object] = [None] * workers

        def worker(
            i: int,
            a: RateLimiter = a,
            b: RateLimiter = b,
            barrier: threading.Barrier = barrier,
            outcomes: list[object] = outcomes,
        ) -> None:
            order = [a, b] if i % 2 else [b, a]
            barrier.wait()
            outcomes[i] = acquire_all(order)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
            assert not t.is_alive()
        assert sum(o is None for o in outcomes) == 3
        assert a.metrics.available_permissions == 2
        assert b.metrics.available_permissions == 0
        assert all(o is None or o[0] is b for o in outcomes)


def test_acquire_all_overlapping_sets_do_not_deadlock() -> None:
    clock = FakeClock()
    limiters = [make(limit=10**9, period="1h", clock=clock) for _ in range(4)]
    workers, rounds = 8, 300
    barrier = threading.Barrier(workers)
    previous = sys.getswitchinterval()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(rounds):
            subset = rng.sample(limiters, rng.randint(2, 4))
            assert acquire_all(subset) is None

    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
            assert not t.is_alive(), "acquire_all deadlocked"
    finally:
        sys.setswitchinterval(previous)
    assert sum(lim.metrics.successful_calls for lim in limiters) > workers * rounds * 2 - 1


# ------------------------------------------------------------------ impossible requests and configs (issue 8)


def test_more_permits_than_a_cycle_holds_without_a_timeout_is_a_clear_error() -> None:
    limiter = make(limit=5, period="1m")
    for call in (limiter.acquire_permission, limiter.acquire_or_raise, limiter.reserve_permission):
        with pytest.raises(ValueError, match=r"'test' can never grant 6 permits in one call: it allows 5 per 1m"):
            call(6)
    with pytest.raises(ValueError, match="can never grant 6"):
        asyncio.run(limiter.aacquire_or_raise(6))
    with pytest.raises(ValueError, match="can never grant 6"):
        acquire_all([limiter, make(limit=10)], permits=6)
    assert limiter.acquire_permission(5) is True  # nothing was taken by the refused calls


def test_with_a_timeout_reservations_of_later_cycles_stay_possible() -> None:
    # Resilience4j's semantics: a timeout lets a call reserve permits of later cycles, up to what it covers.
    limiter = make(limit=2, period="1s", timeout="1s")
    assert most_grantable(limiter.config, limiter._timeout_ns) == 4
    assert limiter.reserve_permission(4) == S  # 2 now, 2 of the next cycle
    assert limiter.reserve_permission(4) == -1  # possible in principle, not now
    with pytest.raises(ValueError, match=r"waits at most 1s, so at most 4"):
        limiter.reserve_permission(5)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"limit_for_period": 10**15}, "limit_for_period.*must be <= 999999999999999"),
        ({"limit_refresh_period": "367d"}, "limit_refresh_period.*must be at most 366d, got 367d"),
        ({"timeout_duration": "400d"}, "timeout_duration.*must be at most 366d, got 400d"),
    ],
)
def test_limits_beyond_exact_and_sane_bounds_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RateLimiterConfig(**fields)
    RateLimiterConfig(limit_for_period=999_999_999_999_999, limit_refresh_period="366d", timeout_duration="366d")
