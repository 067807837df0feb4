"""RedisConnection's async per-call work around the round trip (issues 9 and 13: a decision within 1.10x one
bare async EVALSHA).

On a plain ``redis.asyncio.BlockingConnectionPool`` a script call takes a pooled connection without redis-py's
per-call bookkeeping, writes the packed command itself and parses the reply in one pass. What must hold, as
on redis-py's own path: the bytes sent and the replies read are exactly redis-py's; the pool's bound; a
connection the server closed is reopened, not a fault; a timeout is a timeout; a cancelled await never leaves
a connection with an unread reply in the pool; each event loop has its own pool; nothing blocks the loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

from django_ratelimit_r4.core.clock import SYSTEM_CLOCK  # noqa: E402
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig  # noqa: E402
from tests.backends.patient import PATIENT  # noqa: E402

from ..noblock import forbid_blocking  # noqa: E402

# Patient: a loaded CI machine must not turn these into timeouts (except where a timeout is the point).


def _sha(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()


def _limiter(url: str, prefix: str, name: str, limit: int = 3) -> RateLimiter:
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1h")
    return RateLimiter(name, config, clock=SYSTEM_CLOCK, backend=rb.redis_backend(url, prefix=prefix))


def _run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(main())


async def _until(predicate: Callable[[], bool], what: str, steps: int = 2000) -> None:
    # Loop steps (with a short sleep so the selector runs), bounded: not a wall-clock assert.
    for _ in range(steps):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never saw: {what}")


def _lean_pool(conn: Any) -> Any:
    """``conn``'s pool on this loop, which must take the lean path; a skip only when this redis-py really lacks
    a private name the lean path needs (it then goes redis-py's way, tested elsewhere)."""
    pool, lean = conn._apool()
    missing = rb._aio_lean_missing(pool)
    if missing:
        pytest.skip(f"redis-py {redis.__version__} lacks what the lean async path uses: {', '.join(missing)}")
    assert lean, "a plain BlockingConnectionPool takes the lean path"
    return pool


def test_the_lean_path_is_the_one_under_test(redis_url: str) -> None:
    async def main() -> None:
        conn = rb.connection(redis_url)
        pool, lean = conn._apool()
        # redis-py 8.1 (Python 3.10's newest) has no Connection._force_disconnect: the lean path still holds there.
        assert rb._aio_lean_missing(pool) == ()
        assert lean, "a plain BlockingConnectionPool takes the lean path"
        assert isinstance(pool, redis.asyncio.BlockingConnectionPool)

    _run(main)


@pytest.mark.parametrize("how", ["chosen", "compat"])
def test_a_forced_disconnect_closes_at_once_and_the_next_call_reopens(redis_url: str, how: str) -> None:
    """``_aforce_disconnect`` (redis-py's ``_force_disconnect`` where it has one, else the same synchronous steps
    as its ``disconnect()``): the connection is closed without awaiting, and reopened by the next call."""
    force = rb._aforce_disconnect if how == "chosen" else rb._aforce_disconnect_compat
    source = "return ARGV[1]"

    async def main() -> None:
        conn = rb.connection(redis_url + "?" + PATIENT)
        assert (await conn.arun_script(_sha(source), source, 0, ["one"]))[0] == b"one"
        pool = _lean_pool(conn)
        (ours,) = pool._available_connections
        writer = ours._writer
        faults = conn.server_faults  # a shared connection: other tests' faults are theirs
        assert force(ours) is None  # not a coroutine: a cancelled task must not await again
        assert not ours.is_connected and writer.is_closing()
        assert (await conn.arun_script(_sha(source), source, 0, ["two"]))[0] == b"two"
        assert ours.is_connected and conn.server_faults == faults
        await conn.aclose()

    _run(main)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["r4:rl:{a}:anchor", "r4:rl:{a}:state", b"a", b"1796173925 877938000", 1796173925877938, 0, 10**12, -5, b""],
        ["préfixe:é", "\u00e9\u4e2d", b"\x00\xff" * 4000, 2**70, -(2**70), 0],
    ],
)
def test_the_bytes_written_are_redis_pys(redis_url: str, args: list[Any]) -> None:
    source = "return 1"
    sha = _sha(source)
    written: list[bytes] = []

    async def main() -> None:
        conn = rb.connection(redis_url + "?" + PATIENT)
        await conn.aio().script_load(source)
        pool = _lean_pool(conn)
        probe = await pool.get_connection(*rb._AGET_ARGS)
        expected = b"".join(probe.pack_command("EVALSHA", sha, 2 if args else 0, *args))
        writer = probe._writer
        real = writer.write

        def write(data: Any) -> None:
            written.append(bytes(data))
            real(data)

        writer.write = write
        await pool.release(probe)
        reply, _, _ = await conn.arun_script(sha, source, 2 if args else 0, list(args))
        assert reply == 1
        assert b"".join(written) == expected
        await conn.aclose()

    _run(main)


