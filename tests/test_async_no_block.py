"""Nothing on an async path blocks the event loop, even while limiters wait and bulkheads are full.

Runs under asyncio debug mode with a small ``slow_callback_duration``: any callback (a task step)
that holds the loop longer is logged by the ``asyncio`` logger. A heartbeat task measures how late
it wakes. A positive control shows both detectors catch a real blocking call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import AsyncClient, RequestFactory, override_settings

from django_ratelimit_r4.decorators import bulkhead, ratelimit, resilient
from tests import views

pytestmark = pytest.mark.django_db(databases=[])

SLOW_CALLBACK = 0.2  # seconds; a blocking wait in these paths would last 400 ms to 2 s
HEARTBEAT = 0.005
MAX_LAG = 0.3  # generous for a shared 2-core machine; a blocked loop would lag 400 ms or more


def _settings() -> dict[str, Any]:
    value = views.r4_settings()
    value["ratelimiters"]["instances"]["waiting"] = {
        "limit_for_period": 2,
        "limit_refresh_period": "400ms",
        "timeout_duration": "2s",  # callers reserve and wait up to 1.2 s with a real clock
    }
    value["bulkheads"]["instances"]["narrow"] = {"max_concurrent_calls": 1, "max_wait_duration": "400ms"}
    return value


@ratelimit("waiting")
async def waiting_view(request: Any) -> HttpResponse:
    return HttpResponse("ok")


@bulkhead("narrow")
async def narrow_view(request: Any) -> HttpResponse:
    await asyncio.sleep(0.6)  # holds the only slot longer than waiters may wait
    return HttpResponse("ok")


@resilient(ratelimiter="waiting", bulkhead="narrow")
async def narrow_service(n: int) -> int:
    await asyncio.sleep(0.03)
    return n


async def _observe(
    work: Callable[[], Awaitable[Any]], caplog: pytest.LogCaptureFixture
) -> tuple[Any, float, list[str]]:
    """Run ``work`` in debug mode next to a heartbeat; return (result, max lag, slow-callback messages)."""
    loop = asyncio.get_running_loop()
    old_debug, old_slow = loop.get_debug(), loop.slow_callback_duration
    loop.set_debug(True)
    loop.slow_callback_duration = SLOW_CALLBACK
    lag = 0.0
    stop = asyncio.Event()

    async def heartbeat() -> None:
        nonlocal lag
        while not stop.is_set():
            start = loop.time()
            await asyncio.sleep(HEARTBEAT)
            lag = max(lag, loop.time() - start - HEARTBEAT)

    caplog.set_level(logging.WARNING, logger="asyncio")
    caplog.clear()
    beat = asyncio.ensure_future(heartbeat())
    try:
        await asyncio.sleep(0)
        result = await work()
    finally:
        stop.set()
        await beat
        loop.set_debug(old_debug)
        loop.slow_callback_duration = old_slow
    slow = [r.getMessage() for r in caplog.records if r.name == "asyncio" and "took" in r.getMessage()]
    return result, lag, slow


async def test_waiting_limiters_and_full_bulkheads_never_block_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rf = RequestFactory()

    async def work() -> dict[str, list[Any]]:
        started = time.monotonic()

        async def timed(coro: Awaitable[HttpResponse]) -> tuple[int, float]:
            response = await coro
            return response.status_code, time.monotonic() - started

        limited = asyncio.gather(*(timed(waiting_view(rf.get("/"))) for _ in range(8)))
        full = asyncio.gather(*(timed(narrow_view(rf.get("/"))) for _ in range(4)))
        stacked = asyncio.gather(*(narrow_service(i) for i in range(3)), return_exceptions=True)
        through_asgi = asyncio.gather(*(AsyncClient().get("/deep-async/?limiter=api") for _ in range(3)))
        return {
            "limited": await limited,
            "full": await full,
            "stacked": await stacked,
            "asgi": [r.status_code for r in await through_asgi],
        }

    with override_settings(RATELIMIT_R4=_settings()):
        await AsyncClient().get("/deep-async/?limiter=api")  # warm-up: imports, URL resolver, registry
        result, lag, slow = await _observe(work, caplog)

    # The scenario really waited: 8 callers on 2 permits per 400 ms reserve up to 1.2 s ahead.
    limited = result["limited"]
    assert [code for code, _ in limited].count(200) >= 6
    assert max(elapsed for _, elapsed in limited) >= 0.6
    # The bulkhead was full: waiters gave up after 400 ms with a 503, the holder finished.
    full_codes = sorted(code for code, _ in result["full"])
    assert full_codes[0] == 200 and full_codes[-1] == 503
    assert result["asgi"] == [200, 200, 200]
    assert slow == [], slow
    assert lag < MAX_LAG, f"heartbeat was {lag * 1000:.0f} ms late"


async def test_positive_control_a_blocking_call_is_detected(caplog: pytest.LogCaptureFixture) -> None:
    async def blocker() -> None:
        time.sleep(0.45)  # what a sync wait on the loop would do (a 400 ms bulkhead wait)

    _, lag, slow = await _observe(blocker, caplog)
    assert slow, "debug mode should have reported the blocking step"
    assert lag >= 0.4
