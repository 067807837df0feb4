"""Rate-limiter state in Redis: one budget per limiter (and per client key) for every process and host.

The in-memory backend is per process: under gunicorn with N workers a limit of 10 becomes 10 x N. Here the
state lives in Redis and every decision is ONE round trip: an ``EVALSHA`` of ``lua/fast.lua`` +
``lua/decide.lua`` + ``lua/ratelimiter.lua``, which mirror :func:`~django_ratelimit_r4.backends.base.decide`
(same AtomicRateLimiter math, reservations and debt, truncating ``div_ceil``): ``fast.lua`` decides the common
case inline from the client's cached anchor, the rest is the exact general path. Several limiters (and client
keys) decide all-or-nothing in the same single script.

Public names:

* :class:`RedisBackend` -- a :class:`~.base.RateLimiterBackend` for one (unkeyed) ``RateLimiter``; build it
  through :func:`redis_backend` (a :class:`~.base.BackendFactory`).
* :class:`RedisKeyedStore` -- a :class:`~django_ratelimit_r4.core.backend.KeyedBackend`: one budget per client
  key, shared cluster-wide, decided through the one :class:`~django_ratelimit_r4.keyed.KeyedRateLimiter`
  (:class:`RedisKeyedRateLimiter` is the name of such a limiter built directly).
* :func:`acquire_all_keyed` / :func:`aacquire_all_keyed` -- all-or-nothing over ``(limiter, key|None)``
  entries, like :func:`django_ratelimit_r4.keyed.acquire_all_keyed`, in one round trip.
* :class:`RedisConnection` / :func:`connection` -- the per-process clients of one URL (after fork too).

Both limiters have ``quota()`` (RateLimit header fields) and an ``aquota()`` twin on ``redis.asyncio``; each
is one round trip that writes nothing.

Time: Redis server time (``TIME``) by default, so hosts agree; a limiter whose clock is not the system clock
(a ``FakeClock`` from ``r4_clock``) sends its own ``now`` instead, so tests stay deterministic. With server
time every decision carries a deadline (:meth:`RedisConnection.deadline`): run after its caller gave up, it
changes nothing (no ghost charges after a timeout).

Faults: a Redis error or timeout never raises out of a decision. ``fault_policy="open"`` grants,
``"closed"`` rejects with a short wait (:data:`FAULT_RETRY_AFTER_NS`); either way it is logged at most once per
:data:`FAULT_LOG_INTERVAL_S`. A fault of the server (refused, reset, an error reply, a timeout with no reply
meanwhile) stops calls to Redis for :data:`FAULT_COOLDOWN_S` (no per-request connect timeout while it is
down); a fault of this process (no pooled connection free in time, a timeout while other calls got replies)
decides only the call it hit. See docs/redis.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import math
import operator
import os
import queue
import re
import select
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from concurrent.futures import Executor, Future
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from asgiref.sync import AsyncToSync
from redis._parsers.resp2 import _AsyncRESP2Parser, _RESP2Parser
from redis._parsers.resp3 import _AsyncRESP3Parser, _RESP3Parser
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from ..core.clock import SYSTEM_CLOCK, Clock, MonotonicClock
from ..core.ratelimiter import (
    FAILED_ACQUIRE,
    SUCCESSFUL_ACQUIRE,
    RateLimiter,
    RateLimiterConfig,
    refuse_never_grantable,
)
from ..keyed import DEFAULT_MAX_KEYS, KeyedRateLimiter, _check_limit, memory_keyed_store
from .base import (
    FAULT_POLICIES,
    FAULT_POLICY_OF,
    MAX_NS_PERIOD,
    MAX_PERIOD_NS,
    BackendFactory,
    RateLimiterBackend,
    check_fault_policy,
    redact_url,
    redis_period_error,
)
from .memory import MemoryBackend, acquire_local_many
from .redis_mixed import CYCLE_FILES, MIXED_SCRIPT, MIXED_SCRIPT_SHA, lua_text, mixed_args, mixed_reply

__all__ = [
    "CLUSTER_CLOCK_SKEW_US",
    "CLUSTER_SHARDS",
    "CONNECT_TIMEOUT_S",
    "DEADLINE_MARGIN_US",
    "DEFAULT_PREFIX",
    "FAULT_COOLDOWN_S",
    "FAULT_LOG_INTERVAL_S",
    "FAULT_POLICIES",
    "FAULT_RETRY_AFTER_NS",
    "MAX_CONNECTIONS",
    "MAX_NS_PERIOD",
    "MAX_PERIOD_NS",
    "POOL_TIMEOUT_S",
    "SCRIPT",
    "SCRIPT_SHA",
    "SOCKET_TIMEOUT_S",
    "TIME_RESYNC_S",
    "LostCancellation",
    "RedisBackend",
    "RedisConnection",
    "RedisKeyedRateLimiter",
    "RedisKeyedStore",
    "aacquire_all_keyed",
    "acquire_all_keyed",
    "aread_quotas",
    "client_key_digest",
    "close_connections",
    "connection",
    "connection_ident",
    "key_base",
    "read_quotas",
    "redis_backend",
    "redis_period_error",
    "sentinel_settings",
    "several_slots",
    "shard_of",
    "store_options",
]

logger = logging.getLogger("django_ratelimit_r4.redis")

#: Prefix of every key this backend writes.
DEFAULT_PREFIX = "r4"
# FAULT_POLICIES (imported from .base, where conf reads them too): "open": a decision Redis cannot make is granted;
# "closed": rejected with FAULT_RETRY_AFTER_NS; "local": decided by an in-process limiter of the same config
# (``on_backend_error`` "allow", "deny", "local").
#: The wait (Retry-After) of a rejection made by the "closed" fault policy.
FAULT_RETRY_AFTER_NS = 1_000_000_000
#: After a Redis error, decisions use the fault policy without calling Redis for this long.
FAULT_COOLDOWN_S = 0.5
#: A Redis outage is logged at most once per this many seconds per URL.
FAULT_LOG_INTERVAL_S = 10.0
#: Timeout of each command (override with ``?socket_timeout=...`` in the URL).
SOCKET_TIMEOUT_S = 0.25
#: Timeout of opening a connection, apart from the command timeout: a burst of first calls on a busy worker
#: must not time out on loopback (``?socket_connect_timeout=...``).
CONNECT_TIMEOUT_S = 2.0
#: Connections per pool (the sync client's, and each event loop's); more callers wait (``?max_connections=``).
MAX_CONNECTIONS = 16
#: How long a caller waits for a pooled connection before the fault policy decides its call (``?timeout=``).
#: Commands take well under a millisecond, so a long wait means this process is starved of CPU: callers then
#: wait their turn rather than flip to the fault policy (a command that times out still frees its slot).
POOL_TIMEOUT_S = 5.0
#: A decision carries the server time after which its caller may have given up: its socket timeout, minus
#: the error of the learned server-time offset and this margin (clock drift between two learnings), so the
#: deadline is never later than the give-up; a later execution changes nothing.
DEADLINE_MARGIN_US = 2_000
#: On a Redis Cluster the learned server-time offset is used for every node: node clocks may differ by up to
#: this much (NTP keeps them far closer) and deadlines stay no later than the caller's give-up.
CLUSTER_CLOCK_SKEW_US = 50_000
#: The server-time offset is learned again (from one exact slow-path reply) at least this often.
TIME_RESYNC_S = 60.0

_NS_PER_S = 1_000_000_000
# RedisClusterException is not a RedisError: redis-py raises it when no node of a cluster answers (learning the
# topology again) or a slot has no owner. A fault like any other: the fault policy decides, never a 500.
_FAULTS = (RedisError, OSError, RedisClusterException)
#: One script call of :meth:`RedisConnection.run_scripts`: ``(numkeys, args, deadline_at, tokens)``.
_ScriptCall = tuple[int, list[Any], "int | None", Sequence[int]]
# Replies that mean "not here" (the script did not run): followed once.
_REDIRECTS = (redis.exceptions.MovedError, redis.exceptions.AskError)
_TIMEOUTS = (redis.exceptions.TimeoutError, TimeoutError)
_T = TypeVar("_T")
# Task.cancelling() (Python 3.11+) counts the cancellations requested of a task and not taken back: what tells
# a cancellation the client below us swallowed. Python 3.10 has none: there the call runs in a task of its own
# that the caller watches (_awatched).
_CANCELLING = hasattr(asyncio.Task, "cancelling")
_current_task = asyncio.current_task


class LostCancellation(asyncio.CancelledError):
    """The task was cancelled during a Redis call, yet the call returned: the client below us (redis-py 8.2's
    asyncio client, now and then) lost the ``CancelledError``. The call took effect in Redis; :attr:`reply` is
    what it answered, for a caller to give back what it would otherwise hold. A ``CancelledError``: the task
    ends cancelled wherever nobody catches it (raised by :meth:`RedisConnection.areply`)."""

    def __init__(self, reply: Any) -> None:
        super().__init__("cancelled during a Redis call whose reply came back")
        self.reply = reply


async def _awatched(call: Awaitable[_T]) -> _T:
    """:meth:`RedisConnection.areply` without ``Task.cancelling()`` (Python 3.10): ``call`` runs in a task of its
    own, so a cancellation of the caller reaches the caller here (the client below cannot swallow it), and is
    passed on to ``call``. Then, as with ``cancelling()``: a reply raises :class:`LostCancellation`, a fault or a
    cancellation raises ``CancelledError``. One task more per call, on 3.10 only."""
    inner = asyncio.ensure_future(call)
    cancelled = False
    while True:
        try:
            # asyncio.wait neither cancels ``inner`` nor raises its outcome: a CancelledError here is ours.
            await asyncio.wait((inner,))
            break
        except asyncio.CancelledError:
            cancelled = True
            inner.cancel()
    if not cancelled:
        return inner.result()
    if inner.cancelled():
        raise asyncio.CancelledError("cancelled during a Redis call")
    exc = inner.exception()
    if exc is None:
        raise LostCancellation(inner.result())
    if isinstance(exc, _FAULTS):
        raise asyncio.CancelledError("cancelled during a Redis call (reported as a fault)") from exc
    raise exc


#: asgiref's event loops made for one ``async_to_sync`` call each, with the executor of the thread that waits for
#: that call: Django runs an async view under WSGI (and in its test ``Client``) in such a loop, closed when the
#: request ends. Empty unless such a call is running (an ASGI server's loop is never in it).
_CALL_LOOPS: Mapping[asyncio.AbstractEventLoop, Executor] = getattr(AsyncToSync, "loop_thread_executors", {})


def call_thread_submit(fn: Callable[..., _T], *args: Any) -> Future[_T] | None:
    """``fn(*args)`` submitted to the thread waiting for the running loop, when that loop is asgiref's loop of
    one ``async_to_sync`` call (see :data:`_CALL_LOOPS`); None otherwise (the caller uses its loop's client).

    A Redis client made in such a loop would live for one request: every request opened a connection (a TCP
    handshake, ``HELLO``, ``CLIENT SETINFO``, ``SELECT``) and left a ``TIME_WAIT`` socket when its loop ended
    (measured: +1.5 ms per request, and 2 000 requests left ~2 000 ``TIME_WAIT`` sockets: a host runs out of
    ephemeral ports near 470 requests a second). The waiting thread is the request's own (idle while the loop
    runs, as asgiref's ``sync_to_async(thread_sensitive=True)`` uses it), and the sync client's pool persists:
    the loop never blocks, and no connection is made per request.
    """
    executor = _CALL_LOOPS.get(asyncio.get_running_loop())
    if executor is None:
        return None
    try:
        return executor.submit(fn, *args)
    except RuntimeError:  # that call has returned (a task outliving it): this loop's own client serves it
        return None


async def await_call_thread(done: Future[_T]) -> _T:
    """The outcome of ``done`` (from :func:`call_thread_submit`), honest about a cancellation as
    :meth:`RedisConnection.areply` is: a call already running in the other thread cannot be stopped, so a
    cancellation waits for its outcome, then raises :class:`LostCancellation` with the reply (a caller gives back
    what it would hold, after it was taken) or ``CancelledError`` for a fault; a call not started is withdrawn."""
    future = asyncio.wrap_future(done)
    cancelled = False
    while True:
        try:
            # asyncio.wait neither cancels ``future`` nor raises its outcome: a CancelledError here is ours.
            await asyncio.wait((future,))
            break
        except asyncio.CancelledError:
            if done.cancel():  # still queued: it never runs
                raise
            cancelled = True
    if not cancelled:
        return future.result()
    exc = future.exception()
    if exc is None:
        raise LostCancellation(future.result())
    if isinstance(exc, _FAULTS):
        raise asyncio.CancelledError("cancelled during a Redis call (reported as a fault)") from exc
    raise exc


def _load_script() -> str:
    return "\n".join(lua_text(name) for name in CYCLE_FILES)


#: The Lua source of every operation, and its SHA1 for EVALSHA.
SCRIPT = _load_script()
SCRIPT_SHA = hashlib.sha1(SCRIPT.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------- connections


_EVALSHA_HEADS: dict[tuple[str, int], bytes] = {}
# select.poll where the platform has it (not on Windows): RedisConnection._take's cheap readability test.
_poll: Any = getattr(select, "poll", None)
_POLL_EVENTS = getattr(select, "POLLIN", 1) | getattr(select, "POLLPRI", 2)


class _Packed(bytes):
    """Several script arguments already in RESP (bulk strings), packed once where they are made (a GCRA or
    sliding-window limiter's per-limiter arguments, :func:`packed_args`): :func:`_pack_evalsha` copies them as
    they are; every other way of sending a command takes them one by one again (:func:`_flat`)."""

    args: tuple[Any, ...]


def packed_args(args: Sequence[int | bytes]) -> _Packed:
    """``args`` (ints and bytes) as one :class:`_Packed` run of arguments."""
    values = [arg if isinstance(arg, bytes) else b"%d" % arg for arg in args]
    chunk = _Packed(b"".join(b"$%d\r\n%s\r\n" % (len(value), value) for value in values))
    chunk.args = tuple(args)
    return chunk


def _flat(args: Sequence[Any]) -> list[Any]:
    """``args`` with every :class:`_Packed` run taken apart (for redis-py's own packer)."""
    flat: list[Any] = []
    for arg in args:
        if type(arg) is _Packed:
            flat.extend(arg.args)
        else:
            flat.append(arg)
    return flat


#: RESP bulk strings of the arguments decisions send again and again (keys, ops, per-limiter figures), so a
#: decision formats only what is new (its deadline). Keyed by the argument itself, only ``str``, ``bytes`` and
#: ``int`` (``type(...) is``: a ``bool``, a ``float`` or a ``Decimal`` equal to a cached int is never served
#: from it); ints of magnitude 2^50 or more (deadlines, cycle bases in µs: new every call or cycle) and values
#: over 256 bytes are not kept. Bounded: emptied when full (a keyed limiter's client keys cycle through it).
_RESP_MEMO: dict[Any, bytes] = {}
_RESP_MEMO_MAX = 4096
_MEMO_INT = 2**50


def _pack_evalsha(sha: str, numkeys: int, args: Sequence[Any], utf8: bool) -> bytes | None:
    """``EVALSHA sha numkeys *args`` in RESP, as redis-py's packer writes it, for ``bytes``/``str``/``int``
    arguments on a connection encoding ``str`` as strict UTF-8 (its default; ``utf8``). Otherwise None, and
    the caller lets redis-py pack it.

    Every decision sends one: redis-py's general packer (an encoder call and type tests per argument, chunking
    for large values) costs about 7 µs for a decision's 15 arguments on the shared 2-core machine, this
    about 1.5 µs; the head (``*N``, ``EVALSHA``, the sha, numkeys) is built once per sha and key count, and an
    argument seen before (:data:`_RESP_MEMO`) is one dict lookup instead of a ``%``-format (about 3.8 k
    instructions an argument: 76 k for an all-or-nothing decision over three GCRA limits, 25 k with it).
    """
    if not utf8:
        return None
    head = _EVALSHA_HEADS.get((sha, numkeys))
    if head is None:
        n = str(numkeys).encode()
        head = _EVALSHA_HEADS[(sha, numkeys)] = b"$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
            len(sha),
            sha.encode(),
            len(n),
            n,
        )
    parts = [b"", head]
    append = parts.append
    memo = _RESP_MEMO
    get = memo.get
    count = len(args) + 3
    for arg in args:
        kind = type(arg)
        if kind is not str and kind is not int and kind is not bytes:
            if kind is _Packed:
                append(arg)
                count += len(arg.args) - 1
                continue
            return None
        chunk = get(arg)
        if chunk is None:
            if kind is str:
                value = arg.encode()
            elif kind is int:
                value = b"%d" % arg
            else:
                value = arg
            chunk = b"$%d\r\n%s\r\n" % (len(value), value)
            if len(value) <= 256 and (kind is not int or -_MEMO_INT < arg < _MEMO_INT):
                if len(memo) >= _RESP_MEMO_MAX:
                    memo.clear()
                memo[arg] = chunk
        append(chunk)
    parts[0] = b"*%d\r\n" % count
    return b"".join(parts)


# redis-py's python parsers: a connection using one reads its replies with _aread_replies (same results).
_PY_PARSERS = (_AsyncRESP2Parser, _AsyncRESP3Parser)


class _Incomplete(Exception):
    """The bytes read so far end inside a reply (read more)."""


_SERVER_CLOSED = "Connection closed by server."


def _timeout_factory() -> Any:
    # What redis.asyncio uses: asyncio.timeout from 3.11.3 (sound under cancellation), else async_timeout.
    if sys.version_info >= (3, 11, 3):
        return asyncio.__dict__["timeout"]
    import async_timeout  # a dependency of redis-py on these versions

    return async_timeout.timeout


_async_timeout = _timeout_factory()
# What one read of a reply asks the stream for (whatever is there, up to this much).
_READ_SIZE = 65536


class _Push:
    """A RESP3 push frame met while reading replies (handed to the parser's push handler, not a reply)."""

    __slots__ = ("value",)

    def __init__(self, value: list[Any]) -> None:
        self.value = value


# A push frame (RESP3) goes where redis-py's own parser sends it: redis-py < 5.1 calls the parser's
# push_handler_func (synchronously, on the asyncio parser too), 5.1-5.3 handle_push_response with two more
# arguments, 6+ handle_push_response alone. Push frames are rare (client tracking, pub/sub): not a hot path.
_PUSH_VIA_HANDLER = not hasattr(_RESP3Parser, "set_pubsub_push_handler")
#: redis-py < 5.1 reads a RESP3 set as a Python set when its members allow it (5.1+: always a list).
_SETS_AS_SETS = _PUSH_VIA_HANDLER
_PUSH_EXTRA: tuple[bool, ...] = (
    (False, False) if "disable_decoding" in inspect.signature(_RESP3Parser.handle_push_response).parameters else ()
)


def _parse_reply(buf: bytes, pos: int, parser: Any) -> tuple[Any, int]:
    """One RESP2/RESP3 reply of ``buf`` at ``pos``, as redis-py's python parsers return it without
    ``decode_responses`` (an error reply as its exception; one that means a broken connection raised; a push
    frame as :class:`_Push`), and the position after it. Raises :class:`_Incomplete` when ``buf`` ends
    inside it.
    """
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind = buf[pos]
    if kind == 58 or kind == 40:  # ":" integer, "(" big number
        return int(buf[pos + 1 : end]), end + 2
    if kind == 36 or kind == 61 or kind == 33:  # "$" bulk string, "=" verbatim string, "!" bulk error
        size = int(buf[pos + 1 : end])
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if len(buf) < stop + 2:
            raise _Incomplete
        value = buf[end + 2 : stop]
        if kind == 61:
            return value[4:], stop + 2
        if kind == 33:
            return _error_reply(parser, value), stop + 2
        return value, stop + 2
    if kind == 42 or kind == 126 or kind == 62:  # "*" array, "~" set (a list, as redis-py), ">" push
        count = int(buf[pos + 1 : end])
        if count < 0:
            return None, end + 2
        items: list[Any] = []
        append = items.append
        pos = end + 2
        size = len(buf)
        for _ in range(count):
            if pos < size and buf[pos] == 58:  # ":" an integer (a decision's figures): read here, no call
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    raise _Incomplete
                append(int(buf[pos + 1 : end]))
                pos = end + 2
            else:
                item, pos = _parse_reply(buf, pos, parser)
                append(item)
        if kind == 126 and _SETS_AS_SETS:
            with contextlib.suppress(TypeError):  # an unhashable member: a list, as redis-py < 5.1 leaves it
                return set(items), pos
        return (_Push(items) if kind == 62 else items), pos
    if kind == 37:  # "%" map
        count = int(buf[pos + 1 : end])
        mapping = {}
        pos = end + 2
        for _ in range(count):
            key, pos = _parse_reply(buf, pos, parser)
            mapping[key], pos = _parse_reply(buf, pos, parser)
        return mapping, pos
    if kind == 43:  # "+" status
        return buf[pos + 1 : end], end + 2
    if kind == 45:  # "-" error
        return _error_reply(parser, buf[pos + 1 : end]), end + 2
    if kind == 95:  # "_" null
        return None, end + 2
    if kind == 35:  # "#" boolean
        return buf[pos + 1 : end] == b"t", end + 2
    if kind == 44:  # "," double
        return float(buf[pos + 1 : end]), end + 2
    raise redis.exceptions.InvalidResponse(f"Protocol Error: {buf[pos:end]!r}")


def _error_reply(parser: Any, text: bytes) -> Any:
    # As redis-py's parsers map an error reply: its exception, raised at once if it means a broken connection.
    error = parser.parse_error(text.decode("utf-8", errors="replace"))
    if isinstance(error, redis.exceptions.ConnectionError):
        raise error
    return error


def _drained(parser: Any) -> bool:
    """The parser's socket buffer holds no byte read from the socket and not consumed (redis-py purges it after
    every complete reply; a readability check may leave bytes in it)."""
    buffer = parser._buffer
    return buffer is not None and not buffer._buffer.getvalue()


def _push(parser: Any, value: Any) -> None:
    """Hand a push frame read by :func:`_exchange` to ``parser`` as redis-py would."""
    if _PUSH_VIA_HANDLER:
        parser.push_handler_func(value)
    else:
        parser.handle_push_response(value, *_PUSH_EXTRA)


async def _apush(parser: Any, value: Any) -> None:
    """Hand a push frame read by the lean async exchange to ``parser`` as redis-py would."""
    if _PUSH_VIA_HANDLER:
        parser.push_handler_func(value)
    else:
        await parser.handle_push_response(value, *_PUSH_EXTRA)


_NO_CONNECTION = object()  # _take: nothing taken from the queue yet

# redis-py's sync python parsers: a connection using one (its buffer empty) may be read by _exchange.
_SYNC_PY_PARSERS = (_RESP2Parser, _RESP3Parser)


def _exchange(conn: Any, packed: bytes) -> Any:
    """Write ``packed`` (one command) on ``conn``'s socket and return its reply, as ``send_packed_command`` +
    ``read_response`` do for a connection without health checks whose parser holds no unread bytes: the same
    reply (an error reply raised), the same errors on a timeout, a reset or a closed connection. The caller
    drops the connection on any exception (no reply is left unread in it).

    redis-py reads a reply line by line through its socket buffer (a ``BytesIO``: ``seek``/``tell``/
    ``readline`` per line, four lines for a decision's reply, then a purge) and formats the host for an error
    message on every read; here one ``recv`` takes whatever has arrived and :func:`_parse_reply` reads it in one
    pass. A push frame goes to the parser's handler first, as redis-py does.
    """
    sock = conn._sock
    try:
        sock.sendall(packed)
    except TimeoutError as exc:  # socket.timeout
        if exc.errno is not None:  # ETIMEDOUT from the OS: the connection is dead, not slow (redis-py's rule)
            raise redis.exceptions.ConnectionError(
                f"Error {exc.errno} while writing to socket. {exc.strerror}."
            ) from exc
        raise redis.exceptions.TimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        errno, message = ("UNKNOWN", exc.args[0]) if len(exc.args) == 1 else exc.args[:2]
        raise redis.exceptions.ConnectionError(f"Error {errno} while writing to socket. {message}.") from exc
    parser = conn._parser
    try:
        data = sock.recv(_READ_SIZE)
        pos = 0
        while True:
            if not data:
                raise redis.exceptions.ConnectionError(_SERVER_CLOSED)
            try:
                reply, pos = _parse_reply(data, pos, parser)
            except _Incomplete:
                more = sock.recv(_READ_SIZE)
                if not more:
                    raise redis.exceptions.ConnectionError(_SERVER_CLOSED) from None
                data, pos = data[pos:] + more, 0
                continue
            if type(reply) is _Push:
                _push(parser, reply.value)
                continue
            break
    except TimeoutError:  # socket.timeout
        raise redis.exceptions.TimeoutError(f"Timeout reading from {conn._host_error()}") from None
    except OSError as exc:
        raise redis.exceptions.ConnectionError(f"Error while reading from {conn._host_error()} : {exc.args}") from exc
    if pos != len(data):
        raise redis.exceptions.InvalidResponse("Protocol Error: data after the reply")
    if isinstance(reply, redis.exceptions.ResponseError):
        try:
            raise reply
        finally:
            del reply
    return reply


async def _aread_replies(reader: asyncio.StreamReader, count: int, parser: Any) -> list[Any]:
    """``count`` replies from ``reader``, read as they arrive and parsed in one pass each time.

    redis-py's async parser reads a reply line by line (a ``readline`` coroutine per element, an encoder call
    per value); here whatever has arrived is taken at once. A push frame goes to the parser's handler, as
    redis-py does. The connection carries only these replies (it was clean when taken): anything after them
    is a protocol error, and the caller drops the connection.
    """
    data = await reader.read(_READ_SIZE)
    replies: list[Any] = []
    pos = 0
    while True:
        if not data:
            raise redis.exceptions.ConnectionError(_SERVER_CLOSED)
        try:
            while len(replies) < count:
                reply, pos = _parse_reply(data, pos, parser)
                if type(reply) is _Push:
                    await _apush(parser, reply.value)
                    continue
                replies.append(reply)
            break
        except _Incomplete:
            more = await reader.read(_READ_SIZE)
            if not more:
                raise redis.exceptions.ConnectionError(_SERVER_CLOSED) from None
            data, pos = data[pos:] + more, 0
    if pos != len(data):
        raise redis.exceptions.InvalidResponse("Protocol Error: data after the replies")
    return replies


def _aforce_disconnect_compat(conn: Any) -> None:
    """redis-py < 8.2 (8.1 is the newest Python 3.10 gets) has no ``_force_disconnect``: the same steps as its
    ``disconnect()`` takes outside a task (session state, parser, reconnect flag, a close not awaited). Before
    7.0 there is no session state nor reconnect flag."""
    reset_session = getattr(conn, "_reset_himport_state", None)
    if reset_session is not None:
        reset_session()
    conn._parser.on_disconnect()
    reset_reconnect = getattr(conn, "reset_should_reconnect", None)
    if reset_reconnect is not None:
        reset_reconnect()
    conn._close()


def _command_name_required(method: Any) -> bool:
    """Whether a redis-py pool's ``get_connection`` requires its ``command_name`` (redis-py < 5.3)."""
    parameter = inspect.signature(method).parameters.get("command_name")
    return parameter is not None and parameter.default is inspect.Parameter.empty


# ``pool.get_connection(*_GET_ARGS)``: redis-py < 5.3 requires a command name, which a plain pool ignores;
# 5.3+ deprecates passing one (a warning per call). Chosen once here, for the sync and the asyncio pools.
_GET_ARGS: tuple[str, ...] = ("EVALSHA",) if _command_name_required(redis.ConnectionPool.get_connection) else ()
_AGET_ARGS: tuple[str, ...] = (
    ("EVALSHA",) if _command_name_required(redis.asyncio.ConnectionPool.get_connection) else ()
)


def _node_release_compat(node: Any, conn: Any) -> None:
    """redis-py < 6 has no async ``ClusterNode.release``: what its ``execute_command`` does instead."""
    node._free.append(conn)


#: ``_node_release(node, conn)``: give an async cluster node's connection back (redis-py's own where it has one).
_node_release: Any = getattr(redis.asyncio.cluster.ClusterNode, "release", _node_release_compat)


_AIO_CONNECTION = redis.asyncio.connection.AbstractConnection
#: ``_aforce_disconnect(conn)``: close a ``redis.asyncio`` connection at once, without awaiting (a cancelled
#: task must not await again). Chosen once here: redis-py's own where it has one, else the compat steps, else
#: None (the lean path is then off).
_aforce_disconnect: Any = (
    operator.methodcaller("_force_disconnect")
    if hasattr(_AIO_CONNECTION, "_force_disconnect")
    else _aforce_disconnect_compat
    if hasattr(_AIO_CONNECTION, "_close")
    else None
)
#: redis-py >= 7 asks a connection whether it must reconnect (maintenance notifications) before reuse.
_AIO_SHOULD_RECONNECT = hasattr(_AIO_CONNECTION, "should_reconnect")


class _ReopeningBlockingPool(redis.asyncio.BlockingConnectionPool):
    """redis-py < 8.2's async ``ensure_connection`` passes on a connection the server closed (``CLIENT KILL``,
    its idle timeout) when maintenance notifications are on: its ``can_read()`` reports the EOF as data, which
    that check then tolerates, and the next command failed into the fault policy. Reopened here, as 8.2 does.
    On redis-py < 8 it also gives the lean async path the two names it reads that such a pool lacks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not hasattr(self, "_in_maintenance"):  # redis-py < 8: no maintenance mode, never in it
            self._in_maintenance = False
        if not hasattr(self, "_lock"):  # redis-py < 5.3: nothing of redis-py's own takes it
            self._lock = asyncio.Lock()

    async def ensure_connection(self, connection: Any) -> None:
        reader = getattr(connection, "_reader", None)
        if reader is not None and not reader._buffer and (reader.at_eof() or reader.exception() is not None):
            await connection.disconnect()
        await super().ensure_connection(connection)


#: The async pool class of a plain URL: chosen here, so 8.2 gets redis-py's own and pays nothing.
_AIO_POOL = (
    _ReopeningBlockingPool
    if tuple(int(part) for part in re.findall(r"\d+", redis.__version__)[:2]) < (8, 2)
    else redis.asyncio.BlockingConnectionPool
)
#: The private names of ``redis.asyncio.BlockingConnectionPool`` that the lean async path works on.
_AIO_POOL_NAMES = ("_available_connections", "_in_use_connections", "_condition", "_lock", "_in_maintenance")


def _aio_lean_missing(pool: Any) -> tuple[str, ...]:
    """The private redis-py names the lean async path needs that ``pool`` (or this redis-py) lacks."""
    missing = [name for name in _AIO_POOL_NAMES if not hasattr(pool, name)]
    if hasattr(pool, "_condition") and not hasattr(pool._condition, "_waiters"):
        missing.append("_condition._waiters")
    if _aforce_disconnect is None:
        missing.append("Connection._force_disconnect (or _close)")
    return tuple(missing)


def _aio_pool_is_lean(pool: Any, utf8: bool) -> bool:
    """Whether :meth:`RedisConnection._atake` / ``_agive`` / ``_aexchange`` may work on ``pool`` directly: a
    plain ``redis.asyncio.BlockingConnectionPool`` without decoding or health checks, and the private names
    they use present (else redis-py's own path)."""
    if type(pool) is not _AIO_POOL or not utf8:
        return False
    if _aio_lean_missing(pool) or not issubclass(pool.connection_class, _AIO_CONNECTION):
        return False
    kwargs = pool.connection_kwargs
    return not kwargs.get("decode_responses") and not kwargs.get("health_check_interval")


def _close_abandoned(client: Any) -> None:
    """Close the sockets of an asyncio ``client`` whose event loop has closed, synchronously: its transports
    cannot close through that loop any more (``call_soon`` on a closed loop raises), and redis-py's
    ``Connection.__del__`` would try (< 5.3: an "Event loop is closed" error per connection)."""
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        conns = [conn for node in client.nodes_manager.nodes_cache.values() for conn in node._connections]
    else:
        pool = client.connection_pool
        conns = [*pool._available_connections, *pool._in_use_connections]
    for conn in conns:
        writer = getattr(conn, "_writer", None)
        if writer is None:
            continue
        transport_socket = writer.transport.get_extra_info("socket")
        raw = getattr(transport_socket, "_sock", None)  # asyncio's TransportSocket wraps the socket
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.close()
        conn._writer = conn._reader = None


class RedisConnection:
    """The clients of one Redis URL in this process, plus its fault state.

    ``sync`` is a redis-py client on a bounded :class:`~redis.BlockingConnectionPool` (re-created after a
    fork); :meth:`aio` gives one ``redis.asyncio`` client per running event loop, since asyncio connections
    belong to the loop that made them, on a bounded pool of its own. Clients never retry: a fault goes
    straight to the fault policy.

    A burst of first calls must not be what fails: at most ``max_connections`` connections are opened (other
    callers wait up to ``timeout`` for one), opening one may take ``socket_connect_timeout`` while each
    command keeps the short ``socket_timeout``, and only a fault of the server starts the cool-down (see
    :meth:`fault`). Each of the four can be set in the URL's query string.
    """

    def __init__(
        self, url: str, socket_timeout: float = SOCKET_TIMEOUT_S, options: Mapping[str, Any] | None = None
    ) -> None:
        self.url = url
        self.pid = os.getpid()
        #: The options given (a backend's OPTIONS), part of this connection's identity (see :func:`connection`).
        self.extra: Mapping[str, Any] = dict(options or {})
        pool_options = dict(self.extra)
        #: True for a Redis Cluster (``OPTIONS["cluster"]``): scripts go to the primary of their keys' slot.
        self.cluster = bool(pool_options.pop("cluster", False))
        #: Sentinel settings (``OPTIONS["sentinel"]``, see :func:`sentinel_settings`), None without Sentinel.
        self.sentinel: dict[str, Any] | None = sentinel_settings(url, pool_options.pop("sentinel", None))
        self._options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": CONNECT_TIMEOUT_S,
            "max_connections": MAX_CONNECTIONS,
            "timeout": POOL_TIMEOUT_S,
            **pool_options,
        }
        # Topology to learn again before the next cluster call (a node failed, or a slot moved).
        self._stale_topology = False
        #: The sync client. A Redis Cluster client learns the slots when it is made, so one that cannot be made
        #: (no node answers) is left unset here: :meth:`__getattr__` makes it at its first use, and a failure
        #: there is a fault of that call (the fault policy decides, never a 500 per request). Not a
        #: functools.cached_property: on Python 3.10/3.11 its lock is one per class, so the first calls of every
        #: connection would wait in turn behind one blackholed cluster's connect timeout.
        self.sync: Any
        with contextlib.suppress(redis.exceptions.RedisClusterException):
            self.sync = self.new_client()
        self._aio: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        # Per loop: (its client's pool, whether _atake/_agive/_aexchange may bypass redis-py's per-call work).
        self._aio_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, bool]] = (
            weakref.WeakKeyDictionary()
        )
        # Async cluster clients open connections per node without waiting: this bounds them (per loop).
        self._aio_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        #: time.monotonic() until which Redis is not called (0.0: healthy).
        self.down_until = 0.0
        #: Replies received so far: a timeout while this moved was this process's delay, not the server's.
        self.replies = 0
        #: time.time() when the current outage began (its first server fault), None while healthy.
        self.outage_since: float | None = None
        #: Server faults seen by this process (each starts or extends a cool-down).
        self.server_faults = 0
        #: ``"<what>: <ExceptionType>: <message>"`` of the latest fault (server's or this process's), or None.
        self.last_error: str | None = None
        # Deadlines: server microseconds = local monotonic microseconds + offset, learned from the server time
        # in exact slow-path replies (error: half that round trip). _shift_us is offset - error + the time a
        # caller waits for a reply (socket timeout) - DEADLINE_MARGIN_US: the earliest server time at which
        # the caller may have given up. None until learned. On a cluster the offset is learned from any node
        # and used for all, so the margin also covers CLUSTER_CLOCK_SKEW_US between node clocks.
        self._shift_us: int | None = None
        self._offset_err_us = 0
        self._resync_ns = 0
        # True when the next call with a deadline first learns the server time with a TIME of its own (none
        # known yet, one due again, or forgotten): a decision script never goes without a deadline, so a stalled
        # server holds that TIME, not a script that would spend a permit when it resumes.
        self._needs_time = True
        kwargs = self._connection_kwargs()
        timeout = kwargs.get("socket_timeout") or socket_timeout
        # _take/_give: None (use redis-py's get_connection/release) unless the sync pool is a plain
        # BlockingConnectionPool; else whether a connection with unread data is refused (as redis-py does
        # without a client-side cache or maintenance notifications).
        self._lean: bool | None = None
        pool = None if self.cluster else getattr(self.sync, "connection_pool", None)
        if type(pool) is redis.BlockingConnectionPool and isinstance(getattr(pool, "pool", None), queue.Queue):
            enabled = getattr(pool, "maint_notifications_enabled", None)
            self._lean = getattr(pool, "cache", None) is None and not (enabled is not None and enabled())
        #: _take/_give may work on the pool's LifoQueue under its mutex (the stdlib's queue, its private names present).
        queue_ = getattr(pool, "pool", None)
        self._lifo = (
            self._lean is not None
            and type(queue_) is queue.LifoQueue
            and all(hasattr(getattr(queue_, name, None), "_waiters") for name in ("not_empty", "not_full"))
        )
        #: run_script may exchange on the socket itself (_exchange): lean pool, plain TCP or Unix connections,
        #: replies not decoded, no health checks (redis-py would PING before a command when one is due).
        self._lean_io = (
            self._lean is not None
            and getattr(pool, "connection_class", None) in (redis.Connection, redis.UnixDomainSocketConnection)
            and not kwargs.get("decode_responses")
            and not kwargs.get("health_check_interval")
        )
        # redis-py encodes a str argument as strict UTF-8 unless told otherwise (see _pack_evalsha).
        self._utf8 = kwargs.get("encoding", "utf-8").lower() in ("utf-8", "utf8") and (
            kwargs.get("encoding_errors", "strict") == "strict"
        )
        self._margin_us = DEADLINE_MARGIN_US + (CLUSTER_CLOCK_SKEW_US if self.cluster else 0)
        self._wait_us = int(float(timeout) * 1_000_000)
        self._logged_at = -FAULT_LOG_INTERVAL_S
        self._lock = threading.Lock()

    def new_client(self, **overrides: Any) -> Any:
        """A new sync client of this URL and mode (plain, cluster or Sentinel primary), never retrying.

        Without ``overrides`` it is the bounded pool of :attr:`sync`; the bulkhead's renewal thread asks for a
        client of its own with a longer ``socket_timeout`` and ``max_connections=2``.
        """
        options = {**self._options, **overrides}
        if self.cluster:
            return redis.cluster.RedisCluster.from_url(
                self.url,
                connection_pool_class=redis.BlockingConnectionPool,
                retry=redis.retry.Retry(NoBackoff(), 0),
                **options,
            )
        if self.sentinel is not None:
            return _sentinel_primary(self.sentinel, options, asyncio_=False)
        return redis.Redis(
            connection_pool=redis.BlockingConnectionPool.from_url(
                self.url, retry=redis.retry.Retry(NoBackoff(), 0), **options
            )
        )

    def _connection_kwargs(self) -> Mapping[str, Any]:
        if self.cluster:
            if "sync" not in self.__dict__:  # not made yet: the options as the client will take them
                return {**self._options, **redis.connection.parse_url(self.url)}  # type: ignore[no-untyped-call]
            return self.sync.nodes_manager.connection_kwargs  # type: ignore[no-any-return]
        return self.sync.connection_pool.connection_kwargs  # type: ignore[no-any-return]

    def keyslot(self, key: Any) -> int:
        """The cluster slot of ``key`` (redis-py's rule for a key as this package writes it; no client needed)."""
        return int(key_slot(key.encode() if isinstance(key, str) else key))

    def __getattr__(self, name: str) -> Any:
        # Only reached while ``sync`` is unset (a cluster no node of which answered yet): make it now.
        if name != "sync":
            raise AttributeError(name)
        try:
            client = self.new_client()
        except redis.exceptions.RedisClusterException as exc:
            raise redis.exceptions.ConnectionError(f"{type(exc).__name__}: {exc}") from exc
        self.sync = client
        return client

    def aio(self) -> Any:
        """The asyncio client of the running loop (created on first use in that loop)."""
        loop = asyncio.get_running_loop()
        client = self._aio.get(loop)
        if client is None:
            self._let_go_of_closed_loops()
            if self.cluster:
                options = {k: v for k, v in self._options.items() if k != "timeout"}
                client = redis.asyncio.cluster.RedisCluster.from_url(
                    self.url, retry=redis.asyncio.retry.Retry(NoBackoff(), 0), **options
                )
                self._aio_slots[loop] = asyncio.Semaphore(int(self._options["max_connections"]))
            elif self.sentinel is not None:
                client = _sentinel_primary(self.sentinel, self._options, asyncio_=True)
            else:
                client = redis.asyncio.Redis(
                    connection_pool=_AIO_POOL.from_url(
                        self.url, retry=redis.asyncio.retry.Retry(NoBackoff(), 0), **self._options
                    )
                )
            with self._lock:  # _let_go_of_closed_loops iterates these keys
                self._aio[loop] = client
        return client

    def _let_go_of_closed_loops(self) -> None:
        """Drop the clients of event loops that have closed, their sockets closed here.

        Under WSGI an async view runs in a loop of its own per request (``async_to_sync``), closed when the
        request ends, without :meth:`aclose`. Each such client's transports hold its loop, so the weak keys never
        let go: every request kept a loop, a pool and an open socket to Redis. Run when a new loop first asks
        for a client (once per loop: never on a loop's later calls)."""
        with self._lock:
            closed = [loop for loop in list(self._aio) if loop.is_closed()]
            for loop in closed:
                self._aio_pools.pop(loop, None)
                self._aio_slots.pop(loop, None)
                _close_abandoned(self._aio.pop(loop))

    async def aclose(self) -> None:
        """Close the running loop's asyncio client and its connections (before the loop ends: a cluster client
        warns otherwise, and redis-py < 5.3 fails in each open connection's ``__del__``)."""
        loop = asyncio.get_running_loop()
        self._aio_pools.pop(loop, None)
        client = self._aio.pop(loop, None)
        if client is None:
            return
        if self.cluster:
            await client.aclose()
        else:  # a client made on a pool of ours leaves it open unless told
            await client.aclose(close_connection_pool=True)

    def _apool(self) -> tuple[Any, bool]:
        """The running loop's connection pool (plain or Sentinel), and whether it takes the lean path."""
        entry = self._aio_pools.get(asyncio.get_running_loop())
        if entry is None:
            pool = self.aio().connection_pool
            entry = self._aio_pools[asyncio.get_running_loop()] = (pool, _aio_pool_is_lean(pool, self._utf8))
        return entry

    async def _atake(self, pool: Any, lean: bool) -> tuple[Any, bool]:
        """A connection of ``pool`` checked as ``get_connection`` checks it; and whether it was taken the lean
        way and reads its replies with :func:`_aread_replies` (see :meth:`_aexchange`).

        redis-py's ``get_connection`` + ``release`` take two locks (the pool's condition and lock), an
        ``async_timeout``, observability recorders and an event dispatch per call. When nobody else is in or
        waiting at the pool (so nothing is held across an await, and nobody needs waking), a free connection
        is popped, or a new one made under ``max_connections``, exactly as ``get_available_connection``
        does, without suspending; otherwise (and on a full pool: that wait has the pool's ``timeout``) the
        standard way. A connection with data waiting, or whose stream saw the server close it, gets redis-py's
        own check (``ensure_connection``: reopened, or refused when it holds data).
        """
        if lean and not (
            pool._in_maintenance
            or pool._condition._waiters
            or pool._condition.locked()
            or pool._lock.locked()
        ):
            available = pool._available_connections
            popped = bool(available)
            if popped:
                conn = available.pop()
            elif len(pool._in_use_connections) < pool.max_connections:
                conn = pool.make_connection()
            else:
                conn = None
            if conn is not None and type(conn._parser) not in _PY_PARSERS:
                # Another parser (hiredis): its replies are its own to read, so this pool goes redis-py's way
                # from now on; the connection goes back untouched (a new one, never opened, is dropped).
                if popped:
                    available.append(conn)
                self._aio_pools[asyncio.get_running_loop()] = (pool, False)
                conn = None
            if conn is not None:
                pool._in_use_connections.add(conn)
                try:
                    parser = conn._parser
                    reader = conn._reader
                    # Through areply: redis-py's connect() loses a cancellation more often than any other call
                    # (asyncio.wait_for on 3.11); one lost here stops the call before its command is sent.
                    if reader is None or conn._writer is None:
                        await self.areply(conn.connect())
                    elif parser._buffer or reader._buffer or reader.at_eof() or reader.exception() is not None:
                        # Reopened when the server closed it (on redis-py < 8.2 by _ReopeningBlockingPool).
                        await self.areply(pool.ensure_connection(conn))
                except BaseException:
                    await self._agive(pool, conn, True)
                    raise
                return conn, True
        return await pool.get_connection(*_AGET_ARGS), False

    async def _agive(self, pool: Any, conn: Any, lean: bool) -> None:
        """``pool.release(conn)``, without suspending when :meth:`_atake` took it and nobody waits (a waiter
        is woken by redis-py's release; a connection due to reconnect or re-authenticate goes that way too)."""
        if (
            lean
            and not (_AIO_SHOULD_RECONNECT and conn.should_reconnect())
            and getattr(conn, "_re_auth_token", None) is None
            and not (
                pool._in_maintenance
                or pool._condition._waiters
                or pool._condition.locked()
                or pool._lock.locked()
            )
        ):
            pool._in_use_connections.discard(conn)
            pool._available_connections.append(conn)
            return
        await pool.release(conn)

    @staticmethod
    async def _aexchange(conn: Any, packed: bytes, count: int) -> list[Any]:
        """Write ``packed`` (``count`` commands) on ``conn`` and read their ``count`` replies within its
        ``socket_timeout``, with the errors redis-py raises (``TimeoutError``, ``ConnectionError``). Any
        failure, a cancellation included, closes the connection before it goes back to the pool (synchronously:
        a cancelled task must not await again), so no reply is ever left unread in it.

        redis-py's ``send_packed_command`` wraps each write in ``asyncio.wait_for`` (a task per command) and
        ``read_response`` reads line by line; a command of a few hundred bytes leaves in the ``write`` itself,
        and the one timeout covers the drain (when the transport buffered it) and the replies.
        """
        try:
            writer = conn._writer
            if writer is None or writer.transport.is_closing():
                raise redis.exceptions.ConnectionError("Connection closed by the server before write")
            writer.write(packed)
            timeout = conn.socket_timeout
            if timeout:
                async with _async_timeout(timeout):
                    if writer.transport.get_write_buffer_size():
                        await writer.drain()
                    return await _aread_replies(conn._reader, count, conn._parser)
            if writer.transport.get_write_buffer_size():
                await writer.drain()
            return await _aread_replies(conn._reader, count, conn._parser)
        except asyncio.TimeoutError:
            _aforce_disconnect(conn)
            raise redis.exceptions.TimeoutError(f"Timeout reading from {conn._host_error()}") from None
        except OSError as exc:
            _aforce_disconnect(conn)
            message = f"Error while reading from {conn._host_error()} : {exc.args}"
            raise redis.exceptions.ConnectionError(message) from exc
        except BaseException:
            _aforce_disconnect(conn)
            raise

    @staticmethod
    async def areply(call: Awaitable[_T]) -> _T:
        """Await ``call`` (a Redis call that may change state), honest about a cancellation during it.

        Every async caller of Redis that changes state goes through here (:meth:`arun_script`,
        :meth:`arun_scripts`, the bulkhead's calls). redis-py 8.2's asyncio client now and then returns the
        reply of a command although the task was cancelled during it: the caller would carry on as if not
        cancelled (a bulkhead waiter kept its slot). When ``Task.cancelling()`` rose during the call: a reply
        raises :class:`LostCancellation` carrying it (the caller gives back what it would hold, then lets it
        propagate); a fault raises ``CancelledError`` (the cancellation became a timeout below us: the caller
        was cancelled, the server did not fail, so no fault policy decides it and no cool-down starts).
        Python 3.10 has no ``Task.cancelling()``: there :func:`_awatched` sees the cancellation instead.
        """
        if not _CANCELLING:
            return await _awatched(call)
        task = asyncio.current_task()
        if task is None:
            return await call
        cancelling = task.cancelling  # type: ignore[attr-defined]  # 3.11+ (checked: _CANCELLING)
        before = cancelling()
        try:
            reply = await call
        except _FAULTS as exc:
            if cancelling() > before:
                raise asyncio.CancelledError("cancelled during a Redis call (reported as a fault)") from exc
            raise
        if cancelling() > before:
            raise LostCancellation(reply)
        return reply

    def is_down(self) -> bool:
        """True while in the cool-down after a fault (decisions then skip Redis).

        When it is over, the first caller gets False and probes the server; the cool-down is renewed for the
        others meanwhile (they keep the fault policy), so one probe waits a socket timeout however many
        requests are in flight. Its reply ends the outage (:meth:`answered`), its fault the next cool-down.
        """
        until = self.down_until
        if not until:
            return False
        now = time.monotonic()
        if now < until:
            return True
        with self._lock:
            if self.down_until == until:  # this caller is the probe
                self.down_until = now + FAULT_COOLDOWN_S
                return False
        return bool(self.down_until)  # another caller probes (or the server answered: 0.0)

    def fault(self, exc: BaseException, what: str, replies_before: int | None = None) -> None:
        """Record a failed call; start the cool-down only if the server is at fault.

        Not the server's fault, so no cool-down (this call alone gets the fault policy): every pooled
        connection was busy for the pool's whole ``timeout`` (this process is overloaded), or a timeout while
        other calls got their replies (``replies_before`` is :attr:`replies` when this call began: the server
        answered, this process was too busy to hear it in time). Refused or reset connections, errors from
        the server, and timeouts with no reply in between start the cool-down.

        An outage is logged once when it begins and once when Redis answers again (:meth:`answered`), never
        per request; faults of this process are logged at most once per :data:`FAULT_LOG_INTERVAL_S`.
        """
        self.last_error = f"{what}: {type(exc).__name__}: {exc}"
        if _pool_exhausted(exc):
            self._log(exc, what, "every pooled connection stayed busy; the fault policy decided this call")
            return
        if isinstance(exc, _Late):
            self._log(exc, what, "the call reached Redis after its deadline; the fault policy decided it")
            return
        if isinstance(exc, _TIMEOUTS) and replies_before is not None and self.replies != replies_before:
            self._log(exc, what, "other calls got replies meanwhile; the fault policy decided this call")
            return
        self.down_until = time.monotonic() + FAULT_COOLDOWN_S
        with self._lock:
            self.server_faults += 1
            first = self.outage_since is None
            if first:
                self.outage_since = time.time()
        if first:
            logger.warning(
                "Redis at %s failed during %s (%s: %s); rate limits use their fault policy until it answers "
                "again (retried every %.1fs)",
                redact_url(self.url),
                what,
                type(exc).__name__,
                exc,
                FAULT_COOLDOWN_S,
            )

    def answered(self) -> None:
        """A reply arrived: end the cool-down, and log the end of an outage once."""
        self.down_until = 0.0
        since = self.outage_since
        if since is None:
            return
        with self._lock:
            if self.outage_since is None:
                return
            self.outage_since = None
        logger.warning("Redis at %s answers again after %.1fs of outage", redact_url(self.url), time.time() - since)

    def deadline(self, started_ns: int) -> Any:
        """The server time (µs) after which a call started at ``started_ns`` may have been given up (never
        later than its socket timeout, whatever the offset's error); ``b""`` when the server time is not known
        (the call then takes the slow path, whose reply carries it: only when the offset was forgotten by a
        concurrent call after this one learned it, see :meth:`learn_server_time`).

        Once the offset is due to be learned again (every :data:`TIME_RESYNC_S`, outside an outage) this call
        keeps the last offset's deadline and the next call learns the time first.
        """
        shift = self._shift_us
        if shift is None:
            return b""
        if started_ns > self._resync_ns and self.outage_since is None:
            self._needs_time = True
        return started_ns // 1000 + shift

    def learn_server_time(self) -> None:
        """Learn the server-time offset from one ``TIME`` round trip on the sync client (on a cluster, to
        redis-py's default node: the deadline margin covers the skew between nodes, ``CLUSTER_CLOCK_SKEW_US``).

        Called before a call that needs a deadline when none can be computed yet (a process's first call, an
        offset forgotten after a wrong ``LATE``) or when one is due again. A fault here (a stalled server
        holds the ``TIME``) is the decision's fault: the fault policy answers and no script was sent, so none
        can run late.
        """
        sent = time.monotonic_ns()
        seconds, micros = self.sync.time()
        self._learned(int(seconds) * 1_000_000 + int(micros), sent)

    async def alearn_server_time(self) -> None:
        """Async twin of :meth:`learn_server_time`, on this loop's ``redis.asyncio`` client."""
        sent = time.monotonic_ns()
        seconds, micros = await self.aio().time()
        self._learned(int(seconds) * 1_000_000 + int(micros), sent)

    def _learned(self, server_us: int, sent_ns: int) -> None:
        self._needs_time = False
        self.learn_time(server_us, sent_ns, time.monotonic_ns())
        self.replies += 1

    def learn_time(self, server_us: int, sent_ns: int, received_ns: int) -> None:
        """Learn the server-time offset from a reply carrying the server's time (taken between send and receive).

        A reply that took less time than the one the offset came from is more precise and replaces it; once
        :data:`TIME_RESYNC_S` has passed any reply does (the two clocks drift apart slowly).
        """
        error_us = (received_ns - sent_ns) // 2000 + 1
        if self._shift_us is not None and error_us > self._offset_err_us and received_ns <= self._resync_ns:
            return
        offset_us = server_us - (sent_ns + received_ns) // 2000
        self._offset_err_us = error_us
        self._shift_us = offset_us - error_us + self._wait_us - self._margin_us
        self._resync_ns = received_ns + int(TIME_RESYNC_S * 1e9)

    def was_late(self, started_ns: int) -> bool:
        """A LATE reply to a call started at ``started_ns``: True if it really was (this process held it past
        its socket timeout, e.g. waiting for a pooled connection); else the learned offset is wrong and is
        forgotten, so the next call learns it again."""
        if time.monotonic_ns() - started_ns > self._wait_us * 1000:
            return True
        self._shift_us = None
        self._needs_time = True
        return False

    def recovered(self) -> None:
        """End the cool-down now: a call just got its reply (``reset`` and the management calls use this)."""
        self.answered()

    def health(self) -> dict[str, Any]:
        """This process's view of the server, for ``r4 status``, the state endpoint and the health check."""
        since = self.outage_since
        return {
            "url": redact_url(self.url),
            "degraded": since is not None,
            "degraded_seconds": None if since is None else round(max(0.0, time.time() - since), 3),
            "server_faults": self.server_faults,
            "last_error": self.last_error,
        }

    def _log(self, exc: BaseException, what: str, outcome: str) -> None:
        # One line per FAULT_LOG_INTERVAL_S: this process's own overload must not flood the log either.
        now = time.monotonic()
        with self._lock:
            if now - self._logged_at < FAULT_LOG_INTERVAL_S:
                return
            self._logged_at = now
        logger.warning(
            "Redis at %s: %s during %s (%s: %s); %s",
            redact_url(self.url),
            "no reply in time"
            if isinstance(exc, _TIMEOUTS)
            else ("a reply after the deadline" if isinstance(exc, _Late) else "no free connection"),
            what,
            type(exc).__name__,
            exc,
            outcome,
        )

    def call(
        self, numkeys: int, args: list[Any], deadline_at: int | None = None, tokens: Sequence[int] = ()
    ) -> Any:
        """One EVALSHA of :data:`SCRIPT` (EVAL once if this server does not know it yet) on a pooled connection.

        With ``deadline_at``, ``args[deadline_at]`` becomes :meth:`deadline` taken once the connection is held
        (waiting for the pool does not eat the budget), and when that is unknown the ``tokens`` indexes are
        blanked (the slow path answers with the server time). A reply carrying the server time teaches it;
        a LATE reply raises :class:`_Late`.
        """
        reply, started, _ = self.run_script(SCRIPT_SHA, SCRIPT, numkeys, args, deadline_at, tokens)
        return self._timed(reply, started)

    async def acall(
        self, numkeys: int, args: list[Any], deadline_at: int | None = None, tokens: Sequence[int] = ()
    ) -> Any:
        """Async twin of :meth:`call`, on this loop's ``redis.asyncio`` client."""
        reply, started, _ = await self.arun_script(SCRIPT_SHA, SCRIPT, numkeys, args, deadline_at, tokens)
        return self._timed(reply, started)

    def _stamp(self, args: list[Any], deadline_at: int | None, tokens: Sequence[int], started: int) -> bool:
        # The deadline is taken once a pooled connection is held; True when it is unknown (not learned yet).
        if deadline_at is None:
            return False
        args[deadline_at] = deadline = self.deadline(started)
        if deadline != b"":
            return False
        for at in tokens:
            args[at] = b""
        return True

    def run_script(
        self,
        sha: str,
        source: str,
        numkeys: int,
        args: list[Any],
        deadline_at: int | None = None,
        tokens: Sequence[int] = (),
    ) -> tuple[Any, int, bool]:
        """EVALSHA ``sha`` (EVAL ``source`` when the server does not know it) on a pooled connection.

        Every script of this backend goes through here (the cycle script, GCRA's): the deadline stamping of
        :meth:`call`, the reply count that tells this process's delays from the server's, and the end of an
        outage. On a cluster the call goes to the primary of ``args[0]``'s slot (every key of one script is
        in one slot); a ``MOVED``/``ASK`` redirection (nothing ran) is followed once. Returns ``(reply,
        monotonic ns when the connection was held, deadline unknown)``.
        """
        if self._needs_time and deadline_at is not None:
            self.learn_server_time()
        if self.cluster:
            return self._run_cluster(sha, source, numkeys, args, deadline_at, tokens)
        pool = self.sync.connection_pool
        conn = self._take(pool)
        try:
            started = time.monotonic_ns()
            unknown = self._stamp(args, deadline_at, tokens, started)
            try:
                packed = _pack_evalsha(sha, numkeys, args, self._utf8)
                if packed is None:
                    conn.send_command("EVALSHA", sha, numkeys, *_flat(args))
                    reply = conn.read_response()
                elif self._lean_io and type(conn._parser) in _SYNC_PY_PARSERS and _drained(conn._parser):
                    reply = _exchange(conn, packed)
                else:
                    conn.send_packed_command([packed])
                    reply = conn.read_response()
            except NoScriptError:
                conn.send_command("EVAL", source, numkeys, *_flat(args))
                reply = conn.read_response()
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._give(pool, conn)
        self.replies += 1
        if self.outage_since is not None:
            self.answered()
        return reply, started, unknown

    def _take(self, pool: Any) -> Any:
        """``pool.get_connection()`` of the sync pool, without redis-py's per-call bookkeeping when it can.

        redis-py 8's ``get_connection`` + ``release`` cost about 8 µs per command on the shared 2-core
        machine, half of it observability recorders that do nothing unless OpenTelemetry is set up for
        redis-py. On a plain :class:`~redis.BlockingConnectionPool` of this process (:attr:`_lean`) this
        takes a connection from its queue and checks it exactly as ``get_connection`` does (connected; a
        socket the server closed, e.g. after a restart, is reopened); anything else goes the standard way.
        """
        lean = self._lean
        if lean is None or self.pid != _pid or getattr(pool, "_in_maintenance", False):
            return pool.get_connection(*_GET_ARGS)
        conn: Any = _NO_CONNECTION
        if self._lifo:
            # Queue.get(True, timeout) when a connection is there, without its Python layers (the condition's
            # enter/exit, _qsize, _get, notify and _is_owned: about 10 calls): under the queue's own mutex, the
            # newest item, and a put() waiting for room told (BlockingConnectionPool never waits there).
            items = pool.pool
            with items.mutex:
                if items.queue:
                    conn = items.queue.pop()
                    if items.not_full._waiters:
                        items.not_full.notify()
        if conn is _NO_CONNECTION:
            try:
                conn = pool.pool.get(True, pool.timeout)
            except queue.Empty:
                raise redis.exceptions.ConnectionError("No connection available.") from None
        if conn is None:  # a free slot, no connection yet: the pool makes it (and counts it)
            pool.pool.put_nowait(None)
            return pool.get_connection(*_GET_ARGS)
        try:
            sock = conn._sock
            if sock is None:
                conn.connect()
            elif _poll is not None:
                # redis-py's check (can_read: a non-blocking recv between two settimeout calls) costs about
                # 2.6 µs; one poll says whether there is anything to look at (data, EOF, an error): about
                # 0.7 µs. Only then does redis-py's own check run.
                poller = _poll()
                poller.register(sock, _POLL_EVENTS)
                if poller.poll(0):
                    self._check_readable(conn, lean)
            else:
                self._check_readable(conn, lean)
        except BaseException:
            self._give(pool, conn)
            raise
        return conn

    @staticmethod
    def _check_readable(conn: Any, lean: bool) -> None:
        """redis-py's check of a pooled connection before use: a socket the server closed is reopened; one
        holding unread data is refused when ``lean`` (as ``get_connection`` does)."""
        try:
            if conn.can_read() and lean:
                raise redis.exceptions.ConnectionError("Connection has data")
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            conn.disconnect()
            conn.connect()
            if conn.can_read() and lean:
                raise redis.exceptions.ConnectionError("Connection not ready") from None

    def _give(self, pool: Any, conn: Any) -> None:
        """``pool.release(conn)`` for a connection :meth:`_take` took (the lean way when it took it so)."""
        if self._lean is None or self.pid != _pid or getattr(pool, "_in_maintenance", False):
            pool.release(conn)
            return
        should_reconnect = getattr(conn, "should_reconnect", None)
        if should_reconnect is not None and should_reconnect():
            conn.disconnect()
        items = pool.pool
        if self._lifo:
            # Queue.put_nowait(conn) without its Python layers (as _take's get): a full queue is left to it.
            with items.mutex:
                if items.maxsize <= 0 or len(items.queue) < items.maxsize:
                    items.queue.append(conn)
                    items.unfinished_tasks += 1
                    if items.not_empty._waiters:
                        items.not_empty.notify()
                    return
        items.put_nowait(conn)

    def _cluster_pool(self, key: Any, node: Any = None) -> Any:
        client = self.sync
        if self._stale_topology:
            self._stale_topology = False
            client.nodes_manager.initialize()
        if node is None:
            node = client.get_node_from_key(key)
        return node.redis_connection.connection_pool

    def _redirected(self, exc: BaseException) -> Any:
        # MOVED: the slot's owner changed for good (learn it); ASK: this one call goes elsewhere. Nothing ran.
        manager = self.sync.nodes_manager
        if isinstance(exc, redis.exceptions.MovedError):
            manager.move_slot(exc)
            return None
        node = manager.get_node(host=exc.host, port=exc.port)  # type: ignore[attr-defined]
        if node is None:
            self._stale_topology = True
            raise exc
        return node

    def _run_cluster(
        self, sha: str, source: str, numkeys: int, args: list[Any], deadline_at: int | None, tokens: Sequence[int]
    ) -> tuple[Any, int, bool]:
        node = None
        for attempt in (0, 1):
            pool = self._cluster_pool(args[0], node)
            conn = pool.get_connection(*_GET_ARGS)
            try:
                started = time.monotonic_ns()
                unknown = self._stamp(args, deadline_at, tokens, started)
                try:
                    if node is not None:
                        conn.send_command("ASKING")
                        conn.read_response()
                    conn.send_command("EVALSHA", sha, numkeys, *_flat(args))
                    reply = conn.read_response()
                except NoScriptError:
                    conn.send_command("EVAL", source, numkeys, *_flat(args))
                    reply = conn.read_response()
            except _REDIRECTS as exc:
                pool.release(conn)
                if attempt:
                    raise
                node = self._redirected(exc)
                continue
            except BaseException as exc:
                conn.disconnect()
                pool.release(conn)
                if isinstance(exc, _FAULTS):
                    self._stale_topology = True  # a node failed: its slots may have a new primary
                raise
            pool.release(conn)
            break
        self.replies += 1
        if self.outage_since is not None:
            self.answered()
        return reply, started, unknown

    def run_scripts(
        self,
        sha: str,
        source: str,
        calls: Sequence[_ScriptCall],
        scripts: Sequence[tuple[str, str]] | None = None,
    ) -> list[tuple[Any, int, bool]]:
        """Several scripts at once, for a decision split over cluster slots or algorithms: every call is sent
        before any reply is read (calls to one node share one pooled connection, pipelined; nodes are taken
        in name order, so two callers never wait on each other), so they cost one round trip, not one each.

        ``calls``: ``(numkeys, args, deadline_at, tokens)`` as :meth:`run_script`'s; ``scripts``: each call's
        ``(sha, source)`` when they differ (else ``sha``, ``source`` for all). Returns, per call, ``(reply,
        monotonic ns when sent, deadline unknown)`` where a failed call's reply is its exception (a fault of
        one node does not hide the others' replies).
        """
        scripts = scripts or [(sha, source)] * len(calls)
        if len(calls) == 1:
            numkeys, args, at, tokens = calls[0]
            try:
                return [self.run_script(*scripts[0], numkeys, args, at, tokens)]
            except _FAULTS as exc:
                return [(exc, time.monotonic_ns(), False)]
        if self._needs_time and any(call[2] is not None for call in calls):
            try:
                self.learn_server_time()
            except _FAULTS as exc:
                return [(exc, time.monotonic_ns(), False) for _ in calls]
        by_node: dict[str, list[int]] = {}
        pools: dict[str, Any] = {}
        client = self.sync
        if self.cluster:
            if self._stale_topology:
                self._stale_topology = False
                client.nodes_manager.initialize()
            for index, (_, args, _, _) in enumerate(calls):
                node = client.get_node_from_key(args[0])
                by_node.setdefault(node.name, []).append(index)
                pools[node.name] = node.redis_connection.connection_pool
        else:
            by_node[""], pools[""] = list(range(len(calls))), client.connection_pool
        results: list[list[Any]] = [[None, 0, False] for _ in calls]
        again: list[int] = []  # NOSCRIPT or a redirection: nothing ran, sent once more on its own
        held: list[tuple[str, Any, Any]] = []
        try:
            for name in sorted(by_node):
                pool = pools[name]
                held.append((name, pool, pool.get_connection(*_GET_ARGS) if self.cluster else self._take(pool)))
            for name, _, conn in held:
                try:
                    commands: list[bytes] = []
                    for index in by_node[name]:
                        numkeys, args, at, tokens = calls[index]
                        started = time.monotonic_ns()
                        results[index][1:] = [started, self._stamp(args, at, tokens, started)]
                        packed = _pack_evalsha(scripts[index][0], numkeys, args, self._utf8)
                        if packed is None:
                            commands += conn.pack_command("EVALSHA", scripts[index][0], numkeys, *_flat(args))
                        else:
                            commands.append(packed)
                    # One write for all of the node's calls: redis-py sends each item of a list with a sendall
                    # of its own, which the server may take as several reads (several round trips' work).
                    conn.send_packed_command([b"".join(commands)])
                except _FAULTS as exc:
                    conn.disconnect()
                    for index in by_node[name]:
                        results[index][0] = exc
            for name, _, conn in held:
                for index in by_node[name]:
                    if results[index][0] is not None:
                        continue
                    try:
                        results[index][0] = conn.read_response()
                    except (NoScriptError, *_REDIRECTS) as exc:
                        if isinstance(exc, redis.exceptions.MovedError) and self.cluster:
                            client.nodes_manager.move_slot(exc)
                        again.append(index)
                    except redis.exceptions.ResponseError as exc:
                        results[index][0] = exc  # an error reply: the connection is still in step
                    except _FAULTS as exc:
                        self._stale_topology = self.cluster
                        conn.disconnect()
                        for rest in by_node[name]:
                            if results[rest][0] is None and rest not in again:
                                results[rest][0] = exc
                        break
        except BaseException:
            for _, _, conn in held:
                conn.disconnect()
            raise
        finally:
            for _, pool, conn in held:
                if self.cluster:
                    pool.release(conn)
                else:
                    self._give(pool, conn)
        for index in again:
            numkeys, args, at, tokens = calls[index]
            try:
                results[index][:] = self.run_script(*scripts[index], numkeys, args, at, tokens)
            except _FAULTS as exc:
                results[index][0] = exc
        if any(not isinstance(r[0], BaseException) for r in results):
            self.replies += 1
            if self.outage_since is not None:
                self.answered()
        return [(r[0], r[1], r[2]) for r in results]

    async def arun_scripts(
        self,
        sha: str,
        source: str,
        calls: Sequence[_ScriptCall],
        scripts: Sequence[tuple[str, str]] | None = None,
    ) -> list[tuple[Any, int, bool]]:
        """Async twin of :meth:`run_scripts`: on one server the calls go out in one write on one of this loop's
        connections, then their replies are read; on a cluster they run concurrently (one connection each).
        A cancellation lost below us raises :class:`LostCancellation` with the list (see :meth:`areply`)."""
        if _CALL_LOOPS:  # an async view under WSGI: the request's thread, on the sync pool
            done = call_thread_submit(self.run_scripts, sha, source, calls, scripts)
            if done is not None:
                return await await_call_thread(done)
        return await self.areply(self._arun_scripts(sha, source, calls, scripts))

    async def _arun_scripts(
        self,
        sha: str,
        source: str,
        calls: Sequence[_ScriptCall],
        scripts: Sequence[tuple[str, str]] | None,
    ) -> list[tuple[Any, int, bool]]:
        scripts = scripts or [(sha, source)] * len(calls)
        if self._needs_time and len(calls) > 1 and any(call[2] is not None for call in calls):
            try:
                await self.alearn_server_time()
            except _FAULTS as exc:
                return [(exc, time.monotonic_ns(), False) for _ in calls]
        if not self.cluster and len(calls) > 1:
            return await self._arun_pipelined(calls, scripts)

        async def one(script: tuple[str, str], call: _ScriptCall) -> Any:
            numkeys, args, at, tokens = call
            try:
                return await self._arun_script(script[0], script[1], numkeys, args, at, tokens)
            except _FAULTS as exc:
                return (exc, time.monotonic_ns(), False)

        return list(await asyncio.gather(*(one(script, call) for script, call in zip(scripts, calls, strict=True))))

    async def _arun_pipelined(
        self, calls: Sequence[_ScriptCall], scripts: Sequence[tuple[str, str]]
    ) -> list[tuple[Any, int, bool]]:
        """:meth:`arun_scripts` on one server: every call in one write on one pooled connection, then the
        replies in order (a NOSCRIPT one, which ran nothing, is sent again on its own afterwards)."""
        pool, lean = self._apool()
        results: list[list[Any]] = [[None, 0, False] for _ in calls]
        again: list[int] = []
        conn, lean = await self._atake(pool, lean)
        try:
            commands: list[bytes] = []
            for index, (numkeys, args, at, tokens) in enumerate(calls):
                started = time.monotonic_ns()
                results[index][1:] = [started, self._stamp(args, at, tokens, started)]
                packed = _pack_evalsha(scripts[index][0], numkeys, args, self._utf8)
                if packed is None:
                    commands += conn.pack_command("EVALSHA", scripts[index][0], numkeys, *_flat(args))
                else:
                    commands.append(packed)
            if lean:
                replies = await self._aexchange(conn, b"".join(commands), len(calls))
            else:
                await conn.send_packed_command(commands)
                replies = None
            for index in range(len(calls)):
                if replies is None:
                    try:
                        reply = await conn.read_response()
                    except redis.exceptions.ResponseError as exc:
                        reply = exc  # an error reply: the connection is still in step
                else:
                    reply = replies[index]
                if isinstance(reply, NoScriptError):
                    again.append(index)
                else:
                    results[index][0] = reply
        except _FAULTS as exc:
            if lean:
                _aforce_disconnect(conn)
            else:
                await conn.disconnect()
            for result in results:
                if result[0] is None:
                    result[0] = exc
            again.clear()  # a broken connection: nothing more is sent
        except BaseException:
            if lean:
                _aforce_disconnect(conn)
            else:
                await conn.disconnect()
            raise
        finally:
            await self._agive(pool, conn, lean)
        for index in again:
            numkeys, args, at, tokens = calls[index]
            try:
                results[index][:] = await self._arun_script(*scripts[index], numkeys, args, at, tokens)
            except _FAULTS as exc:
                results[index][0] = exc
        if any(not isinstance(r[0], BaseException) for r in results):
            self.replies += 1
            if self.outage_since is not None:
                self.answered()
        return [(r[0], r[1], r[2]) for r in results]

    async def arun_script(
        self,
        sha: str,
        source: str,
        numkeys: int,
        args: list[Any],
        deadline_at: int | None = None,
        tokens: Sequence[int] = (),
    ) -> tuple[Any, int, bool]:
        """Async twin of :meth:`run_script`, on this loop's ``redis.asyncio`` client (the lean way of
        :meth:`_atake` / :meth:`_aexchange` on a plain pool). A cancellation lost below us raises
        :class:`LostCancellation` with the ``(reply, started, unknown)`` triple (see :meth:`areply`)."""
        if _CALL_LOOPS:  # an async view under WSGI: the request's thread, on the sync pool
            done = call_thread_submit(self.run_script, sha, source, numkeys, args, deadline_at, tokens)
            if done is not None:
                return await await_call_thread(done)
        # areply's check inline: every async decision pays this, and a wrapping coroutine cost 4k instructions.
        task = _current_task() if _CANCELLING else None
        if task is None:
            if _CANCELLING:
                return await self._arun_script(sha, source, numkeys, args, deadline_at, tokens)
            return await _awatched(self._arun_script(sha, source, numkeys, args, deadline_at, tokens))
        before = task.cancelling()  # type: ignore[attr-defined]  # 3.11+ (checked: _CANCELLING)
        try:
            result = await self._arun_script(sha, source, numkeys, args, deadline_at, tokens)
        except _FAULTS as exc:
            if task.cancelling() > before:  # type: ignore[attr-defined]
                raise asyncio.CancelledError("cancelled during a Redis call (reported as a fault)") from exc
            raise
        if task.cancelling() > before:  # type: ignore[attr-defined]
            raise LostCancellation(result)
        return result

    async def _arun_script(
        self,
        sha: str,
        source: str,
        numkeys: int,
        args: list[Any],
        deadline_at: int | None,
        tokens: Sequence[int],
    ) -> tuple[Any, int, bool]:
        if self._needs_time and deadline_at is not None:
            await self.alearn_server_time()
        if self.cluster:
            return await self._arun_cluster(sha, source, numkeys, args, deadline_at, tokens)
        pool, lean = self._apool()
        conn, lean = await self._atake(pool, lean)
        try:
            started = time.monotonic_ns()
            unknown = self._stamp(args, deadline_at, tokens, started)
            try:
                packed = _pack_evalsha(sha, numkeys, args, self._utf8)
                if lean:
                    if packed is None:
                        packed = b"".join(conn.pack_command("EVALSHA", sha, numkeys, *_flat(args)))
                    (reply,) = await self._aexchange(conn, packed, 1)
                    if isinstance(reply, redis.exceptions.ResponseError):
                        raise reply
                else:
                    if packed is None:
                        await conn.send_command("EVALSHA", sha, numkeys, *_flat(args))
                    else:
                        await conn.send_packed_command([packed])
                    reply = await conn.read_response()
            except NoScriptError:
                await conn.send_command("EVAL", source, numkeys, *_flat(args))
                reply = await conn.read_response()
        except BaseException:
            if lean:
                _aforce_disconnect(conn)
            else:
                await conn.disconnect()
            raise
        finally:
            await self._agive(pool, conn, lean)
        self.replies += 1
        if self.outage_since is not None:
            self.answered()
        return reply, started, unknown

    async def _arun_cluster(
        self, sha: str, source: str, numkeys: int, args: list[Any], deadline_at: int | None, tokens: Sequence[int]
    ) -> tuple[Any, int, bool]:
        client = self.aio()
        slots = self._aio_slots[asyncio.get_running_loop()]
        try:
            await asyncio.wait_for(slots.acquire(), float(self._options["timeout"]))
        except asyncio.TimeoutError:
            raise redis.exceptions.ConnectionError("No connection available.") from None
        try:
            if client._initialize:
                await client.initialize()
            elif self._stale_topology:
                self._stale_topology = False
                await client.nodes_manager.initialize()
            node = client.get_node_from_key(args[0])
            asking = False
            for attempt in (0, 1):
                conn = node.acquire_connection()
                try:
                    started = time.monotonic_ns()
                    unknown = self._stamp(args, deadline_at, tokens, started)
                    try:
                        if asking:
                            await conn.send_command("ASKING")
                            await conn.read_response()
                        await conn.send_command("EVALSHA", sha, numkeys, *_flat(args))
                        reply = await conn.read_response()
                    except NoScriptError:
                        await conn.send_command("EVAL", source, numkeys, *_flat(args))
                        reply = await conn.read_response()
                except _REDIRECTS as exc:
                    _node_release(node, conn)
                    if attempt:
                        raise
                    manager = client.nodes_manager
                    if isinstance(exc, redis.exceptions.MovedError):
                        await manager.move_slot(exc)
                        node = client.get_node_from_key(args[0])
                    else:
                        asking = True
                        found = manager.get_node(host=exc.host, port=exc.port)
                        if found is None:
                            self._stale_topology = True
                            raise
                        node = found
                    continue
                except BaseException as exc:
                    await conn.disconnect()
                    _node_release(node, conn)
                    if isinstance(exc, _FAULTS):
                        self._stale_topology = True
                    raise
                _node_release(node, conn)
                break
        finally:
            slots.release()
        self.replies += 1
        if self.outage_since is not None:
            self.answered()
        return reply, started, unknown

    def _timed(self, reply: Any, started_ns: int) -> Any:
        # A stale reply ({reply, {now_us, ...}}) carries the server time; LATE means the deadline passed.
        if type(reply) is list and len(reply) == 2 and type(reply[1]) is list:
            if reply[1][0]:
                self.learn_time(reply[1][0], started_ns, time.monotonic_ns())
        elif type(reply) is bytes:
            raise _Late(self.was_late(started_ns))
        return reply

    def close(self) -> None:
        """Close the sync pool's connections and forget the asyncio clients and the fault state."""
        if self.cluster:
            for node in self.sync.get_nodes() if "sync" in self.__dict__ else ():
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()
        else:
            self.sync.connection_pool.disconnect()
        self._aio.clear()
        self._aio_pools.clear()
        self._aio_slots.clear()
        self.down_until = 0.0
        self.outage_since = None
        self._shift_us = None


