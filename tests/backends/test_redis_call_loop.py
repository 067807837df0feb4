"""Async Redis calls in asgiref's loop of one ``async_to_sync`` call: an async view under WSGI.

Django runs such a view in an event loop of its own per request, closed when the request ends. An asyncio
client made there lived for one request: each request opened a connection (handshake included) and left a
``TIME_WAIT`` socket (measured: +1.5 ms per request; 2 000 requests, ~2 000 ``TIME_WAIT`` sockets). These calls
now run on the sync client's pool in the thread that waits for that loop (the request's own): counted here with
the server's ``total_connections_received`` on a private ``redis-server``.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from django_ratelimit_r4.core.bulkhead import BulkheadConfig
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, aacquire_all
from django_ratelimit_r4.decorators import ratelimit
from tests.backends.patient import patient

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")
from django_ratelimit_r4.backends.redis_breaker import RedisCircuitBreaker  # noqa: E402
from django_ratelimit_r4.backends.redis_bulkhead import RedisBulkhead  # noqa: E402
from django_ratelimit_r4.core.circuitbreaker import CircuitBreakerConfig  # noqa: E402

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(databases=[])]


def _connections_received(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_connections_received"])
    finally:
        client.close()


def _limiter(url: str, prefix: str, limit: int) -> RateLimiter:
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1h")
    return RateLimiter("wsgi", config, clock=SYSTEM_CLOCK, backend=rb.redis_backend(url, prefix=prefix))


def test_async_decisions_under_wsgi_open_no_connection_per_request(redis_server: Any) -> None:
    url = patient(redis_server.url)
    limiter = _limiter(url, "r4callloop", limit=20)
    conn: Any = limiter.backend._connection()  # type: ignore[attr-defined]
    assert limiter.acquire_permission()  # the sync pool's connection, opened once
    before = _connections_received(redis_server.url)
    threads: list[int] = []

    async def decide() -> bool:
        threads.append(threading.get_ident())
        return await limiter.aacquire_permission()

    granted = [async_to_sync(decide)() for _ in range(30)]
    # One connection per call before (each loop's own client); now the sync pool's, still open. The +1 is
    # this test's own INFO connection.
    assert _connections_received(redis_server.url) - before == 1
    assert granted == [True] * 19 + [False] * 11  # exact: 20 in all, the first one sync
    assert threading.get_ident() not in threads  # each ran in asgiref's loop thread, not this one...
    assert len(conn._aio) == 0  # ...and no asyncio client was made for any of them


def test_multi_limit_and_quota_calls_under_wsgi_open_no_connection(redis_server: Any) -> None:
    url = patient(redis_server.url)
    one, two = _limiter(url, "r4callloop:a", limit=3), _limiter(url, "r4callloop:b", limit=5)
    assert one.acquire_permission()
    before = _connections_received(redis_server.url)

    async def both() -> tuple[bool, int]:
        refused = await aacquire_all([one, two])
        remaining, _ = await one.backend.aquota()  # type: ignore[attr-defined]
        return refused is None, remaining

    outcomes = [async_to_sync(both)() for _ in range(3)]
    assert _connections_received(redis_server.url) - before == 1
    assert outcomes == [(True, 1), (True, 0), (False, 0)]  # all-or-nothing: the third is refused by `one`
    assert two.backend.quota()[0] == 3  # type: ignore[attr-defined]  # nothing taken by the refused one


def test_bulkhead_and_breaker_under_wsgi_open_no_connection(redis_server: Any) -> None:
    url = patient(redis_server.url)
    bulkhead = RedisBulkhead("pool", BulkheadConfig(max_concurrent_calls=2), url=url, prefix="r4callloop")
    breaker = RedisCircuitBreaker("partner", CircuitBreakerConfig(), url=url, prefix="r4callloop")
    try:
        assert bulkhead.try_acquire_permission()
        bulkhead.on_complete()
        breaker.call(lambda: None)
        before = _connections_received(redis_server.url)

        async def guarded() -> int:
            assert await bulkhead.atry_acquire_permission()
            held = bulkhead.cluster_concurrent_calls()
            await bulkhead.aon_complete()
            await breaker.acall(asyncio.sleep, 0)
            return held

        assert [async_to_sync(guarded)() for _ in range(5)] == [1] * 5
        # The bulkhead's renewal thread may have connected meanwhile (its own client): at most one more.
        assert _connections_received(redis_server.url) - before <= 2
    finally:
        bulkhead.close()
        breaker.close()


def test_a_cancelled_call_waits_for_the_thread_and_reports_the_reply(redis_server: Any) -> None:
    """The call runs on in the other thread whatever the task does: a cancellation waits for it, so a caller
    giving back what it took (a bulkhead slot, a lease) gives back after it was taken, never before."""
    url = patient(redis_server.url)
    limiter = _limiter(url, "r4callloop:cancel", limit=5)
    conn: Any = limiter.backend._connection()  # type: ignore[attr-defined]
    assert limiter.acquire_permission()
    started, go, finished = threading.Event(), threading.Event(), threading.Event()
    real = conn.run_script

    def held_run_script(*args: Any) -> Any:
        started.set()
        assert go.wait(30)
        try:
            return real(*args)
        finally:
            finished.set()

    conn.run_script = held_run_script

    async def main() -> BaseException:
        task = asyncio.ensure_future(limiter.aacquire_permission())
        for _ in range(5000):  # until the call runs in the waiting thread (bounded: a failure, not a hang)
            if started.is_set():
                break
            await asyncio.sleep(0.002)
        else:
            task.cancel()
            raise AssertionError("the call never ran on the sync client in the waiting thread")
        task.cancel()
        await asyncio.sleep(0.01)
        assert not task.done()  # still waiting for the thread's outcome
        go.set()
        try:
            await task
        except asyncio.CancelledError as exc:
            assert finished.is_set()  # the cancellation came after the call had finished
            return exc
        raise AssertionError("not cancelled")

    exc = async_to_sync(main)()
    if sys.version_info >= (3, 11):
        assert isinstance(exc, rb.LostCancellation)
    conn.run_script = real
    assert limiter.backend.quota()[0] == 3  # type: ignore[attr-defined]  # the cancelled call's permit was spent


def test_a_call_not_started_is_withdrawn_on_cancel(redis_server: Any) -> None:
    url = patient(redis_server.url)
    limiter = _limiter(url, "r4callloop:queued", limit=5)
    conn: Any = limiter.backend._connection()  # type: ignore[attr-defined]
    assert limiter.acquire_permission()
    ran: list[int] = []
    real = conn.run_script

    def counted(*args: Any) -> Any:
        ran.append(1)
        return real(*args)

    conn.run_script = counted

    async def main() -> None:
        task = asyncio.ensure_future(limiter.aacquire_permission())
        await asyncio.sleep(0)  # submitted; the waiting thread cannot run it before this loop step ends
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async_to_sync(main)()
    conn.run_script = real
    # Withdrawn, or (if the thread was faster) run: never lost half-way.
    assert limiter.backend.quota()[0] == 4 - len(ran)  # type: ignore[attr-defined]


def test_a_call_loop_whose_call_has_returned_uses_its_own_client(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task outliving its ``async_to_sync`` call finds that call's executor closed: it is decided on its
    loop's own client, not lost."""
    url = patient(redis_server.url)
    limiter = _limiter(url, "r4callloop:late", limit=5)

    class Closed:
        def submit(self, *args: Any) -> Any:
            raise RuntimeError("CurrentThreadExecutor already quit or is broken")

    async def main() -> bool:
        monkeypatch.setitem(rb._CALL_LOOPS, asyncio.get_running_loop(), Closed())  # type: ignore[arg-type]
        try:
            return await limiter.aacquire_permission()
        finally:
            await limiter.backend._connection().aclose()  # type: ignore[attr-defined]

    assert asyncio.run(main())
    assert limiter.backend.quota()[0] == 4  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------ HTTP


@ratelimit("api")
async def api(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("api/", api)]


@pytest.fixture
def r4_redis(redis_server: Any) -> Iterator[str]:
    value = {
        "backend": "redis",
        "redis_url": patient(redis_server.url),
        "redis_key_prefix": "r4callloop:http",
        "ratelimiters": {"instances": {"api": {"limit_for_period": 10, "limit_refresh_period": "1h"}}},
    }
    with override_settings(RATELIMIT_R4=value):
        yield redis_server.url


def test_an_async_view_under_wsgi_opens_no_connection_per_request(r4_redis: str) -> None:
    client = Client()
    assert client.get("/api/").status_code == 200  # the first one opens the sync pool's connection
    before = _connections_received(r4_redis)
    codes = [client.get("/api/").status_code for _ in range(11)]
    assert codes == [200] * 9 + [429] * 2
    assert _connections_received(r4_redis) - before == 1  # this test's INFO connection
