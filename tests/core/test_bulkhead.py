"""Bulkhead: the seed-002 runs, FIFO hand-off, permits returned on every exit path, threads + loop at once."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable

import pytest

from django_ratelimit_r4.core import bulkhead as bulkhead_module
from django_ratelimit_r4.core.bulkhead import (
    CALL_FINISHED,
    CALL_PERMITTED,
    CALL_REJECTED,
    Bulkhead,
    BulkheadConfig,
    BulkheadEvent,
)
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import BulkheadFull, ConfigurationError, ResilienceError
from tests.noblock import forbid_blocking


def make(max_calls: int = 1, wait: object = 0, **kwargs: object) -> Bulkhead:
    return Bulkhead("test", BulkheadConfig(max_concurrent_calls=max_calls, max_wait_duration=wait), **kwargs)  # type: ignore[arg-type]


def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll (threads) until ``predicate()``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.001)


async def auntil(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll (event loop) until ``predicate()``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


def assert_all_free(b: Bulkhead) -> None:
    assert b.metrics.available_concurrent_calls == b.metrics.max_allowed_concurrent_calls
    assert b.metrics.concurrent_calls == 0
    assert b.metrics.waiting_calls == 0


class InFlight:
    """Counts calls inside the protected section and remembers the peak (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def exit(self) -> None:
        with self.lock:
            self.now -= 1


# -- seed 002: the article's BulkheadSimples ---------------------------------------------------------


async def test_seed_002_thousand_tasks_through_a_bulkhead_of_100() -> None:
    """The article's scenario on the fake clock: 1000 calls of 300 ms, 100 slots, a 200 ms wait.

    No slot frees before 300 ms, so every waiter's budget runs out first: exactly 900 are refused. The calls
    end when the test's clock reaches 300 ms, not when a loaded machine gets round to it.
    """
    clock = FakeClock()
    b = make(100, "200ms", clock=clock)
    flight = InFlight()
    calls_end = asyncio.Event()
    rejected = 0

    async def capture() -> None:
        nonlocal rejected
        try:
            async with b:
                flight.enter()
                try:
                    await calls_end.wait()  # the 300 ms call
                finally:
                    flight.exit()
        except BulkheadFull:
            rejected += 1

    tasks = [asyncio.ensure_future(capture()) for _ in range(1000)]  # all arrive together
    await auntil(lambda: b.metrics.concurrent_calls == 100 and b.metrics.waiting_calls + rejected == 900)
    clock.advance(0.2)  # t = 200 ms: every waiter's budget is spent, every slot still held
    await auntil(lambda: rejected == 900)
    assert b.metrics.concurrent_calls == 100
    clock.advance(0.1)  # t = 300 ms: the calls end
    calls_end.set()
    await asyncio.gather(*tasks)
    assert (flight.peak, rejected) == (100, 900)
    assert_all_free(b)
    m = b.metrics
    assert (m.permitted_calls, m.rejected_calls, m.finished_calls) == (100, 900, 100)


@pytest.mark.parametrize("trial", range(2))
def test_seed_002_with_threads(trial: int) -> None:
    """40 threads released together on 10 slots with a 100 ms wait; the calls end when the fake clock says."""
    clock = FakeClock()
    b = make(10, "100ms", clock=clock)
    flight = InFlight()
    barrier = threading.Barrier(40)
    calls_end = threading.Event()
    rejected: list[int] = []

    def capture() -> None:
        barrier.wait()
        try:
            with b:
                flight.enter()
                try:
                    calls_end.wait(30)
                finally:
                    flight.exit()
        except BulkheadFull:
            rejected.append(1)

    threads = [threading.Thread(target=capture) for _ in range(40)]
    for t in threads:
        t.start()
    until(lambda: b.metrics.concurrent_calls == 10 and b.metrics.waiting_calls + len(rejected) == 30)
    clock.advance(0.1)  # every waiter's budget is spent while all 10 slots are held
    until(lambda: len(rejected) == 30)
    calls_end.set()
    for t in threads:
        t.join()
    assert flight.peak == 10
    assert len(rejected) == 30
    assert_all_free(b)


# -- threads and the event loop on one instance ------------------------------------------------------


async def test_threads_and_loop_share_one_instance_without_blocking_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    b = make(3, "1s")  # built before the watch: its own short-held lock is not a thread wait
    flight = InFlight()
    release_threads = threading.Event()
    results: list[str] = []

    def thread_holder() -> None:
        with b:
            flight.enter()
            release_threads.wait(5)
            flight.exit()
        results.append("thread-holder")

    def thread_waiter() -> None:
        try:
            with b:
                flight.enter()
                time.sleep(0.01)
                flight.exit()
            results.append("thread-waiter")
        except BulkheadFull:
            results.append("thread-rejected")

    async def async_waiter() -> None:
        async with b:  # parked while threads hold every slot: must not block the loop
            flight.enter()
            await asyncio.sleep(0.01)
            flight.exit()
        results.append("async-waiter")

    # Waiter locks made from here on report a wait on the loop's thread; threads may block.
    with forbid_blocking(monkeypatch) as blocking:
        holders = [threading.Thread(target=thread_holder) for _ in range(3)]
        for t in holders:
            t.start()
        await auntil(lambda: b.metrics.concurrent_calls == 3)
        waiters = [threading.Thread(target=thread_waiter) for _ in range(2)]
        for t in waiters:
            t.start()
        tasks = [asyncio.ensure_future(async_waiter()) for _ in range(3)]
        await auntil(lambda: b.metrics.waiting_calls == 5)
        release_threads.set()  # threads release; slots go to thread and async waiters alike
        await asyncio.gather(*tasks)
        await loop.run_in_executor(None, lambda: [t.join() for t in holders + waiters])

    assert sorted(results) == ["async-waiter"] * 3 + ["thread-holder"] * 3 + ["thread-waiter"] * 2
    assert flight.peak == 3
    assert_all_free(b)
    assert blocking == [], blocking  # async waiters parked on futures, never on a thread lock


def test_thread_waiter_gets_a_slot_released_from_the_event_loop() -> None:
    b = make(1, "5s")
    got: list[bool] = []
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(b.aacquire_permission())
        t = threading.Thread(target=lambda: got.append(b.try_acquire_permission()))
        t.start()
        until(lambda: b.metrics.waiting_calls == 1)

        async def release() -> None:
            b.on_complete()

        loop.run_until_complete(release())
        t.join(5)
    finally:
        loop.close()
    assert got == [True]
    b.on_complete()
    assert_all_free(b)


def test_async_waiter_on_another_thread_loop_is_woken_by_a_thread_release() -> None:
    b = make(1, "5s")
    b.acquire_permission()
    got: list[bool] = []

    def run_loop() -> None:
        got.append(asyncio.run(b.atry_acquire_permission()))

    t = threading.Thread(target=run_loop)
    t.start()
    until(lambda: b.metrics.waiting_calls == 1)
    started = time.monotonic()
    b.on_complete()
    t.join(5)
    assert got == [True]
    assert time.monotonic() - started < 3.0  # woken, not timed out (the budget is 5 s)
    b.on_complete()
    assert_all_free(b)


def test_waiter_on_a_closed_loop_passes_its_permit_on() -> None:
    b = make(1, "5s")
    b.acquire_permission()
    loop = asyncio.new_event_loop()
    task_holder: list[asyncio.Task[bool]] = []

    async def park_and_leave() -> None:
        task_holder.append(asyncio.ensure_future(b.atry_acquire_permission()))
        await auntil(lambda: b.metrics.waiting_calls == 1)

    loop.run_until_complete(park_and_leave())
    loop.close()  # its parked task will never run again
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(b.try_acquire_permission()))
    t.start()
    until(lambda: b.metrics.waiting_calls == 2)
    b.on_complete()  # the dead waiter is first in line: its permit must reach the thread
    t.join(5)
    assert got == [True]
    b.on_complete()
    assert_all_free(b)