def sentinel_settings(url: str, sentinels: Any) -> dict[str, Any] | None:
    """The Sentinel settings of a backend: ``OPTIONS["sentinel"]`` is the list of Sentinels (``"host:port"``
    strings or ``(host, port)`` pairs) and the LOCATION's host is the name of the monitored primary (its
    ``service_name``); the LOCATION's credentials, db and scheme (``rediss://`` for TLS) are the primary's.

    None without Sentinels; ``ValueError`` when the list or the URL cannot be used.
    """
    if sentinels is None:
        return None
    if isinstance(sentinels, (str, bytes)) or not isinstance(sentinels, Sequence) or not sentinels:
        raise ValueError(f"OPTIONS['sentinel'] must be a non-empty list of 'host:port', got {sentinels!r}")
    nodes: list[tuple[str, int]] = []
    for entry in sentinels:
        if isinstance(entry, str):
            host, sep, port = entry.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"a Sentinel must be 'host:port', got {entry!r}")
            nodes.append((host.strip("[]"), int(port)))
        elif isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[1], int):
            nodes.append((str(entry[0]), int(entry[1])))
        else:
            raise ValueError(f"a Sentinel must be 'host:port', got {entry!r}")
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ValueError(
            f"with OPTIONS['sentinel'] the LOCATION is redis://[:password@]<service name>[/db] (or rediss://), "
            f"got {redact_url(url)!r}"
        )
    db = parts.path.strip("/") or "0"
    if not db.isdigit():
        raise ValueError(f"the LOCATION's db must be a number, got {db!r}")
    return {
        "sentinels": nodes,
        "service_name": unquote(parts.hostname),
        "db": int(db),
        "username": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else None,
        "ssl": parts.scheme == "rediss",
    }


