"""A pooled connection the server closed (``CLIENT KILL``, the server's idle ``timeout``) is reopened before the
next call, on the sync and the async path, the lean way and redis-py's, whether the first command on it is the
decision's script or the server-time read (``TIME``, sent by redis-py's own client): never a fault (no fault
policy, no outage logged).

redis-py 8.1 (what Python 3.10 gets) passes such a connection on when maintenance notifications are on (its
async ``can_read()`` then reports the EOF as pending data, which that check tolerates): the call failed with
"Connection closed by server" into the fault policy. 8.2 reopens it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

from django_ratelimit_r4.core.clock import SYSTEM_CLOCK  # noqa: E402
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig  # noqa: E402
from tests.backends.patient import PATIENT  # noqa: E402


def _kill_every_other_client(url: str) -> None:
    admin = redis.Redis.from_url(url)
    try:
        own = str(admin.client_id())
        for client in admin.client_list():
            if client["id"] != own:
                admin.client_kill_filter(_id=client["id"])
    finally:
        admin.close()


@pytest.mark.parametrize("first", ["script", "server time"])
@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("way", ["lean", "redis-py"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_pooled_connection_the_server_closed_is_reopened_not_a_fault(
    redis_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    mode: str,
    way: str,
    protocol: int,
    first: str,
) -> None:
    url = f"{redis_server.url}?protocol={protocol}&{PATIENT}"
    config = RateLimiterConfig(limit_for_period=5, limit_refresh_period="1h")
    # "closed": a decision the fault policy answered is a denial, so every True below is Redis's answer.
    limiter = RateLimiter(
        "closed-by-server", config, clock=SYSTEM_CLOCK, backend=rb.redis_backend(url, prefix="r4", fault_policy="closed")
    )
    conn = rb.connection(url)
    if way == "redis-py":  # what a client-side cache or hiredis get: get_connection/release
        monkeypatch.setattr(conn, "_lean", None)
        monkeypatch.setattr(conn, "_lean_io", False)
        monkeypatch.setattr(rb, "_PY_PARSERS", ())
    caplog.set_level(logging.WARNING, logger="django_ratelimit_r4")

    def next_first() -> None:
        if first == "server time":  # the next decision reads TIME first, on the pooled connection
            conn._needs_time = True

    if mode == "sync":
        assert limiter.acquire_permission()
        _kill_every_other_client(url)
        next_first()
        assert limiter.acquire_permission()  # was: False (fault policy "closed") on redis-py 8.1
        _kill_every_other_client(url)
        next_first()
        assert limiter.acquire_permission()
    else:

        async def main() -> None:
            assert await limiter.aacquire_permission()
            pool, _ = conn._apool()
            for _ in range(2):
                (ours,) = pool._available_connections
                await asyncio.to_thread(_kill_every_other_client, url)
                for _ in range(2000):  # bounded: until the loop has seen the server's close
                    if ours._reader is None or ours._reader.at_eof():
                        break
                    await asyncio.sleep(0.005)
                next_first()
                assert await limiter.aacquire_permission()  # was: False (fault policy "closed") on redis-py 8.1

        asyncio.run(main())

    assert limiter.metrics.available_permissions == 2
    backend: Any = limiter.backend
    assert backend.faults == 0
    assert conn.server_faults == 0 and conn.outage_since is None
    assert [r.getMessage() for r in caplog.records if "failed during" in r.getMessage()] == []