# -- FIFO hand-off ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fair", [True, False])
def test_thread_waiters_are_served_in_arrival_order(fair: bool) -> None:
    b = Bulkhead("t", BulkheadConfig(max_concurrent_calls=1, max_wait_duration="5s", fair_call_handling=fair))
    b.acquire_permission()
    order: list[int] = []

    def waiter(i: int) -> None:
        with b:
            order.append(i)

    threads = []
    for i in range(8):
        t = threading.Thread(target=waiter, args=(i,))
        t.start()
        until(lambda i=i: b.metrics.waiting_calls == i + 1)  # type: ignore[misc]
        threads.append(t)
    b.on_complete()
    for t in threads:
        t.join(5)
    assert order == list(range(8))
    assert_all_free(b)


async def test_async_waiters_are_served_in_arrival_order() -> None:
    b = make(2, "5s")
    await b.aacquire_permission()
    await b.aacquire_permission()
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with b:
            order.append(i)
            await asyncio.sleep(0)

    tasks = []
    for i in range(10):
        tasks.append(asyncio.ensure_future(waiter(i)))
        await auntil(lambda i=i: b.metrics.waiting_calls == i + 1)  # type: ignore[misc]
    b.on_complete()
    b.on_complete()
    await asyncio.gather(*tasks)
    assert order == list(range(10))
    assert_all_free(b)


