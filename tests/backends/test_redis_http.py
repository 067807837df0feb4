"""Every HTTP path with ``"backend": "redis"``: decorators (sync and async), the DRF throttle, faults.

Against a real Redis (db 15, a unique key prefix per test; skipped without Redis unless
R4_REQUIRE_REDIS=1, as in CI). Time is the ``r4_clock`` FakeClock (the Redis backend then sends the
client's time), except where processes must share the server's clock. Async paths are checked two
ways: no sync redis-py command may run on a thread with a running event loop, and no blocking call
of any kind (a blocking socket, a sleep, a thread wait) may run on the loop's thread (tests/noblock.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from django_ratelimit_r4 import get_rate_limiter, registry
from django_ratelimit_r4.decorators import RateLimitGate, _secret_salt, ratelimit
from django_ratelimit_r4.headers import partition_key
from django_ratelimit_r4.keyed import acquire_all_keyed
from django_ratelimit_r4.rest_framework import RateLimiterThrottle
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)
from tests.noblock import forbid_blocking

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(databases=[])]

ROOT = Path(__file__).resolve().parents[2]
# Nothing listens on port 1. The query string makes this URL (and so its process-wide connection and
# fault-log state) distinct from the one tests/backends/test_redis.py uses, whatever the test order.
UNREACHABLE = "redis://127.0.0.1:1/15?socket_timeout=0.25"
A = {"REMOTE_ADDR": "203.0.113.7"}
B = {"REMOTE_ADDR": "198.51.100.2"}
API_POLICY = '"api";q=10;w=1'


def r4_settings(url: str, prefix: str, **top: Any) -> dict[str, Any]:
    """RATELIMIT_R4 with every rate limiter in Redis under ``prefix``."""
    value: dict[str, Any] = {
        "backend": "redis",
        "redis_url": url,
        "redis_key_prefix": prefix,
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": "1s", "timeout_duration": "0s"}},
            "instances": {
                "api": {"limit_for_period": 10},
                "per_ip": {"limit_for_period": 2, "key": "ip"},
                "burst": {"limit_for_period": 2},
                "burst3": {"limit_for_period": 3},
                "sustained": {"limit_for_period": 3, "limit_refresh_period": "60s"},
                "shared": {"limit_for_period": 10, "limit_refresh_period": "1h"},
            },
        },
    }
    value.update(top)
    return value


# ------------------------------------------------------------------------------------------------ views


@ratelimit("api")
def api(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("api")
async def api_async(request: HttpRequest) -> HttpResponse:
    await asyncio.sleep(0)
    return HttpResponse("ok")


@ratelimit("sustained")
def sustained(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_ip")
def per_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_ip")
async def per_ip_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["burst", "sustained"])
def multi(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["burst", "sustained"])
async def multi_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["per_ip", "burst3"])
def multi_keyed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["per_ip", "burst3"])
async def multi_keyed_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("shared")
def shared(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class ThrottledView(APIView):  # type: ignore[misc]
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = "api"

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class ThrottledMultiView(APIView):  # type: ignore[misc]
    throttle_classes = [RateLimiterThrottle]
    rate_limiter = ["burst", "sustained"]

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


urlpatterns = [
    path("api/", api),
    path("api-async/", api_async),
    path("sustained/", sustained),
    path("per-ip/", per_ip),
    path("per-ip-async/", per_ip_async),
    path("multi/", multi),
    path("multi-async/", multi_async),
    path("multi-keyed/", multi_keyed),
    path("multi-keyed-async/", multi_keyed_async),
    path("shared/", shared),
    path("drf/", ThrottledView.as_view()),
    path("drf-multi/", ThrottledMultiView.as_view()),
]


# --------------------------------------------------------------------------------------------- fixtures



def _build_all() -> None:
    # Limiters built under a FakeClock reset their Redis state when built (a sync call): do it here,
    # off any event loop, so the async tests observe only the request path.
    for name in ("api", "burst", "burst3", "sustained", "shared"):
        get_rate_limiter(name)
    registry.get_keyed_rate_limiter("per_ip")


@pytest.fixture
def on_redis(redis_url: str, prefix: str, r4_clock: Any) -> Iterator[Any]:
    """Every limiter in Redis under this test's prefix, driven by the ``r4_clock`` FakeClock."""
    with override_settings(RATELIMIT_R4=r4_settings(redis_url, prefix)):
        _build_all()
        assert isinstance(get_rate_limiter("api").backend, rb.RedisBackend)
        assert isinstance(registry.get_keyed_rate_limiter("per_ip").store, rb.RedisKeyedStore)
        yield r4_clock


