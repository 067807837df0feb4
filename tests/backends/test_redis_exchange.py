"""RedisConnection's own exchange on a pooled connection (issue 9: the DRF throttle on Redis within 1.10 RT).

``_exchange`` writes a packed ``EVALSHA`` and reads its reply in one pass (no socket buffer, no host formatted
per read), so it must answer exactly what redis-py's ``send_packed_command`` + ``read_response`` answer, RESP2
and RESP3, with the same errors; ``run_script`` takes it only when the connection's parser holds no unread
bytes. ``_take`` / ``_give`` take and return connections under the pool queue's own mutex and still wake a
caller waiting for one.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any

import pytest

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

from redis._parsers.resp2 import _RESP2Parser  # noqa: E402
from redis._parsers.resp3 import _RESP3Parser  # noqa: E402

from django_ratelimit_r4.core.clock import SYSTEM_CLOCK  # noqa: E402
from django_ratelimit_r4.core.exceptions import RequestNotPermitted  # noqa: E402
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig  # noqa: E402

SCRIPTS = [
    "return 1",
    "return -7",
    "return {1, 2, {3, 'x'}, 'abc'}",
    "return nil",
    "return redis.status_reply('FINE')",
    "return 'x' .. string.rep('y', 200000)",  # more than one recv (64 KiB each)
    "return {}",
    "return {string.rep('a', 70000), 5}",
]


def _connection(url: str, protocol: int) -> Any:
    conn = redis.Redis.from_url(url, protocol=protocol).connection_pool.make_connection()
    conn.connect()
    return conn


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("script", SCRIPTS)
def test_exchange_answers_what_redis_py_answers(redis_server: Any, protocol: int, script: str) -> None:
    conn = _connection(redis_server.url, protocol)
    try:
        assert type(conn._parser) in rb._SYNC_PY_PARSERS
        sha = redis.Redis.from_url(redis_server.url).script_load(script)
        packed = rb._pack_evalsha(sha, 0, [], True)
        conn.send_packed_command([packed])
        theirs = conn.read_response()
        assert rb._drained(conn._parser)
        assert rb._exchange(conn, packed) == theirs
        assert rb._drained(conn._parser)
        assert conn.send_command("PING") is None and conn.read_response() in (b"PONG", "PONG")  # still in step
    finally:
        conn.disconnect()


@pytest.mark.parametrize("protocol", [2, 3])
def test_exchange_raises_the_error_replies_redis_py_raises(redis_server: Any, protocol: int) -> None:
    conn = _connection(redis_server.url, protocol)
    try:
        with pytest.raises(redis.exceptions.NoScriptError):
            rb._exchange(conn, rb._pack_evalsha("0" * 40, 0, [], True))
        sha = redis.Redis.from_url(redis_server.url).script_load("return redis.error_reply('WRONGTYPE nope')")
        with pytest.raises(redis.exceptions.ResponseError, match="nope"):
            rb._exchange(conn, rb._pack_evalsha(sha, 0, [], True))
    finally:
        conn.disconnect()


def test_exchange_times_out_and_tells_a_closed_connection(redis_server: Any) -> None:
    url = redis_server.url
    conn = redis.Redis.from_url(url, socket_timeout=0.2).connection_pool.make_connection()
    conn.connect()
    sha = redis.Redis.from_url(url).script_load("return 1")
    packed = rb._pack_evalsha(sha, 0, [], True)
    redis_server.pause()
    try:
        with pytest.raises(redis.exceptions.TimeoutError, match="Timeout reading from"):
            rb._exchange(conn, packed)
    finally:
        redis_server.resume()
    conn.disconnect()
    conn.connect()
    redis_server.stop()
    with pytest.raises(redis.exceptions.ConnectionError):
        rb._exchange(conn, packed)


class _Socket:
    """A socket whose replies arrive in the given pieces."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = list(pieces)
        self.sent: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sent.append(data)

    def recv(self, size: int) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