def test_released_slot_is_reserved_for_the_waiter_not_for_a_newcomer() -> None:
    b = make(1, "5s")
    b.acquire_permission()
    entered = threading.Event()
    leave = threading.Event()
    order: list[str] = []

    def first_waiter() -> None:
        with b:
            order.append("waiter")
            entered.set()
            leave.wait(5)

    t = threading.Thread(target=first_waiter)
    t.start()
    until(lambda: b.metrics.waiting_calls == 1)
    b.on_complete()
    # Handed over inside on_complete(): nothing is free for a newcomer, even before the waiter runs.
    assert b.metrics.available_concurrent_calls == 0
    assert b.metrics.waiting_calls == 0
    newcomer = threading.Thread(target=lambda: b.call(order.append, "newcomer"))
    newcomer.start()
    entered.wait(5)
    time.sleep(0.02)
    assert order == ["waiter"]
    leave.set()
    t.join(5)
    newcomer.join(5)
    assert order == ["waiter", "newcomer"]
    assert_all_free(b)


# -- change_config ---------------------------------------------------------------------------------


def test_growing_hands_new_slots_to_waiters_at_once() -> None:
    b = make(1, "10s")
    b.acquire_permission()
    got: list[bool] = []
    threads = [threading.Thread(target=lambda: got.append(b.try_acquire_permission())) for _ in range(3)]
    for t in threads:
        t.start()
    until(lambda: b.metrics.waiting_calls == 3)
    started = time.monotonic()
    b.change_config(BulkheadConfig(max_concurrent_calls=3, max_wait_duration="10s"))
    until(lambda: len(got) == 2)
    assert time.monotonic() - started < 2.0
    assert got == [True, True]
    assert b.metrics.waiting_calls == 1
    assert b.metrics.max_allowed_concurrent_calls == 3
    for _ in range(3):
        b.on_complete()  # the third waiter gets the first freed slot
    for t in threads:
        t.join(5)
    assert got == [True, True, True]
    b.on_complete()
    assert_all_free(b)


async def test_growing_wakes_async_waiters() -> None:
    b = make(0 + 1, "10s")
    await b.aacquire_permission()
    task = asyncio.ensure_future(b.atry_acquire_permission())
    await auntil(lambda: b.metrics.waiting_calls == 1)
    b.change_config(BulkheadConfig(max_concurrent_calls=2, max_wait_duration="10s"))
    assert await asyncio.wait_for(task, 2) is True
    b.on_complete()
    b.on_complete()
    assert_all_free(b)


