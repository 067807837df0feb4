"""Nothing on an async path blocks the event loop, even while limiters wait and bulkheads are full.

Every blocking call made on the loop's thread (a sleep, a blocking socket, a thread wait or a contended
lock) is recorded by :func:`tests.noblock.forbid_blocking`, by what it is rather than by how long it took,
so a busy CI machine cannot fail the test and a short block cannot pass it. A positive control shows the
detector catches a real blocking wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import AsyncClient, RequestFactory, override_settings

from django_ratelimit_r4.decorators import bulkhead, ratelimit, resilient
from tests import views
from tests.noblock import forbid_blocking

pytestmark = pytest.mark.django_db(databases=[])

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


async def _observe(work: Callable[[], Awaitable[Any]], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str]]:
    """Run ``work``; return (its result, the blocking calls made on the loop's thread meanwhile)."""
    with forbid_blocking(monkeypatch) as blocking:
        result = await work()
    return result, blocking


async def test_waiting_limiters_and_full_bulkheads_never_block_the_loop(
    monkeypatch: pytest.MonkeyPatch,
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
        result, blocking = await _observe(work, monkeypatch)

    # The scenario really waited: 8 callers on 2 permits per 400 ms reserve up to 1.2 s ahead.
    limited = result["limited"]
    assert [code for code, _ in limited].count(200) >= 6
    assert max(elapsed for _, elapsed in limited) >= 0.6
    # The bulkhead was full: waiters gave up after 400 ms with a 503, the holder finished.
    full_codes = sorted(code for code, _ in result["full"])
    assert full_codes[0] == 200 and full_codes[-1] == 503
    assert result["asgi"] == [200, 200, 200]
    assert blocking == [], blocking


async def test_positive_control_a_blocking_call_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    async def blocker() -> None:
        time.sleep(0.01)  # what a sync wait on the loop would do (a bulkhead's thread wait)

    _, blocking = await _observe(blocker, monkeypatch)
    assert blocking and "time.sleep(0.01)" in blocking[0], blocking
