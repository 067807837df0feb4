"""RATELIMIT_R4["stall_detector"]: monitor_asgi's default threshold and ResilienceMiddleware's auto-start.

The setting is read lazily (first call, never when wrapping or importing) and once; the middleware
starts one detector per running loop in async mode only, never a second one on a loop already watched.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings
from django.urls import path

from django_ratelimit_r4 import conf, stall
from django_ratelimit_r4.middleware import ResilienceMiddleware
from django_ratelimit_r4.stall import StallDetector, ensure_detector, get_detectors, monitor_asgi
from tests import views

MIDDLEWARE = ["django_ratelimit_r4.middleware.ResilienceMiddleware"]
BLOCK = 0.15


def blocking_call_for_settings_test() -> None:
    """Stands for a sync Redis/ORM call made from an async view."""
    time.sleep(BLOCK)


async def blocking_view(request: HttpRequest) -> HttpResponse:
    blocking_call_for_settings_test()
    return HttpResponse("blocked")


async def ok_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def sync_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("sync")


urlpatterns = [path("block/", blocking_view), path("ok/", ok_view), path("sync/", sync_view)]


def with_stall(**stall_detector: Any) -> Any:
    """override_settings with this module's URLs, the middleware and a stall_detector option."""
    return override_settings(
        ROOT_URLCONF=__name__,
        MIDDLEWARE=MIDDLEWARE,
        RATELIMIT_R4=views.r4_settings(stall_detector=stall_detector),
    )