REPLIES = [
    "return 1",
    "return -7",
    "return 'abc'",
    "return ''",
    "return false",
    "return {}",
    "return {1, {2, 'x', {}}, 'y', -3}",
    "return {1, false, 3}",
    "return redis.status_reply('LATE')",
    "return string.rep('z', 100000)",
    "return {string.rep('a', 70000), 5, {string.rep('b', 3)}}",
    "return 2^53",
    "return {ARGV[1], KEYS[1]}",
    "return {1.5, -0.5}",
    # RESP3 types (a map, a double, a boolean, a set, a verbatim string) where the connection speaks RESP3
    "redis.setresp(3); return {map={a=1, b={2, 'x'}}}",
    "redis.setresp(3); return {double=3.25}",
    "redis.setresp(3); return {true, false, {double=-1.5}}",
    "redis.setresp(3); return redis.call('SMEMBERS', KEYS[1])",
    "redis.setresp(3); redis.call('SADD', KEYS[1], 'm'); return redis.call('SMEMBERS', KEYS[1])",
    "redis.setresp(3); return {big_number='123456789012345678901234567890'}",
    "redis.setresp(3); return {verbatim_string={format='txt', string='hello'}}",
]


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("source", REPLIES)
def test_replies_are_read_as_redis_py_reads_them(redis_url: str, prefix: str, source: str, protocol: int) -> None:
    async def main() -> None:
        conn = rb.connection(redis_url + f"?protocol={protocol}&" + PATIENT)
        _lean_pool(conn)
        client = conn.aio()
        expected = await client.eval(source, 1, f"{prefix}:k", "é")
        got, _, _ = await conn.arun_script(_sha(source), source, 1, [f"{prefix}:k", "é"])
        assert got == expected and type(got) is type(expected)
        # pipelined (several calls in one write): the same replies, in order
        calls = [(1, [f"{prefix}:k", "é"], None, ()) for _ in range(3)]
        results = await conn.arun_scripts(_sha(source), source, calls)
        assert [r[0] for r in results] == [expected] * 3
        await conn.aclose()

    _run(main)


def test_error_replies_raise_as_redis_pys_and_the_connection_stays_usable(redis_url: str) -> None:
    source = "return redis.error_reply('ERR boom')"

    async def main() -> None:
        conn = rb.connection(redis_url + "?" + PATIENT)
        with pytest.raises(redis.exceptions.ResponseError, match="boom"):
            await conn.aio().eval(source, 0)
        with pytest.raises(redis.exceptions.ResponseError, match="boom") as caught:
            await conn.arun_script(_sha(source), source, 0, [])
        assert type(caught.value) is redis.exceptions.ResponseError
        # an unknown script: EVAL once, then EVALSHA
        fresh = f"return {{'{id(conn)}', 2}}"
        reply, _, _ = await conn.arun_script(_sha(fresh), fresh, 0, [])
        assert reply == [str(id(conn)).encode(), 2]
        results = await conn.arun_scripts(
            "", "", [(0, [], None, ()), (0, [], None, ())], scripts=[(_sha(source), source), (_sha(fresh), fresh)]
        )
        assert isinstance(results[0][0], redis.exceptions.ResponseError)
        assert results[1][0] == [str(id(conn)).encode(), 2]
        reply, _, _ = await conn.arun_script(_sha("return 3"), "return 3", 0, [])
        assert reply == 3
        await conn.aclose()

    _run(main)