class _Conn:
    def __init__(self, sock: _Socket, parser: Any) -> None:
        self._sock = sock
        self._parser = parser

    def _host_error(self) -> str:
        return "test:0"


def test_exchange_reads_a_reply_in_pieces_and_hands_push_frames_to_the_parser() -> None:
    parser = _RESP3Parser(65536)
    pushed: list[Any] = []
    # redis-py < 5.1 names its handler otherwise
    (getattr(parser, "set_pubsub_push_handler", None) or parser.set_push_handler)(pushed.append)
    sock = _Socket(b">2\r\n$7\r\nmes", b"sage\r\n$2\r\nhi\r\n*3\r\n:1", b"\r\n:2\r\n$3\r\nab", b"c\r\n")
    assert rb._exchange(_Conn(sock, parser), b"packed") == [1, 2, b"abc"]
    assert sock.sent == [b"packed"]
    assert pushed == [[b"message", b"hi"]]


def test_exchange_refuses_a_closed_stream_and_data_after_the_reply() -> None:
    with pytest.raises(redis.exceptions.ConnectionError, match="closed by server"):
        rb._exchange(_Conn(_Socket(b"*2\r\n:1\r\n"), _RESP2Parser(65536)), b"x")
    with pytest.raises(redis.exceptions.InvalidResponse, match="data after the reply"):
        rb._exchange(_Conn(_Socket(b":1\r\n:2\r\n"), _RESP2Parser(65536)), b"x")


def _limiter(url: str, prefix: str) -> RateLimiter:
    config = RateLimiterConfig(limit_for_period=3, limit_refresh_period="1h")
    return RateLimiter("exchange", config, clock=SYSTEM_CLOCK, backend=rb.redis_backend(url, prefix=prefix))


