"""TimeLimiter: asyncio deadlines with Resilience4j's cancel_running_future, metrics and events."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging

import pytest

from django_ratelimit_r4.core import timelimiter as tl_module
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock
from django_ratelimit_r4.core.exceptions import ResilienceError, TimeLimitExceeded
from django_ratelimit_r4.core.timelimiter import TimeLimiter, TimeLimiterConfig, TimeLimiterEvent

SHORT = "30ms"


def limiter(timeout: str = SHORT, cancel: bool = True) -> tuple[TimeLimiter, list[TimeLimiterEvent]]:
    tl = TimeLimiter("tl", TimeLimiterConfig(timeout_duration=timeout, cancel_running_future=cancel))
    events: list[TimeLimiterEvent] = []
    tl.events.on_event(events.append)
    return tl, events


def counts(tl: TimeLimiter) -> tuple[int, int, int]:
    m = tl.metrics
    return m.number_of_successful_calls, m.number_of_failed_calls, m.number_of_timeout_calls


class Hanging:
    """A coroutine function that waits for an event nobody sets, recording how it ended."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = False
        self.cancelled = False
        self.finished = False

    async def __call__(self, value: object = "late") -> object:
        self.started = True
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished = True
        if isinstance(value, BaseException):
            raise value
        return value


def test_defaults_match_resilience4j() -> None:
    tl = TimeLimiter("d")
    assert tl.config.timeout_duration == 1_000_000_000
    assert tl.config.cancel_running_future is True
    assert tl.clock is SYSTEM_CLOCK
    assert "timeout=1s" in repr(tl)


async def test_success_returns_the_result_and_counts() -> None:
    tl, events = limiter("1s")

    async def add(a: int, *, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await tl.acall(add, 2, b=3) == 5
    assert loop.time() - start < 0.9  # does not wait for the 1 s deadline
    assert counts(tl) == (1, 0, 0)
    assert [(e.event_type, e.name, e.exception) for e in events] == [("SUCCESS", "tl", None)]


async def test_an_exception_in_time_is_reraised_and_counted_as_failed() -> None:
    tl, events = limiter("1s")
    error = ValueError("boom")

    async def fail() -> None:
        await asyncio.sleep(0)
        raise error

    with pytest.raises(ValueError) as info:
        await tl.acall(fail)
    assert info.value is error
    assert counts(tl) == (0, 1, 0)
    assert [(e.event_type, e.exception) for e in events] == [("ERROR", error)]


async def test_timeout_raises_and_cancels_the_running_call() -> None:
    tl, events = limiter(SHORT)
    hanging = Hanging()
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeLimitExceeded) as info:
        await tl.acall(hanging)
    elapsed = loop.time() - start
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, ResilienceError)
    assert info.value.time_limiter is tl and info.value.name == "tl"
    assert str(info.value) == "TimeLimiter 'tl' recorded a timeout exception."
    assert 0.025 <= elapsed < 2.5  # the 30 ms timeout, not the hanging call (bound wide for a loaded CI)
    # The cancellation has landed before acall() raised.
    assert hanging.started and hanging.cancelled and not hanging.finished
    assert counts(tl) == (0, 0, 1)
    assert [e.event_type for e in events] == ["TIMEOUT"]
    assert events[0].exception is info.value


async def test_without_cancel_running_future_the_call_runs_on() -> None:
    tl, events = limiter(SHORT, cancel=False)
    hanging = Hanging()
    with pytest.raises(TimeLimitExceeded):
        await tl.acall(hanging, "done anyway")
    assert hanging.started and not hanging.cancelled and not hanging.finished
    hanging.release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert hanging.finished and not hanging.cancelled
    assert counts(tl) == (0, 0, 1)
    assert [e.event_type for e in events] == ["TIMEOUT"]  # the late outcome is not reported
    assert not tl._abandoned  # the reference kept while it ran is dropped


async def test_an_abandoned_call_that_fails_later_is_not_logged_as_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    tl, _ = limiter(SHORT, cancel=False)
    hanging = Hanging()
    with pytest.raises(TimeLimitExceeded) as info:
        await tl.acall(hanging, RuntimeError("late failure"))
    hanging.release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert hanging.finished
    # Even while the TimeLimitExceeded (and its traceback) is kept, the finished task is freed.
    gc.collect()
    # type(), not isinstance(): isinstance reads __class__, which makes Django's lazy objects set up.
    assert not [o for o in gc.get_objects() if issubclass(type(o), asyncio.Task) and "Hanging" in repr(o)]
    assert info.value.name == "tl"
    assert "never retrieved" not in caplog.text


async def test_cancelling_the_caller_cancels_the_call() -> None:
    tl, events = limiter("5s")
    hanging = Hanging()
    outer = asyncio.ensure_future(tl.acall(hanging))
    while not hanging.started:
        await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    await asyncio.sleep(0)
    assert hanging.cancelled
    assert counts(tl) == (0, 0, 0) and events == []