def test_the_pool_bound_holds_on_the_lean_path(redis_server: Any) -> None:
    url = redis_server.url + "?max_connections=2&timeout=0.05&" + PATIENT

    async def main() -> None:
        conn = rb.connection(url)
        pool = _lean_pool(conn)
        lean = True
        first, _ = await conn._atake(pool, lean)
        second, _ = await conn._atake(pool, lean)
        try:
            with pytest.raises(redis.exceptions.ConnectionError, match="No connection available"):
                await conn._atake(pool, lean)
        finally:
            await conn._agive(pool, first, True)
            await conn._agive(pool, second, True)
        await conn.aclose()

    _run(main)

    # 8 tasks at once on 2 connections: exact, and every waiter is woken (no pool timeout, no fault).
    url = redis_server.url + "?max_connections=2&timeout=2&" + PATIENT

    async def burst() -> tuple[list[bool], int]:
        limiter = _limiter(url, "r4", "bound")
        results = await asyncio.gather(*(limiter.aacquire_permission() for _ in range(8)))
        pool, _ = rb.connection(url)._apool()
        opened = len(pool._available_connections) + len(pool._in_use_connections)
        backend: Any = limiter.backend
        assert backend.faults == 0
        return list(results), opened

    results, opened = _run(burst)
    assert sorted(results) == [False] * 5 + [True] * 3
    assert opened <= 2


def test_a_connection_the_server_closed_is_reopened_not_a_fault(redis_server: Any) -> None:
    url = redis_server.url + "?" + PATIENT
    limiter = _limiter(url, "r4", "reopen")
    conn = rb.connection(url)

    async def kill_ours() -> None:
        assert await limiter.aacquire_permission()
        pool = _lean_pool(conn)
        (ours,) = pool._available_connections
        admin = redis.asyncio.Redis.from_url(url)
        try:
            for client in await admin.client_list():
                if client["id"] != str(await admin.client_id()):
                    await admin.client_kill_filter(_id=client["id"])
        finally:
            await admin.aclose()
        await _until(lambda: ours._reader is None or ours._reader.at_eof(), "the server's close")
        assert await limiter.aacquire_permission()
        # Restarted under this loop: its pooled connection is closed under it.
        (ours,) = pool._available_connections
        redis_server.stop()
        redis_server.start()  # the same port, empty: a full budget again
        await _until(lambda: ours._reader is None or ours._reader.at_eof(), "the server's close")
        assert await limiter.aacquire_permission()

    _run(kill_ours)
    backend: Any = limiter.backend
    assert backend.faults == 0
    assert conn.server_faults == 0


def test_a_cancelled_call_never_leaves_its_reply_in_the_pool(redis_server: Any) -> None:
    url = redis_server.url + "?max_connections=1&timeout=5&" + PATIENT
    source = "return ARGV[1]"
    sha = _sha(source)

    async def main() -> None:
        conn = rb.connection(url)
        assert (await conn.arun_script(sha, source, 0, ["warm"]))[0] == b"warm"
        pool = _lean_pool(conn)
        redis_server.pause()
        try:
            task = asyncio.ensure_future(conn.arun_script(sha, source, 0, ["first"]))
            await _until(lambda: len(pool._in_use_connections) == 1, "the call in flight")
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            redis_server.resume()
        # The one pooled connection is the one that sent "first": its reply must not answer "second".
        for word in ("second", "third"):
            reply, _, _ = await conn.arun_script(sha, source, 0, [word])
            assert reply == word.encode()
        assert len(pool._in_use_connections) == 0
        await conn.aclose()

    for _ in range(3):
        _run(main)


def test_a_cancelled_pipelined_call_never_leaves_its_replies_in_the_pool(redis_server: Any) -> None:
    url = redis_server.url + "?max_connections=1&timeout=5&" + PATIENT
    source = "return ARGV[1]"
    sha = _sha(source)

    async def main() -> None:
        conn = rb.connection(url)
        assert (await conn.arun_script(sha, source, 0, ["warm"]))[0] == b"warm"
        pool = _lean_pool(conn)
        redis_server.pause()
        try:
            calls = [(0, ["a"], None, ()), (0, ["b"], None, ())]
            task = asyncio.ensure_future(conn.arun_scripts(sha, source, calls))
            await _until(lambda: len(pool._in_use_connections) == 1, "the calls in flight")
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            redis_server.resume()
        reply, _, _ = await conn.arun_script(sha, source, 0, ["c"])
        assert reply == b"c"
        await conn.aclose()

    _run(main)


def test_a_timeout_is_a_timeout_and_the_connection_is_not_reused_with_its_reply(redis_server: Any) -> None:
    url = redis_server.url + "?max_connections=1&timeout=5&socket_timeout=0.2&socket_connect_timeout=5"
    source = "return ARGV[1]"
    sha = _sha(source)

    async def main() -> None:
        conn = rb.connection(url)
        assert (await conn.arun_script(sha, source, 0, ["warm"]))[0] == b"warm"
        redis_server.pause()
        try:
            with pytest.raises(redis.exceptions.TimeoutError):
                await conn.arun_script(sha, source, 0, ["late"])
        finally:
            redis_server.resume()
        reply, _, _ = await conn.arun_script(sha, source, 0, ["next"])
        assert reply == b"next"
        await conn.aclose()

    _run(main)


