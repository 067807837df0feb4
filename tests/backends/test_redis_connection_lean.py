"""RedisConnection's per-call work around the round trip (issue 9: a decision within 1.10x one bare EVALSHA).

``_pack_evalsha`` writes exactly the bytes redis-py's own packer writes; ``_take``/``_give`` take pooled
connections without redis-py's per-call bookkeeping but keep its checks: the pool's bound, a connection the
server closed (a restart, ``CLIENT KILL``) reopened before use instead of failing the decision.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

from redis.connection import PythonRespSerializer  # noqa: E402

from django_ratelimit_r4.core.clock import SYSTEM_CLOCK  # noqa: E402
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig  # noqa: E402


def _redis_py_packed(*args: Any) -> bytes:
    packer = PythonRespSerializer(6000, redis.connection.Encoder("utf-8", "strict", False).encode)
    return b"".join(packer.pack(*args))


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["r4:rl:{a}:anchor", "r4:rl:{a}:state", b"a", b"1796173925 877938000", 1796173925877938, 0, 10**12, -5, b""],
        ["préfixe:é", "\u00e9\u4e2d", b"\x00\xff" * 4000, 2**70, -(2**70), 0],
    ],
)
def test_pack_evalsha_writes_what_redis_py_writes(args: list[Any]) -> None:
    sha = rb.SCRIPT_SHA
    for numkeys in (0, 2, 11):
        assert rb._pack_evalsha(sha, numkeys, args, True) == _redis_py_packed("EVALSHA", sha, numkeys, *args)


def test_pack_evalsha_leaves_other_types_and_encodings_to_redis_py() -> None:
    assert rb._pack_evalsha(rb.SCRIPT_SHA, 0, [1.5], True) is None
    assert rb._pack_evalsha(rb.SCRIPT_SHA, 0, [True], True) is None
    assert rb._pack_evalsha(rb.SCRIPT_SHA, 0, ["x"], False) is None
    latin = rb.RedisConnection("redis://127.0.0.1:1/0", options={"encoding": "latin-1"})
    assert latin._utf8 is False
    assert rb.RedisConnection("redis://127.0.0.1:1/0")._utf8 is True


def test_pack_evalsha_memo_serves_only_the_same_type_and_stays_bounded() -> None:
    from decimal import Decimal
    from fractions import Fraction

    sha = rb.SCRIPT_SHA
    args = ["k", b"k", 1, 0, 2**49, 2**50, -(2**50), "x" * 300, b""]
    for _ in range(2):  # the second time from the memo
        assert rb._pack_evalsha(sha, 2, args, True) == _redis_py_packed("EVALSHA", sha, 2, *args)
    assert 1 in rb._RESP_MEMO and 2**50 not in rb._RESP_MEMO and "x" * 300 not in rb._RESP_MEMO
    # equal to a memoised int, but not an int: redis-py packs them (or refuses), as without the memo
    for other in (True, False, 1.0, 0.0, Decimal(1), Fraction(1)):
        assert rb._pack_evalsha(sha, 0, [other], True) is None
    for i in range(rb._RESP_MEMO_MAX + 10):
        rb._pack_evalsha(sha, 0, [f"key-{i}"], True)
    assert len(rb._RESP_MEMO) <= rb._RESP_MEMO_MAX
    assert rb._pack_evalsha(sha, 2, args, True) == _redis_py_packed("EVALSHA", sha, 2, *args)


def test_packed_argument_runs_are_sent_as_the_arguments_they_hold() -> None:
    sha = rb.SCRIPT_SHA
    run = rb.packed_args([18, 18000000000000, 5, 3600000000000])
    flat = ["k1", "k2", b"m", 1, 0, 2, 18, 18000000000000, 5, 3600000000000, 7, 0, 1, 2, b""]
    args = ["k1", "k2", b"m", 1, 0, 2, run, rb.packed_args([7, 0, 1, 2]), b""]
    assert rb._flat(args) == flat
    assert rb._pack_evalsha(sha, 2, args, True) == _redis_py_packed("EVALSHA", sha, 2, *flat)
    assert rb._pack_evalsha(sha, 2, [*args, 1.5], True) is None  # redis-py then packs _flat(args)


def test_packed_runs_reach_redis_by_every_path(redis_server: Any) -> None:
    """GCRA and sliding-window decisions send their per-limiter arguments as packed runs: the same decisions
    on a connection redis-py packs for (another encoding) and after the server forgot the script (EVAL)."""
    from django_ratelimit_r4.core.ratelimiter import acquire_all

    url = redis_server.url
    for algorithm in ("gcra", "sliding_window"):
        config = RateLimiterConfig(limit_for_period=2, limit_refresh_period="1h", algorithm=algorithm)
        for options in ({}, {"encoding": "latin-1"}):
            factory = rb.redis_backend(url, prefix=f"packed-{len(options)}", connection_options=options)
            trio = [RateLimiter(f"{algorithm}-{i}", config, clock=SYSTEM_CLOCK, backend=factory) for i in range(3)]
            redis.Redis.from_url(url).script_flush()
            assert trio[0].acquire_permission()
            assert acquire_all(trio) is None  # 2 of 2 taken from the first one
            redis.Redis.from_url(url).script_flush()
            refused = acquire_all(trio)
            assert refused is not None and refused[0] is trio[0]
            assert trio[1].acquire_permission() and not trio[1].acquire_permission()


def _limiter(url: str, prefix: str, name: str = "lean") -> RateLimiter:
    config = RateLimiterConfig(limit_for_period=3, limit_refresh_period="1h")
    return RateLimiter(name, config, clock=SYSTEM_CLOCK, backend=rb.redis_backend(url, prefix=prefix))


def test_a_connection_the_server_closed_is_reopened_not_a_fault(redis_server: Any) -> None:
    url = redis_server.url
    limiter = _limiter(url, "r4")
    conn = rb.connection(url)
    assert conn._lean is not None  # the lean path is the one under test
    assert limiter.acquire_permission()
    admin = redis.Redis.from_url(url)
    try:
        for client in admin.client_list():  # the pooled connection of this process
            if client["id"] != str(admin.client_id()):
                admin.client_kill_filter(_id=client["id"])
    finally:
        admin.close()
    assert limiter.acquire_permission()
    redis_server.stop()
    redis_server.start()  # the same port, empty: a full budget again
    assert limiter.acquire_permission()
    backend: Any = limiter.backend
    assert backend.faults == 0
    assert conn.server_faults == 0


def test_the_pool_bound_holds_on_the_lean_path(redis_server: Any) -> None:
    url = redis_server.url + "?max_connections=2&timeout=0.05"
    prefix = "r4"
    conn = rb.connection(url)
    pool = conn.sync.connection_pool
    first, second = conn._take(pool), conn._take(pool)
    try:
        with pytest.raises(redis.exceptions.ConnectionError, match="No connection available"):
            conn._take(pool)
    finally:
        conn._give(pool, first)
        conn._give(pool, second)
    # Both slots are usable again, by 8 threads at once sharing the 2 connections. A patient pool this time
    # (another URL, so another pool): with 0.05 s a thread of a busy machine waited longer for its turn, and the
    # fault policy decided its call (flaked at load 8).
    patient = redis_server.url + "?max_connections=2&timeout=10"
    for taken in (conn._take(pool), conn._take(pool)):
        conn._give(pool, taken)
    pool = rb.connection(patient).sync.connection_pool
    limiter = _limiter(patient, prefix, "bound")
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def run() -> None:
        barrier.wait()
        results.append(limiter.acquire_permission())

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 5 + [True] * 3
    assert len(pool._connections) <= 2


@pytest.mark.parametrize("asynchronous", [False, True])
def test_cycle_all_or_nothing_packed_runs_with_the_deadline_known_and_unknown(
    redis_server: Any, asynchronous: bool
) -> None:
    """On server time an all-or-nothing call of cycle limiters sends each limiter's token and then its other
    five arguments as one packed run: with the server time not learned yet (the tokens are blanked, the reply
    carries the time), learned, forgotten again and after the anchors moved on, it decides exactly."""
    import asyncio
    import uuid

    from django_ratelimit_r4.core.ratelimiter import aacquire_all, acquire_all

    config = RateLimiterConfig(limit_for_period=4, limit_refresh_period="1h")
    factory = rb.redis_backend(redis_server.url, prefix=f"pk{uuid.uuid4().hex[:6]}")
    trio = [RateLimiter(f"c{i}", config, clock=SYSTEM_CLOCK, backend=factory) for i in range(3)]

    def decide() -> Any:
        return asyncio.run(aacquire_all(trio)) if asynchronous else acquire_all(trio)

    conn = trio[0].backend._connection()
    conn._shift_us = None  # the deadline unknown: the slow path
    assert decide() is None
    assert conn._shift_us is not None
    assert decide() is None
    conn._shift_us = None
    assert decide() is None
    assert trio[2].acquire_permission()  # 4 of 4 taken from the third
    refused = decide()
    assert refused is not None and refused[0] is trio[2]
    assert [r.backend.successful_calls for r in trio] == [3, 3, 4]