def test_shrinking_blocks_nobody_and_lets_calls_in_flight_drain() -> None:
    b = make(4, 0)
    for _ in range(4):
        b.acquire_permission()
    started = time.monotonic()
    b.change_config(BulkheadConfig(max_concurrent_calls=2))
    assert time.monotonic() - started < 2  # Resilience4j would block here until two calls finish (never)
    assert b.metrics.max_allowed_concurrent_calls == 2
    assert b.metrics.concurrent_calls == 4
    assert b.metrics.available_concurrent_calls == 0  # really -2: reported as 0
    assert b.try_acquire_permission() is False
    b.on_complete()
    b.on_complete()
    assert b.metrics.available_concurrent_calls == 0
    assert b.try_acquire_permission() is False  # 2 in flight, limit 2
    b.on_complete()
    assert b.metrics.available_concurrent_calls == 1
    assert b.try_acquire_permission() is True
    b.on_complete()
    b.on_complete()
    assert_all_free(b)


def test_shrinking_keeps_waiters_parked_until_the_drain_reaches_the_new_limit() -> None:
    b = make(3, "10s")
    for _ in range(3):
        b.acquire_permission()
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(b.try_acquire_permission()))
    t.start()
    until(lambda: b.metrics.waiting_calls == 1)
    b.change_config(BulkheadConfig(max_concurrent_calls=1, max_wait_duration="10s"))
    b.on_complete()
    b.on_complete()
    time.sleep(0.02)
    assert got == []  # one still in flight = the new limit
    b.on_complete()
    t.join(5)
    assert got == [True]
    b.on_complete()
    assert_all_free(b)


def test_change_config_applies_the_new_wait_budget_and_rejects_wrong_types() -> None:
    b = make(1, 0)
    b.acquire_permission()
    b.change_config(BulkheadConfig(max_concurrent_calls=1, max_wait_duration="30ms"))
    started = time.monotonic()
    assert b.try_acquire_permission() is False
    assert time.monotonic() - started >= 0.025
    with pytest.raises(TypeError):
        b.change_config({"max_concurrent_calls": 2})  # type: ignore[arg-type]


# -- a permit is returned on every exit path -------------------------------------------------------


def test_exception_in_with_block_returns_the_permit() -> None:
    b = make(1)
    with pytest.raises(ValueError), b:
        raise ValueError("boom")
    assert_all_free(b)
    assert b.metrics.finished_calls == 1


def test_keyboard_interrupt_in_with_block_returns_the_permit() -> None:
    b = make(1)
    with pytest.raises(KeyboardInterrupt), b:
        raise KeyboardInterrupt
    assert_all_free(b)


def test_call_returns_result_and_releases_on_exception() -> None:
    b = make(1)
    assert b.call(lambda x, y=0: x + y, 1, y=2) == 3

    def fail() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        b.call(fail)
    assert_all_free(b)
    assert (b.metrics.permitted_calls, b.metrics.finished_calls) == (2, 2)


async def test_acall_returns_result_and_releases_on_exception() -> None:
    b = make(1)

    async def add(x: int, y: int = 0) -> int:
        await asyncio.sleep(0)
        return x + y

    async def fail() -> None:
        raise KeyError("x")

    assert await b.acall(add, 1, y=2) == 3
    with pytest.raises(KeyError):
        await b.acall(fail)
    assert_all_free(b)


async def test_cancelled_while_holding_returns_the_permit() -> None:
    b = make(1)
    inside = asyncio.Event()

    async def hold() -> None:
        async with b:
            inside.set()
            await asyncio.sleep(10)

    task = asyncio.ensure_future(hold())
    await inside.wait()
    assert b.metrics.available_concurrent_calls == 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_all_free(b)


