"""A bulkhead whose ``max_concurrent_calls`` slots are shared by every process on every host, through Redis.

"At most 500 concurrent calls from all our instances to the partner": :class:`RedisBulkhead` has
:class:`~django_ratelimit_r4.core.bulkhead.Bulkhead`'s interface (acquire/try/release, ``on_complete``, sync and
async context managers, ``call``/``acall``/``decorate``, events, metrics, :class:`BulkheadFull`), so the
decorators use it unchanged, but its slots live in Redis (``lua/bulkhead.lua``):

* A slot is a **lease**: a member of a sorted set scored by its expiry in server time (``TIME``). Acquiring is
  one script (drop expired leases, count, add if below the limit and nobody queues). A background thread per
  bulkhead and process renews every live lease of that process in ONE script every ``lease_ttl / 3``, so a
  worker killed mid-call (``kill -9``) gives its slots back at most ``lease_ttl`` later.
* **Waiting** (``max_wait_duration``) never polls: a caller that finds no slot joins a FIFO queue in Redis in the
  same script; a release (or a renewal that finds expired leases) hands the slot straight to the oldest waiter
  still within its budget and pushes its lease id on a per-process wake list, on which that process's thread
  blocks (``BLPOP``) and wakes the local thread or task. A waiter that runs out of budget takes itself out of
  the queue in one script (which also tells it if the slot arrived meanwhile: nothing leaks).
* Costs: one round trip per acquire and per release; a waiter adds at most one (its give-up); each process
  adds one renewal script every ``lease_ttl / 3`` while it holds a lease or waits.

Permits of one process are interchangeable: a release gives back any one slot this process holds (so
``acquire_permission`` and ``on_complete`` may run in different threads, like the in-process bulkhead).

Faults (Redis unreachable, an error, a timeout): never raised. ``fault_policy="local"`` (default) falls back
to an in-process :class:`Bulkhead` with the same config, so each process keeps at most
``max_concurrent_calls`` (the cluster may then run up to that times the number of processes); ``"open"``
grants; ``"closed"`` rejects. A release that fails is retried by the renewal thread until Redis answers
(the lease, no longer renewed, expires after ``lease_ttl`` at the latest). The cool-down of the shared
:class:`~.redis.RedisConnection` applies.

Guarantee: never more than ``max_concurrent_calls`` leases alive at once. A process that cannot renew for
``lease_ttl`` (stopped, paused, cut off from Redis) loses its leases while its calls may still run: those
are counted in ``metrics.lost_leases`` and the cluster may exceed the limit by them until they finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import math
import os
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any, ParamSpec, TypeVar

import redis
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from ..core.bulkhead import (
    CALL_FINISHED,
    CALL_PERMITTED,
    CALL_REJECTED,
    Bulkhead,
    BulkheadConfig,
    BulkheadEvent,
    BulkheadEvents,
)
from ..core.clock import SYSTEM_CLOCK, Clock
from ..core.config import InvalidValue
from ..core.exceptions import BulkheadFull
from .base import DEFAULT_LEASE_TTL, FAULT_POLICIES, MIN_LEASE_TTL, check_fault_policy, lease_ttl_value
from .redis import (
    _CALL_LOOPS,
    CONNECT_TIMEOUT_S,
    DEFAULT_PREFIX,
    FAULT_COOLDOWN_S,
    LostCancellation,
    RedisConnection,
    _name_part,
    await_call_thread,
    call_thread_submit,
    connection,
)

__all__ = [
    "BULKHEAD_FAULT_POLICIES",
    "BULKHEAD_SCRIPT",
    "DEFAULT_LEASE_TTL",
    "MIN_LEASE_TTL_NS",
    "RedisBulkhead",
    "RedisBulkheadMetrics",
]

logger = logging.getLogger("django_ratelimit_r4.redis")

# DEFAULT_LEASE_TTL, MIN_LEASE_TTL and the lease_ttl rule are in .base (conf checks them without redis).
#: The shortest lease TTL accepted, in ns: renewals run every third of it.
MIN_LEASE_TTL_NS = int(MIN_LEASE_TTL)
#: ``"local"``: an in-process bulkhead decides while Redis is unreachable; ``"open"`` grants; ``"closed"`` rejects.
BULKHEAD_FAULT_POLICIES = FAULT_POLICIES

#: The Lua source of the bulkhead operations.
BULKHEAD_SCRIPT = (resources.files(__package__) / "lua" / "bulkhead.lua").read_text(encoding="utf-8")
_SHA = hashlib.sha1(BULKHEAD_SCRIPT.encode("utf-8")).hexdigest()
# RedisClusterException is not a RedisError: redis-py raises it when no node of a cluster answers (learning the
# topology again) or a slot has no owner. A fault like any other: the fault policy decides, never a 500.
_FAULTS = (RedisError, OSError, RedisClusterException)
_GRANTED, _REJECTED, _QUEUED = 1, 0, 2

P = ParamSpec("P")
R = TypeVar("R")


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Waiter:
    """A caller parked in this process until its queued lease is granted (``granted`` set under the lock)."""

    __slots__ = ("future", "granted", "lock", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.granted = False
        self.loop = loop
        self.lock: threading.Lock | None = None
        self.future: asyncio.Future[None] | None = None
        if loop is None:
            self.lock = threading.Lock()
            self.lock.acquire()
        else:
            self.future = loop.create_future()

    def wake(self) -> bool:
        """Wake the caller; False if it can never run again (its event loop is closed)."""
        if self.lock is not None:
            self.lock.release()
            return True
        assert self.loop is not None and self.future is not None
        try:
            self.loop.call_soon_threadsafe(_resolve, self.future)
        except RuntimeError:
            return False
        return True


class RedisBulkheadMetrics:
    """Live numbers of one :class:`RedisBulkhead`: this process's, plus the cluster count last seen."""

    __slots__ = ("_b",)

    def __init__(self, bulkhead: RedisBulkhead) -> None:
        self._b = bulkhead

    @property
    def available_concurrent_calls(self) -> int:
        """Free slots cluster-wide, as of the latest reply from Redis (no round trip)."""
        return max(0, self._b._max - self._b._cluster)

    @property
    def max_allowed_concurrent_calls(self) -> int:
        """The configured ``max_concurrent_calls`` (cluster-wide)."""
        return self._b._max

    @property
    def cluster_concurrent_calls(self) -> int:
        """Leases alive in the whole cluster, as of the latest reply from Redis (no round trip)."""
        return self._b._cluster

    @property
    def concurrent_calls(self) -> int:
        """Permits held by this process (leases, fault-policy permits, and lost leases still running)."""
        b = self._b
        return len(b._live) + b._lost + b._open + b._local_held

    @property
    def waiting_calls(self) -> int:
        """Callers of this process waiting in the cluster-wide queue."""
        return len(self._b._waiters)

    @property
    def permitted_calls(self) -> int:
        """Cumulative count of calls of this process that got a permit."""
        return self._b._permitted

    @property
    def rejected_calls(self) -> int:
        """Cumulative count of calls of this process refused."""
        return self._b._rejected

    @property
    def finished_calls(self) -> int:
        """Cumulative count of :meth:`RedisBulkhead.on_complete` calls in this process."""
        return self._b._finished

    @property
    def lost_leases(self) -> int:
        """Leases of this process found expired at renewal while their call still ran (renewal came too late)."""
        return self._b._lost_total

    @property
    def fault_decisions(self) -> int:
        """Decisions made by the fault policy because Redis did not answer."""
        return self._b._faults


