"""The event-loop stall detector, against real blocking calls.

A stall *is* wall-clock time on the loop thread, so these tests block for real. They stay robust on
a loaded 2-core machine by blocking several times longer than the threshold and never asserting
exact timings: only lower bounds and generous upper bounds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from django_ratelimit_r4 import stall
from django_ratelimit_r4.stall import (
    STALL_BUCKETS,
    StallDetector,
    StallEvent,
    add_stall_listener,
    get_detectors,
    monitor_asgi,
    remove_stall_listener,
)

THRESHOLD = 0.04
BLOCK = 0.15


def _watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("r4-stall-detector")]


@pytest.fixture(autouse=True)
def no_leaked_watchdogs() -> Iterator[None]:
    """Every test must leave no detector registered and no watchdog thread alive."""
    yield
    deadline = time.monotonic() + 2
    while _watchdogs() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _watchdogs() == []
    assert get_detectors() == []


def blocking_handler_for_test(seconds: float = BLOCK) -> None:
    """Stands for a sync Redis/ORM call made from a coroutine."""
    time.sleep(seconds)


async def blocking_view() -> None:
    blocking_handler_for_test()


async def wait_until(predicate: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def _names(event: StallEvent) -> list[str]:
    return [frame.name for frame in event.stack]


async def test_catches_time_sleep_inside_a_coroutine() -> None:
    events: list[StallEvent] = []
    async with StallDetector(THRESHOLD, on_stall=events.append, hang_report_after=None) as detector:
        await asyncio.sleep(0.05)  # a few healthy heartbeats first
        await blocking_view()
        await wait_until(lambda: detector.stalls_total >= 1)
        await asyncio.sleep(0.1)  # room for a (wrong) duplicate record of the same block

    blamed = [e for e in events if "blocking_handler_for_test" in _names(e)]
    assert len(blamed) == 1, [_names(e) for e in events]
    event = blamed[0]
    # The lag undercounts the block by at most one interval; allow a loaded machine's slack above.
    assert THRESHOLD <= event.duration_s <= BLOCK + 1.0
    assert event.duration_s >= BLOCK - detector.interval - 0.01
    # Outermost first, down to the blocking call: the coroutine and the function it called.
    assert _names(event).index("blocking_view") < _names(event).index("blocking_handler_for_test")
    assert _names(event)[-1] == "blocking_handler_for_test"
    assert "time.sleep(seconds)" in event.format_stack()
    # Counters agree with the events delivered.
    assert detector.stalls_total == len(events)
    assert detector.stall_seconds_total == pytest.approx(sum(e.duration_s for e in events))
    assert detector.max_stall_seconds == max(e.duration_s for e in events)
    assert detector.last_stall is events[-1]
    assert sum(detector.bucket_counts) == detector.stalls_total


async def test_no_stall_for_a_loop_that_only_awaits() -> None:
    detector = StallDetector(0.05)
    async with detector:
        for _ in range(40):
            await asyncio.sleep(0.005)
        await asyncio.gather(*(asyncio.sleep(0.02) for _ in range(50)))
    assert detector.stalls_total == 0
    assert detector.stall_seconds_total == 0.0
    assert sum(detector.bucket_counts) == 0


async def test_multiple_stalls_are_counted_one_each() -> None:
    events: list[StallEvent] = []
    async with StallDetector(THRESHOLD, on_stall=events.append, hang_report_after=None) as detector:
        for expected in (1, 2, 3):
            blocking_handler_for_test(0.12)
            await wait_until(
                lambda n=expected: sum("blocking_handler_for_test" in _names(e) for e in events) >= n
            )
            await asyncio.sleep(0.05)
    blamed = [e for e in events if "blocking_handler_for_test" in _names(e)]
    assert len(blamed) == 3
    assert detector.stalls_total == len(events) >= 3
    assert detector.stall_seconds_total >= 3 * THRESHOLD
    assert detector.stall_seconds_total == pytest.approx(sum(e.duration_s for e in events))
    assert sum(detector.bucket_counts) == detector.stalls_total
    cumulative = detector.cumulative_buckets()
    assert cumulative[-1] == (float("inf"), detector.stalls_total)
    assert [count for _, count in cumulative] == sorted(count for _, count in cumulative)


def test_histogram_buckets_are_le_bounds() -> None:
    # Boundaries are the subject here, so feed durations directly instead of blocking a loop.
    detector = StallDetector(0.02)
    empty = StallEvent(0.0, stall.traceback.StackSummary()).stack
    for duration in (0.02, 0.0200001, 0.05, 9.0, 10.0, 11.0):
        detector._record(duration, empty)
    expected = [0] * (len(STALL_BUCKETS) + 1)
    expected[0] = 1  # 0.02 <= 0.02
    expected[1] = 2  # 0.0200001 and 0.05 <= 0.05
    expected[STALL_BUCKETS.index(10.0)] = 2  # 9.0 and 10.0
    expected[-1] = 1  # 11.0 -> +Inf
    assert detector.bucket_counts == expected
    assert detector.stalls_total == 6
    assert detector.max_stall_seconds == 11.0
    assert detector.snapshot().bucket_counts == tuple(expected)
    detector.reset()
    assert detector.snapshot() == (0, 0.0, 0.0, (0,) * (len(STALL_BUCKETS) + 1))


async def test_logs_one_warning_per_stall_with_the_stack(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="django_ratelimit_r4.stall")
    async with StallDetector(THRESHOLD, hang_report_after=None) as detector:
        blocking_handler_for_test()
        await wait_until(lambda: detector.stalls_total >= 1)
    records = [r for r in caplog.records if "blocking_handler_for_test" in r.getMessage()]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert "blocked for" in records[0].getMessage()


async def test_stack_is_not_formatted_when_warning_is_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    real = stall._format_stack
    monkeypatch.setattr(stall, "_format_stack", lambda s: calls.append(s) or real(s))
    quiet = logging.getLogger("tests.stall.quiet")
    quiet.setLevel(logging.ERROR)
    async with StallDetector(THRESHOLD, logger=quiet, hang_report_after=None) as detector:
        blocking_handler_for_test()
        await wait_until(lambda: detector.stalls_total >= 1)
    assert calls == []
    assert detector.last_stall is not None and "blocking_handler_for_test" in _names(detector.last_stall)


async def test_a_long_stall_is_reported_while_it_lasts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="django_ratelimit_r4.stall")
    async with StallDetector(THRESHOLD, hang_report_after=0.1) as detector:
        blocking_handler_for_test(0.4)
        await wait_until(lambda: detector.stalls_total >= 1)
    messages = [r.getMessage() for r in caplog.records if "blocking_handler_for_test" in r.getMessage()]
    assert sum("still is" in m for m in messages) == 1
    assert sum("still is" not in m and "blocked for" in m for m in messages) == 1
    assert detector.stalls_total >= 1


async def test_a_failing_listener_does_not_stop_the_watchdog(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[StallEvent] = []

    def broken(event: StallEvent) -> None:
        raise RuntimeError("listener bug")

    add_stall_listener(seen.append)
    try:
        async with StallDetector(THRESHOLD, on_stall=broken, hang_report_after=None) as detector:
            for n in (1, 2):
                blocking_handler_for_test(0.12)
                await wait_until(lambda n=n: detector.stalls_total >= n)
                await asyncio.sleep(0.03)
    finally:
        remove_stall_listener(seen.append)
    assert detector.stalls_total >= 2
    assert len(seen) == detector.stalls_total  # the global listener ran after the broken one
    assert any("stall listener" in r.getMessage() for r in caplog.records)


def test_stop_joins_the_thread_and_start_stop_are_idempotent() -> None:
    loop = asyncio.new_event_loop()
    try:
        detector = StallDetector(0.02)
        assert detector.start(loop) is detector
        assert detector.start(loop) is detector  # idempotent: still one thread
        threads = _watchdogs()
        assert len(threads) == 1 and threads[0].daemon
        assert get_detectors() == [detector] and detector.running and detector.loop is loop
        with pytest.raises(RuntimeError, match="another event loop"):
            detector.start(asyncio.new_event_loop())
        detector.stop()
        assert not threads[0].is_alive()
        assert not detector.running and detector.loop is None
        assert get_detectors() == []
        detector.stop()  # idempotent
        detector.start(loop)  # restartable
        assert detector.running
        detector.stop()
    finally:
        loop.close()


def test_start_without_a_running_loop_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        StallDetector().start()
    assert _watchdogs() == []


def test_a_loop_that_is_not_running_is_not_stalled() -> None:
    """Between run_until_complete calls nothing services the loop; that is idle, not blocked."""
    loop = asyncio.new_event_loop()
    detector = StallDetector(0.02)
    try:
        detector.start(loop)
        loop.run_until_complete(asyncio.sleep(0.03))
        time.sleep(0.15)  # the loop is not running: heartbeats queue up
        loop.run_until_complete(asyncio.sleep(0.05))
    finally:
        detector.stop()
        loop.close()
    assert detector.stalls_total == 0


def test_the_watchdog_ends_when_its_loop_is_closed() -> None:
    loop = asyncio.new_event_loop()
    detector = StallDetector(0.02)
    detector.start(loop)
    loop.run_until_complete(asyncio.sleep(0.03))
    thread = _watchdogs()[0]
    loop.close()
    thread.join(3)
    assert not thread.is_alive()
    assert not detector.running and get_detectors() == []


def test_threshold_and_interval_parsing() -> None:
    assert StallDetector("20ms").threshold == pytest.approx(0.02)
    assert StallDetector().threshold == 0.020
    assert StallDetector(0.05).interval == pytest.approx(0.025)
    assert StallDetector(0.05, interval="5ms").interval == pytest.approx(0.005)
    for bad in (0, -1, "0s", "fast", True):
        with pytest.raises(ValueError):
            StallDetector(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        monitor_asgi(lambda *a: None, threshold="soon")  # type: ignore[arg-type,return-value]


async def test_monitor_asgi_wraps_an_asgi_app() -> None:
    events: list[StallEvent] = []

    async def app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            return
        if scope["path"] == "/block":
            blocking_handler_for_test()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["path"].encode()})

    application = monitor_asgi(app, threshold=THRESHOLD, on_stall=events.append, hang_report_after=None)
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    try:
        assert get_detectors() == []  # nothing starts before the first call
        await application({"type": "lifespan"}, receive, send)
        detectors = get_detectors()
        assert len(detectors) == 1 and detectors[0].loop is asyncio.get_running_loop()
        assert detectors[0].threshold == THRESHOLD and detectors[0].name == "asgi"
        await application({"type": "http", "path": "/ok"}, receive, send)
        await application({"type": "http", "path": "/block"}, receive, send)
        assert get_detectors() == detectors  # once per loop
        assert application.detectors == detectors
        await wait_until(lambda: any("blocking_handler_for_test" in _names(e) for e in events))
    finally:
        application.stop()
    assert [m.get("body") for m in sent if m["type"] == "http.response.body"] == [b"/ok", b"/block"]
    assert detectors[0].stalls_total >= 1 and not detectors[0].running
    assert any("app" in _names(e) for e in events)  # the wrapped app's frame is on the blocked stack


def test_monitor_asgi_starts_one_detector_per_loop() -> None:
    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        return None

    application = monitor_asgi(app)
    loops = [asyncio.new_event_loop() for _ in range(2)]
    try:
        for loop in loops:
            for _ in range(3):
                loop.run_until_complete(application({"type": "lifespan"}, None, None))  # type: ignore[arg-type]
        assert sorted(id(d.loop) for d in application.detectors) == sorted(id(loop) for loop in loops)
        assert len(get_detectors()) == 2
    finally:
        application.stop()
        for loop in loops:
            loop.close()


def test_running_loop_thread_id_reads_cpython_loop():
    """The one private read (asyncio's ``_thread_id``): fails here, not silently, if CPython changes it."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    loop.call_soon(started.set)
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        assert started.wait(10)
        assert stall._running_loop_thread_id(loop) == runner.ident
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()
    assert stall._running_loop_thread_id(loop) is None  # not running: unknown, never a stale id