def test_a_decision_takes_the_exchange_and_the_queue_mutex(redis_server: Any, monkeypatch: Any) -> None:
    """What a decision costs the client: no redis-py read (socket buffer, line by line) and no Queue.get/put
    layers on the lean pool. Counted, so the test fails if a change sends decisions back through them."""
    limiter = _limiter(redis_server.url, "r4x")
    assert limiter.acquire_permission()  # the first call loads the script and learns the server time
    conn = rb.connection(redis_server.url)
    assert conn._lean_io and conn._lifo
    calls: list[str] = []
    for cls, name in ((redis.Connection, "read_response"), (redis.Connection, "send_packed_command"),
                      (queue.Queue, "get"), (queue.Queue, "put")):
        original = getattr(cls, name)

        def counted(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(cls, name, counted)
    assert limiter.acquire_permission()
    assert limiter.acquire_permission()
    assert not limiter.acquire_permission()
    assert calls == []


def test_a_connection_with_unread_bytes_in_its_parser_is_read_by_redis_py(redis_server: Any) -> None:
    limiter = _limiter(redis_server.url, "r4y")
    assert limiter.acquire_permission()
    conn = rb.connection(redis_server.url)
    pool = conn.sync.connection_pool
    taken = conn._take(pool)
    try:
        taken._parser._buffer._buffer.write(b"+stray\r\n")  # read from the socket, never consumed
        assert not rb._drained(taken._parser)
    finally:
        conn._give(pool, taken)
    # The stray reply is read first by redis-py's own path (the script's reply then waits on the socket):
    # the decision does not misread it as its own. The connection is dropped and the next call is exact.
    with contextlib.suppress(Exception):  # the fault policy or redis-py's error: either way not a wrong reply
        limiter.acquire_permission()
    assert limiter.acquire_permission() in (True, False)
    backend: Any = limiter.backend
    assert backend.quota()[0] >= 0


def test_a_waiting_caller_gets_the_connection_given_back(redis_server: Any) -> None:
    conn = rb.connection(redis_server.url + "?max_connections=1&timeout=30")
    pool = conn.sync.connection_pool
    first = conn._take(pool)
    got: list[Any] = []
    started = threading.Event()

    def wait_for_it() -> None:
        started.set()
        got.append(conn._take(pool))  # blocks in the queue: the pool's only connection is out

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    started.wait(10)
    deadline = 10.0
    while not pool.pool.not_empty._waiters and deadline > 0:  # it is waiting now
        threading.Event().wait(0.01)
        deadline -= 0.01
    assert pool.pool.not_empty._waiters
    conn._give(pool, first)
    thread.join(10)
    assert got == [first]
    conn._give(pool, got[0])
    assert len(pool.pool.queue) == 1


def test_a_returning_client_key_is_not_hashed_again(redis_server: Any, monkeypatch: Any) -> None:
    """Each decision of a keyed limit names its client's state key (a BLAKE2b digest of the key): a string key's
    is kept, up to ``_STATE_KEYS_MAX`` clients (then forgotten at once), the same key as computed."""
    config = RateLimiterConfig(limit_for_period=2, limit_refresh_period="1h")
    keyed = rb.RedisKeyedRateLimiter("returning", config, url=redis_server.url, prefix="r4z")
    expected = keyed.store._state_key_of("203.0.113.7")
    hashed: list[object] = []
    digest = rb.client_key_digest
    monkeypatch.setattr(rb, "client_key_digest", lambda key: (hashed.append(key), digest(key))[1])
    assert keyed.acquire_quota("203.0.113.7")[0] == 1
    assert keyed.acquire_quota("203.0.113.7")[0] == 0
    with pytest.raises(RequestNotPermitted):
        keyed.acquire_quota("203.0.113.7")
    assert hashed == ["203.0.113.7"]
    assert keyed.store._state_key("203.0.113.7") == expected
    monkeypatch.setattr(rb, "_STATE_KEYS_MAX", 3)
    for i in range(7):
        keyed.store._state_key(f"c{i}")
    assert len(keyed.store._state_keys) <= 3
    assert keyed.store._state_key(42) == keyed.store._state_key_of(42)  # not a str: computed, not kept
    assert 42 not in keyed.store._state_keys


@pytest.mark.parametrize(
    "wire, value",
    [
        (b"*2\r\n*1\r\n:0\r\n*6\r\n:5\r\n:-3\r\n:0\r\n:12345678901234\r\n:1\r\n:0\r\n", [[0], [5, -3, 0, 12345678901234, 1, 0]]),
        (b"*3\r\n:1\r\n$3\r\nabc\r\n:-2\r\n", [1, b"abc", -2]),
        (b"*2\r\n*0\r\n:7\r\n", [[], 7]),
        (b"*4\r\n:1\r\n_\r\n(99\r\n:2\r\n", [1, None, 99, 2]),
    ],
)
def test_parse_reply_reads_integer_elements_and_tells_every_cut_short(wire: bytes, value: Any) -> None:
    """Array elements that are integers (the decision replies) are read in the array's own loop: the same
    values, and every prefix of the reply is incomplete (read more), never a wrong value or an IndexError."""
    parser = _RESP3Parser(65536)
    assert rb._parse_reply(wire, 0, parser) == (value, len(wire))
    assert rb._parse_reply(b"xx" + wire, 2, parser) == (value, len(wire) + 2)
    for cut in range(len(wire)):
        with pytest.raises(rb._Incomplete):
            rb._parse_reply(wire[:cut], 0, parser)


async def test_the_async_exchange_hands_push_frames_to_the_parser_as_redis_py_does() -> None:
    """redis-py < 5.1 calls the asyncio parser's push_handler_func without awaiting it; 5.1+ awaits
    handle_push_response, which awaits the pub/sub handler (5.1-5.3 with two more arguments)."""
    from redis._parsers.resp3 import _AsyncRESP3Parser

    parser = _AsyncRESP3Parser(65536)
    pushed: list[Any] = []
    if rb._PUSH_VIA_HANDLER:
        parser.set_push_handler(pushed.append)
    else:

        async def handler(response: Any) -> None:
            pushed.append(response)

        parser.set_pubsub_push_handler(handler)
    await rb._apush(parser, [b"message", b"hi"])
    assert pushed == [[b"message", b"hi"]]