def _sentinel_primary(settings: Mapping[str, Any], options: Mapping[str, Any], asyncio_: bool) -> Any:
    """A client of the primary that ``settings``' Sentinels name now (and after each failover), on a bounded
    blocking pool like every other client of this backend."""
    if asyncio_:
        from redis.asyncio import sentinel as module

        blocking: Any = redis.asyncio.BlockingConnectionPool
        client_class: Any = redis.asyncio.Redis
        retry: Any = redis.asyncio.retry.Retry(NoBackoff(), 0)
    else:
        from redis import sentinel as module  # type: ignore[no-redef]

        blocking = redis.BlockingConnectionPool
        client_class = redis.Redis
        retry = redis.retry.Retry(NoBackoff(), 0)
    timeouts = {
        "socket_timeout": options.get("socket_timeout"),
        "socket_connect_timeout": options.get("socket_connect_timeout"),
    }
    sentinel = module.Sentinel(settings["sentinels"], **timeouts)  # type: ignore[no-untyped-call, arg-type, unused-ignore]  # typed in redis-py 8.2

    class BlockingSentinelPool(module.SentinelConnectionPool, blocking):  # type: ignore[misc]
        if "inuse_connections" not in inspect.signature(blocking.disconnect).parameters:

            def disconnect(self, inuse_connections: bool = True) -> Any:
                # redis-py < 7's sync blocking pool takes no argument and closes every connection; its Sentinel
                # manager asks for the idle ones after a failover. All close; each reopens at its next use.
                return blocking.disconnect(self)

    kwargs: dict[str, Any] = {
        **options,
        "db": settings["db"],
        "username": settings["username"],
        "password": settings["password"],
        "retry": retry,
    }
    if settings["ssl"]:
        kwargs["ssl"] = True
    pool = BlockingSentinelPool(settings["service_name"], sentinel, **kwargs)  # type: ignore[no-untyped-call]
    return client_class(connection_pool=pool)