@contextmanager
def no_sync_redis_on_loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record every sync redis-py command issued on a thread that runs an event loop."""
    violations: list[str] = []
    original = redis.Redis.execute_command
    original_call = rb.RedisConnection.call  # the decisions' sync path (a pooled connection, not execute_command)

    def on_loop(what: str) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # a worker thread (executor, sync view): blocking is fine here
        else:
            violations.append(what)

    def guarded(self: Any, *args: Any, **options: Any) -> Any:
        on_loop(str(args[:1]))
        return original(self, *args, **options)

    def guarded_call(self: Any, numkeys: int, args: Any, *more: Any) -> Any:
        on_loop(f"EVALSHA {args[2 * numkeys] if len(args) > 2 * numkeys else ''!r}")
        return original_call(self, numkeys, args, *more)

    with monkeypatch.context() as patch:
        patch.setattr(redis.Redis, "execute_command", guarded)
        patch.setattr(rb.RedisConnection, "call", guarded_call)
        yield violations


class PeerAsyncClient(AsyncClient):
    """AsyncClient from one peer address (ASGI takes REMOTE_ADDR from scope["client"], not a header)."""

    def __init__(self, peer: str) -> None:
        super().__init__()
        self.peer = peer

    def _base_scope(self, **request: Any) -> dict[str, Any]:
        scope = super()._base_scope(**request)
        scope["client"] = [self.peer, 0]
        return scope


def statuses(client: Client, url: str, n: int, **extra: str) -> list[int]:
    return [client.get(url, **extra).status_code for _ in range(n)]


def available(name: str, key: str | None = None) -> int:
    return get_rate_limiter(name, key=key).metrics.available_permissions


# ------------------------------------------------------------------------------------ seed 000, sync


def test_ten_pass_eleventh_is_429_with_exact_headers_then_one_second_later_passes(on_redis: Any) -> None:
    client = Client()
    first = client.get("/api/")
    assert first.status_code == 200
    assert first["RateLimit-Policy"] == API_POLICY
    assert first["RateLimit"] == '"api";r=9;t=1'
    on_redis.advance(0.25)
    second = client.get("/api/")
    assert second["RateLimit"] == '"api";r=8;t=1'  # 0.75 s to the boundary, rounded up
    assert statuses(client, "/api/", 8) == [200] * 8
    rejected = client.get("/api/")
    assert rejected.status_code == 429
    assert rejected["Retry-After"] == "1"
    assert rejected["RateLimit-Policy"] == API_POLICY
    assert rejected["RateLimit"] == '"api";r=0;t=1'
    assert available("api") == 0  # the state really is in Redis
    on_redis.advance(0.75)
    again = client.get("/api/")
    assert again.status_code == 200
    assert again["RateLimit"] == '"api";r=9;t=1'


def test_reset_is_the_time_to_the_cycle_boundary_not_the_period(on_redis: Any) -> None:
    client = Client()
    assert client.get("/sustained/")["RateLimit"] == '"sustained";r=2;t=60'
    on_redis.advance(10)
    assert client.get("/sustained/")["RateLimit"] == '"sustained";r=1;t=50'
    on_redis.advance(20.5)
    assert client.get("/sustained/")["RateLimit"] == '"sustained";r=0;t=30'  # 29.5 s rounds up
    rejected = client.get("/sustained/")
    assert (rejected.status_code, rejected["Retry-After"], rejected["RateLimit"]) == (
        429,
        "30",
        '"sustained";r=0;t=30',
    )


def test_the_budget_lives_in_redis(on_redis: Any, redis_url: str, prefix: str) -> None:
    assert statuses(Client(), "/api/", 3) == [200] * 3
    raw = redis.Redis.from_url(redis_url)
    try:
        cycle, permissions, *anchor = raw.get(f"{prefix}:rl:{{api}}:state").split()
        assert b" ".join(anchor) == raw.get(f"{prefix}:rl:{{api}}:anchor")  # the anchor it was written under
    finally:
        raw.close()
    assert (int(cycle), int(permissions)) == (0, 7)


def test_keyed_by_ip_two_clients_two_budgets_forged_xff_changes_nothing(on_redis: Any) -> None:
    client = Client()
    pk_a = partition_key("ip:" + A["REMOTE_ADDR"], _secret_salt())
    first = client.get("/per-ip/", **A)
    assert first["RateLimit-Policy"] == f'"per_ip";q=2;w=1;pk={pk_a}'
    assert first["RateLimit"] == f'"per_ip";r=1;t=1;pk={pk_a}'
    assert client.get("/per-ip/", **A).status_code == 200
    rejected = client.get("/per-ip/", **A)
    assert (rejected.status_code, rejected["Retry-After"]) == (429, "1")
    assert rejected["RateLimit"] == f'"per_ip";r=0;t=1;pk={pk_a}'
    forged = client.get("/per-ip/", HTTP_X_FORWARDED_FOR="10.9.8.7", **A)
    assert forged.status_code == 429  # no trusted proxy: X-Forwarded-For is ignored
    assert statuses(client, "/per-ip/", 3, **B) == [200, 200, 429]
    assert available("per_ip", "ip:" + A["REMOTE_ADDR"]) == 0
    assert available("per_ip", "ip:10.9.8.7") == 2  # the forged address got no budget and spent none
    on_redis.advance(1)
    assert client.get("/per-ip/", **A).status_code == 200


def test_multi_limit_all_or_nothing_consumes_nothing_on_rejection(on_redis: Any) -> None:
    client = Client()
    assert statuses(client, "/multi/", 2) == [200, 200]
    rejected = client.get("/multi/")
    assert (rejected.status_code, rejected["Retry-After"]) == (429, "1")  # burst said no ...
    assert available("sustained") == 1  # ... and sustained kept its permit
    on_redis.advance(1)
    assert client.get("/multi/").status_code == 200
    rejected = client.get("/multi/")
    assert (rejected.status_code, rejected["Retry-After"]) == (429, "59")  # sustained said no ...
    assert available("burst") == 1  # ... and burst kept its permit
    assert rejected["RateLimit-Policy"] == '"burst";q=2;w=1, "sustained";q=3;w=60'
    assert rejected["RateLimit"] == '"burst";r=1;t=1, "sustained";r=0;t=59'


def test_multi_limit_keyed_and_unkeyed(on_redis: Any) -> None:
    client = Client()
    assert statuses(client, "/multi-keyed/", 3, **A) == [200, 200, 429]  # A's own budget said no ...
    assert available("burst3") == 1  # ... and the shared one was not charged
    assert client.get("/multi-keyed/", **B).status_code == 200
    assert client.get("/multi-keyed/", **B).status_code == 429  # the shared one said no ...
    assert available("per_ip", "ip:" + B["REMOTE_ADDR"]) == 1  # ... and B kept its permit


def test_keyed_acquire_all_keyed_hands_off_to_redis_and_decides_mixed_entries(on_redis: Any) -> None:
    burst, sustained = get_rate_limiter("burst"), get_rate_limiter("sustained")
    per_ip_store = registry.get_keyed_rate_limiter("per_ip")
    entries = [(burst, None), (sustained, None), (per_ip_store, "a")]
    assert acquire_all_keyed(entries) is None
    assert acquire_all_keyed(entries) is None  # burst 0, sustained 1, a 0
    on_redis.advance(0.5)
    index, wait = acquire_all_keyed(entries)  # type: ignore[misc]
    assert index in (0, 2) and wait == 500_000_000
    assert (available("sustained"), per_ip_store.quota("b")[0]) == (1, 2)
    from django_ratelimit_r4.core.ratelimiter import RateLimiter

    in_memory = RateLimiter("mem", clock=on_redis)
    # Memory and Redis together (issue 9): memory decides first, Redis says no, memory gets its permit back.
    assert acquire_all_keyed([(burst, None), (in_memory, None)]) == (0, 500_000_000)
    assert available("burst") == 0
    assert in_memory.metrics.available_permissions == 50


def test_a_gate_mixing_memory_and_redis_decides_both(on_redis: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig

    in_memory = RateLimiter("burst", RateLimiterConfig(limit_for_period=2, limit_refresh_period="1s"), clock=on_redis)
    real = registry.get_rate_limiter
    monkeypatch.setattr(
        registry, "get_rate_limiter", lambda name, key=None: in_memory if name == "burst" else real(name)
    )
    gate = RateLimitGate(["burst", "sustained"])
    assert gate.plan().remote
    gate.acquire()
    assert (in_memory.metrics.available_permissions, available("sustained")) == (1, 2)


# ------------------------------------------------------------------------------------------------ async


async def test_async_view_same_numbers_never_touches_the_sync_client_on_the_loop(
    on_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = AsyncClient()
    with forbid_blocking(monkeypatch) as blocking, no_sync_redis_on_loop(monkeypatch) as violations:
        first = await client.get("/api-async/")
        on_redis.advance(0.25)
        second = await client.get("/api-async/")
        codes = [(await client.get("/api-async/")).status_code for _ in range(8)]
        rejected = await client.get("/api-async/")
        on_redis.advance(0.75)
        again = await client.get("/api-async/")
    assert (first.status_code, first["RateLimit-Policy"], first["RateLimit"]) == (
        200,
        API_POLICY,
        '"api";r=9;t=1',
    )
    assert second["RateLimit"] == '"api";r=8;t=1'
    assert codes == [200] * 8
    assert (rejected.status_code, rejected["Retry-After"]) == (429, "1")
    assert rejected["RateLimit"] == '"api";r=0;t=1'
    assert (again.status_code, again["RateLimit"]) == (200, '"api";r=9;t=1')
    assert violations == []
    assert blocking == [], blocking


async def test_async_keyed_and_multi_limit_views(
    on_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = AsyncClient()
    client_a = PeerAsyncClient(A["REMOTE_ADDR"])
    pk_a = partition_key("ip:" + A["REMOTE_ADDR"], _secret_salt())
    with forbid_blocking(monkeypatch) as blocking, no_sync_redis_on_loop(monkeypatch) as violations:
        keyed = [await client_a.get("/per-ip-async/") for _ in range(3)]
        other = await PeerAsyncClient(B["REMOTE_ADDR"]).get("/per-ip-async/")
        multi_codes = [(await client.get("/multi-async/")).status_code for _ in range(3)]
        on_redis.advance(1)
        ok = await client.get("/multi-async/")
        by_sustained = await client.get("/multi-async/")
        mixed = [(await client_a.get("/multi-keyed-async/")).status_code for _ in range(2)]
    assert [r.status_code for r in keyed] == [200, 200, 429]
    assert keyed[0]["RateLimit"] == f'"per_ip";r=1;t=1;pk={pk_a}'
    assert (keyed[2]["Retry-After"], keyed[2]["RateLimit"]) == ("1", f'"per_ip";r=0;t=1;pk={pk_a}')
    assert other.status_code == 200
    assert multi_codes == [200, 200, 429]
    assert ok.status_code == 200
    assert (by_sustained.status_code, by_sustained["Retry-After"]) == (429, "59")
    assert by_sustained["RateLimit"] == '"burst";r=1;t=1, "sustained";r=0;t=59'
    assert mixed == [200, 200]  # A's budget refreshed with the advance above
    assert violations == []
    assert blocking == [], blocking
    # Read outside the guarded block (sync reads), the all-or-nothing held on the async path too.
    assert await asyncio.to_thread(available, "burst") == 1
    assert await asyncio.to_thread(available, "burst3") == 1


async def test_async_view_with_redis_down_open_and_closed(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = AsyncClient()
    down_open = r4_settings(UNREACHABLE, prefix, redis_fault_policy="open")
    with override_settings(RATELIMIT_R4=down_open), forbid_blocking(monkeypatch) as blocking:
        started = time.monotonic()
        codes = [(await client.get("/api-async/")).status_code for _ in range(12)]
        elapsed = time.monotonic() - started
    assert codes == [200] * 12
    assert elapsed < 3, elapsed
    assert blocking == [], blocking
    with override_settings(RATELIMIT_R4=r4_settings(UNREACHABLE, prefix, redis_fault_policy="closed")):
        rejected = await client.get("/multi-async/")
    assert (rejected.status_code, rejected["Retry-After"]) == (429, "1")


# -------------------------------------------------------------------------------------------------- DRF


def test_drf_throttle_on_redis(on_redis: Any) -> None:
    client = Client()
    first = client.get("/drf/")
    assert (first.status_code, first["RateLimit"]) == (200, '"api";r=9;t=1')
    assert statuses(client, "/drf/", 9) == [200] * 9
    rejected = client.get("/drf/")
    assert (rejected.status_code, rejected["Retry-After"]) == (429, "1")
    assert rejected["RateLimit"] == '"api";r=0;t=1'
    assert available("api") == 0
    on_redis.advance(1)
    assert client.get("/drf/").status_code == 200


def test_drf_throttle_multi_limit_on_redis(on_redis: Any) -> None:
    client = Client()
    assert statuses(client, "/drf-multi/", 3) == [200, 200, 429]
    assert available("sustained") == 1


# ----------------------------------------------------------------------------------- two processes


CHILD = textwrap.dedent(
    """
    import json, os, sys
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django
    django.setup()
    from django.test import Client
    from django.test.utils import override_settings
    r4 = json.loads(sys.argv[1])
    with override_settings(RATELIMIT_R4=r4, ROOT_URLCONF="tests.backends.test_redis_http"):
        client = Client()
        client.get("/nothing-here/")  # import and resolve everything before the race
        print("ready", flush=True)
        sys.stdin.readline()
        print(json.dumps([client.get("/shared/").status_code for _ in range(10)]), flush=True)
    """
)


def test_two_processes_share_one_budget_through_http(redis_url: str, prefix: str) -> None:
    # No FakeClock: both processes use the Redis server's clock, as in production (1 h period).
    r4 = r4_settings(redis_url, prefix)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(  # closes the pipes on exit
        [sys.executable, "-c", CHILD, json.dumps(r4)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
            with override_settings(RATELIMIT_R4=r4):
                client = Client()
                client.get("/nothing-here/")
                mine: list[int] = []
                racer = threading.Thread(target=lambda: mine.extend(statuses(client, "/shared/", 10)))
                child.stdin.write("go\n")
                child.stdin.flush()
                racer.start()
                theirs = json.loads(child.stdout.readline())
                racer.join(30)
                assert child.wait(30) == 0
                after = client.get("/shared/")
                left = available("shared")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert len(mine) == len(theirs) == 10
    assert (mine + theirs).count(200) == 10, (mine, theirs)  # one budget of 10, not 10 per process
    assert (mine + theirs).count(429) == 10
    assert after.status_code == 429
    assert left == 0


# ---------------------------------------------------------------------------------------------- faults


def test_redis_down_fault_policy_open_allows_without_500_or_hang(redis_url: str, prefix: str) -> None:
    with override_settings(RATELIMIT_R4=r4_settings(UNREACHABLE, prefix, redis_fault_policy="open")):
        client = Client()
        started = time.monotonic()
        responses = [client.get(url, **A) for url in ("/api/", "/per-ip/", "/multi/", "/drf/") * 5]
        elapsed = time.monotonic() - started
    assert [r.status_code for r in responses] == [200] * 20
    assert elapsed < 3, elapsed  # refused connections, then the cool-down: no per-request timeout
    assert responses[0]["RateLimit"] == '"api";r=10;t=1'  # "open" reports a full budget


def test_redis_down_fault_policy_closed_rejects_with_retry_after(redis_url: str, prefix: str) -> None:
    with override_settings(RATELIMIT_R4=r4_settings(UNREACHABLE, prefix, redis_fault_policy="closed")):
        client = Client()
        started = time.monotonic()
        responses = [client.get(url, **A) for url in ("/api/", "/per-ip/", "/multi/", "/drf/") * 3]
        elapsed = time.monotonic() - started
    assert [r.status_code for r in responses] == [429] * 12
    assert {r["Retry-After"] for r in responses} == {"1"}
    assert responses[0]["RateLimit"] == '"api";r=0;t=1'
    assert elapsed < 3, elapsed


# ------------------------------------------------------------------------------------ quota() parity


def test_memory_quota_matches_redis_quota_step_by_step(redis_url: str, prefix: str) -> None:
    """MemoryBackend.quota() (the header fast path) and RedisBackend.quota() agree, debt included."""
    from django_ratelimit_r4.backends.memory import MemoryBackend
    from django_ratelimit_r4.core.clock import FakeClock

    clock = FakeClock()
    second = 1_000_000_000
    memory = MemoryBackend("q", 3, 2 * second, clock)
    remote = rb.RedisBackend("q", 3, 2 * second, clock, url=redis_url, prefix=prefix)
    # (advance ns, permits, timeout ns): plain takes, rejections, reservations into debt, idle cycles.
    steps = [
        (0, 1, 0), (1, 2, 0), (0, 1, 0), (700_000_000, 2, 5 * second), (0, 4, 9 * second),
        (2 * second, 1, 0), (3 * second + 1, 1, 0), (1_299_999_999, 3, 0), (10 * second, 1, 0),
        (second // 2, 5, 20 * second), (2 * second - 1, 1, 0), (1, 1, 0),
    ]  # fmt: skip
    for advance, permits, timeout in steps:
        clock.advance_ns(advance)
        assert memory.quota() == remote.quota()
        assert memory.acquire(permits, timeout) == remote.acquire(permits, timeout)
        assert memory.quota() == remote.quota()
        clock.advance_ns(second)  # across a boundary: MemoryBackend refreshes under its lock
        assert memory.quota() == remote.quota()
