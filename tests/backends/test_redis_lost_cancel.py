"""A cancellation the Redis client loses during a call still cancels (RedisConnection.areply), for every async
caller that changes state in Redis.

redis-py 8.2's asyncio client now and then returns a command's reply although the task was cancelled during
the command (the CancelledError is gone). Each caller must still raise CancelledError, and what the reply
granted must be given back where it would otherwise be held, or kept where keeping it is the documented rule:

* a rate limit decision (cycle, GCRA, keyed, all-or-nothing): the permit stays spent, as in memory and in
  Resilience4j (a cancelled request's permits are not given back); nothing is held, the cycle renews it;
* a permit lease (``"lease": N``): the request's permit is spent, the rest of the batch stays in this
  process's lease (else taken from the cluster's budget and used by nobody until the cycle ends);
* a half-open trial of the cluster-wide breaker: given back (else held until the trial TTL);
* a bulkhead slot: given back (else held by nobody for as long as the renewal thread renews it); a release
  whose cancellation was lost did release.

The cancellation is made to land inside the call below the wrapper (tests/backends/lost_cancel.py): the lean
path's exchange for scripts run by RedisConnection, redis-py's ``evalsha`` for the bulkhead. Every test runs
both ways a cancellation is seen: ``Task.cancelling()`` (Python 3.11+) and, where there is none (Python 3.10),
the call run in a task of its own that the caller watches (forced on 3.11+ too, so both are tested anywhere).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

import pytest

from django_ratelimit_r4.backends import redis as rb
from django_ratelimit_r4.backends import redis_lease as rl
from django_ratelimit_r4.core.bulkhead import BulkheadConfig
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, aacquire_all

from .lost_cancel import HANG_GUARD_S, Loser, cancel_lost

redis = pytest.importorskip("redis")



@pytest.fixture(autouse=True, params=["Task.cancelling", "watched task"])
def seen_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How a cancellation during a Redis call is seen: the way this Python has, or the 3.10 way forced."""
    if request.param == "Task.cancelling" and sys.version_info < (3, 11):
        pytest.skip("Task.cancelling() is Python 3.11+; the watched task is this Python's way (tested)")
    if request.param == "watched task":
        monkeypatch.setattr(rb, "_CANCELLING", False)
    return str(request.param)


S = 1_000_000_000
# Patient: a loaded machine must not turn these calls into faults (the fault policy would decide them).
PATIENT = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}


def limiter(url: str, prefix: str, limit: int, *, name: str = "rl", algorithm: str = "cycle") -> RateLimiter:
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1h", algorithm=algorithm)
    backend = rb.redis_backend(url, prefix=prefix, fault_policy="open", connection_options=PATIENT)
    return RateLimiter(name, config, clock=FakeClock(), backend=backend)


def lose_in_exchange(monkeypatch: pytest.MonkeyPatch, conn: rb.RedisConnection, marker: bytes = b"") -> Loser:
    """The next lean exchange on ``conn`` (whose command holds ``marker``) loses its cancellation."""
    assert conn._apool()[1], "the lean path is the one under test"
    loser = Loser()
    monkeypatch.setattr(conn, "_aexchange", loser.wrap(conn._aexchange, lambda _c, packed, _n: marker in packed))
    return loser


# ------------------------------------------------------------------------------------- rate limit decisions