_instances: weakref.WeakSet[RedisBulkhead] = weakref.WeakSet()


def _after_fork() -> None:
    # A child holds none of its parent's leases and has no renewal thread.
    for bulkhead in list(_instances):
        bulkhead._fresh_process()


os.register_at_fork(after_in_child=_after_fork)


class RedisBulkhead:
    """:class:`~django_ratelimit_r4.core.bulkhead.Bulkhead` with slots shared cluster-wide through Redis.

    ``url``: the Redis URL (its connection pool is shared with the rate limiters of that URL). ``prefix``: of
    every key (the keys of bulkhead ``name`` are ``<prefix>:bh:{<name>}:...``, one hash slot).
    ``lease_ttl``: how long a lease lives without renewal (default :data:`DEFAULT_LEASE_TTL`; at least
    :data:`MIN_LEASE_TTL_NS`). ``fault_policy``: one of :data:`BULKHEAD_FAULT_POLICIES`. ``clock`` is
    accepted for symmetry and unused: waits and leases run on Redis server time and real time.
    ``connection_options``: redis-py pool options, as a backend's ``OPTIONS`` (see :func:`~.redis.connection`).

    In settings: ``"backend": "<alias>"`` on a bulkhead instance, ``RATELIMIT_R4["backends"][alias]`` a redis
    backend, with ``lease_ttl`` and ``on_backend_error`` (``"local"``, ``"allow"``, ``"deny"``).

    From async code use the async forms (``async with``, ``acall``, ``aacquire_permission`` with
    ``aon_complete``): the sync ``on_complete`` makes a blocking round trip.
    """

    def __init__(
        self,
        name: str,
        config: BulkheadConfig | None = None,
        *,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        lease_ttl: Any = DEFAULT_LEASE_TTL,
        fault_policy: str = "local",
        clock: Clock | None = None,
        connection_options: Mapping[str, Any] | None = None,
    ) -> None:
        check_fault_policy(fault_policy)
        try:
            ttl_ns = int(lease_ttl_value(lease_ttl))
        except InvalidValue as exc:
            raise ValueError(f"lease_ttl {exc.message}") from None
        self.name = name
        self.url = url
        self.connection_options: Mapping[str, Any] = dict(connection_options or {})
        self.prefix = prefix
        self.fault_policy = fault_policy
        self.clock = clock if clock is not None else SYSTEM_CLOCK
        self.lease_ttl_ns = ttl_ns
        self._ttl_ms = max(1, ttl_ns // 1_000_000)
        self._renew_every_s = ttl_ns / 3e9
        base = f"{prefix}:bh:{{{_name_part(name)}}}"
        self._base = base
        self._keys = [f"{base}:leases", f"{base}:queue", f"{base}:waiters", f"{base}:seq", f"{base}:stats"]
        self.events = BulkheadEvents()
        self.metrics = RedisBulkheadMetrics(self)
        self._lock = threading.Lock()
        self._permitted = self._rejected = self._finished = self._faults = self._lost_total = 0
        self._cluster = 0
        self._apply(config if config is not None else BulkheadConfig())
        self._fresh_process()
        _instances.add(self)

    def _apply(self, config: BulkheadConfig) -> None:
        self.config = config
        self._max: int = config.max_concurrent_calls
        self._wait_ns: int = int(config.max_wait_duration)
        self._wait_ms = math.ceil(self._wait_ns / 1_000_000)
        self._local = Bulkhead(self.name, config)

    def _fresh_process(self) -> None:
        """Forget this process's holdings (after a fork the parent keeps them, and renews them)."""
        self._lock = threading.Lock()
        self._connection: RedisConnection | None = None
        self._proc = uuid.uuid4().hex[:16]
        self._ids = itertools.count(1)
        self._wake_key = f"{self._base}:wake:{self._proc}"
        self._live: set[str] = set()
        self._waiters: dict[str, _Waiter] = {}
        # Lease ids of interrupted waiters: the thread cancels them (and releases what was granted).
        self._pending: list[str] = []
        self._lost = self._open = self._local_held = 0
        self._local = Bulkhead(self.name, self.config)
        self._thread: threading.Thread | None = None
        self._work = threading.Event()
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"RedisBulkhead({self.name!r}, held={self.metrics.concurrent_calls}, "
            f"cluster={self._cluster}/{self._max}, waiting={len(self._waiters)})"
        )

    @property
    def _conn(self) -> RedisConnection:
        conn = self._connection  # looked up once per process: no per-call hashing of the options
        if conn is None:
            conn = self._connection = connection(self.url, self.connection_options)
        return conn

    # -- permits ---------------------------------------------------------------------------------

    def try_acquire_permission(self) -> bool:
        """Take a cluster-wide slot, waiting up to ``max_wait_duration`` (this thread only). False if none came."""
        ok = self._acquire()
        if self.events.has_listeners:
            self._emit(CALL_PERMITTED if ok else CALL_REJECTED)
        return ok

    async def atry_acquire_permission(self) -> bool:
        """Async twin of :meth:`try_acquire_permission` on ``redis.asyncio``: never blocks the loop."""
        ok = await self._aacquire()
        if self.events.has_listeners:
            self._emit(CALL_PERMITTED if ok else CALL_REJECTED)
        return ok

    def acquire_permission(self) -> None:
        """Like :meth:`try_acquire_permission` but raise :class:`BulkheadFull` when no slot came."""
        if not self.try_acquire_permission():
            raise BulkheadFull(self)  # type: ignore[arg-type]

    async def aacquire_permission(self) -> None:
        """Like :meth:`atry_acquire_permission` but raise :class:`BulkheadFull` when no slot came."""
        if not await self.atry_acquire_permission():
            raise BulkheadFull(self)  # type: ignore[arg-type]

    def release_permission(self) -> None:
        """Give back a permit that was acquired but not used (no event, not counted as finished)."""
        self._release()

    async def arelease_permission(self) -> None:
        """Async twin of :meth:`release_permission`."""
        await self._arelease()

    def on_complete(self) -> None:
        """Give back the permit of a finished call and publish ``CALL_FINISHED`` (one round trip)."""
        with self._lock:
            self._finished += 1
        self._release()
        if self.events.has_listeners:
            self._emit(CALL_FINISHED)

    async def aon_complete(self) -> None:
        """Async twin of :meth:`on_complete`."""
        with self._lock:
            self._finished += 1
        await self._arelease()
        if self.events.has_listeners:
            self._emit(CALL_FINISHED)

    # -- context managers and decorators ---------------------------------------------------------

    def __enter__(self) -> RedisBulkhead:
        self.acquire_permission()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.on_complete()

    async def __aenter__(self) -> RedisBulkhead:
        await self.aacquire_permission()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.aon_complete()

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` holding a slot; raise :class:`BulkheadFull` if none came."""
        self.acquire_permission()
        try:
            return fn(*args, **kwargs)
        finally:
            self.on_complete()

    async def acall(self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Await ``fn(*args, **kwargs)`` holding a slot; raise :class:`BulkheadFull` if none came."""
        await self.aacquire_permission()
        try:
            return await fn(*args, **kwargs)
        finally:
            await self.aon_complete()

    #: Wrap ``fn`` (sync or ``async def``) so each call runs through :meth:`call` / :meth:`acall`: the
    #: in-process bulkhead's wrapper, which needs nothing but those two methods.
    decorate = Bulkhead.decorate

    # -- configuration and lifecycle -------------------------------------------------------------

    def change_config(self, new_config: BulkheadConfig) -> None:
        """Swap the config. The cluster limit is the one sent by each acquire: give every process the same."""
        if not isinstance(new_config, BulkheadConfig):
            raise TypeError(f"expected a BulkheadConfig, got {type(new_config).__name__}")
        self._apply(new_config)

    def set_clock(self, clock: Clock) -> None:
        """Accepted for symmetry with :class:`Bulkhead`: leases and waits use server time and real time."""
        self.clock = clock

    def reset(self) -> None:
        """Zero this process's counters and delete the shared state (every lease, cluster-wide). For tests
        (``r4_clock`` and ``r4_reset`` call it); never raises: with Redis unreachable only this process resets."""
        self._permitted = self._rejected = self._finished = self._faults = self._lost_total = 0
        with self._lock:
            self._live.clear()
            self._lost = self._open = self._local_held = 0
        self._local.reset()
        self._cluster = 0
        try:
            self._conn.sync.delete(*self._keys)
        except _FAULTS as exc:
            self._conn.fault(exc, f"bulkhead {self.name!r} reset")

    def cluster_concurrent_calls(self) -> int:
        """Leases alive in the whole cluster now (one round trip; a fault raises)."""
        return self.cluster_counts()[0]

    def cluster_counts(self) -> tuple[int, int]:
        """``(leases alive in the whole cluster now, leases that ever expired unreleased)`` in one round trip.

        An expired lease is a slot given back by its TTL: a worker killed or stalled mid-call. A fault raises.
        """
        reply = self._eval(self._conn.sync, "count")
        self._cluster = alive = int(reply[0])
        # Every lease ever granted was released, is alive, or was given back by its TTL.
        return alive, max(0, int(reply[1]) - int(reply[2]) - alive)

    def close(self) -> None:
        """Give back every lease this process holds and stop the renewal thread (for shutdown and tests)."""
        self._closed = True
        self._work.set()
        with self._lock:
            leases, self._live = list(self._live), set()
            thread = self._thread
        with contextlib.suppress(*_FAULTS):
            if leases:
                self._eval(self._conn.sync, "release", *leases)
            if thread is not None and thread.is_alive():
                # Ends the thread's BLPOP now. A thread not in BLPOP (idle, waiting for work) never pops it:
                # the list expires like the grants pushed on it, instead of staying in Redis for ever.
                poke = self._conn.sync.pipeline(transaction=False)  # one key: one node, one write
                poke.rpush(self._wake_key, "")
                poke.pexpire(self._wake_key, self._ttl_ms)
                poke.execute()
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._renew_every_s + 1.0)

    # -- internals -------------------------------------------------------------------------------

    def _emit(self, event_type: str) -> None:
        self.events.publish(BulkheadEvent(event_type, self.name))

    def _args(self, op: str, *rest: Any) -> list[Any]:
        return [*self._keys, op, self._max, self._ttl_ms, *rest]

    def _eval(self, client: redis.Redis, op: str, *rest: Any) -> Any:
        args = self._args(op, *rest)
        try:
            return client.evalsha(_SHA, len(self._keys), *args)
        except NoScriptError:
            return client.eval(BULKHEAD_SCRIPT, len(self._keys), *args)

    async def _aeval(self, op: str, *rest: Any) -> Any:
        # Through RedisConnection.areply: a cancellation the client lost during the call still cancels
        # (LostCancellation, with the reply); every caller below gives back what that reply granted.
        if _CALL_LOOPS:  # an async view under WSGI: the request's thread, on the sync pool
            done = call_thread_submit(lambda: self._eval(self._conn.sync, op, *rest))
            if done is not None:
                return await await_call_thread(done)
        return await self._conn.areply(self._aeval_once(op, *rest))

    async def _aeval_once(self, op: str, *rest: Any) -> Any:
        client = self._conn.aio()
        args = self._args(op, *rest)
        try:
            return await client.evalsha(_SHA, len(self._keys), *args)
        except NoScriptError:
            return await client.eval(BULKHEAD_SCRIPT, len(self._keys), *args)

    def _new_id(self) -> str:
        return f"{self._proc}:{next(self._ids)}"

    def _hold(self, lease: str) -> None:
        with self._lock:
            self._live.add(lease)
            self._permitted += 1
            start = self._thread is None
        if start:
            self._start_thread()
        self._work.set()

    def _park(self, lease: str, waiter: _Waiter) -> None:
        with self._lock:
            self._waiters[lease] = waiter
            start = self._thread is None
        if start:
            self._start_thread()
        self._work.set()

    def _unpark(self, lease: str) -> None:
        with self._lock:
            self._waiters.pop(lease, None)

    def _reject(self) -> bool:
        with self._lock:
            self._rejected += 1
        return False

    def _granted_while_waiting(self, lease: str, waiter: _Waiter) -> bool | None:
        """True if the grant reached the waiter; else it is unparked (later grants are ignored) and None."""
        with self._lock:
            if waiter.granted:
                self._permitted += 1
                return True
            self._waiters.pop(lease, None)
        return None

    def _after_cancel(self, lease: str, reply: Any) -> bool:
        self._cluster = int(reply[1])
        if reply[0] == 1:  # the slot arrived between our give-up and the script: keep it
            self._hold(lease)
            return True
        return self._reject()

    def _interrupted(self, lease: str) -> None:
        """An interrupted wait (KeyboardInterrupt, cancellation) keeps nothing: the thread cancels/releases."""
        with self._lock:
            self._rejected += 1
            self._waiters.pop(lease, None)
            self._live.discard(lease)
            self._pending.append(lease)
        self._work.set()
        if self.events.has_listeners:
            self._emit(CALL_REJECTED)

    def _fallback(self) -> bool:
        with self._lock:
            self._faults += 1
        if self.fault_policy == "open":
            with self._lock:
                self._open += 1
                self._permitted += 1
            return True
        if self.fault_policy == "closed":
            return self._reject()
        if self._local.try_acquire_permission():
            with self._lock:
                self._local_held += 1
                self._permitted += 1
            return True
        return self._reject()

    async def _afallback(self) -> bool:
        if self.fault_policy != "local":
            return self._fallback()
        with self._lock:
            self._faults += 1
        if await self._local.atry_acquire_permission():
            with self._lock:
                self._local_held += 1
                self._permitted += 1
            return True
        return self._reject()

    def _acquire(self) -> bool:
        conn = self._conn
        if conn.is_down():
            return self._fallback()
        lease = self._new_id()
        waiter = None
        if self._wait_ms > 0:
            waiter = _Waiter(None)
            self._park(lease, waiter)  # before the script: the grant may come before its reply
        try:
            reply = self._eval(conn.sync, "acquire", lease, self._wait_ms, self._wake_key)
        except _FAULTS as exc:
            self._unpark(lease)
            conn.fault(exc, f"bulkhead {self.name!r} acquire")
            return self._fallback()
        status, self._cluster = int(reply[0]), int(reply[1])
        if status != _QUEUED:
            self._unpark(lease)
            if status == _GRANTED:
                self._hold(lease)
                return True
            return self._reject()
        assert waiter is not None and waiter.lock is not None
        try:
            waiter.lock.acquire(True, min(self._wait_ns / 1e9, threading.TIMEOUT_MAX))
        except BaseException:
            self._interrupted(lease)
            raise
        if self._granted_while_waiting(lease, waiter):
            return True
        try:
            reply = self._eval(conn.sync, "cancel", lease)
        except _FAULTS as exc:
            conn.fault(exc, f"bulkhead {self.name!r} give-up")
            return self._reject()  # a slot granted meanwhile is not renewed: it expires after lease_ttl
        return self._after_cancel(lease, reply)

    async def _aacquire(self) -> bool:
        conn = self._conn
        if conn.is_down():
            return await self._afallback()
        lease = self._new_id()
        waiter = None
        loop = asyncio.get_running_loop()
        if self._wait_ms > 0:
            waiter = _Waiter(loop)
            self._park(lease, waiter)
        try:
            reply = await self._aeval("acquire", lease, self._wait_ms, self._wake_key)
        except _FAULTS as exc:
            self._unpark(lease)
            conn.fault(exc, f"bulkhead {self.name!r} acquire")
            return await self._afallback()
        except BaseException:
            # Cancelled: the script may have run (a LostCancellation says it did): a slot granted to nobody
            # goes back.
            self._interrupted(lease)
            raise
        status, self._cluster = int(reply[0]), int(reply[1])
        if status != _QUEUED:
            self._unpark(lease)
            if status == _GRANTED:
                self._hold(lease)
                return True
            return self._reject()
        assert waiter is not None and waiter.future is not None
        timer = loop.call_later(self._wait_ns / 1e9, _resolve, waiter.future)
        try:
            await waiter.future
        except BaseException:
            self._interrupted(lease)
            raise
        finally:
            timer.cancel()
        if self._granted_while_waiting(lease, waiter):
            return True
        try:
            reply = await self._aeval("cancel", lease)
        except _FAULTS as exc:
            conn.fault(exc, f"bulkhead {self.name!r} give-up")
            return self._reject()
        except BaseException:
            self._interrupted(lease)
            raise
        return self._after_cancel(lease, reply)

    def _take_hold(self) -> str | None:
        """Which permit a release gives back: any one of this process's (they are interchangeable).

        Permits Redis does not count (lost leases, "open" grants) go first, so the cluster's count is
        right again as soon as possible; ``""`` means nothing to tell Redis.
        """
        with self._lock:
            if self._lost:
                self._lost -= 1
                return ""
            if self._open:
                self._open -= 1
                return ""
            if self._live:
                return self._live.pop()
            if self._local_held:
                self._local_held -= 1
                local = True
            else:
                return None  # nothing held (a release without an acquire): ignored like Bulkhead
        if local:
            self._local.release_permission()
        return ""

    def _defer(self, lease: str) -> None:
        """Leave a release to the renewal thread (it retries until Redis answers; the lease is no longer
        renewed, so it expires after ``lease_ttl`` at the latest)."""
        with self._lock:
            self._pending.append(lease)
        self._work.set()

    def _release(self) -> None:
        lease = self._take_hold()
        if not lease:
            return
        conn = self._conn
        if conn.is_down():
            self._defer(lease)
            return
        try:
            reply = self._eval(conn.sync, "release", lease)
        except _FAULTS as exc:
            conn.fault(exc, f"bulkhead {self.name!r} release")
            self._defer(lease)
            return
        self._cluster = int(reply[1])

    async def _arelease(self) -> None:
        lease = self._take_hold()
        if not lease:
            return
        conn = self._conn
        if conn.is_down():
            self._defer(lease)
            return
        try:
            reply = await self._aeval("release", lease)
        except _FAULTS as exc:
            conn.fault(exc, f"bulkhead {self.name!r} release")
            self._defer(lease)
            return
        except LostCancellation as lost:
            self._cluster = int(lost.reply[1])  # released: the reply came back, only the caller was cancelled
            raise
        except BaseException:
            self._defer(lease)  # cancelled mid-release: the thread makes sure it is given back
            raise
        self._cluster = int(reply[1])

    # -- the renewal thread: renews leases, receives grants, cleans up after interrupted waiters ----

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"r4-bulkhead-{self.name}", daemon=True, args=(self._proc,)
            )
        self._thread.start()

    def _busy(self) -> bool:
        return bool(self._live or self._waiters or self._pending)

    def _run(self, proc: str) -> None:
        # A client of its own: BLPOP holds its connection for up to a renewal interval.
        # Connects lazily (per command, from a pool of its own): Redis may be down when the thread starts.
        conn = self._conn
        if conn.cluster or conn.sentinel is not None:
            client = conn.new_client(socket_timeout=self._renew_every_s + 5.0, max_connections=2)
        else:
            client = redis.Redis.from_url(
                self.url,
                socket_timeout=self._renew_every_s + 5.0,
                socket_connect_timeout=self.connection_options.get("socket_connect_timeout", CONNECT_TIMEOUT_S),
                max_connections=2,
            )
        next_renew = time.monotonic() + self._renew_every_s
        try:
            while not self._closed and proc == self._proc:
                if not self._busy():
                    self._work.clear()
                    if not self._busy():
                        self._work.wait()
                        # Idle meant no lease: whatever is held now was just taken with a full TTL.
                        next_renew = time.monotonic() + self._renew_every_s
                        continue
                try:
                    self._cleanup(client)
                    left = next_renew - time.monotonic()
                    if left > 0.001:
                        item = client.blpop([self._wake_key], timeout=left)
                        if item is not None and item[1]:
                            self._grant(item[1].decode() if isinstance(item[1], bytes) else item[1])
                    if time.monotonic() >= next_renew:
                        self._renew(client)
                        next_renew = time.monotonic() + self._renew_every_s
                    self._cleanup(client)
                except _FAULTS as exc:
                    conn.fault(exc, f"bulkhead {self.name!r} lease renewal")
                    time.sleep(FAULT_COOLDOWN_S)
                except Exception:  # never let the thread die: the leases of every call would expire
                    logger.exception("bulkhead %r: the lease renewal thread failed; retrying", self.name)
                    time.sleep(FAULT_COOLDOWN_S)
        finally:
            client.close()

    def _grant(self, lease: str) -> None:
        with self._lock:
            waiter = self._waiters.pop(lease, None)
            if waiter is None:
                return  # its caller gave up; its give-up script told it whether it holds the slot
            waiter.granted = True
            self._live.add(lease)
        if not waiter.wake():
            with self._lock:  # nobody will ever use or release it: give it back now
                self._live.discard(lease)
                self._pending.append(lease)

    def _renew(self, client: redis.Redis) -> None:
        with self._lock:
            leases = list(self._live)
        reply = self._eval(client, "renew", *leases)
        self._cluster = int(reply[0])
        lost = [x.decode() for x in reply[1:]]
        if lost:
            with self._lock:
                for lease in lost:
                    if lease in self._live:
                        self._live.discard(lease)
                        self._lost += 1
                        self._lost_total += 1
            logger.warning(
                "bulkhead %r: %d lease(s) of this process expired before renewal (stalled longer than "
                "lease_ttl); the cluster may exceed max_concurrent_calls until those calls finish",
                self.name,
                len(lost),
            )

    def _cleanup(self, client: redis.Redis) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        while pending:
            lease = pending[-1]
            try:
                reply = self._eval(client, "cancel", lease)
                if reply[0] == 1:
                    reply = self._eval(client, "release", lease)
            except BaseException:
                with self._lock:  # retried at the next turn (Redis may be down)
                    self._pending.extend(pending)
                raise
            pending.pop()
            self._cluster = int(reply[1])