async def test_cancelled_while_waiting_leaves_no_trace() -> None:
    b = make(1, "10s")
    await b.aacquire_permission()
    task = asyncio.ensure_future(b.aacquire_permission())
    await auntil(lambda: b.metrics.waiting_calls == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert b.metrics.waiting_calls == 0
    assert b.metrics.rejected_calls == 1
    b.on_complete()
    assert_all_free(b)


async def test_cancelled_after_the_slot_was_handed_over_passes_it_on() -> None:
    b = make(1, "10s")
    await b.aacquire_permission()
    first = asyncio.ensure_future(b.aacquire_permission())
    await auntil(lambda: b.metrics.waiting_calls == 1)
    second = asyncio.ensure_future(b.aacquire_permission())
    await auntil(lambda: b.metrics.waiting_calls == 2)
    b.on_complete()  # hands the slot to `first`, which has not run yet...
    first.cancel()  # ...and is cancelled before it can use it
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 2)  # the slot went on to `second`
    assert b.metrics.concurrent_calls == 1
    b.on_complete()
    assert_all_free(b)


async def test_acall_cancelled_while_waiting_then_holding() -> None:
    b = make(1, "10s")
    inside = asyncio.Event()

    async def slow() -> None:
        inside.set()
        await asyncio.sleep(10)

    holder = asyncio.ensure_future(b.acall(slow))
    await inside.wait()
    waiter = asyncio.ensure_future(b.acall(slow))
    await auntil(lambda: b.metrics.waiting_calls == 1)
    waiter.cancel()
    holder.cancel()
    await asyncio.gather(holder, waiter, return_exceptions=True)
    assert holder.cancelled() and waiter.cancelled()
    assert_all_free(b)


def test_keyboard_interrupt_while_waiting_leaves_no_trace() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    b = make(1, "10s")
    b.acquire_permission()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt_when_parked() -> None:
        until(lambda: b.metrics.waiting_calls == 1)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    t = threading.Thread(target=interrupt_when_parked)
    t.start()
    try:
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            b.acquire_permission()
        assert time.monotonic() - started < 5
    finally:
        signal.signal(signal.SIGINT, previous)
        t.join()
    assert b.metrics.waiting_calls == 0
    b.on_complete()
    assert_all_free(b)


def test_real_time_wait_budget_runs_out_for_threads() -> None:
    b = make(1, "50ms")
    b.acquire_permission()
    started = time.monotonic()
    with pytest.raises(BulkheadFull) as info:
        b.acquire_permission()
    elapsed = time.monotonic() - started
    assert 0.045 <= elapsed < 2.5  # the budget, not a hang (bound wide for a loaded CI)
    assert info.value.bulkhead is b and info.value.name == "test" and info.value.wait_ns == 0
    assert isinstance(info.value, ResilienceError)
    assert b.metrics.waiting_calls == 0
    b.on_complete()
    assert_all_free(b)


async def test_real_time_wait_budget_runs_out_for_tasks() -> None:
    b = make(1, "50ms")
    await b.aacquire_permission()
    started = time.monotonic()
    with pytest.raises(BulkheadFull):
        async with b:
            pass
    assert 0.045 <= time.monotonic() - started < 2.5  # the budget, not a hang (bound wide for a loaded CI)
    b.on_complete()
    assert_all_free(b)


def test_fake_clock_decides_a_thread_wait_without_sleeping() -> None:
    clock = FakeClock()
    b = make(1, "60s", clock=clock)
    b.acquire_permission()
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(b.try_acquire_permission()))
    t.start()
    until(lambda: b.metrics.waiting_calls == 1)
    clock.advance(59.9)
    time.sleep(0.02)
    assert got == []  # still inside the budget
    clock.advance(0.2)
    t.join(2)
    assert got == [False]
    assert b.metrics.waiting_calls == 0
    b.on_complete()
    assert_all_free(b)