@pytest.mark.parametrize("algorithm", ["cycle", "gcra", "sliding_window"])
async def test_a_decision_whose_cancellation_was_lost_cancels_and_its_permit_stays_spent(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    rl_ = limiter(redis_url, prefix, 3, algorithm=algorithm)
    backend: Any = rl_.backend
    assert await rl_.aacquire_permission()
    loser = lose_in_exchange(monkeypatch, backend._connection())
    task = await cancel_lost(loser, rl_.aacquire_permission())
    assert task.cancelled(), task  # was: True, as if the request had not been cancelled
    assert rl_.metrics.available_permissions == 1  # the cancelled request's permit is spent, as in memory
    assert await rl_.aacquire_permission()
    assert not await rl_.aacquire_permission()


async def test_a_cancellation_lost_while_connecting_cancels_before_anything_is_sent(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py 8.2's ``Connection.connect()`` loses a cancellation most often of all (measured on Python
    3.11.7: 1570 of the 2971 cancels that landed in it). The lean path opens a new or reopened connection with
    it before writing the command itself: a cancellation lost there must stop the call before the command is
    sent, so the decision is not taken at all."""
    rl_ = limiter(redis_url, prefix, 3)
    backend: Any = rl_.backend
    conn = backend._connection()
    pool, lean = conn._apool()
    assert lean
    for idle in list(pool._available_connections):  # every connection is opened afresh
        rb._aforce_disconnect(idle)
    loser = Loser()
    monkeypatch.setattr(pool.connection_class, "connect", loser.wrap(pool.connection_class.connect))
    task = await cancel_lost(loser, rl_.aacquire_permission())
    assert task.cancelled(), task
    assert rl_.metrics.available_permissions == 3  # nothing taken: the command never left
    monkeypatch.undo()
    assert await rl_.aacquire_permission()


async def test_a_keyed_decision_whose_cancellation_was_lost_cancels(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = RateLimiterConfig(limit_for_period=2, limit_refresh_period="1h")
    keyed = rb.RedisKeyedRateLimiter(
        uuid.uuid4().hex, config, clock=FakeClock(), url=redis_url, prefix=prefix, connection_options=PATIENT
    )
    conn = rb.connection(redis_url, PATIENT)
    loser = lose_in_exchange(monkeypatch, conn)
    task = await cancel_lost(loser, keyed.aacquire_permission("client-1"))
    assert task.cancelled(), task
    assert await keyed.aquota("client-1") == (1, 3600 * S)  # spent, as in memory
    assert await keyed.aquota("client-2") == (2, 3600 * S)


async def test_an_all_or_nothing_decision_whose_cancellation_was_lost_cancels(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = limiter(redis_url, prefix, 3, name="a")
    b = limiter(redis_url, prefix, 2, name="b", algorithm="gcra")  # two algorithms: the composed script
    backend: Any = a.backend
    loser = lose_in_exchange(monkeypatch, backend._connection())
    task = await cancel_lost(loser, aacquire_all([a, b]))
    assert task.cancelled(), task
    assert (a.metrics.available_permissions, b.metrics.available_permissions) == (2, 1)


async def test_a_pipelined_read_whose_cancellation_was_lost_cancels(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``arun_scripts`` (several calls in one write: a mixed gate's 429 figures, cluster splits) goes through the
    wrapper too: its caller ends cancelled instead of answering as if not cancelled."""
    a = limiter(redis_url, prefix, 3, name="a")
    b = limiter(redis_url, prefix, 2, name="b", algorithm="gcra")
    backend: Any = a.backend
    loser = lose_in_exchange(monkeypatch, backend._connection())
    task = await cancel_lost(loser, rb.aread_quotas([(a, None), (b, None)]))
    assert task.cancelled(), task
    monkeypatch.undo()
    assert [q for q, _ in await rb.aread_quotas([(a, None), (b, None)])] == [3, 2]  # a read: nothing taken


async def test_a_cancellation_turned_into_a_timeout_below_us_cancels_and_is_no_fault(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that reports a cancellation as its own timeout (async_timeout before Python 3.11.3 could):
    the caller was cancelled, Redis did not fail. The fault policy must not decide it, nor a cool-down start
    for every caller of this server."""
    rl_ = limiter(redis_url, prefix, 3)
    backend: Any = rl_.backend
    conn = backend._connection()
    entered = asyncio.Event()

    async def timing_out(*_: Any) -> Any:
        entered.set()
        try:
            await asyncio.sleep(HANG_GUARD_S)
        except asyncio.CancelledError:
            raise redis.exceptions.TimeoutError("Timeout reading from the server") from None
        raise AssertionError("hang guard: never cancelled")

    monkeypatch.setattr(conn, "_aexchange", timing_out)
    task = asyncio.ensure_future(rl_.aacquire_permission())
    await asyncio.wait_for(entered.wait(), HANG_GUARD_S)
    faults = conn.server_faults
    task.cancel()
    await asyncio.wait([task], timeout=HANG_GUARD_S)
    assert task.cancelled(), task  # was: True (the "open" fault policy admitted a cancelled request)
    assert conn.server_faults == faults and not conn.is_down()
    assert backend.faults == 0


# ------------------------------------------------------------------------------------------- permit leases


async def test_a_lease_whose_cancellation_was_lost_cancels_and_keeps_the_batch(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = rl.RedisLeaseBackend(
        "leased", 10, 60 * S, FakeClock(), lease=4, url=redis_url, prefix=prefix, connection_options=PATIENT
    )
    loser = lose_in_exchange(monkeypatch, b._connection())
    task = await cancel_lost(loser, b.aacquire(1, 0))
    assert task.cancelled(), task
    assert b.lease_stats.round_trips == 1
    assert b._held(b.state_key) == 3  # the batch of 4 less the cancelled request's permit
    assert [await b.aacquire(1, 0) for _ in range(3)] == [0, 0, 0]
    assert b.lease_stats.round_trips == 1  # spent from the lease: no round trip
    assert b.quota()[0] == 6  # 10 - 4 taken by the one batch


# -------------------------------------------------------------------------------- cluster-wide breaker


async def test_a_half_open_trial_whose_cancellation_was_lost_is_given_back(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_ratelimit_r4.backends.redis_breaker import RedisCircuitBreaker
    from django_ratelimit_r4.core.circuitbreaker import CircuitBreakerConfig

    config = CircuitBreakerConfig(permitted_number_of_calls_in_half_open_state=1)
    a = RedisCircuitBreaker("partner", config, url=redis_url, prefix=prefix, connection_options=PATIENT)
    try:
        await asyncio.to_thread(a.transition_to_open_state)
        await asyncio.to_thread(a.transition_to_half_open_state)
        client = redis.Redis.from_url(redis_url)
        trials_key = f"{prefix}:cb:{{partner}}:trials"
        ran: list[str] = []

        async def call() -> str:
            ran.append("called")
            return "ok"

        loser = lose_in_exchange(monkeypatch, a._conn, b"trial")
        task = await cancel_lost(loser, a.acall(call))
        assert task.cancelled(), task
        assert ran == []  # the protected call never ran for a cancelled caller
        for _ in range(int(HANG_GUARD_S / 0.01)):  # a hang guard: the sender thread gives the trial back
            if await asyncio.to_thread(client.zcard, trials_key) == 0:
                break
            await asyncio.sleep(0.01)
        assert await asyncio.to_thread(client.zcard, trials_key) == 0  # was: held until the trial TTL
        assert await a.acall(call) == "ok"  # the one trial is free again
        client.close()
    finally:
        a.close()


# --------------------------------------------------------------------------------------------- bulkhead


async def test_a_bulkhead_release_whose_cancellation_was_lost_cancels_and_released(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_ratelimit_r4.backends.redis_bulkhead import RedisBulkhead

    a = RedisBulkhead("partner", BulkheadConfig(max_concurrent_calls=1), url=redis_url, prefix=prefix,
                      connection_options=PATIENT)
    try:
        assert await a.atry_acquire_permission()
        client = a._conn.aio()
        loser = Loser()
        monkeypatch.setattr(client, "evalsha", loser.wrap(client.evalsha, lambda *args: "release" in args))
        task = await cancel_lost(loser, a.aon_complete())
        assert task.cancelled(), task  # was: None, as if not cancelled
        assert a.cluster_concurrent_calls() == 0 and a.metrics.concurrent_calls == 0
        assert not a._pending  # released by the call itself: nothing left for the renewal thread
        assert await a.atry_acquire_permission()
        await a.aon_complete()
    finally:
        a.close()