class _Late(RedisError):
    """The script refused to act because the call reached Redis after its deadline (nothing was changed)."""

    def __init__(self, really: bool) -> None:
        super().__init__("the decision reached Redis after its deadline")
        self.really = really


def _pool_exhausted(exc: BaseException) -> bool:
    # redis-py raises a plain ConnectionError with this text when a BlockingConnectionPool wait times out.
    return isinstance(exc, redis.exceptions.ConnectionError) and str(exc) == "No connection available."


_connections: dict[Any, RedisConnection] = {}
_connections_lock = threading.Lock()
_pid = os.getpid()


def _after_fork() -> None:
    # A child must not share its parent's sockets: connections are rebuilt on first use.
    global _pid
    _pid = os.getpid()
    _connections.clear()


os.register_at_fork(after_in_child=_after_fork)


def close_connections() -> None:
    """Close every Redis connection of this process and end every cool-down (tests call it between tests)."""
    with _connections_lock:
        conns = list(_connections.values())
    for conn in conns:
        conn.close()


def _frozen(value: Any) -> Any:
    # An option value as part of a dict key (the Sentinel list is a list).
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def connection_ident(url: str, options: Mapping[str, Any] | None = None) -> Hashable:
    """What :func:`connection` shares one :class:`RedisConnection` by: the URL as written (not normalised: another
    spelling of the same server is another connection) and every option. Two Redis limits are decided in one
    all-or-nothing script only on one connection, so ``manage.py check`` compares these, built from the setting
    alone (:func:`store_options`), to find a decision that would raise ``TypeError`` (``ratelimit_r4.E035``)."""
    return url if not options else (url, tuple(sorted((k, _frozen(v)) for k, v in options.items())))


