"""No ghost charges: a decision that reaches Redis after its caller gave up changes nothing.

These tests use their own ``redis-server`` (the ``redis_server`` fixture: the machine's must never be paused)
and freeze it with SIGSTOP
while requests time out, as a stalled or overloaded Redis host would. Without deadlines the commands queued
in the frozen server's sockets all ran on SIGCONT and spent the permits of requests that had long been
answered by the fault policy (measured: after 48 rejected requests, 1 of 5 permits was left).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from django_ratelimit_r4.backends import redis as rb
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig

redis = pytest.importorskip("redis")

TIMEOUT_S = 0.2  # each command's socket timeout in these tests


def _commands(url: str, *names: str) -> int:
    """Calls of the commands ``names`` the server has run (``INFO commandstats``)."""
    client = redis.Redis.from_url(url.split("?")[0])
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in names)


def _wait_for_commands(url: str, at_least: int, *names: str) -> int:
    """Poll until the resumed server has run ``at_least`` of ``names`` (the queued ones); bounded."""
    deadline = time.monotonic() + 20
    calls = _commands(url, *names)
    while calls < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
        calls = _commands(url, *names)
    return calls


def _evalsha_calls(url: str) -> int:
    return _commands(url, "evalsha", "eval")


def _wait_for_calls(url: str, at_least: int) -> int:
    """Poll until the resumed server has run ``at_least`` scripts (the queued ones); bounded."""
    return _wait_for_commands(url, at_least, "evalsha", "eval")


def _limiter(url: str, name: str) -> RateLimiter:
    config = RateLimiterConfig(limit_for_period=5, limit_refresh_period="60s")
    return RateLimiter(
        name, config, clock=SYSTEM_CLOCK, backend=rb.redis_backend(url, prefix="r4late", fault_policy="closed")
    )


def _round(rl: RateLimiter, threads: int) -> list[bool]:
    """``threads`` decisions released together (each on its own pooled connection)."""
    barrier = threading.Barrier(threads)
    results: list[bool] = []

    def work() -> None:
        barrier.wait()
        results.append(rl.acquire_permission())

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return results


QUEUED = 8  # decisions of each path (sync, async) that reach the frozen server on open connections


def _open_connections(pool, n: int) -> None:
    """Make the pool hold ``n`` open connections (opened before the freeze: a new one cannot be set up then)."""
    held = [pool.get_connection(*rb._GET_ARGS) for _ in range(n)]
    for connection in held:
        pool.release(connection)


async def _aopen_connections(pool, n: int) -> None:
    held = [await pool.get_connection(*rb._AGET_ARGS) for _ in range(n)]
    for connection in held:
        await pool.release(connection)


async def _frozen_async_burst(server, rl: RateLimiter, url: str) -> int:
    """Freeze the server, send 8 sync and 8 async decisions that time out, then 32 more in the cool-down.

    Returns how many decisions reached the frozen server; every one of the 48 is rejected (closed policy).
    """
    conn = rb.connection(url)
    _open_connections(conn.sync.connection_pool, QUEUED)
    await _aopen_connections(conn.aio().connection_pool, QUEUED)
    server.pause()
    try:
        assert await asyncio.to_thread(_round, rl, QUEUED) == [False] * QUEUED
        conn.answered()  # end the cool-down: the async burst reaches the frozen server too
        assert await asyncio.gather(*(rl.aacquire_permission() for _ in range(QUEUED))) == [False] * QUEUED
        assert conn.is_down()
        assert [rl.acquire_permission() for _ in range(48 - 2 * QUEUED)] == [False] * (48 - 2 * QUEUED)
    finally:
        server.resume()
    return 2 * QUEUED


def _freeze_and_resume(server, url: str, rl: RateLimiter) -> float:
    """48 rejected decisions while the server is frozen, 16 of them queued in it; wait until it ran them."""
    before = _evalsha_calls(url)
    started = time.monotonic()
    queued = asyncio.run(_frozen_async_burst(server, rl, url))
    ran = _wait_for_calls(url, before + queued)
    assert ran >= before + queued  # every queued decision did run once the server resumed
    rb.connection(url).answered()  # end the cool-down now rather than sleeping it out
    return time.monotonic() - started


def test_decisions_that_time_out_while_redis_is_frozen_charge_nothing_when_it_resumes(redis_server) -> None:
    url = f"{redis_server.url}?socket_timeout={TIMEOUT_S}"
    rl = _limiter(url, "frozen")
    assert rl.acquire_permission()  # 4 of 5 left; the client now knows the anchor and the server time
    took = _freeze_and_resume(redis_server, url, rl)
    assert rl.metrics.available_permissions == 4  # the budget is intact
    assert rl.backend.faults == 48  # type: ignore[attr-defined]  # the fault policy answered all 48
    assert [rl.acquire_permission() for _ in range(5)] == [True] * 4 + [False]
    assert took < 15  # two 0.2 s timeouts and the resume: bounded (generous for a loaded machine)


def test_without_deadlines_the_same_pause_spends_the_budget(redis_server, monkeypatch) -> None:
    """The control: the same scenario with the deadline disabled loses the budget (what this guards)."""
    url = f"{redis_server.url}?socket_timeout={TIMEOUT_S}"
    rl = _limiter(url, "ghosts")
    assert rl.acquire_permission()
    monkeypatch.setattr(rb.RedisConnection, "deadline", lambda self, started_ns: b"")
    _freeze_and_resume(redis_server, url, rl)
    assert rl.backend.state()[1] == 0  # type: ignore[attr-defined]  # ghost charges took the 4 permits left
    assert rl.backend.faults == 48  # type: ignore[attr-defined]  # while all 48 callers were told "no"


def test_a_wrong_server_time_offset_costs_one_retry_never_a_decision(redis_url: str, prefix: str) -> None:
    """Clock skew cannot make every decision look late: a LATE reply that came back in time relearns the time."""
    config = RateLimiterConfig(limit_for_period=3, limit_refresh_period="60s")
    rl = RateLimiter("skew", config, clock=SYSTEM_CLOCK, backend=rb.redis_backend(redis_url, prefix=prefix))
    assert rl.acquire_permission()
    conn = rb.connection(redis_url)
    assert conn._shift_us is not None
    # As if this host's idea of the server's time were an hour behind (a stepped server clock, a bad sync):
    # every deadline it computes is already past on the server.
    conn._shift_us -= 3_600_000_000
    assert rl.acquire_permission() and rl.acquire_permission() and not rl.acquire_permission()
    assert rl.backend.faults == 0  # type: ignore[attr-defined]
    assert conn.deadline(time.monotonic_ns()) != b""  # learned again from the retry's reply
    seconds, micros = redis.Redis.from_url(redis_url).time()
    assert abs(conn.deadline(time.monotonic_ns()) - (seconds * 1_000_000 + micros)) < 10_000_000


async def _outage_past_the_resync(server, rl: RateLimiter, url: str) -> int:
    """Freeze the server, let 8 sync decisions time out (the outage begins), then make the server time due to be
    learned again (an outage longer than ``TIME_RESYNC_S``) and send 8 async probes. Returns how many decisions
    reached the frozen server; every one is rejected (closed policy)."""
    conn = rb.connection(url)
    _open_connections(conn.sync.connection_pool, QUEUED)
    await _aopen_connections(conn.aio().connection_pool, QUEUED)
    server.pause()
    try:
        assert await asyncio.to_thread(_round, rl, QUEUED) == [False] * QUEUED
        assert conn.outage_since is not None
        conn._resync_ns = 0  # the outage outlasted TIME_RESYNC_S: the offset is due to be learned again
        conn.down_until = 0.0  # the cool-down is over: these probe the frozen server (the outage goes on)
        assert await asyncio.gather(*(rl.aacquire_permission() for _ in range(QUEUED))) == [False] * QUEUED
    finally:
        server.resume()
    return 2 * QUEUED


@pytest.mark.parametrize("burst", ["async_probes", "sync_probes"])
def test_probes_of_an_outage_longer_than_the_time_resync_charge_nothing_when_it_resumes(
    redis_server, burst: str
) -> None:
    """A probe sent while the server time is due to be learned again went without a deadline (the learning
    call's shape): in an outage longer than ``TIME_RESYNC_S`` every probe (two a second) queued in a frozen
    server was a ghost charge on resume (failed before: 0 of 5 permits left). During an outage the last
    offset's deadline is kept; the time is learned again once the server answers."""
    url = f"{redis_server.url}?socket_timeout={TIMEOUT_S}"
    rl = _limiter(url, "long-outage")
    assert rl.acquire_permission()  # 4 of 5 left; the client now knows the anchor and the server time
    before = _evalsha_calls(url)
    scenario = _outage_past_the_resync if burst == "async_probes" else _outage_past_the_resync_sync_probes
    queued = asyncio.run(scenario(redis_server, rl, url))
    assert _wait_for_calls(url, before + queued) >= before + queued
    conn = rb.connection(url)
    conn.answered()
    assert rl.metrics.available_permissions == 4  # the budget is intact
    assert [rl.acquire_permission() for _ in range(5)] == [True] * 4 + [False]
    assert conn._resync_ns > time.monotonic_ns()  # and the server time was learned again


async def _outage_past_the_resync_sync_probes(server, rl: RateLimiter, url: str) -> int:
    """:func:`_outage_past_the_resync` with the roles swapped: 8 async decisions begin the outage, 8 sync ones
    probe it once the server time is due to be learned again."""
    conn = rb.connection(url)
    _open_connections(conn.sync.connection_pool, QUEUED)
    await _aopen_connections(conn.aio().connection_pool, QUEUED)
    server.pause()
    try:
        assert await asyncio.gather(*(rl.aacquire_permission() for _ in range(QUEUED))) == [False] * QUEUED
        assert conn.outage_since is not None
        conn._resync_ns = 0
        conn.down_until = 0.0
        assert await asyncio.to_thread(_round, rl, QUEUED) == [False] * QUEUED
    finally:
        server.resume()
    return 2 * QUEUED


# ----------------------------------------------------------------------------- one probe, however many callers


@pytest.mark.parametrize("side", ["sync", "async"])
def test_after_a_cool_down_one_caller_probes_and_the_others_keep_the_policy(redis_server, side: str) -> None:
    """When the cool-down ends, the first caller probes the server; callers arriving while that probe waits
    keep the fault policy. Before, every caller of that moment went to the hanging server and waited its socket
    timeout (8 concurrent callers: 8 timeouts per cool-down, a latency spike for every in-flight request)."""
    url = f"{redis_server.url}?socket_timeout=0.5"
    rl = RateLimiter(
        "probe-once",
        RateLimiterConfig(limit_for_period=5, limit_refresh_period="60s"),
        clock=SYSTEM_CLOCK,
        backend=rb.redis_backend(url, prefix="r4probe", fault_policy="open"),
    )
    assert rl.acquire_permission()
    conn = rb.connection(url)
    redis_server.pause()
    try:
        assert rl.acquire_permission()  # the open policy: the outage begins
        assert conn.is_down() and conn.server_faults == 1
        conn.down_until = time.monotonic() - 1  # the cool-down is over
        sent: list[int] = []
        if side == "sync":
            real = conn.run_script

            def counting(*args: Any, **kwargs: Any) -> Any:
                sent.append(1)
                return real(*args, **kwargs)

            conn.run_script = counting  # type: ignore[method-assign]
            start = threading.Barrier(8)
            results: list[bool] = []

            def call() -> None:
                start.wait()
                results.append(rl.acquire_permission())

            threads = [threading.Thread(target=call) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            areal = conn.arun_script

            async def acounting(*args: Any, **kwargs: Any) -> Any:
                sent.append(1)
                return await areal(*args, **kwargs)

            conn.arun_script = acounting  # type: ignore[method-assign]

            async def burst() -> list[bool]:
                return await asyncio.gather(*(rl.aacquire_permission() for _ in range(8)))

            results = asyncio.run(burst())
        assert results == [True] * 8  # the open policy decided all of them
        assert len(sent) == 1 and conn.server_faults == 2  # one probe reached the server, one more fault
    finally:
        redis_server.resume()


# ----------------------------------------------------------------------------- no call without a deadline


async def _frozen_first_calls(server, rl: RateLimiter, url: str) -> None:
    """8 sync then 8 async decisions of a process that has no reply from the server yet, sent while it is
    frozen (on connections opened before): every one is rejected by the closed policy."""
    conn = rb.connection(url)
    _open_connections(conn.sync.connection_pool, QUEUED)
    await _aopen_connections(conn.aio().connection_pool, QUEUED)
    assert conn._shift_us is None  # no server time known yet
    server.pause()
    try:
        assert await asyncio.to_thread(_round, rl, QUEUED) == [False] * QUEUED
        conn.answered()  # end the cool-down: the async burst reaches the frozen server too
        assert await asyncio.gather(*(rl.aacquire_permission() for _ in range(QUEUED))) == [False] * QUEUED
    finally:
        server.resume()


def test_a_process_first_calls_during_a_stall_charge_nothing_when_it_resumes(redis_server) -> None:
    """A process's first decisions had no server time to compute a deadline from, so they went without one:
    every one queued in a stalled server spent a permit on resume (failed before: 0 of 5 left, as the callers
    were told "no"). Now a decision never goes without a deadline: the server time is learned first, by a
    ``TIME`` of its own, and a stalled server holds that ``TIME``, not the script."""
    url = f"{redis_server.url}?socket_timeout={TIMEOUT_S}"
    loader = redis.Redis.from_url(redis_server.url)
    loader.script_load(rb.SCRIPT)  # as another process would have: a queued EVALSHA runs (no NOSCRIPT)
    loader.close()
    rl = _limiter(url, "first-calls")
    before = _commands(url, "evalsha", "eval", "time")
    asyncio.run(_frozen_first_calls(redis_server, rl, url))
    assert _wait_for_commands(url, before + 2 * QUEUED, "evalsha", "eval", "time") >= before + 2 * QUEUED
    rb.connection(url).answered()
    assert rl.metrics.available_permissions == 5  # the budget is intact
    assert [rl.acquire_permission() for _ in range(6)] == [True] * 5 + [False]
    assert rb.connection(url)._shift_us is not None


def test_decisions_in_flight_when_a_due_resync_meets_a_stall_charge_nothing(redis_server) -> None:
    """When the server time was due to be learned again (every ``TIME_RESYNC_S``), the calls of that moment went
    without a deadline (the learning call's shape): those in flight when the server stalled were ghost charges
    on resume (failed before: 0 of 5 left). Now they keep the last offset's deadline and the next call learns the
    time with a ``TIME`` of its own."""
    url = f"{redis_server.url}?socket_timeout={TIMEOUT_S}"
    rl = _limiter(url, "due-resync")
    assert rl.acquire_permission()  # 4 of 5 left; the server time is known
    conn = rb.connection(url)
    _open_connections(conn.sync.connection_pool, QUEUED)
    before = _commands(url, "evalsha", "eval", "time")
    conn._resync_ns = 0  # the server time is due to be learned again; no outage
    redis_server.pause()
    try:
        assert _round(rl, QUEUED) == [False] * QUEUED
    finally:
        redis_server.resume()
    assert _wait_for_commands(url, before + QUEUED, "evalsha", "eval", "time") >= before + QUEUED
    conn.answered()
    assert rl.metrics.available_permissions == 4  # the budget is intact
    assert [rl.acquire_permission() for _ in range(5)] == [True] * 4 + [False]
    assert conn._resync_ns > time.monotonic_ns()  # and the server time was learned again