@pytest.fixture(autouse=True)
def no_leaked_detectors() -> Iterator[None]:
    """Stop whatever a test started; every test begins with no detector running."""
    assert get_detectors() == []
    yield
    for detector in get_detectors():
        detector.stop()
    assert [t for t in threading.enumerate() if t.name.startswith("r4-stall-detector")] == []


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every read of the parsed options, recorded."""
    seen: list[object] = []
    real = conf.get_options

    def spy() -> conf.R4Options:
        options = real()
        seen.append(options.stall_detector)
        return options

    monkeypatch.setattr(conf, "get_options", spy)
    return seen


async def wait_until(predicate: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    return None


# ----------------------------------------------------------------------------------------- monitor_asgi


async def test_monitor_asgi_takes_the_threshold_from_the_setting_at_its_first_call(
    reads: list[object],
) -> None:
    with with_stall(threshold="70ms"):
        application = monitor_asgi(asgi_app)
        assert reads == [] and get_detectors() == []  # wrapping (asgi.py import time) reads nothing
        await application({"type": "lifespan"}, None, None)
        await application({"type": "http"}, None, None)
        (detector,) = application.detectors
        assert detector.threshold == pytest.approx(0.07) and detector.interval == pytest.approx(0.035)
        assert detector.name == "asgi"
        assert len(reads) == 1  # once, not per request
    application.stop()


async def test_monitor_asgi_ignores_enabled_false_and_keeps_an_explicit_threshold(
    reads: list[object],
) -> None:
    with with_stall(enabled=False, threshold="70ms"):
        explicit = monitor_asgi(asgi_app, threshold="30ms")
        await explicit({"type": "lifespan"}, None, None)
        assert [d.threshold for d in explicit.detectors] == [pytest.approx(0.03)]
        assert reads == []
    explicit.stop()


async def test_monitor_asgi_default_is_20ms(reads: list[object]) -> None:
    application = monitor_asgi(asgi_app)
    await application({"type": "lifespan"}, None, None)
    assert [d.threshold for d in application.detectors] == [pytest.approx(stall.DEFAULT_THRESHOLD_S)]
    application.stop()


async def test_invalid_options_fall_back_to_the_default_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    with (
        with_stall(enabled=True, threshold="-5ms"),
        caplog.at_level(logging.ERROR, "django_ratelimit_r4.stall"),
    ):
        application = monitor_asgi(asgi_app)
        await application({"type": "lifespan"}, None, None)
    assert [d.threshold for d in application.detectors] == [pytest.approx(0.02)]
    assert "invalid RATELIMIT_R4 options" in caplog.text and "stall_detector" in caplog.text
    application.stop()


def test_configured_options_outside_a_project_are_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.conf import settings

    monkeypatch.setattr(type(settings), "configured", property(lambda self: False))
    assert stall.configured_options() == conf.StallDetectorOptions(enabled=False, threshold_ns=20_000_000)


# ------------------------------------------------------------------------------- ResilienceMiddleware


async def test_enabled_middleware_starts_a_detector_that_catches_a_blocking_view() -> None:
    with with_stall(enabled=True, threshold="40ms"):
        client = AsyncClient()
        assert (await client.get("/ok/")).content == b"ok"
        (detector,) = get_detectors()
        assert detector.loop is asyncio.get_running_loop() and detector.running
        assert detector.threshold == pytest.approx(0.04) and detector.name == "asgi"
        events: list[Any] = []
        stall.add_stall_listener(events.append)
        try:
            assert (await client.get("/block/")).content == b"blocked"
            await wait_until(lambda: any(_blames(e, "blocking_call_for_settings_test") for e in events))
        finally:
            stall.remove_stall_listener(events.append)
        assert get_detectors() == [detector]  # still one detector for this loop
        assert detector.stalls_total >= 1
        blamed = next(e for e in events if _blames(e, "blocking_call_for_settings_test"))
        assert _blames(blamed, "blocking_view")


def _blames(event: Any, function: str) -> bool:
    return any(frame.name == function for frame in event.stack)


async def test_disabled_middleware_reads_the_setting_once_and_starts_nothing(reads: list[object]) -> None:
    with with_stall(enabled=False):
        client = AsyncClient()
        for _ in range(5):
            assert (await client.get("/ok/")).status_code == 200
    assert get_detectors() == []
    assert len(reads) == 1  # AsyncClient builds one handler, so one middleware: one read


async def test_default_setting_is_off() -> None:
    with override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=MIDDLEWARE):
        assert (await AsyncClient().get("/ok/")).status_code == 200
    assert get_detectors() == []


def _async_middleware() -> ResilienceMiddleware:
    async def get_response(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    return ResilienceMiddleware(get_response)


def test_one_check_per_request_and_one_detector_per_loop(reads: list[object]) -> None:
    middleware = _async_middleware()
    request = RequestFactory().get("/")
    loops = [asyncio.new_event_loop() for _ in range(2)]
    try:
        with with_stall(enabled=True, threshold="50ms"):
            for loop in loops:
                for _ in range(3):
                    loop.run_until_complete(middleware(request))  # type: ignore[arg-type]
            assert sorted(id(d.loop) for d in get_detectors()) == sorted(id(loop) for loop in loops)
            assert len(reads) == 1  # the setting is read at the first request only
            # A second middleware instance (another handler) on a watched loop adds nothing.
            loops[1].run_until_complete(_async_middleware()(request))  # type: ignore[arg-type]
            assert len(get_detectors()) == 2
    finally:
        for loop in loops:
            loop.close()
    # Detectors end with their loop.
    deadline = time.monotonic() + 3
    while get_detectors() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert get_detectors() == []


async def test_a_loop_watched_by_monitor_asgi_is_not_watched_twice() -> None:
    with with_stall(enabled=True, threshold="50ms"):
        application = monitor_asgi(asgi_app, threshold="30ms", name="mine")
        await application({"type": "lifespan"}, None, None)
        await _async_middleware()(RequestFactory().get("/"))  # type: ignore[misc]
        assert [(d.name, d.threshold) for d in get_detectors()] == [("mine", pytest.approx(0.03))]
    application.stop()


def test_sync_mode_starts_nothing_and_reads_nothing(reads: list[object]) -> None:
    with with_stall(enabled=True):
        assert Client().get("/sync/").content == b"sync"
    assert get_detectors() == [] and reads == []


async def test_ensure_detector_reuses_a_running_detector_of_the_loop() -> None:
    async with StallDetector(0.05, name="own") as own:
        assert ensure_detector() is own
    fresh = ensure_detector(threshold=0.05)
    try:
        assert fresh is not own and fresh.running and fresh.name == "asgi"
        assert ensure_detector() is fresh
    finally:
        fresh.stop()