def store_options(options: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """``(key_prefix, connection options)`` of a redis backend's validated ``OPTIONS``: ``key_prefix`` belongs to
    the :class:`RedisStore` (the keys it writes), every other option to its connection (:func:`connection_ident`)."""
    connection_options = dict(options or {})
    return connection_options.pop("key_prefix", DEFAULT_PREFIX), connection_options


def connection(url: str, options: Mapping[str, Any] | None = None) -> RedisConnection:
    """The process-wide :class:`RedisConnection` of ``url`` with ``options`` (created once per process).

    ``options`` are redis-py pool options (``socket_timeout``, ``socket_connect_timeout`` in seconds,
    ``max_connections``, ``timeout``): backends with the same URL and options share one connection (and one
    fault state, :func:`connection_ident`); the URL's query string still overrides them (redis-py's rule).
    """
    ident = connection_ident(url, options)
    conn = _connections.get(ident)
    if conn is None or conn.pid != _pid:
        with _connections_lock:
            conn = _connections.get(ident)
            if conn is None or conn.pid != _pid:
                conn = _connections[ident] = RedisConnection(url, options=options)
    return conn


# ----------------------------------------------------------------------------------------------- key layout


def _name_part(name: str) -> str:
    # Percent-encoded, so a name holds no ':', brace or glob character and cannot reach into another's keys.
    return quote(name, safe="")


#: On a Redis Cluster the client keys of a keyed limiter are spread over this many hash tags (the first two
#: hex digits of the key's digest), each with an anchor of its own; on one server a keyed limiter has one.
CLUSTER_SHARDS = 256


def key_base(prefix: str, kind: str, name: str, shard: str | None = None) -> str:
    """The start of every Redis key of one limiter (or shard): ``<prefix>:<kind>:{<name>}`` or
    ``<prefix>:<kind>:{<name>:<shard>}``.

    The braces are a Redis Cluster hash tag: every key of a script shares it, so each script touches one
    slot (a plain server ignores them). Every module of this backend builds its keys here: ``rl`` unkeyed
    limiters, ``rlk`` keyed ones (sharded on a cluster, see :data:`CLUSTER_SHARDS`), ``bh`` bulkheads, ``cb`` circuit breakers.
    """
    tag = _name_part(name) if shard is None else f"{_name_part(name)}:{shard}"
    return f"{prefix}:{kind}:{{{tag}}}"


def shard_of(digest: str) -> str:
    """The shard of a client key's :func:`client_key_digest` on a cluster (one of :data:`CLUSTER_SHARDS`)."""
    return digest[:2]


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis SCAN/KEYS pattern."""
    return "".join("\\" + c if c in "\\*?[]" else c for c in text)


#: Per keyed store: the state keys of at most this many client keys are kept (see RedisKeyedStore._state_key).
_STATE_KEYS_MAX = 1024


def client_key_digest(key: object) -> str:
    """The Redis-safe form of a client key: a 128-bit BLAKE2b hex digest (no client data stored in Redis)."""
    raw = key if isinstance(key, str) else str(key)
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _check_period(period_ns: int) -> None:
    error = redis_period_error(period_ns)
    if error is not None:
        raise ValueError(error)


class _RedisCycleOps:
    """The Redis operations of the cycle limiters (RedisBackend, RedisKeyedStore): clock mode, anchor cache, one-key
    decisions, counters and fault handling.

    The anchor cache: the anchor value last seen in Redis (the token the script compares), and a base
    instant ``anchor + K * period`` (K a cycle the server reported), computed exactly here, so the script's
    elapsed time stays below 2^53 units and one divmod replaces its long division. The script checks the
    token on every call; when another process reset the limiter (or the base is too old), it decides on the
    exact slow path and its reply refreshes the cache.
    """

    #: The algorithm's own script (GCRA, sliding window: :class:`~.redis_scripted.ScriptedLimiter`); None: the cycle script.
    _script: Any = None
    _url: str
    _conn: RedisConnection
    _now: Any
    _limit: int
    _period: int
    _fault_wait: int
    _counter_lock: threading.Lock
    anchor_key: str
    fault_policy: str
    faults: int
    successful_calls: int
    failed_calls: int
    #: The in-process limiter deciding while Redis fails, under fault policy "local" (else None).
    _local: Any = None
    #: The type ``_local`` has on an unkeyed limiter (a keyed one's is a keyed in-process limiter, asked by key).
    _local_type: Any = MemoryBackend
    #: A keyed limiter on a cluster: the anchor cache of each shard (:class:`_Phase`), by shard. None: this
    #: limiter is its own (only) phase.
    _phases: dict[str, _Phase] | None = None
    # Time unit (ns per unit), units per microsecond (script argument), period in units, K alignment.
    _unit: int
    _m: bytes
    _period_u: int
    _align: int
    _fast_ok: bool
    # (token, base instant in ns, K) of the anchor cache; _lim: the script's six limiter arguments.
    _cache: tuple[bytes, int, int]
    _lim: list[Any]
    _lim_resp: list[Any]

    def _use_period(self, period_ns: int) -> None:
        _check_period(period_ns)
        self._period = period_ns
        self._unit = 1 if period_ns <= MAX_NS_PERIOD else 1000
        self._m = b"1000" if self._unit == 1 else b"1"
        self._period_u = period_ns // self._unit
        # With server time the base is sent in whole microseconds: K is a multiple of _align, so that
        # K * period is; the fast path needs _align periods to fit well below 2^53 units.
        self._align = 1 if period_ns % 1000 == 0 else 1000 // math.gcd(period_ns, 1000)
        self._fast_ok = self._unit == 1000 or self._align * period_ns < 2**50
        self._cache = (b"", 0, 0)

    def _use_clock(self, clock: Clock) -> None:
        # The system clock is per host (monotonic), so decisions use Redis TIME; any other clock (FakeClock)
        # is the caller's time line and is sent with each call.
        self._now = None if isinstance(clock, MonotonicClock) else clock.now_ns
        self._cache = (b"", 0, 0)
        self._build_lim()
        if self._phases is not None:
            self._phases.clear()

    def _phase_of(self, state_key: str) -> Any:
        """The phase (anchor key and anchor cache) deciding ``state_key``: this limiter, or its shard's."""
        phases = self._phases
        if phases is None:
            return self
        shard = state_key[-32:-30]
        phase = phases.get(shard)
        if phase is None:
            phase = phases.setdefault(shard, _Phase(self, self._shard_anchor(shard)))
        return phase

    def _shard_anchor(self, shard: str) -> str:
        raise NotImplementedError

    def _build_lim(self) -> None:
        token, base_ns, k = self._cache
        # Server time: the base in absolute microseconds. Client time: filled in per call (elapsed units).
        self._lim = [token, base_ns // 1000, k, self._limit, self._period_u, self._m]
        # The same as an all-or-nothing call sends them on server time: the token (blanked when the deadline is
        # unknown), then the other five packed once (they change with the anchor cache only).
        self._lim_resp = [token, packed_args(self._lim[1:])]

    def _refresh(self, anchor: bytes, cycle: int) -> None:
        """Cache ``anchor`` (as stored in Redis) with a base at ``cycle``, as the script reported them."""
        try:
            seconds, nanos = anchor.split()
            anchor_ns = int(seconds) * _NS_PER_S + int(nanos)
        except ValueError:
            self._cache = (b"", 0, 0)
        else:
            k = int(cycle)
            if self._now is None:
                k -= k % self._align
            base_ns = anchor_ns + k * self._period
            usable = self._now is not None or (self._fast_ok and base_ns % 1000 == 0)
            self._cache = (anchor if usable else b"", base_ns, k)
        self._build_lim()

    def _limiter_args(self) -> list[Any]:
        """The script's six arguments for this limiter at the current time (see ratelimiter.lua)."""
        if self._now is None:
            return self._lim
        lim = list(self._lim)
        lim[1] = (self._now() - self._cache[1]) // self._unit
        return lim

    def _client_now(self) -> list[Any]:
        """ARGV tail of the client-time mode: ``now_s, now_ns`` (nothing with server time)."""
        now = self._now
        if now is None:
            return []
        return list(divmod(int(now()), _NS_PER_S))

    def all_or_nothing(self) -> tuple[Any, object]:
        """:class:`~..core.backend.AllOrNothingPlace`: this module decides all-or-nothing over the limits of
        one connection (its ``acquire_all_keyed`` / ``acquire_all_quotas`` and their async twins)."""
        return _THIS_MODULE, self._connection()

    def _connection(self) -> RedisConnection:
        conn = self._conn
        if conn.pid != _pid:
            conn = self._conn = connection(self._url, conn.extra)
        return conn

    def _fault(
        self, conn: RedisConnection, exc: BaseException | None, what: str, replies_before: int | None = None
    ) -> None:
        with self._counter_lock:
            self.faults += 1
        if exc is not None:
            conn.fault(exc, what, replies_before)

    def backend_health(self) -> dict[str, Any]:
        """This process's view of the backend: ``kind``, ``fault_policy``, ``fault_decisions`` (decisions the
        policy made here), and the connection's ``degraded`` flag, outage length, server faults and last error.

        Information for ``r4 status``, the state endpoint, metrics and the health check: never a failure.
        """
        return {
            "kind": "redis",
            "fault_policy": self.fault_policy,
            "fault_decisions": self.faults,
            **self._connection().health(),
        }

    def _one_args(self, state_key: str, op: bytes, permits: int, timeout_ns: int) -> list[Any]:
        phase = self._phase_of(state_key)
        timeout = timeout_ns // self._unit
        if permits == 1 and timeout == 0 and op in _ONE_OPS:
            # "A"/"Q": one permit, no wait (what a request asks), without those two arguments (Redis CPU)
            return [phase.anchor_key, state_key, _ONE_OPS[op], *phase._limiter_args(), b"", *self._client_now()]
        return [
            phase.anchor_key,
            state_key,
            op,
            *phase._limiter_args(),
            permits,
            timeout,
            b"",  # deadline: set by RedisConnection.call once a connection is held (server time only)
            *self._client_now(),
        ]

    @staticmethod
    def _settle(reply: Any, owners: Sequence[Any]) -> Any:
        """The script's plain reply; a stale one first refreshes the anchor caches of the limiters it names."""
        if type(reply) is list and len(reply) == 2 and type(reply[1]) is list:
            reply, stale = reply
            for at in range(1, len(stale), 3):
                owners[stale[at] - 1]._refresh(stale[at + 1], stale[at + 2])
        return reply

    def _roundtrip(self, state_key: str, op: bytes, permits: int, timeout_ns: int) -> Any:
        """One script call for this limiter; a LATE reply (nothing changed) retries once, then is a fault."""
        conn = self._connection()
        args = self._one_args(state_key, op, permits, timeout_ns)
        at = None if self._now is not None else len(args) - 1
        owners = (self._phase_of(state_key),)
        try:
            return self._settle(conn.call(2, args, at, _ONE_TOKEN), owners)
        except _Late:
            pass  # nothing was changed: once more with a fresh deadline (and the server time learned again)
        return self._settle(
            conn.call(2, self._one_args(state_key, op, permits, timeout_ns), at, _ONE_TOKEN), owners
        )

    async def _aroundtrip(self, state_key: str, op: bytes, permits: int, timeout_ns: int) -> Any:
        """Async twin of :meth:`_roundtrip` on ``redis.asyncio``."""
        conn = self._connection()
        args = self._one_args(state_key, op, permits, timeout_ns)
        at = None if self._now is not None else len(args) - 1
        owners = (self._phase_of(state_key),)
        try:
            return self._settle(await conn.acall(2, args, at, _ONE_TOKEN), owners)
        except _Late:
            pass  # nothing was changed: once more with a fresh deadline (and the server time learned again)
        args = self._one_args(state_key, op, permits, timeout_ns)
        return self._settle(await conn.acall(2, args, at, _ONE_TOKEN), owners)

    def _count(self, wait: int) -> int:
        with self._counter_lock:
            if wait >= 0:
                self.successful_calls += 1
            else:
                self.failed_calls += 1
        return wait

    def _acquire_at(self, state_key: str, permits: int, timeout_ns: int) -> int:
        """Decide and commit in one round trip: wait ``>= 0`` granted (reserved), ``< 0`` rejected (``-wait``)."""
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits!r}")
        conn = self._connection()
        if conn.is_down():
            self._fault(conn, None, "acquire")
            return self._fault_decision(state_key, permits, timeout_ns)
        replies = conn.replies
        try:
            wait = self._roundtrip(state_key, b"a", permits, timeout_ns)
        except _FAULTS as exc:
            self._fault(conn, exc, "acquire", replies)
            return self._fault_decision(state_key, permits, timeout_ns)
        return self._count(wait * self._unit)

    async def _aacquire_at(self, state_key: str, permits: int, timeout_ns: int) -> int:
        """Async twin of :meth:`_acquire_at` on ``redis.asyncio``: never blocks the event loop."""
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits!r}")
        conn = self._connection()
        if conn.is_down():
            self._fault(conn, None, "acquire")
            return self._fault_decision(state_key, permits, timeout_ns)
        replies = conn.replies
        try:
            wait = await self._aroundtrip(state_key, b"a", permits, timeout_ns)
        except _FAULTS as exc:
            self._fault(conn, exc, "acquire", replies)
            return self._fault_decision(state_key, permits, timeout_ns)
        return self._count(wait * self._unit)

    def _acquire_quota_at(self, state_key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """:meth:`_acquire_at` whose one round trip also reads the RateLimit figures after the decision:
        ``(wait, remaining, reset_ns)`` (see :func:`_quota`); on a fault, the policy's decision and view."""
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits!r}")
        conn = self._connection()
        if not conn.is_down():
            replies = conn.replies
            try:
                return self._quota_reply(self._roundtrip(state_key, b"q", permits, timeout_ns))
            except _FAULTS as exc:
                self._fault(conn, exc, "acquire", replies)
        else:
            self._fault(conn, None, "acquire")
        return self._fault_quota(state_key, permits, timeout_ns)

    async def _aacquire_quota_at(self, state_key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """Async twin of :meth:`_acquire_quota_at` on ``redis.asyncio``."""
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits!r}")
        conn = self._connection()
        if not conn.is_down():
            replies = conn.replies
            try:
                return self._quota_reply(await self._aroundtrip(state_key, b"q", permits, timeout_ns))
            except _FAULTS as exc:
                self._fault(conn, exc, "acquire", replies)
        else:
            self._fault(conn, None, "acquire")
        return self._fault_quota(state_key, permits, timeout_ns)

    def _quota_reply(self, reply: Any) -> tuple[int, int, int]:
        if type(reply) is int:  # "Q"'s one integer (see ratelimiter.lua)
            if reply < 0:
                wait, remaining, reset = reply, 0, -reply
            else:
                wait = 0
                n, thousands = divmod(reply, 2)
                if thousands:
                    remaining, reset = divmod(n, self._period_u // 1000 + 1)
                    reset *= 1000
                else:
                    remaining, reset = divmod(n, self._period_u + 1)
        else:
            wait, remaining, reset = reply
        unit = self._unit
        return self._count(wait * unit), remaining, reset * unit

    def _fault_quota(self, state_key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        wait = self._fault_decision(state_key, permits, timeout_ns)
        return (wait, *_quota(self._fault_state(state_key)))

    def _state_reply(self, reply: Any) -> tuple[int, int, int, int]:
        cycle, permissions, wait, to_next = reply
        unit = self._unit
        return cycle, permissions, wait * unit, to_next * unit

    def _state_at(self, state_key: str) -> tuple[int, int, int, int]:
        """``(cycle, permissions, nanos_to_wait for 1, ns to the next cycle)``; on a fault, the policy's view."""
        conn = self._connection()
        if not conn.is_down():
            replies = conn.replies
            try:
                return self._state_reply(self._roundtrip(state_key, b"s", 1, 0))
            except _FAULTS as exc:
                conn.fault(exc, "state", replies)
        return self._fault_state(state_key)

    async def _astate_at(self, state_key: str) -> tuple[int, int, int, int]:
        """Async twin of :meth:`_state_at` on ``redis.asyncio``: one round trip, never blocks the loop."""
        conn = self._connection()
        if not conn.is_down():
            replies = conn.replies
            try:
                return self._state_reply(await self._aroundtrip(state_key, b"s", 1, 0))
            except _FAULTS as exc:
                conn.fault(exc, "state", replies)
        return self._fault_state(state_key)

    def _state_call(self, state_key: str) -> tuple[tuple[str, str], _ScriptCall]:
        """:meth:`_state_at`'s read as one call of :meth:`RedisConnection.run_scripts` (several limits' state
        reads in one round trip, :func:`read_quotas`): ``((script SHA, source), call)``."""
        args = self._one_args(state_key, b"s", 1, 0)
        return _CYCLE_SCRIPT, (2, args, None if self._now is not None else len(args) - 1, _ONE_TOKEN)

    def _state_of(
        self, conn: RedisConnection, state_key: str, outcome: tuple[Any, int, bool]
    ) -> tuple[int, int, int, int]:
        """The state of a :meth:`_state_call`'s outcome in ``run_scripts``; raises its fault (``_Late``: LATE)."""
        reply, started, _ = outcome
        if isinstance(reply, BaseException):
            raise reply
        return self._state_reply(self._settle(conn._timed(reply, started), (self._phase_of(state_key),)))

    def _shown(self, state_key: str, state: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        """A state read (or the fault policy's view) as :meth:`_state_at` answers it (a lease adds its permits)."""
        return state

    def _fault_state(self, state_key: str) -> tuple[int, int, int, int]:
        # What a state read shows while Redis cannot answer: the fault policy's decision, as a state.
        if self._local is not None:
            return _local_state(self, state_key)
        if self.fault_policy == "open":
            return 0, self._limit, 0, self._period
        return 0, 0, FAULT_RETRY_AFTER_NS, FAULT_RETRY_AFTER_NS

    def _fault_decision(self, state_key: str, permits: int, timeout_ns: int) -> int:
        # The fault policy's decision: "local" asks the in-process limiter, the others answer a constant.
        local = self._local
        if local is None:
            return self._fault_wait
        if isinstance(local, self._local_type):
            return local.acquire(permits, timeout_ns)  # type: ignore[no-any-return]
        return local.decide(state_key, permits, timeout_ns)  # type: ignore[no-any-return]

    def _drain_at(self, state_key: str) -> int:
        """Drain ``state_key``'s refreshed permissions to 0 (debt kept); how many were drained, 0 on a fault."""
        conn = self._connection()
        try:
            return int(self._roundtrip(state_key, b"d", 1, 0))
        except _FAULTS as exc:
            self._fault(conn, exc, "drain")
            return 0

    def _reset_call(self, conn: RedisConnection, keys: Sequence[Any], phase: Any = None) -> None:
        """Anchor := now and ``keys[1:]`` deleted, in one script call; caches the new anchor (in ``phase``)."""
        anchor, _ = conn.call(len(keys), [*keys, b"r", b"", *self._client_now()])
        (self if phase is None else phase)._refresh(anchor, 0)


class _Phase:
    """The anchor cache of one shard of a keyed limiter on a cluster (each shard has an anchor of its own, in
    its hash tag); the limit, period and clock are its limiter's. Decides like :class:`_RedisCycleOps`."""

    __slots__ = ("_cache", "_lim", "_lim_resp", "anchor_key", "owner")

    def __init__(self, owner: _RedisCycleOps, anchor_key: str) -> None:
        self.owner = owner
        self.anchor_key = anchor_key
        self._cache: tuple[bytes, int, int] = (b"", 0, 0)
        self._build_lim()

    @property
    def _now(self) -> Any:
        return self.owner._now

    @property
    def _align(self) -> int:
        return self.owner._align

    @property
    def _period(self) -> int:
        return self.owner._period

    @property
    def _fast_ok(self) -> bool:
        return self.owner._fast_ok

    @property
    def _limit(self) -> int:
        return self.owner._limit

    @property
    def _period_u(self) -> int:
        return self.owner._period_u

    @property
    def _m(self) -> bytes:
        return self.owner._m

    @property
    def _unit(self) -> int:
        return self.owner._unit

    # The same code as the limiter's: it reads only the attributes above.
    _refresh: Any = _RedisCycleOps._refresh
    _build_lim: Any = _RedisCycleOps._build_lim
    _limiter_args: Any = _RedisCycleOps._limiter_args


# The token's index in a one-limiter call's arguments (anchor key, state key, op, token, ...).
_ONE_TOKEN = (3,)
# "a"/"q" of one permit without waiting, sent as the ops without permits and timeout ("A"/"Q").
_ONE_OPS = {b"a": b"A", b"q": b"Q"}
#: The cycle script's (SHA, source), as :meth:`RedisConnection.run_scripts` takes each call's.
_CYCLE_SCRIPT = (SCRIPT_SHA, SCRIPT)


# ------------------------------------------------------------------------------------------- unkeyed backend


class RedisBackend(_RedisCycleOps):
    """One limiter's state in Redis (a :class:`~.base.RateLimiterBackend`); build with :func:`redis_backend`.

    Keys: ``<prefix>:rl:<name>:anchor`` (when cycle 0 began; never expires) and ``<prefix>:rl:<name>:state``
    (``cycle permissions``; deleted when full, else expires when it would be full). Every process using the
    same URL, prefix and name shares the budget. ``successful_calls`` / ``failed_calls`` / ``faults`` count
    this process's decisions.
    """

    def __init__(
        self,
        name: str,
        limit_for_period: int,
        limit_refresh_period_ns: int,
        clock: Clock,
        *,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        fault_policy: str = "open",
        connection_options: Mapping[str, Any] | None = None,
    ) -> None:
        check_fault_policy(fault_policy)
        self.name = name
        self.fault_policy = fault_policy
        self._url = url
        self._conn = connection(url, connection_options)
        base = key_base(prefix, "rl", name)
        self.anchor_key = base + ":anchor"
        self.state_key = base + ":state"
        self._limit = int(limit_for_period)
        self._use_period(int(limit_refresh_period_ns))
        self._counter_lock = threading.Lock()
        self.successful_calls = 0
        self.failed_calls = 0
        self.faults = 0
        self._use_clock(clock)
        self._fault_wait = 0 if fault_policy == "open" else -FAULT_RETRY_AFTER_NS
        if fault_policy == "local":
            self._local = MemoryBackend(name, self._limit, self._period, clock)
        if self._now is not None:
            # A test clock: start full at its current time, like MemoryBackend. With server time the shared
            # state is left alone (other processes may be using it).
            self.reset(clock)

    # -- protocol -------------------------------------------------------------------------------------

    def acquire(self, permits: int, timeout_ns: int) -> int:
        """Decide and commit in one round trip: wait ``>= 0`` granted (reserved), ``< 0`` rejected (``-wait``)."""
        return self._acquire_at(self.state_key, permits, timeout_ns)

    async def aacquire(self, permits: int, timeout_ns: int) -> int:
        """Async twin of :meth:`acquire` on ``redis.asyncio``: never blocks the event loop."""
        return await self._aacquire_at(self.state_key, permits, timeout_ns)

    def acquire_quota(self, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """:meth:`acquire` and :meth:`quota` in one round trip: ``(wait, remaining, reset_ns)``, the figures
        as :meth:`quota` reads them right after this decision (used by ``RateLimiter.acquire_quota``)."""
        return self._acquire_quota_at(self.state_key, permits, timeout_ns)

    async def aacquire_quota(self, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """Async twin of :meth:`acquire_quota` on ``redis.asyncio``: never blocks the event loop."""
        return await self._aacquire_quota_at(self.state_key, permits, timeout_ns)

    def state4(self) -> tuple[int, int, int, int]:
        """``(cycle, available_permissions, nanos_to_wait for 1, ns to the next cycle)``; writes nothing.

        On a fault: full and no wait under "open", empty with the fault wait under "closed".
        """
        return self._state_at(self.state_key)

    def state(self) -> tuple[int, int, int]:
        """``(cycle, available_permissions, nanos_to_wait for 1 permit)`` now (one round trip, no write)."""
        return self.state4()[:3]

    def quota(self) -> tuple[int, int]:
        """``(remaining, reset_ns)`` for RateLimit headers: time to the next cycle, or the wait for one permit."""
        return _quota(self._state_at(self.state_key))

    async def aquota(self) -> tuple[int, int]:
        """Async twin of :meth:`quota`: the same ``(remaining, reset_ns)``, one ``redis.asyncio`` round trip.

        Writes nothing and never raises on a Redis fault (the fault policy's view, as :meth:`state4`).
        """
        return _quota(await self._astate_at(self.state_key))

    def drain(self) -> int:
        """Drain the refreshed permissions to 0 (debt kept); returns how many. 0 on a fault."""
        return self._drain_at(self.state_key)

    def change_limit(self, limit_for_period: int) -> None:
        """Use ``limit_for_period`` from the next decision on (it travels with every call)."""
        self._limit = int(limit_for_period)
        self._build_lim()
        if self._local is not None:
            self._local.change_limit(limit_for_period)

    def reset(self, clock: Clock) -> None:
        """Cycle 0 starts now (per ``clock``'s mode) and the state is full; this process's counters reset.

        This resets the budget for every process sharing it. A fault is logged, never raised.
        """
        self._use_clock(clock)
        if self._local is not None:
            self._local.reset(clock)
        with self._counter_lock:
            self.successful_calls = 0
            self.failed_calls = 0
            self.faults = 0
        conn = self._connection()
        try:
            self._reset_call(conn, [self.anchor_key, self.state_key])
            conn.recovered()
        except _FAULTS as exc:
            self._fault(conn, exc, "reset")

    def acquire_many(self, backends: Sequence[RateLimiterBackend], permits: int) -> tuple[int, int] | None:
        """All-or-nothing with timeout 0 over ``RedisBackend`` instances of one URL, in one round trip."""
        members = _many_members(self, [(b, None) for b in backends], permits)
        return _many_result(members, _sync_many(self, members, permits))

    async def aacquire_many(
        self, backends: Sequence[RateLimiterBackend], permits: int
    ) -> tuple[int, int] | None:
        """Async twin of :meth:`acquire_many` (``redis.asyncio``, never blocks the loop)."""
        members = _many_members(self, [(b, None) for b in backends], permits)
        return _many_result(members, await _async_many(self, members, permits))

    def __repr__(self) -> str:
        return (
            f"RedisBackend(name={self.name!r}, limit={self._limit}, period_ns={self._period}, "
            f"url={redact_url(self._url)!r}, fault_policy={self.fault_policy!r})"
        )


def _quota(state4: tuple[int, int, int, int]) -> tuple[int, int]:
    """``(remaining, reset_ns)`` of a state: time to the next cycle while permits remain, else the wait for one."""
    _, permissions, wait, to_next = state4
    return (permissions, to_next) if permissions >= 1 else (permissions, wait)


class _Member:
    """One entry of an all-or-nothing decision: the limiter deciding it (its counters), its algorithm's
    :class:`~.redis_scripted.Script` (None: a cycle limiter), and its Redis keys: a cycle limiter's phase
    (anchor cache: the limiter, or its shard's) and anchor, and the state."""

    __slots__ = ("anchor", "counter", "phase", "script", "state")

    def __init__(self, counter: Any, state: str) -> None:
        self.counter = counter
        self.script = script = counter._script
        if script is None:
            self.phase = phase = counter._phase_of(state)
            self.anchor = phase.anchor_key
        else:  # GCRA, sliding window: one key, no anchor
            self.phase = self.anchor = None
        self.state = state


def _many_members(leader: _RedisCycleOps, entries: Sequence[tuple[Any, str | None]], permits: int) -> list[_Member]:
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits!r}")
    conn = leader._connection()
    members: list[_Member] = []
    for target, key in entries:
        if isinstance(target, RedisBackend):
            members.append(_Member(target, target.state_key))
        elif isinstance(target, RedisKeyedStore):
            if key is None:
                raise ValueError(f"keyed rate limiter {target.name!r} needs a key")
            members.append(_Member(target, target._state_key(key)))
        else:
            raise TypeError(f"cannot combine {type(target).__name__} with Redis limiters in one decision")
        if target._connection() is not conn:
            raise ValueError("all Redis limiters of one decision must use the same Redis (URL and OPTIONS)")
    if len({m.state for m in members}) != len(members):
        raise ValueError("the same rate limiter (and key) appears more than once")
    return members


def _pair_members(leader: _RedisCycleOps, pairs: Sequence[tuple[Any, str]]) -> list[_Member]:
    """``(limiter, its Redis state key)`` pairs as members of one decision (any algorithms, one Redis)."""
    conn = leader._connection()
    members: list[_Member] = []
    for target, state in pairs:
        if not isinstance(target, _RedisCycleOps):
            raise TypeError(f"cannot combine {type(target).__name__} with Redis limiters in one decision")
        if target._connection() is not conn:
            raise ValueError("all Redis limiters of one decision must use the same Redis (URL and OPTIONS)")
        members.append(_Member(target, state))
    if len({m.state for m in members}) != len(members):
        raise ValueError("the same rate limiter (and key) appears more than once")
    return members


def _many_args(leader: _RedisCycleOps, members: list[_Member], permits: int, op: bytes = b"m") -> list[Any]:
    args: list[Any] = []
    for m in members:
        args.append(m.anchor)
        args.append(m.state)
    args += [op, permits, len(members)]
    for m in members:
        args += m.phase._limiter_args()
    args.append(b"")  # the deadline: set by RedisConnection.call once a connection is held
    return args + leader._client_now()


_FAULT = object()


def _many_where(leader: _RedisCycleOps, n: int) -> tuple[int | None, range]:
    """Index of the deadline and of every token in a many-call of ``n`` limiters (no deadline on a client clock)."""
    if leader._now is not None:
        return None, range(0)
    return 8 * n + 3, range(2 * n + 3, 8 * n + 3, 6)


def _packed_many(
    leader: _RedisCycleOps, members: list[_Member], permits: int, op: bytes
) -> tuple[list[Any], int | None, Sequence[int]]:
    """:func:`_many_args` and :func:`_many_where` of one all-or-nothing call: on server time each limiter's
    token and then its other five arguments as one packed run (``_lim_resp``, built with its anchor cache), so
    the deadline and the tokens sit at other indexes; on a caller's clock the plain layout."""
    n = len(members)
    if leader._now is None:
        args: list[Any] = []
        for m in members:
            args.append(m.anchor)
            args.append(m.state)
        args += [op, permits, n]
        for m in members:
            phase = m.phase
            if phase._now is not None:
                break
            args += phase._lim_resp
        else:
            args.append(b"")  # the deadline: set by RedisConnection.call once a connection is held
            return args, 4 * n + 3, range(2 * n + 3, 4 * n + 3, 2)
    at, tokens = _many_where(leader, n)
    return _many_args(leader, members, permits, op), at, tokens


def _many_call(
    conn: RedisConnection, leader: _RedisCycleOps, members: list[_Member], permits: int, op: bytes = b"m"
) -> Any:
    owners = [m.phase for m in members]
    try:
        args, at, tokens = _packed_many(leader, members, permits, op)
        return leader._settle(conn.call(2 * len(members), args, at, tokens), owners)
    except _Late:
        pass  # nothing was changed: once more with a fresh deadline
    args, at, tokens = _packed_many(leader, members, permits, op)
    return leader._settle(conn.call(2 * len(members), args, at, tokens), owners)


async def _amany_call(
    conn: RedisConnection, leader: _RedisCycleOps, members: list[_Member], permits: int, op: bytes = b"m"
) -> Any:
    owners = [m.phase for m in members]
    try:
        args, at, tokens = _packed_many(leader, members, permits, op)
        return leader._settle(await conn.acall(2 * len(members), args, at, tokens), owners)
    except _Late:
        pass  # nothing was changed: once more with a fresh deadline
    args, at, tokens = _packed_many(leader, members, permits, op)
    return leader._settle(await conn.acall(2 * len(members), args, at, tokens), owners)


def _sync_many(leader: _RedisCycleOps, members: list[_Member], permits: int, op: bytes = b"m") -> Any:
    conn = leader._connection()
    if conn.is_down():
        leader._fault(conn, None, "acquire_many")
        return _fault_reply(members, permits, op)
    replies = conn.replies
    try:
        groups = _groups(conn, members)
        if groups is not None:
            if _one_slot(conn, members, groups):
                return _mixed_call(conn, leader, members, groups, permits, op)
            return _split_many(conn, leader, members, groups, permits, op)
        return _many_call(conn, leader, members, permits, op)
    except _FAULTS as exc:
        leader._fault(conn, exc, "acquire_many", replies)
        return _fault_reply(members, permits, op)


async def _async_many(leader: _RedisCycleOps, members: list[_Member], permits: int, op: bytes = b"m") -> Any:
    conn = leader._connection()
    if conn.is_down():
        leader._fault(conn, None, "acquire_many")
        return _fault_reply(members, permits, op)
    replies = conn.replies
    try:
        groups = _groups(conn, members)
        if groups is not None:
            if _one_slot(conn, members, groups):
                return await _amixed_call(conn, leader, members, groups, permits, op)
            return await _asplit_many(conn, leader, members, groups, permits, op)
        return await _amany_call(conn, leader, members, permits, op)
    except _FAULTS as exc:
        leader._fault(conn, exc, "acquire_many", replies)
        return _fault_reply(members, permits, op)


# ------------------------------------------------- all-or-nothing over several algorithms in one slot
#
# One run of redis_mixed.MIXED_SCRIPT: every algorithm's script, composed into one, takes and (when a group
# rejects) gives back in the same run: atomic, exact, one round trip whether granted or refused.


def _one_slot(conn: RedisConnection, members: list[_Member], groups: list[list[int]]) -> bool:
    """True when ``groups`` (several algorithms, or one algorithm in several slots) can share one script run:
    one server, or every key in one cluster slot."""
    if not conn.cluster:
        return True
    keyslot = conn.keyslot
    return len({keyslot(members[group[0]].state) for group in groups}) == 1 and len(groups) > 1


def _mixed_once(
    leader: _RedisCycleOps, members: list[_Member], groups: list[list[int]], permits: int, op: bytes
) -> tuple[list[int], int, list[Any], int | None]:
    """The mixed script's call: member order, key count, arguments, deadline slot (None on a caller's clock)."""
    order, numkeys, args, at = mixed_args(members, groups, permits, op, leader._client_now)
    return order, numkeys, args, at if leader._now is None else None


def _mixed_settle(
    conn: RedisConnection,
    leader: _RedisCycleOps,
    members: list[_Member],
    order: list[int],
    outcome: tuple[Any, int, bool],
    op: bytes,
) -> Any:
    """The reply in member order (the cycle script's shape); LATE raises ``_Late``; a reported anchor and the
    server time are learned."""
    reply, started, _ = outcome
    reply = leader._settle(conn._timed(reply, started), [members[i].phase for i in order])
    return mixed_reply(order, reply, op)


def _mixed_call(
    conn: RedisConnection, leader: _RedisCycleOps, members: list[_Member], groups: list[list[int]], permits: int,
    op: bytes,
) -> Any:
    """An all-or-nothing decision over several algorithms in one slot: one run of the mixed script (a LATE
    reply, nothing changed, is retried once with a fresh deadline)."""
    try:
        order, numkeys, args, at = _mixed_once(leader, members, groups, permits, op)
        outcome = conn.run_script(MIXED_SCRIPT_SHA, MIXED_SCRIPT, numkeys, args, at)
        return _mixed_settle(conn, leader, members, order, outcome, op)
    except _Late:
        pass
    order, numkeys, args, at = _mixed_once(leader, members, groups, permits, op)
    outcome = conn.run_script(MIXED_SCRIPT_SHA, MIXED_SCRIPT, numkeys, args, at)
    return _mixed_settle(conn, leader, members, order, outcome, op)


async def _amixed_call(
    conn: RedisConnection, leader: _RedisCycleOps, members: list[_Member], groups: list[list[int]], permits: int,
    op: bytes,
) -> Any:
    """Async twin of :func:`_mixed_call`."""
    try:
        order, numkeys, args, at = _mixed_once(leader, members, groups, permits, op)
        outcome = await conn.arun_script(MIXED_SCRIPT_SHA, MIXED_SCRIPT, numkeys, args, at)
        return _mixed_settle(conn, leader, members, order, outcome, op)
    except _Late:
        pass
    order, numkeys, args, at = _mixed_once(leader, members, groups, permits, op)
    outcome = await conn.arun_script(MIXED_SCRIPT_SHA, MIXED_SCRIPT, numkeys, args, at)
    return _mixed_settle(conn, leader, members, order, outcome, op)


# ------------------------------- all-or-nothing over several algorithms (scripts) or several cluster slots
#
# Redis runs a script on one slot only, and each algorithm has a script of its own (cycle: SCRIPT; GCRA,
# sliding window: redis_scripted.Script). A decision over limits of several algorithms in ONE slot is one run
# of redis_mixed's composed script (above). A decision in several slots (a cluster) is
# split: one "m"/"M" call per (algorithm, slot) group, all sent at once (pipelined on one connection per node:
# one round trip). Each call is all-or-nothing in its group. When every slot granted, the
# decision is granted. When one rejected (or failed), the slots that granted get their permits back with one
# "g" call each, again all at once: "g" makes each state exactly what it would be had the permits never been
# taken, so no limit ever admits more than it allows; between the two round trips other callers may be
# rejected by permits that are about to come back (a brief under-admission, the price of exactness). When a
# cycle boundary fell between the take and the give-back, the new cycle's refill may have absorbed the take,
# so nothing is given back there; and a "g" that fails leaves those permits taken. Both only under-admit, by
# at most that decision's permits, until the cycle ends (logged when a "g" fails).


def several_slots(conn: RedisConnection, keys: Sequence[Any]) -> bool:
    """True when ``keys`` live in several cluster slots: one script cannot decide them, :func:`mixed_many` does
    (one call per slot, sent at once, and a give-back when one rejects)."""
    return bool(conn.cluster) and len({conn.keyslot(key) for key in keys}) > 1


def _groups(conn: RedisConnection, members: list[_Member]) -> list[list[int]] | None:
    """Member indexes grouped by algorithm (script) and cluster slot (first-seen order), or None when they are
    all cycle limiters in one slot (or on one server): the usual single call."""
    if not conn.cluster:
        for m in members:
            if m.script is not None:
                break
        else:
            return None  # the common case: cycle limiters on one server, one call
    keyslot = conn.keyslot if conn.cluster else None
    groups: dict[tuple[Any, int], list[int]] = {}
    for index, member in enumerate(members):
        groups.setdefault((member.script, keyslot(member.state) if keyslot else 0), []).append(index)
    if len(groups) == 1 and members[0].script is None:
        return None
    return list(groups.values())


def _scripted_args(sub: list[_Member], permits: int, op: bytes) -> tuple[list[Any], int]:
    """A GCRA or sliding-window group's keys and arguments (``redis_scripted``'s many-call layout), and the
    index of its deadline slot in them."""
    args: list[Any] = [m.state for m in sub]
    args += [op, permits, 0, len(sub)]
    for m in sub:
        args += m.counter._margs
    at = len(args)
    return args + sub[0].counter._tail(), at


def _group_calls(
    leader: _RedisCycleOps, members: list[_Member], groups: list[list[int]], permits: int, op: bytes
) -> tuple[list[_ScriptCall], list[tuple[str, str]]]:
    """Each group's "m"/"M" call, and its script's (SHA, source)."""
    calls: list[_ScriptCall] = []
    scripts: list[tuple[str, str]] = []
    for group in groups:
        sub = [members[i] for i in group]
        script = sub[0].script
        if script is None:
            at, tokens = _many_where(leader, len(sub))
            calls.append((2 * len(sub), _many_args(leader, sub, permits, op), at, tokens))
            scripts.append((SCRIPT_SHA, SCRIPT))
        else:  # "n"/"N": "m"/"M" whose grant names what the give-back needs
            args, deadline_at = _scripted_args(sub, permits, b"n" if op == b"m" else b"N")
            calls.append((len(sub), args, deadline_at if leader._now is None else None, ()))
            scripts.append((script.sha, script.text))
    return calls, scripts


def _give_back_calls(
    conn: RedisConnection,
    leader: _RedisCycleOps,
    members: list[_Member],
    groups: list[list[int]],
    permits: int,
    sent: list[int],
    clock_then: int,
    takes: list[bytes] | None = None,
) -> list[_ScriptCall]:
    """The "g" calls returning ``permits`` to ``groups``, whose takes were sent at monotonic ``sent`` (client
    time: at ``clock_then`` or later): a cycle group's carries ``since``, a time no later than its take ran;
    a GCRA or sliding-window group's what its take reported (``takes``, see :func:`_taken`)."""
    calls: list[_ScriptCall] = []
    for group, started, taken in zip(groups, sent, takes or [b""] * len(groups), strict=True):
        sub = [members[i] for i in group]
        if leader._now is None:  # server µs no later than the send (so than the take); 0: unknown, none back
            shift = conn._shift_us
            since = 0 if shift is None else started // 1000 + shift - conn._wait_us
        else:  # ns elapsed on the limiter's clock since the take's time, at least
            since = leader._now() - clock_then
        if sub[0].script is None:
            args = _many_args(leader, sub, permits, b"g")
            args[8 * len(sub) + 3] = since
            calls.append((2 * len(sub), args, None, ()))
        else:
            args, at = _scripted_args(sub, permits, b"g")
            args[at] = taken
            calls.append((len(sub), args, None, ()))
    return calls


def _group_reply(
    conn: RedisConnection,
    leader: _RedisCycleOps,
    members: list[_Member],
    group: list[int],
    outcome: tuple[Any, int, bool],
    op: bytes,
) -> Any:
    """A group's reply in the cycle script's shape ("m": ``[0]`` or ``[worst, wait, rejecting...]``; "M": the
    figures then that; "g": the figures), whatever its algorithm; raises its fault (``_Late`` for LATE)."""
    reply, started, learn = outcome
    if isinstance(reply, BaseException):
        raise reply
    if members[group[0]].script is None:
        return leader._settle(conn._timed(reply, started), [members[i].phase for i in group])
    if type(reply) is bytes:
        raise _Late(conn.was_late(started))
    if learn:  # {reply, {now_us}}: the deadline was unknown, the server time comes with the reply
        reply, (now_us,) = reply
        conn.learn_time(now_us, started, time.monotonic_ns())
    if op == b"M":  # {"m"'s reply, figures}
        return [*reply[1], *_cycle_verdict(reply[0])]
    if op == b"m":  # {0} or {index, wait}
        return _cycle_verdict(reply)
    return reply  # "g": the figures


def _cycle_verdict(verdict: Any) -> list[Any]:
    # GCRA's and the sliding window's {index, wait} name the worst rejection only: it is the rejecting one. A
    # grant keeps what the script wrote ({0, ...}: what its give-back needs).
    return list(verdict) if verdict[0] == 0 else [verdict[0], verdict[1], verdict[0]]


def _taken(reply: Any, size: int, op: bytes) -> bytes:
    """What a granted GCRA or sliding-window group's give-back needs from its take's reply (cycle shape): the
    states GCRA wrote, joined by ","; the sliding window's ``"<now_s> <now_ns>"``."""
    extra = reply[2 * size + 1 if op == b"M" else 1 :]
    if extra and type(extra[0]) is bytes:
        return b",".join(extra)
    return b" ".join(b"%d" % int(v) for v in extra)


def _group_granted(reply: Any, size: int, op: bytes) -> bool:
    return bool(reply[2 * size if op == b"M" else 0] == 0)


def _split_first(
    conn: RedisConnection,
    leader: _RedisCycleOps,
    members: list[_Member],
    groups: list[list[int]],
    op: bytes,
    outcomes: list[tuple[Any, int, bool]],
) -> tuple[list[Any], list[int], BaseException | None]:
    """Each slot's reply (None: failed or late), the slots to compensate, and the first fault."""
    replies: list[Any] = []
    error: BaseException | None = None
    for group, outcome in zip(groups, outcomes, strict=True):
        try:
            replies.append(_group_reply(conn, leader, members, group, outcome, op))
        except _FAULTS as exc:  # a LATE slot changed nothing; any other fault may have: both fail the decision
            replies.append(None)
            error = error or exc
    granted = [k for k, reply in enumerate(replies) if reply is not None and _group_granted(reply, len(groups[k]), op)]
    return replies, granted, error


def _split_result(
    conn: RedisConnection,
    leader: _RedisCycleOps,
    members: list[_Member],
    groups: list[list[int]],
    op: bytes,
    replies: list[Any],
    given: list[int],
    outcomes: list[tuple[Any, int, bool]],
    error: BaseException | None,
) -> Any:
    """The split decision as one script's reply ("m" or "M" shape, member indexes); raises the first fault."""
    figures: dict[int, Any] = {}
    for k, outcome in zip(given, outcomes, strict=True):
        try:
            figures[k] = _group_reply(conn, leader, members, groups[k], outcome, b"g")
        except _FAULTS as exc:
            conn.fault(exc, "acquire_many (giving permits back)")
    if error is not None:
        raise error
    n = len(members)
    quotas: list[Any] = [0] * (2 * n)
    worst, worst_wait, worst_ns = 0, 0, -1
    rejecting: list[int] = []
    for k, (group, reply) in enumerate(zip(groups, replies, strict=True)):
        size = len(group)
        if op == b"M":  # a slot that gave its permits back reports the figures after that
            own = figures.get(k) or reply
            for j, index in enumerate(group):
                quotas[2 * index], quotas[2 * index + 1] = own[2 * j], own[2 * j + 1]
        verdict = reply[2 * size :] if op == b"M" else reply
        if verdict[0] != 0:
            local = group[verdict[0] - 1]
            wait_ns = verdict[1] * members[local].counter._unit
            if wait_ns > worst_ns:
                worst, worst_wait, worst_ns = local + 1, verdict[1], wait_ns
            rejecting += [group[i - 1] + 1 for i in verdict[2:]]
    verdict = [0] if not worst else [worst, worst_wait, *sorted(rejecting)]
    return [*quotas, *verdict] if op == b"M" else verdict


def _split_many(
    conn: RedisConnection, leader: _RedisCycleOps, members: list[_Member], groups: list[list[int]], permits: int, op: bytes
) -> Any:
    """An all-or-nothing decision over several slots: one round trip, plus one to compensate a rejection."""
    clock_then = 0 if leader._now is None else leader._now()
    calls, scripts = _group_calls(leader, members, groups, permits, op)
    first = conn.run_scripts(SCRIPT_SHA, SCRIPT, calls, scripts)
    replies, granted, error = _split_first(conn, leader, members, groups, op, first)
    given: list[int] = []
    back: list[tuple[Any, int, bool]] = []
    if granted and (error is not None or len(granted) < len(groups)):
        given = granted
        sent = [first[k][1] for k in given]
        takes = [_taken(replies[k], len(groups[k]), op) for k in given]
        calls = _give_back_calls(
            conn, leader, members, [groups[k] for k in given], permits, sent, clock_then, takes
        )
        back = conn.run_scripts(SCRIPT_SHA, SCRIPT, calls, [scripts[k] for k in given])
    return _split_result(conn, leader, members, groups, op, replies, given, back, error)


# Give-backs running on after their caller was cancelled: referenced until done (the loop keeps weak ones).
_GIVING_BACK: set[asyncio.Task[Any]] = set()


def _given_back(task: asyncio.Task[Any]) -> None:
    _GIVING_BACK.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: a fault was already recorded by the call (run_scripts returns it)


def _agive_back(
    conn: RedisConnection,
    leader: _RedisCycleOps,
    members: list[_Member],
    groups: list[list[int]],
    permits: int,
    op: bytes,
    scripts: list[tuple[str, str]],
    first: list[tuple[Any, int, bool]],
    replies: list[Any],
    given: list[int],
    clock_then: int,
) -> asyncio.Task[list[tuple[Any, int, bool]]]:
    """The give-back of a refused split decision as a task of its own: it restores permits other requests
    need, so a cancellation of the caller (a client gone, a timeout around the view) must not stop it."""
    sent = [first[k][1] for k in given]
    takes = [_taken(replies[k], len(groups[k]), op) for k in given]
    calls = _give_back_calls(conn, leader, members, [groups[k] for k in given], permits, sent, clock_then, takes)
    task = asyncio.ensure_future(conn.arun_scripts(SCRIPT_SHA, SCRIPT, calls, [scripts[k] for k in given]))
    _GIVING_BACK.add(task)
    task.add_done_callback(_given_back)
    return task


async def _asplit_many(
    conn: RedisConnection, leader: _RedisCycleOps, members: list[_Member], groups: list[list[int]], permits: int, op: bytes
) -> Any:
    """Async twin of :func:`_split_many` (the calls of each step run concurrently). The give-back runs to
    its end even when the caller is cancelled, and a refusal whose cancellation was lost below us (its
    replies came back) still gives back what its granted slots took."""
    clock_then = 0 if leader._now is None else leader._now()
    calls, scripts = _group_calls(leader, members, groups, permits, op)
    try:
        first = await conn.arun_scripts(SCRIPT_SHA, SCRIPT, calls, scripts)
    except LostCancellation as lost:
        replies, granted, error = _split_first(conn, leader, members, groups, op, lost.reply)
        if granted and (error is not None or len(granted) < len(groups)):
            _agive_back(conn, leader, members, groups, permits, op, scripts, lost.reply, replies, granted, clock_then)
        raise
    replies, granted, error = _split_first(conn, leader, members, groups, op, first)
    given: list[int] = []
    back: list[tuple[Any, int, bool]] = []
    if granted and (error is not None or len(granted) < len(groups)):
        given = granted
        back = await asyncio.shield(
            _agive_back(conn, leader, members, groups, permits, op, scripts, first, replies, given, clock_then)
        )
    return _split_result(conn, leader, members, groups, op, replies, given, back, error)


def mixed_many(leader: _RedisCycleOps, pairs: Sequence[tuple[Any, str]], permits: int, op: bytes = b"m") -> Any:
    """All-or-nothing (timeout 0) over ``(limiter, its Redis state key)`` pairs of any algorithms on one Redis:
    one run of the mixed script when their keys share a slot (always on one server); across cluster slots one
    call per algorithm and slot, all sent at once, a give-back of the granted groups when another rejected
    (see above). :func:`~.redis_scripted.acquire_all`'s result: ``None`` or ``(index of the
    largest wait, that wait)``; with ``op=b"M"`` a pair ``(that, [(remaining, reset_ns), ...])``."""
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits!r}")
    members = _pair_members(leader, pairs)
    reply = _sync_many(leader, members, permits, op)
    if op == b"M":
        reply, quotas = _split_quotas(members, reply)
        return _many_result(members, reply), quotas
    return _many_result(members, reply)


async def amixed_many(
    leader: _RedisCycleOps, pairs: Sequence[tuple[Any, str]], permits: int, op: bytes = b"m"
) -> Any:
    """Async twin of :func:`mixed_many` on ``redis.asyncio``."""
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits!r}")
    members = _pair_members(leader, pairs)
    reply = await _async_many(leader, members, permits, op)
    if op == b"M":
        reply, quotas = _split_quotas(members, reply)
        return _many_result(members, reply), quotas
    return _many_result(members, reply)


def _split_quotas(members: list[_Member], reply: Any) -> tuple[Any, list[tuple[int, int]]]:
    """An "M" reply as ``("m"'s reply, each member's (remaining, reset_ns))``; a fault's reply carries the
    policy's view instead."""
    if type(reply) is tuple:  # _fault_reply: (its "m" reply, quotas already read)
        return reply
    n = len(members)
    quotas = [
        (reply[2 * i], reply[2 * i + 1] * members[i].counter._unit) for i in range(n)
    ]
    return reply[2 * n :], quotas


def _bump(counter: Any, granted: bool) -> None:
    with counter._counter_lock:
        if granted:
            counter.successful_calls += 1
        else:
            counter.failed_calls += 1


def _many_result(members: list[_Member], reply: Any) -> tuple[int, int] | None:
    """Turn the script's reply into ``None`` or ``(index of the worst rejection, its wait)``; count."""
    if reply is _FAULT:
        # Fault policy of the first member decides for all.
        if members[0].counter.fault_policy == "open":
            return None
        return 0, FAULT_RETRY_AFTER_NS
    if reply[0] == 0:
        for m in members:
            _bump(m.counter, True)
        return None
    for index in reply[2:]:
        _bump(members[index - 1].counter, False)
    return reply[0] - 1, reply[1] * members[reply[0] - 1].counter._unit


def _factory_of(
    cls: Any,
    url: str,
    *,
    prefix: str = DEFAULT_PREFIX,
    fault_policy: str = "open",
    connection_options: Mapping[str, Any] | None = None,
    **extra: Any,
) -> Any:
    """A :class:`~.base.BackendFactory` building ``cls`` (a :class:`RedisBackend`) on ``url`` with these
    options and ``extra`` keyword arguments (a GCRA burst, a lease); ``fault_policy`` is checked here, once."""
    check_fault_policy(fault_policy)

    def factory(name: str, limit_for_period: int, limit_refresh_period_ns: int, clock: Clock) -> Any:
        return cls(
            name,
            limit_for_period,
            limit_refresh_period_ns,
            clock,
            url=url,
            prefix=prefix,
            fault_policy=fault_policy,
            connection_options=connection_options,
            **extra,
        )

    return factory


def redis_backend(
    url: str,
    *,
    prefix: str = DEFAULT_PREFIX,
    fault_policy: str = "open",
    connection_options: Mapping[str, Any] | None = None,
) -> Any:
    """A :class:`~.base.BackendFactory` building :class:`RedisBackend` on ``url`` for ``RateLimiter(backend=...)``."""
    options: dict[str, Any] = {
        "prefix": prefix,
        "fault_policy": fault_policy,
        "connection_options": connection_options,
    }
    factory = _factory_of(RedisBackend, url, **options)

    def for_config(config: Any) -> Any:
        # The factory of config's algorithm: RedisBackend for "cycle", RedisGcraBackend for "gcra",
        # RedisSlidingBackend for "sliding_window".
        if config.algorithm == "cycle":
            return factory
        if config.algorithm == "sliding_window":
            from .redis_sliding import RedisSlidingBackend

            return _factory_of(RedisSlidingBackend, url, **options)
        if config.algorithm != "gcra":
            raise ValueError(f"algorithm {config.algorithm!r} is not implemented by the Redis backend")
        from .redis_gcra import RedisGcraBackend

        return _factory_of(RedisGcraBackend, url, burst=config.burst, **options)

    factory.for_config = for_config
    return factory


# --------------------------------------------------------------------------------------------- keyed limiter


class RedisKeyedStore(_RedisCycleOps):
    """Every client key's state in Redis: a :class:`~django_ratelimit_r4.core.backend.KeyedBackend` that a
    :class:`~django_ratelimit_r4.keyed.KeyedRateLimiter` decides through (one budget per client key for the
    whole cluster); the limiter owns events, waiting, exceptions and metrics, this store decides and counts.

    Keys: ``<prefix>:rlk:<name>:anchor`` (cycle 0 of every key; never expires) and
    ``<prefix>:rlk:<name>:k:<blake2b(key)>`` (``cycle permissions``; deleted when full, else expires when it
    would be full, so idle clients cost nothing). Client keys are hashed: a key cannot reach another's Redis
    key and no client data is stored. ``max_keys`` / ``idle_timeout_ns`` bound only the "local" fault
    policy's in-process store (expiry bounds Redis). ``len()`` scans Redis (O(keys)), :meth:`live_keys` is -1
    (unknown) and :meth:`keys` is always empty (only digests are stored). Calls are counted in this process.
    """

    remote = True
    rejection_quotas = True
    #: Redis keys are never evicted with state by this library (they expire once full again).
    lossy_evictions = 0

    def __init__(
        self,
        name: str,
        config: RateLimiterConfig | None = None,
        *,
        clock: Clock | None = None,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        fault_policy: str = "open",
        max_keys: int = DEFAULT_MAX_KEYS,
        idle_timeout_ns: int | None = None,
        connection_options: Mapping[str, Any] | None = None,
    ) -> None:
        check_fault_policy(fault_policy)
        self.name = name
        self.config: RateLimiterConfig = config if config is not None else RateLimiterConfig()
        clock = clock if clock is not None else SYSTEM_CLOCK
        self.fault_policy = fault_policy
        self._limit = int(self.config.limit_for_period)
        self._use_period(int(self.config.limit_refresh_period))
        self._url = url
        self._conn = connection(url, connection_options)
        self._prefix = prefix
        self._base = key_base(prefix, "rlk", name)
        #: The anchor of every client key on one server (on a cluster each shard has its own, see _phase_of).
        self.anchor_key = self._base + ":anchor"
        self._key_prefix = self._base + ":k:"
        self._state_keys: dict[str, str] = {}
        if self._conn.cluster:
            self._phases = {}
        self._counter_lock = threading.Lock()
        self.successful_calls = 0
        self.failed_calls = 0
        self.faults = 0
        self._fault_wait = 0 if fault_policy == "open" else -FAULT_RETRY_AFTER_NS
        if fault_policy == "local":
            self._local = memory_keyed_store(
                self.config, clock, max_keys=max_keys, idle_timeout_ns=idle_timeout_ns
            )
        self._use_clock(clock)
        if self._now is not None:
            self.reset()

    def _state_key(self, key: object) -> str:
        """The Redis key of ``key``'s state: ``<base>:k:<digest>``, the base of its shard on a cluster.

        Clients come back: a string key's state key is kept (at most :data:`_STATE_KEYS_MAX`, forgotten all at
        once when full) instead of hashing it per decision.
        """
        if type(key) is str:
            known = self._state_keys.get(key)
            if known is not None:
                return known
            state_key = self._state_key_of(key)
            if len(self._state_keys) >= _STATE_KEYS_MAX:
                self._state_keys.clear()
            self._state_keys[key] = state_key
            return state_key
        return self._state_key_of(key)

    def _state_key_of(self, key: object) -> str:
        digest = client_key_digest(key)
        if self._phases is None:
            return self._key_prefix + digest
        return f"{key_base(self._prefix, 'rlk', self.name, shard_of(digest))}:k:{digest}"

    def _shard_anchor(self, shard: str) -> str:
        return key_base(self._prefix, "rlk", self.name, shard) + ":anchor"

    # -- the KeyedBackend protocol: one round trip each ------------------------------------------------

    def decide(self, key: str, permits: int, timeout_ns: int) -> int:
        """One round trip: wait ``>= 0`` granted (reserved), ``< 0`` rejected (``-wait``); on a fault, the
        policy's decision."""
        return self._acquire_at(self._state_key(key), permits, timeout_ns)

    async def adecide(self, key: str, permits: int, timeout_ns: int) -> int:
        """Async twin of :meth:`decide` on ``redis.asyncio``: never blocks the event loop."""
        return await self._aacquire_at(self._state_key(key), permits, timeout_ns)

    def decide_quota(self, key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """``(wait, remaining, reset_ns)``: the decision and ``key``'s figures after it in the same round trip
        (after a rejection too: the exception carries them)."""
        return self._acquire_quota_at(self._state_key(key), permits, timeout_ns)

    async def adecide_quota(self, key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """Async twin of :meth:`decide_quota` on ``redis.asyncio``."""
        return await self._aacquire_quota_at(self._state_key(key), permits, timeout_ns)

    def drain(self, key: str) -> int:
        """Set ``key``'s refreshed permissions to 0 (debt kept); how many were drained (0 on a fault)."""
        return self._drain_at(self._state_key(key))

    def state(self, key: str) -> tuple[int, int, int]:
        """``(cycle, available_permissions, nanos_to_wait for 1 permit)`` for ``key``; writes nothing."""
        return self._state_at(self._state_key(key))[:3]

    def quota(self, key: str) -> tuple[int, int]:
        """``(remaining, reset_ns)`` for ``key`` (RateLimit headers): one round trip, writes nothing."""
        return _quota(self._state_at(self._state_key(key)))

    async def aquota(self, key: str) -> tuple[int, int]:
        """Async twin of :meth:`quota` on ``redis.asyncio``: same result, one round trip, never blocks the loop."""
        return _quota(await self._astate_at(self._state_key(key)))

    def _scan_keys(self) -> list[bytes]:
        # The prefix is the operator's (redis_key_prefix): escaped, so "a*" cannot match another app's keys.
        if self._phases is None:
            pattern = _glob_escape(self._key_prefix) + "*"
        else:  # every shard's states: <prefix>:rlk:{<name>:<2 hex>}:k:<digest>
            pattern = _glob_escape(key_base(self._prefix, "rlk", self.name, "")[:-1]) + "??}:k:*"
        return list(self._conn.sync.scan_iter(match=pattern, count=1000))

    def purge(self) -> int:
        """Nothing to do (full states are deleted and others expire in Redis); returns 0."""
        return 0

    def keys(self, limit: int | None = None) -> list[str]:
        """Always ``[]``: Redis holds only BLAKE2b digests of client keys, which cannot be turned back into keys.

        ``limit`` is validated as the in-memory stores do, so operator listings
        (``state.snapshot(include_keys=True)``) work on both; here they list no key. Use :meth:`state` /
        ``key in limiter`` for a known key.
        """
        _check_limit(limit)
        return []

    def live_keys(self) -> int:
        """Always -1 (unknown): counting keys in Redis is O(keys); ``len()`` scans, for housekeeping."""
        return -1

    def reset(self, key: str | None = None) -> None:
        """Forget ``key`` (full again), or with no key every key of this limiter (cluster-wide) and the
        counters of this process, with cycle 0 starting now. A fault is logged, never raised."""
        if self._local is not None:
            self._local.reset(None if key is None else self._state_key(key))
        conn = self._connection()
        try:
            if key is not None:
                conn.sync.delete(self._state_key(key))
                return
            with self._counter_lock:
                self.successful_calls = 0
                self.failed_calls = 0
                self.faults = 0
            states = self._scan_keys()
            if self._phases is None:
                for start in range(0, max(len(states), 1), 500):
                    self._reset_call(conn, [self.anchor_key, *states[start : start + 500]])
            else:  # on a cluster: each shard's anchor with its own states (one slot per script)
                by_shard: dict[str, list[bytes]] = {f"{i:02x}": [] for i in range(CLUSTER_SHARDS)}
                for state in states:
                    by_shard[state[-32:-30].decode()].append(state)
                for shard, shard_states in by_shard.items():
                    phase = self._phase_of(f"{shard}{'0' * 30}")
                    for start in range(0, max(len(shard_states), 1), 500):
                        self._reset_call(conn, [phase.anchor_key, *shard_states[start : start + 500]], phase)
            conn.recovered()
        except _FAULTS as exc:
            self._fault(conn, exc, "reset")

    def set_clock(self, clock: Clock) -> None:
        """Read time from ``clock`` (see the module doc for the two time modes) and reset everything."""
        self._use_clock(clock)
        if self._local is not None:
            self._local.set_clock(clock)
        self.reset()

    def __len__(self) -> int:
        """Client keys holding state in Redis now (a SCAN: O(keys), for housekeeping, not hot paths)."""
        try:
            return len(self._scan_keys())
        except _FAULTS:
            return 0

    def __contains__(self, key: object) -> bool:
        try:
            return bool(self._conn.sync.exists(self._state_key(key)))
        except _FAULTS:
            return False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, limit_for_period={self._limit}, "
            f"limit_refresh_period_ns={self._period}, url={redact_url(self._url)!r})"
        )


class RedisKeyedRateLimiter(KeyedRateLimiter):
    """A :class:`~django_ratelimit_r4.keyed.KeyedRateLimiter` on a :class:`RedisKeyedStore`: the name kept for
    code that builds one directly (``RedisKeyedRateLimiter(name, config, url=...)``). It only builds the store
    (:attr:`store_type`, from the keyword arguments; ``max_keys`` / ``idle_timeout_ns`` go to both); everything else is
    ``KeyedRateLimiter``'s. The registry builds a plain ``KeyedRateLimiter(..., store=...)`` over
    :meth:`RedisStore.keyed_store`.
    """

    #: The store this name builds (the GCRA, sliding-window and lease names set theirs).
    store_type: ClassVar[type[Any]] = RedisKeyedStore

    def __init__(
        self, name: str, config: RateLimiterConfig | None = None, *, clock: Clock | None = None, **options: Any
    ) -> None:
        clock = clock if clock is not None else SYSTEM_CLOCK
        bounds = {k: options.pop(k) for k in ("max_keys", "idle_timeout_ns") if k in options}
        store = self.store_type(name, config, clock=clock, **bounds, **options)
        super().__init__(name, config, clock=clock, store=store, **bounds)


# ------------------------------------------------------------------------------------- mixed all-or-nothing


def _entries_members(
    entries: Sequence[tuple[Any, str | None]], permits: int
) -> tuple[list[Any], list[_Member]]:
    owners: list[Any] = []
    targets: list[tuple[Any, str | None]] = []
    for limiter, key in entries:
        owners.append(limiter)
        if isinstance(limiter, RateLimiter):
            targets.append((limiter.backend, None))
        else:
            targets.append((limiter.store, key))
    leader = targets[0][0]
    if not isinstance(leader, _RedisCycleOps):
        raise TypeError(f"cannot combine {type(leader).__name__} with Redis limiters in one decision")
    return owners, _many_members(leader, targets, permits)


def _entries_outcome(
    owners: list[Any], outcome: tuple[int, int] | None, permits: int
) -> tuple[int, int] | None:
    if outcome is None:
        for owner in owners:
            if owner.events.wants_successful:
                owner._publish(SUCCESSFUL_ACQUIRE, permits)
        return None
    for owner in owners:
        refuse_never_grantable(owner, permits, 0)  # all-or-nothing decides with timeout 0
    loser = owners[outcome[0]]
    if loser.events.wants_failed:
        loser._publish(FAILED_ACQUIRE, permits)
    return outcome


_SCRIPTED: list[Any] = []


def _scripted() -> Any:
    """:mod:`.redis_scripted`, imported on first use (it imports this module) and then kept: an ``import``
    statement in a function runs the import machinery's lookup on every call (a few thousand instructions)."""
    if not _SCRIPTED:
        from . import redis_scripted

        _SCRIPTED.append(redis_scripted)
    return _SCRIPTED[0]


def _is_scripted(entries: Sequence[tuple[Any, str | None]]) -> bool:
    """True when every entry's algorithm is one with a script of its own (all GCRA, or all sliding window: see
    :mod:`.redis_scripted`, which decides them in one call of that script). Entries of several algorithms are
    split by algorithm (:func:`_split_many`)."""
    first = None
    for limiter, _ in entries:
        target = limiter.backend if isinstance(limiter, RateLimiter) else getattr(limiter, "store", limiter)
        script = getattr(target, "_script", None)
        if script is None or (first is not None and script is not first):
            return False  # a cycle limiter (the common case: at once), or several algorithms
        first = script
    return True


def acquire_all_keyed(
    entries: Sequence[tuple[RateLimiter | KeyedRateLimiter, str | None]], permits: int = 1
) -> tuple[int, int] | None:
    """All-or-nothing over Redis-backed ``(RateLimiter, None)`` and ``(KeyedRateLimiter, key)`` entries.

    Same contract as :func:`django_ratelimit_r4.keyed.acquire_all_keyed` (timeout 0; None when all granted,
    else ``(index of the rejecting entry with the largest wait, that wait)`` with nothing consumed), decided
    atomically by one script in one round trip when the limiters share an algorithm (and a cluster slot);
    limiters of several algorithms (or slots) are decided by one call per algorithm (and slot), all sent at
    once, and the granted calls are given back when another rejected (a second round trip, only then). Every
    entry must use the same Redis URL.
    """
    if not entries:
        return None
    if _is_scripted(entries):  # all GCRA or all sliding-window limiters: one call of their algorithm's script
        redis_scripted = _scripted()
        return redis_scripted.entries(redis_scripted.members_of(entries), permits)  # type: ignore[no-any-return]
    owners, members = _entries_members(entries, permits)
    leader = members[0].counter
    return _entries_outcome(owners, _many_result(members, _sync_many(leader, members, permits)), permits)


async def aacquire_all_keyed(
    entries: Sequence[tuple[RateLimiter | KeyedRateLimiter, str | None]], permits: int = 1
) -> tuple[int, int] | None:
    """Async twin of :func:`acquire_all_keyed` on ``redis.asyncio``."""
    if not entries:
        return None
    if _is_scripted(entries):  # all GCRA or all sliding-window limiters: one call of their algorithm's script
        redis_scripted = _scripted()
        return await redis_scripted.aentries(redis_scripted.members_of(entries), permits)  # type: ignore[no-any-return]
    owners, members = _entries_members(entries, permits)
    leader = members[0].counter
    return _entries_outcome(
        owners, _many_result(members, await _async_many(leader, members, permits)), permits
    )


def _quotas_outcome(
    entries: Sequence[tuple[Any, str | None]], permits: int, many: Any
) -> tuple[tuple[int, int] | None, list[tuple[int, int]]]:
    owners, members = _entries_members(entries, permits)
    reply, quotas = _split_quotas(members, many(members[0].counter, members, permits, b"M"))
    return _entries_outcome(owners, _many_result(members, reply), permits), quotas


def acquire_all_quotas(
    entries: Sequence[tuple[RateLimiter | KeyedRateLimiter, str | None]], permits: int = 1
) -> tuple[tuple[int, int] | None, list[tuple[int, int]]]:
    """:func:`acquire_all_keyed` whose one round trip also reads every entry's RateLimit figures after the
    decision: ``(outcome, [(remaining, reset_ns), ...])`` in entry order (``quota()``'s values, read at once)."""
    if entries and _is_scripted(entries):  # all GCRA or all sliding-window limiters: their algorithm's script
        redis_scripted = _scripted()
        return redis_scripted.entries_quotas(redis_scripted.members_of(entries), permits)  # type: ignore[no-any-return]
    return _quotas_outcome(entries, permits, _sync_many)


async def aacquire_all_quotas(
    entries: Sequence[tuple[RateLimiter | KeyedRateLimiter, str | None]], permits: int = 1
) -> tuple[tuple[int, int] | None, list[tuple[int, int]]]:
    """Async twin of :func:`acquire_all_quotas` on ``redis.asyncio``."""
    if entries and _is_scripted(entries):  # all GCRA or all sliding-window limiters: their algorithm's script
        redis_scripted = _scripted()
        return await redis_scripted.aentries_quotas(redis_scripted.members_of(entries), permits)  # type: ignore[no-any-return]
    owners, members = _entries_members(entries, permits)
    reply, quotas = _split_quotas(members, await _async_many(members[0].counter, members, permits, b"M"))
    return _entries_outcome(owners, _many_result(members, reply), permits), quotas


def _state_targets(entries: Sequence[tuple[Any, str | None]]) -> list[tuple[_RedisCycleOps, str]]:
    """Each Redis entry's limiter (backend or keyed store) and state key; all on one connection."""
    targets: list[tuple[_RedisCycleOps, str]] = []
    for limiter, key in entries:
        target: Any = limiter.backend if isinstance(limiter, RateLimiter) else limiter.store
        state: str | None = None
        if isinstance(target, RedisBackend):
            state = target.state_key
        elif isinstance(target, RedisKeyedStore) and key is not None:
            state = target._state_key(key)
        if state is None:
            raise TypeError(f"cannot read {limiter.name!r} (key {key!r}) with Redis limiters in one round trip")
        targets.append((target, state))
    conn = targets[0][0]._connection()
    if any(target._connection() is not conn for target, _ in targets):
        raise ValueError("all Redis limiters read at once must use the same Redis (URL and OPTIONS)")
    return targets


def _read_quotas_of(
    conn: RedisConnection, targets: list[tuple[_RedisCycleOps, str]], outcomes: list[tuple[Any, int, bool]],
    replies: int,
) -> tuple[list[tuple[int, int] | None], list[int]]:
    """Each target's ``(remaining, reset_ns)`` from its outcome (the fault policy's view for a failed read, the
    fault recorded once), and the indexes of LATE reads (None there: read again alone)."""
    quotas: list[tuple[int, int] | None] = []
    late: list[int] = []
    error: BaseException | None = None
    for index, ((target, state_key), outcome) in enumerate(zip(targets, outcomes, strict=True)):
        try:
            state = target._state_of(conn, state_key, outcome)
        except _Late:
            quotas.append(None)
            late.append(index)
            continue
        except _FAULTS as exc:
            error = error or exc
            state = target._fault_state(state_key)
        quotas.append(_quota(target._shown(state_key, state)))
    if error is not None:
        conn.fault(error, "state", replies)
    return quotas, late


def read_quotas(entries: Sequence[tuple[RateLimiter | KeyedRateLimiter, str | None]]) -> list[tuple[int, int]]:
    """Every entry's ``quota()`` figures ``(remaining, reset_ns)``, in entry order, read in ONE round trip.

    ``entries`` as :func:`acquire_all_keyed`'s (Redis limiters of one connection, any algorithms): each state
    read (op "s" of its algorithm's script) goes out in one write on one pooled connection (one per node on a
    cluster, all written before any reply is read); nothing is written in Redis. A mixed gate refused by an
    in-memory limit reads its Redis limits' figures for the 429 so (``keyed.acquire_all_quotas``). Under a
    fault, each figure is the fault policy's view, as ``quota()``'s; a LATE read (nothing to change anyway) is
    read again alone.
    """
    targets = _state_targets(entries)
    conn = targets[0][0]._connection()
    if conn.is_down():
        return [_quota(target._shown(state_key, target._fault_state(state_key))) for target, state_key in targets]
    replies = conn.replies
    calls = [target._state_call(state_key) for target, state_key in targets]
    try:
        outcomes = conn.run_scripts(SCRIPT_SHA, SCRIPT, [call for _, call in calls], [script for script, _ in calls])
    except _FAULTS as exc:  # no connection to be had: every read failed alike
        outcomes = [(exc, 0, False)] * len(calls)
    quotas, late = _read_quotas_of(conn, targets, outcomes, replies)
    for index in late:
        target, state_key = targets[index]
        quotas[index] = _quota(target._state_at(state_key))
    return quotas  # type: ignore[return-value]


async def aread_quotas(
    entries: Sequence[tuple[RateLimiter | KeyedRateLimiter, str | None]],
) -> list[tuple[int, int]]:
    """Async twin of :func:`read_quotas` on ``redis.asyncio`` (one write on one of this loop's connections)."""
    targets = _state_targets(entries)
    conn = targets[0][0]._connection()
    if conn.is_down():
        return [_quota(target._shown(state_key, target._fault_state(state_key))) for target, state_key in targets]
    replies = conn.replies
    calls = [target._state_call(state_key) for target, state_key in targets]
    try:
        outcomes = await conn.arun_scripts(
            SCRIPT_SHA, SCRIPT, [call for _, call in calls], [script for script, _ in calls]
        )
    except _FAULTS as exc:  # no connection to be had: every read failed alike
        outcomes = [(exc, 0, False)] * len(calls)
    quotas, late = _read_quotas_of(conn, targets, outcomes, replies)
    for index in late:
        target, state_key = targets[index]
        quotas[index] = _quota(await target._astate_at(state_key))
    return quotas  # type: ignore[return-value]


# --------------------------------------------------------------------------- fault policy "local", and the store


def _local_state(owner: _RedisCycleOps, state_key: str) -> tuple[int, int, int, int]:
    """The state4 of ``state_key`` in ``owner``'s in-process fallback (fault policy "local")."""
    local = owner._local
    if isinstance(local, owner._local_type):
        cycle, permissions, wait = local.state()
        _, reset_ns = local.quota()
    else:
        cycle, permissions, wait = local.state(state_key)
        _, reset_ns = local.quota(state_key)
    return cycle, permissions, wait, reset_ns


def _fault_reply(members: list[_Member], permits: int, op: bytes = b"m") -> Any:
    reply = _fault_many_reply(members, permits)
    if op == b"M":  # with the figures: each member's view under its fault policy, after the decision
        return reply, [_quota(m.counter._fault_state(m.state)) for m in members]
    return reply


def _fault_many_reply(members: list[_Member], permits: int) -> Any:
    """What an all-or-nothing decision Redis could not make answers: ``_FAULT`` (the first member's "open" or
    "closed" policy decides), or under "local" the in-process limiters' decision shaped as the script's reply.

    The local decision is all-or-nothing under the in-process limiters' locks (:func:`.memory.acquire_local_many`:
    every member peeked, all committed only when all grant), so a refused decision takes nothing from any member
    and nothing is given back: exact for every algorithm (it took each member's permits in turn and gave the
    earlier ones back, GCRA from the clock reading before its take: up to that interval less). A member on
    another policy is refused as "closed" (its own policy cannot be mixed in), after the members before it.
    """
    if members[0].counter._local is None:
        return _FAULT
    local: list[tuple[Any, str | None]] = []
    for member in members:
        owner = member.counter._local
        if owner is None:
            break
        # An unkeyed in-process limiter, or the keyed in-process store (keyed by the member's state key).
        local.append((owner, None if isinstance(owner, member.counter._local_type) else member.state))
    mixed = len(local) < len(members)
    outcome = acquire_local_many(local, permits, commit=not mixed) if local else None
    if outcome is None:
        if not mixed:
            return [0]
        outcome = (len(local), FAULT_RETRY_AFTER_NS)
    index, wait = outcome
    unit = members[index].counter._unit  # _many_result scales the script's wait by it: round up to it here
    return [index + 1, -(-wait // unit), index + 1]


#: The all-or-nothing decider of every Redis limiter (``_RedisCycleOps.all_or_nothing``): this module.
_THIS_MODULE = sys.modules[__name__]

#: ``on_backend_error`` (the setting's words) -> the Redis backend's fault policy (defined in .base).
_ON_ERROR_POLICY = FAULT_POLICY_OF


class RedisStore:
    """``{"BACKEND": "redis", "LOCATION": url, "OPTIONS": {...}}``: rate limiters naming it share their budgets
    through Redis (a :class:`~.base.Store`).

    ``OPTIONS``: ``key_prefix`` (default ``"r4"``) and the connection's ``socket_timeout``,
    ``socket_connect_timeout``, ``max_connections`` and ``timeout`` (pool wait), timeouts in seconds. Stores
    with the same URL and connection options share one :class:`RedisConnection` per process (and its fault
    state). An instance's ``on_backend_error`` picks the fault policy: ``"local"`` (default), ``"allow"``,
    ``"deny"``.
    """

    per_process = False

    def __init__(self, alias: str, location: str | None, options: Mapping[str, Any] | None = None) -> None:
        if not location:
            raise ValueError(f"redis backend {alias!r} needs a LOCATION (a redis:// URL)")
        self.alias = alias
        self.url = location
        self.prefix: str
        #: The redis-py pool options (timeouts in seconds, max_connections).
        self.connection_options: Mapping[str, Any]
        self.prefix, self.connection_options = store_options(options)

    def backend_factory(self, on_error: str | None, *, lease: int | None = None) -> BackendFactory:
        """A factory of :class:`RedisBackend` on this store's connection, with ``on_error``'s fault policy; with
        ``lease`` (the instance option) a :class:`~.redis_lease.RedisLeaseBackend`'s, leasing that many permits
        per round trip."""
        if lease is not None:
            from .redis_lease import redis_lease_backend  # imported only when an instance leases

            leased: BackendFactory = redis_lease_backend(
                self.url,
                lease=lease,
                prefix=self.prefix,
                fault_policy=_ON_ERROR_POLICY[on_error],
                connection_options=self.connection_options,
            )
            return leased
        factory: BackendFactory = redis_backend(
            self.url,
            prefix=self.prefix,
            fault_policy=_ON_ERROR_POLICY[on_error],
            connection_options=self.connection_options,
        )
        return factory

    def keyed_store(
        self,
        name: str,
        config: Any,
        *,
        clock: Clock,
        max_keys: int,
        idle_timeout_ns: int | None,
        on_error: str | None,
        lease: int | None = None,
    ) -> RedisKeyedStore:
        """A :class:`RedisKeyedStore` (GCRA's, the sliding window's, for their ``algorithm``; a
        :class:`~.redis_lease.RedisLeaseKeyedStore` with ``lease``, the instance option) on this store's
        connection, with ``on_error``'s fault policy (``max_keys`` / ``idle_timeout_ns`` bound its "local"
        fallback)."""
        cls: Any = RedisKeyedStore
        algorithm = getattr(config, "algorithm", "cycle")
        if lease is not None:  # conf allows a lease with algorithm "cycle" only (ratelimit_r4.E031)
            from .redis_lease import RedisLeaseKeyedStore  # imported only when an instance leases

            return self._keyed(  # type: ignore[no-any-return]
                RedisLeaseKeyedStore, name, config, clock=clock, max_keys=max_keys,
                idle_timeout_ns=idle_timeout_ns, on_error=on_error, lease=lease,
            )
        if algorithm == "gcra":
            from .redis_gcra import RedisGcraKeyedStore as cls
        elif algorithm == "sliding_window":
            from .redis_sliding import RedisSlidingKeyedStore as cls
        return self._keyed(  # type: ignore[no-any-return]
            cls, name, config, clock=clock, max_keys=max_keys, idle_timeout_ns=idle_timeout_ns, on_error=on_error
        )

    def _keyed(
        self,
        cls: Any,
        name: str,
        config: Any,
        *,
        clock: Clock,
        max_keys: int,
        idle_timeout_ns: int | None,
        on_error: str | None,
        **extra: Any,
    ) -> Any:
        # A keyed store of class ``cls`` on this store's connection, with on_error's fault policy and ``extra``
        # keyword arguments (a lease).
        return cls(
            name,
            config,
            clock=clock,
            url=self.url,
            prefix=self.prefix,
            fault_policy=_ON_ERROR_POLICY[on_error],
            max_keys=max_keys,
            idle_timeout_ns=idle_timeout_ns,
            connection_options=self.connection_options,
            **extra,
        )

    def bulkhead(
        self, name: str, config: Any, *, clock: Clock, lease_ttl_ns: int, on_error: str | None
    ) -> Any:
        """A cluster-wide :class:`~.redis_bulkhead.RedisBulkhead` on this store's connection."""
        from .redis_bulkhead import RedisBulkhead  # imported only when a bulkhead names this store

        return RedisBulkhead(
            name,
            config,
            url=self.url,
            prefix=self.prefix,
            lease_ttl=lease_ttl_ns,
            fault_policy=_ON_ERROR_POLICY[on_error],
            clock=clock,
            connection_options=self.connection_options,
        )

    def circuit_breaker(self, name: str, config: Any, *, clock: Clock) -> Any:
        """A cluster-wide :class:`~.redis_breaker.RedisCircuitBreaker` on this store's connection."""
        from .redis_breaker import RedisCircuitBreaker  # imported only when a breaker names this store

        return RedisCircuitBreaker(
            name,
            config,
            url=self.url,
            prefix=self.prefix,
            clock=clock,
            connection_options=self.connection_options,
            backend=self.alias,
        )

    def __repr__(self) -> str:
        return f"RedisStore({self.alias!r}, url={redact_url(self.url)!r}, prefix={self.prefix!r})"