async def test_fake_clock_decides_a_task_wait_without_sleeping() -> None:
    clock = FakeClock()
    b = make(1, "60s", clock=clock)
    await b.aacquire_permission()
    task = asyncio.ensure_future(b.atry_acquire_permission())
    await auntil(lambda: b.metrics.waiting_calls == 1)
    clock.advance(59.9)
    await asyncio.sleep(0.02)
    assert not task.done()
    clock.advance(0.2)
    assert await asyncio.wait_for(task, 2) is False
    b.on_complete()
    assert_all_free(b)


def test_fake_clock_waiter_still_gets_a_released_slot() -> None:
    b = make(1, "60s", clock=FakeClock())
    b.acquire_permission()
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(b.try_acquire_permission()))
    t.start()
    until(lambda: b.metrics.waiting_calls == 1)
    b.on_complete()
    t.join(2)
    assert got == [True]
    b.on_complete()
    assert_all_free(b)


def test_forgotten_fake_clock_never_waits_longer_than_the_real_budget() -> None:
    b = make(1, "50ms", clock=FakeClock())
    b.acquire_permission()
    started = time.monotonic()
    assert b.try_acquire_permission() is False
    assert time.monotonic() - started < 2.5  # the 50 ms real budget, never the fake clock's forever


# -- max_concurrent_calls = 0 ----------------------------------------------------------------------


async def test_zero_max_concurrent_calls_rejects_everything_at_once() -> None:
    b = make(0, "10s")
    started = time.monotonic()
    assert b.try_acquire_permission() is False
    assert await b.atry_acquire_permission() is False
    with pytest.raises(BulkheadFull):
        b.call(lambda: None)
    with pytest.raises(BulkheadFull):
        async with b:
            pass
    assert time.monotonic() - started < 3.0  # no wait for a slot that cannot come (the budget is 10 s)
    assert b.metrics.rejected_calls == 4
    assert b.metrics.permitted_calls == 0
    assert b.metrics.available_concurrent_calls == 0


def test_zero_config_is_valid_and_negative_is_not() -> None:
    BulkheadConfig(max_concurrent_calls=0)
    with pytest.raises(ConfigurationError):
        BulkheadConfig(max_concurrent_calls=-1)


# -- events and metrics ----------------------------------------------------------------------------


def test_events_are_published_per_type() -> None:
    b = make(1)
    seen: list[tuple[str, str]] = []
    every: list[str] = []
    b.events.on_call_permitted(lambda e: seen.append(("permitted", e.event_type)))
    b.events.on_call_rejected(lambda e: seen.append(("rejected", e.event_type)))
    b.events.on_call_finished(lambda e: seen.append(("finished", e.event_type)))
    b.events.on_event(lambda e: every.append(e.event_type))
    with b:
        assert b.try_acquire_permission() is False
    b.acquire_permission()
    b.release_permission()  # no event for an unused permit
    assert seen == [
        ("permitted", CALL_PERMITTED),
        ("rejected", CALL_REJECTED),
        ("finished", CALL_FINISHED),
        ("permitted", CALL_PERMITTED),
    ]
    assert every == [CALL_PERMITTED, CALL_REJECTED, CALL_FINISHED, CALL_PERMITTED]
    assert (b.metrics.permitted_calls, b.metrics.rejected_calls, b.metrics.finished_calls) == (2, 1, 1)
    assert_all_free(b)