@pytest.mark.parametrize("query", ["", "&health_check_interval=30"], ids=["lean", "redis-py's way"])
def test_aclose_closes_the_loops_connections(redis_url: str, prefix: str, query: str) -> None:
    """The client was made on a pool of ours, which redis-py's ``aclose()`` leaves open: its connections stayed
    open until collected (on redis-py 5.0, an "Event loop is closed" error from each one's ``__del__``)."""

    async def main() -> None:
        url = redis_url + "?" + PATIENT + query
        conn = rb.connection(url)
        limiter = _limiter(url, prefix, "aclose")
        assert limiter.backend._connection() is conn  # type: ignore[attr-defined]  # one per URL and options
        assert await limiter.aacquire_permission()
        await conn.aio().ping()
        pool = conn._apool()[0]
        opened = [c for c in (*pool._available_connections, *pool._in_use_connections) if c.is_connected]
        assert opened
        await conn.aclose()
        assert [c for c in opened if c.is_connected] == []

    _run(main)


@pytest.mark.parametrize("query", ["", "&health_check_interval=30"], ids=["lean", "redis-py's way"])
def test_a_closed_loops_client_is_let_go_with_its_connections_closed(redis_url: str, prefix: str, query: str) -> None:
    """A loop per job (a worker calling ``asyncio.run`` per task), each closed without ``aclose()``. Each loop's
    client kept that loop, its pool and an open socket for good (measured with async views under WSGI, before
    they were decided in the request's thread: 200 requests held 200 loops and 200 sockets to Redis)."""
    limiter = _limiter(redis_url + "?" + PATIENT + query, prefix, "loops", limit=1000)
    conn: Any = limiter.backend._connection()  # type: ignore[attr-defined]
    opened: list[Any] = []

    async def decide() -> None:
        assert await limiter.aacquire_permission()
        pool = conn._apool()[0]
        opened.extend(c for c in (*pool._available_connections, *pool._in_use_connections) if c.is_connected)

    for _ in range(20):
        asyncio.run(decide())
    assert len(opened) == 20  # one per loop: a loop's connections cannot serve another loop
    assert len(conn._aio) == 1 and len(conn._aio_pools) == 1  # the last loop's, let go when another comes
    assert [c for c in opened[:-1] if c.is_connected] == []


def test_each_event_loop_has_its_own_pool(redis_url: str, prefix: str) -> None:
    url = redis_url + "?" + PATIENT
    limiter = _limiter(url, prefix, "loops", limit=40)
    conn = rb.connection(url)
    pools: list[Any] = []
    granted: list[bool] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    async def decide() -> None:
        pools.append(conn._apool()[0])
        for _ in range(10):
            granted.append(await limiter.aacquire_permission())

    def thread() -> None:
        try:
            barrier.wait()
            asyncio.run(decide())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=thread) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({id(p) for p in pools}) == 4
    assert granted.count(True) == 40
    backend: Any = limiter.backend
    assert backend.faults == 0


def test_no_blocking_call_on_the_loop(redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = redis_url + "?" + PATIENT
    limiter = _limiter(url, prefix, "noblock", limit=100)

    async def main() -> None:
        with forbid_blocking(monkeypatch) as violations:
            for _ in range(5):  # the first one opens the connection
                await limiter.aacquire_permission()
                await limiter.aacquire_quota()
        assert violations == []

    _run(main)


def test_a_pool_of_another_parser_goes_redis_pys_way(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hiredis (or any parser but redis-py's python ones) reads its own replies: the pool is taken and given
    back through redis-py (counted there), and decisions are the same."""
    monkeypatch.setattr(rb, "_PY_PARSERS", ())
    url = redis_url + "?" + PATIENT
    limiter = _limiter(url, prefix, "foreign", limit=2)

    async def main() -> None:
        conn = rb.connection(url)
        results = [await limiter.aacquire_permission() for _ in range(3)]
        assert results == [True, True, False]
        pool, lean = conn._apool()
        assert not lean
        assert len(pool._in_use_connections) == 0 and len(pool._available_connections) == 1
        backend: Any = limiter.backend
        assert backend.faults == 0

    _run(main)