async def test_cancelling_the_caller_leaves_the_call_running_without_cancel_running_future() -> None:
    tl, _ = limiter("5s", cancel=False)
    hanging = Hanging()
    outer = asyncio.ensure_future(tl.acall(hanging))
    while not hanging.started:
        await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    hanging.release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert hanging.finished and not hanging.cancelled


async def test_a_call_that_cancels_itself_propagates_cancellation_uncounted() -> None:
    tl, events = limiter("1s")

    async def self_cancel() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await tl.acall(self_cancel)
    assert counts(tl) == (0, 0, 0) and events == []


async def test_typed_listeners_and_no_events_without_listeners(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object, **kwargs: object) -> None:
        raise AssertionError("event built without a listener")

    monkeypatch.setattr(tl_module, "TimeLimiterEvent", explode)
    tl = TimeLimiter("q", TimeLimiterConfig(timeout_duration=SHORT))

    async def ok() -> str:
        return "ok"

    async def bad() -> None:
        raise KeyError

    assert await tl.acall(ok) == "ok"
    with pytest.raises(KeyError):
        await tl.acall(bad)
    with pytest.raises(TimeLimitExceeded):
        await tl.acall(Hanging())
    assert counts(tl) == (1, 1, 1)

    monkeypatch.undo()
    timeouts: list[TimeLimiterEvent] = []
    errors: list[TimeLimiterEvent] = []
    successes: list[TimeLimiterEvent] = []
    tl.events.on_timeout(timeouts.append)
    tl.events.on_error(errors.append)
    tl.events.on_success(successes.append)
    assert await tl.acall(ok) == "ok"
    with pytest.raises(KeyError):
        await tl.acall(bad)
    with pytest.raises(TimeLimitExceeded):
        await tl.acall(Hanging())
    assert [e.event_type for e in (*successes, *errors, *timeouts)] == ["SUCCESS", "ERROR", "TIMEOUT"]
    assert isinstance(errors[0].exception, KeyError)


async def test_decorate_an_async_function() -> None:
    tl, _ = limiter(SHORT)

    async def fetch(x: int) -> int:
        """Doc."""
        await asyncio.sleep(0)
        return x * 2

    wrapped = tl.decorate(fetch)
    assert inspect.iscoroutinefunction(wrapped)
    assert wrapped.__name__ == "fetch" and wrapped.__doc__ == "Doc."
    assert await wrapped(21) == 42
    hanging = Hanging()
    with pytest.raises(TimeLimitExceeded):
        await tl.decorate(hanging)()
    assert hanging.cancelled


def blocking_io() -> str:
    return "done"


@pytest.mark.parametrize("use", ["call", "decorate"])
def test_sync_callables_are_refused_with_advice(use: str) -> None:
    tl = TimeLimiter("sync")
    with pytest.raises(TypeError) as info:
        if use == "call":
            tl.call(blocking_io)
        else:
            tl.decorate(blocking_io)
    message = str(info.value)
    assert "TimeLimiter 'sync'" in message and "blocking_io" in message
    assert "cannot stop a running thread" in message
    assert "timeout=" in message and "async view" in message


def test_call_with_an_async_function_points_to_acall() -> None:
    tl = TimeLimiter("a")
    hanging = Hanging()
    with pytest.raises(TypeError, match=r"await time_limiter.acall"):
        tl.call(hanging)
    assert not hanging.started  # no coroutine was created (and none left un-awaited)


async def test_acall_with_a_sync_function_is_refused() -> None:
    tl = TimeLimiter("s")
    with pytest.raises(TypeError, match="cannot stop a running thread"):
        await tl.acall(blocking_io)


async def test_acall_accepts_a_sync_function_returning_a_coroutine() -> None:
    tl = TimeLimiter("c")

    async def inner() -> str:
        return "inner"

    assert await tl.acall(lambda: inner()) == "inner"


async def test_reset_and_set_clock() -> None:
    tl, events = limiter("1s")

    async def ok() -> int:
        return 1

    metrics = tl.metrics
    await tl.acall(ok)
    tl.reset()
    assert tl.metrics is metrics and counts(tl) == (0, 0, 0)
    clock = FakeClock()
    tl.set_clock(clock)
    assert tl.clock is clock
    await tl.acall(ok)
    assert counts(tl) == (1, 0, 0) and len(events) == 2  # listeners survive reset
    assert "successful=1" in repr(tl.metrics)


async def test_many_concurrent_calls_are_each_limited() -> None:
    tl, _ = limiter(SHORT)
    quick = [tl.acall(asyncio.sleep, 0, i) for i in range(50)]
    slow = [tl.acall(Hanging()) for _ in range(50)]
    results = await asyncio.gather(*quick, *slow, return_exceptions=True)
    assert results[:50] == list(range(50))
    assert all(isinstance(r, TimeLimitExceeded) for r in results[50:])
    assert counts(tl) == (50, 0, 50)