async def test_cancelled_wait_publishes_a_rejection() -> None:
    b = make(1, "10s")
    events: list[BulkheadEvent] = []
    b.events.on_event(events.append)
    await b.aacquire_permission()
    task = asyncio.ensure_future(b.aacquire_permission())
    await auntil(lambda: b.metrics.waiting_calls == 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [e.event_type for e in events] == [CALL_PERMITTED, CALL_REJECTED]
    assert all(e.name == "test" for e in events)


def test_a_failing_listener_does_not_break_the_call() -> None:
    b = make(1)

    def broken(event: BulkheadEvent) -> None:
        raise RuntimeError("listener bug")

    b.events.on_call_permitted(broken)
    b.events.on_call_finished(broken)
    assert b.call(lambda: 42) == 42
    assert_all_free(b)


def test_no_event_is_built_without_listeners(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def spy(event_type: str, name: str) -> BulkheadEvent:
        built.append(event_type)
        return BulkheadEvent(event_type, name)

    monkeypatch.setattr(bulkhead_module, "BulkheadEvent", spy)
    b = make(1)
    with b:
        b.try_acquire_permission()
    assert built == []
    b.events.on_call_finished(lambda e: None)
    with b:
        pass
    assert built == [CALL_PERMITTED, CALL_FINISHED]  # every type is built once anyone listens


# -- decorate, reset, set_clock --------------------------------------------------------------------


async def test_decorate_sync_and_async_functions() -> None:
    b = make(1)

    @b.decorate
    def double(x: int) -> int:
        """Doubles."""
        assert b.metrics.available_concurrent_calls == 0
        return 2 * x

    @b.decorate
    async def adouble(x: int) -> int:
        assert b.metrics.available_concurrent_calls == 0
        return 2 * x

    assert double(2) == 4 and double.__name__ == "double" and double.__doc__ == "Doubles."
    assert await adouble(3) == 6
    assert asyncio.iscoroutinefunction(adouble)
    assert_all_free(b)


def test_reset_frees_every_permit_and_zeroes_counters() -> None:
    b = make(2, 0)
    b.acquire_permission()
    b.acquire_permission()
    assert b.try_acquire_permission() is False
    b.reset()
    assert_all_free(b)
    assert (b.metrics.permitted_calls, b.metrics.rejected_calls, b.metrics.finished_calls) == (0, 0, 0)
    b.acquire_permission()
    b.on_complete()  # an in-flight call from before reset() finishing...
    b.on_complete()  # ...while the count is already 0 must not push it below 0
    assert b.metrics.available_concurrent_calls == 2
    assert b.metrics.concurrent_calls == 0


def test_reset_hands_freed_slots_to_parked_waiters() -> None:
    b = make(1, "10s")
    b.acquire_permission()
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(b.try_acquire_permission()))
    t.start()
    until(lambda: b.metrics.waiting_calls == 1)
    b.reset()
    t.join(2)
    assert got == [True]
    b.on_complete()
    assert_all_free(b)


def test_set_clock_swaps_the_time_source() -> None:
    b = make(1, "60s")
    clock = FakeClock()
    b.set_clock(clock)
    assert b.clock is clock
    b.acquire_permission()
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(b.try_acquire_permission()))
    t.start()
    until(lambda: b.metrics.waiting_calls == 1)
    clock.advance(61)
    t.join(2)
    assert got == [False]


def test_defaults_follow_resilience4j() -> None:
    b = Bulkhead("d")
    assert b.config == BulkheadConfig()
    assert b.metrics.max_allowed_concurrent_calls == 25
    assert b.config.max_wait_duration == 0
    assert b.config.fair_call_handling is True
    assert "Bulkhead('d'" in repr(b)


def test_a_wait_budget_beyond_the_platform_lock_timeout_still_waits() -> None:
    """A max_wait_duration longer than threading.TIMEOUT_MAX must wait, not raise OverflowError."""
    b = make(1, "400000d")  # ~1095 years, beyond TIMEOUT_MAX (~292 years on Linux, ~49 days on Windows)
    assert b.try_acquire_permission()
    got: list[object] = []

    def waiter() -> None:
        try:
            got.append(b.try_acquire_permission())
        except BaseException as exc:  # recorded: the assertion below shows what went wrong
            got.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    until(lambda: b.metrics.waiting_calls == 1 or bool(got))
    b.on_complete()
    t.join(5)
    assert got == [True]
    b.on_complete()
    assert_all_free(b)
