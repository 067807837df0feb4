"""A circuit breaker whose state is shared by every process on every host, through Redis.

:class:`RedisCircuitBreaker` is a :class:`~django_ratelimit_r4.core.circuitbreaker.CircuitBreaker` (same
``call``/``acall``/``decorate``, manual protocol, ``state``, ``transition_to_*``, events, metrics), so the
decorators, ``get_circuit_breaker(name)``, ``r4 transition`` and the 503 with Retry-After use it unchanged.
The state machine still runs in each process; what is shared is its *transitions*:

* **CLOSED decides locally.** A call in CLOSED (or DISABLED, METRICS_ONLY), and a rejection in OPEN before
  its deadline or in FORCED_OPEN, makes no round trip. Each process keeps its own sliding window; when its
  failure (or slow-call) rate crosses the threshold, the transition is written to Redis with a
  compare-and-set on the state's *epoch* (``lua/breaker.lua``), so two processes opening at once make one
  transition, and published on a channel.
* **Every process follows.** A listener thread per breaker and process (started at first use, again in a
  forked child) is subscribed to the channel and installs every transition made elsewhere, with the remaining
  open time, usually within a millisecond or two (``benchmarks/bench_breaker_propagation.py``). The stored
  state (with its open-until time in server time) is read at first use and after every reconnection, so a
  worker started later starts in the current state.
* **Half-open is cluster-wide.** Leaving OPEN and every trial call go through Redis: one script turns OPEN
  into HALF_OPEN (once, whoever comes first) and hands out exactly ``permitted_number_of_calls_in_half_open_state``
  trials across the cluster; their outcomes are counted in Redis and the one that completes the trial window
  decides OPEN or CLOSED for everyone (Resilience4j's verdict over the trial window). A trial is a lease
  (``trial_ttl``, default twice ``slow_call_duration_threshold``): a worker killed mid-trial gives its place
  back when it expires.
* **Manual transitions** (``transition_to_*``, ``reset``) are unconditional: the operator's last word wins,
  and it reaches every worker (calling it on one worker is enough).

Faults: while Redis is unreachable each process is its own breaker (the in-process state machine decides
everything, half-open trials included), ``shared_health()["degraded"]`` is True (``r4 status``, the state
endpoint, the ``resilience4j_circuitbreaker_backend_degraded`` metric), and transitions are not shared. When
Redis answers again the listener reads the shared state and adopts it (transitions made locally meanwhile are
dropped). Nothing raises out of a call because of Redis.

Async callers: ``acall`` takes half-open trials on ``redis.asyncio``; outcomes and transitions are sent by
the breaker's sender thread, so the event loop never waits on a socket.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any, TypeVar

import redis
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from ..core.circuitbreaker import CircuitBreaker, CircuitBreakerConfig, ResultRecordedAsFailure, State
from ..core.circuitbreaker.breaker import _Pending, _test
from ..core.circuitbreaker.events import CircuitBreakerOnIgnoredErrorEvent
from ..core.clock import Clock
from ..core.durations import parse_duration
from ..core.exceptions import CallNotPermitted
from .base import redact_url
from .redis import DEFAULT_PREFIX, FAULT_COOLDOWN_S, RedisConnection, connection, key_base

__all__ = ["BREAKER_SCRIPT", "LISTENER_PING_S", "RedisCircuitBreaker"]

logger = logging.getLogger("django_ratelimit_r4.redis")

#: The Lua source of the shared breaker's operations.
BREAKER_SCRIPT = (resources.files(__package__) / "lua" / "breaker.lua").read_text(encoding="utf-8")
_SHA = hashlib.sha1(BREAKER_SCRIPT.encode("utf-8")).hexdigest()
#: The listener pings Redis after this many idle seconds; no answer within 3 times it ends the connection.
LISTENER_PING_S = 1.0
# RedisClusterException is not a RedisError: redis-py raises it when no node of a cluster answers (learning the
# topology again) or a slot has no owner. A fault like any other: the fault policy decides, never a 500.
_FAULTS = (RedisError, OSError, RedisClusterException)
_OPEN, _HALF_OPEN, _CLOSED = State.OPEN, State.HALF_OPEN, State.CLOSED
_FORCED_OPEN = State.FORCED_OPEN
_NEVER_WRITTEN = -1
_NS_PER_MS = 1_000_000
T = TypeVar("T")

_instances: weakref.WeakSet[RedisCircuitBreaker] = weakref.WeakSet()
_core_call = CircuitBreaker.call
_core_acall = CircuitBreaker.acall


def _after_fork() -> None:
    # A forked child has none of its parent's threads: it starts its own at first use and reads the state again.
    for breaker in list(_instances):
        breaker._fresh_process()


os.register_at_fork(after_in_child=_after_fork)


class _Trial:
    """A half-open trial call granted by Redis: its id, its epoch (outcomes of another epoch are too late)."""

    __slots__ = ("attempts", "epoch", "id")

    def __init__(self, trial_id: str, epoch: int, attempts: int) -> None:
        self.id = trial_id
        self.epoch = epoch
        self.attempts = attempts


def _ints(reply: Any) -> list[int]:
    return [int(x) for x in reply]


class RedisCircuitBreaker(CircuitBreaker):
    """A :class:`CircuitBreaker` whose transitions and half-open trials are shared cluster-wide through Redis.

    ``url``: the Redis URL (its connection pool is shared with the rate limiters of that URL); ``prefix``: of the
    keys (breaker ``name`` keeps ``<prefix>:cb:{<name>}:state`` and publishes on ``<prefix>:cb:{<name>}:events``);
    ``connection_options``: redis-py pool options, as a backend's ``OPTIONS``; ``backend``: the
    ``RATELIMIT_R4["backends"]`` alias it was built from (shown by ``r4 status``); ``trial_ttl``: how long a
    half-open trial holds its place without an outcome (default: twice ``slow_call_duration_threshold``).

    In settings: ``"backend": "<alias>"`` on a circuit breaker instance, the alias naming a redis backend.
    """

    #: True for a breaker whose transitions reach every worker: an operator's transition needs calling on one
    #: worker only (a broadcast that calls it on each would repeat it; harmless but for OPEN's backoff count).
    shared = True

    __slots__ = (
        "_adopting",
        "_channel",
        "_conn_cache",
        "_degraded",
        "_degraded_since",
        "_epoch",
        "_held",
        "_key",
        "_last_error",
        "_listener",
        "_listening",
        "_live",
        "_outbox",
        "_proc",
        "_received",
        "_resync",
        "_send_lock",
        "_sender",
        "_sent",
        "_shutdown",
        "_start_lock",
        "_trial_ids",
        "_trial_ttl_ms",
        "_trials_key",
        "_unconditional",
        "_wake",
        "backend",
        "connection_options",
        "prefix",
        "url",
    )

    def __init__(
        self,
        name: str,
        config: CircuitBreakerConfig | None = None,
        *,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        connection_options: Mapping[str, Any] | None = None,
        backend: str | None = None,
        trial_ttl: Any = None,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.backend = backend
        self.connection_options: Mapping[str, Any] = dict(connection_options or {})
        base = key_base(prefix, "cb", name)
        self._key = f"{base}:state"
        self._trials_key = f"{base}:trials"
        self._channel = f"{base}:events"
        self._sent = self._received = 0
        self._fresh_process(first=True)
        super().__init__(name, config, clock=clock)
        ttl_ns = 2 * self._slow_ns if trial_ttl is None else int(parse_duration(trial_ttl))
        self._trial_ttl_ms = max(1, ttl_ns // _NS_PER_MS)
        _instances.add(self)

    def _fresh_process(self, first: bool = False) -> None:
        """Per-process state: no thread, not loaded (read again at first use), a token of its own."""
        if not first:
            self._lock = threading.Lock()  # another thread of the parent may have held it at fork time
        self._proc = uuid.uuid4().hex[:16]
        self._trial_ids = itertools.count(1)
        self._start_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._outbox: collections.deque[tuple[Any, ...]] = collections.deque()
        self._held: collections.deque[_Trial] = collections.deque()
        self._listener: threading.Thread | None = None
        self._listening = threading.Event()
        self._sender: threading.Thread | None = None
        self._conn_cache: RedisConnection | None = None
        self._live = False  # loaded and threads started in this process
        self._degraded = False
        self._degraded_since: float | None = None
        self._last_error: str | None = None
        self._resync = False
        self._shutdown = False
        self._adopting = False
        self._unconditional = False
        self._epoch = 0

    @property
    def _conn(self) -> RedisConnection:
        conn = self._conn_cache
        if conn is None:
            conn = self._conn_cache = connection(self.url, self.connection_options)
        return conn

    def __repr__(self) -> str:
        return (
            f"RedisCircuitBreaker(name={self.name!r}, state={self._st.state.name}, epoch={self._epoch}"
            f"{', degraded' if self._degraded else ''})"
        )

    # ------------------------------------------------------------------------------- Redis plumbing

    def _args(self, op: str, *rest: Any) -> list[Any]:
        return [self._key, self._trials_key, op, self._channel, self._proc, *rest]

    def _run(self, op: str, *rest: Any) -> list[int]:
        reply, _, _ = self._conn.run_script(_SHA, BREAKER_SCRIPT, 2, self._args(op, *rest))
        return _ints(reply)

    async def _arun(self, op: str, *rest: Any) -> list[int]:
        reply, _, _ = await self._conn.arun_script(_SHA, BREAKER_SCRIPT, 2, self._args(op, *rest))
        return _ints(reply)

    def _fault(self, exc: BaseException, what: str) -> None:
        """Redis failed: decide locally until the listener has read the shared state again."""
        self._conn.fault(exc, f"circuit breaker {self.name!r} {what}")
        self._last_error = f"{what}: {type(exc).__name__}: {exc}"
        if not self._degraded:
            self._degraded = True
            self._degraded_since = time.time()
            logger.warning(
                "circuit breaker %r: Redis at %s failed during %s (%s: %s); this worker decides alone until "
                "Redis answers again",
                self.name,
                redact_url(self.url),
                what,
                type(exc).__name__,
                exc,
            )
        self._resync = True
        with self._lock:
            self._outbox.clear()
            self._held.clear()

    # ------------------------------------------------------------------------------- lifecycle

    def _ensure_started(self) -> None:
        """First use in this process: read the shared state (one round trip) and start the threads."""
        if self._live:
            return
        with self._start_lock:
            if self._live:
                return
            try:
                snapshot = self._run("load")
            except _FAULTS as exc:
                self._fault(exc, "first read of the shared state")
            else:
                self._resync_from(snapshot)
            self._start_threads()

    async def _aensure_started(self) -> None:
        """:meth:`_ensure_started` on ``redis.asyncio`` (never blocks the loop)."""
        if self._live:
            return
        try:
            snapshot = await self._arun("load")
        except _FAULTS as exc:
            self._fault(exc, "first read of the shared state")
        else:
            if not self._live:
                self._resync_from(snapshot)
        if not self._live:
            self._start_threads()

    def _start_threads(self) -> None:
        if self._listener is None:
            proc = self._proc
            self._listener = threading.Thread(
                target=self._listen, args=(proc,), name=f"r4-breaker-{self.name}-listen", daemon=True
            )
            self._sender = threading.Thread(
                target=self._send_loop, args=(proc,), name=f"r4-breaker-{self.name}-send", daemon=True
            )
            self._listener.start()
            self._sender.start()
        self._live = True

    def close(self) -> None:
        """Stop this process's listener and sender threads (for shutdown and tests); the shared state stays."""
        self._shutdown = True
        self._wake.set()
        if self._listening.is_set():
            with contextlib.suppress(*_FAULTS):
                self._conn.sync.publish(self._channel, "")  # wakes the listener now, not at its next ping
        for thread in (self._listener, self._sender):
            if thread is not None and thread is not threading.current_thread():
                thread.join(LISTENER_PING_S * 3 + 2.0)

    # ------------------------------------------------------------------------------- shared -> local

    def _install_locked(self, to: State, attempts: int, remaining_ns: int, out: _Pending) -> None:
        """Install a state decided elsewhere (no validation: the cluster's word is final). Lock held."""
        now = self._now()
        cur = self._st
        frm = cur.state
        self._adopting = True
        try:
            if to is _OPEN and frm is _OPEN:
                cur.deadline = now + remaining_ns
                cur.attempts = attempts
                return
            if to is not _OPEN:
                self._retired_not_permitted += cur.window.not_permitted
            window = cur.window if to is _OPEN else None
            self._st = self._make_state(to, attempts, now, window, remaining_ns if to is _OPEN else None)
        finally:
            self._adopting = False
        if frm is not to:
            out.append(("STATE_TRANSITION", frm, to))

    def _adopt(self, snapshot: list[int], *, force: bool = False) -> bool:
        """Follow a shared state newer than ours (``force``: whatever its epoch, after a reconnection)."""
        epoch, state, remaining_ms, attempts = snapshot[1:5]
        out: _Pending = []
        with self._lock:
            if state == _NEVER_WRITTEN or (epoch <= self._epoch and not force):
                return False
            same = force and epoch == self._epoch and self._st.state.value == state
            # Local transitions not sent yet came from a state that is gone.
            self._outbox = collections.deque(x for x in self._outbox if x[0] == "set" and x[1])
            if not same:
                self._install_locked(State(state), attempts, remaining_ms * _NS_PER_MS, out)
            # The epoch last, once its state is in place: the epoch and state are read without the lock
            # (wait_epoch, the state property), and an epoch seen must mean its state is what a call finds.
            self._epoch = epoch
            self._received += 1
        if out:
            self._flush(out)
        return True

    def _resync_from(self, snapshot: list[int], force: bool = False) -> None:
        """Adopt the stored state when it is newer (``force``: whatever its epoch, after a fault); push ours
        if Redis lost what it had (restarted, flushed)."""
        if snapshot[2] == _NEVER_WRITTEN:
            with self._lock:
                # Only after a fault: a reply read before our own first transition is not a lost state.
                if force and (self._epoch > 0 or self._st.state is not State[self.config.initial_state]):
                    self._epoch = 0
                    # Not degraded before the push is queued: the sender drops what it takes while degraded.
                    self._degraded = False
                    self._queue_locked(True, self._st, self._now())
        else:
            self._adopt(snapshot, force=force)
        self._degraded = False
        self._degraded_since = None

    def _on_message(self, data: Any) -> None:
        text = data.decode() if isinstance(data, bytes) else str(data)
        parts = text.split("|")
        if len(parts) != 5 or parts[4] == self._proc:
            return  # our own transition: its reply already told us
        self._adopt([1, *(int(p) for p in parts[:4])])

    def _listen(self, proc: str) -> None:
        """Follow the channel; on any fault: decide locally, reconnect, read the state again (resync)."""
        while not self._shutdown and proc == self._proc:
            # A client of its own (plain, cluster or Sentinel primary, like the URL's): the subscription holds
            # its connection. It connects lazily: Redis may be down when the thread starts.
            client = self._conn.new_client(socket_timeout=LISTENER_PING_S * 3, max_connections=2)
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(self._channel)
                deadline = time.monotonic() + LISTENER_PING_S * 3
                while True:  # subscribed before reading the state: no transition falls in between
                    msg = pubsub.get_message(timeout=LISTENER_PING_S)
                    if msg is not None and msg["type"] == "subscribe":
                        break
                    if msg is not None and msg["type"] == "message":
                        continue  # older than the state about to be read
                    if time.monotonic() > deadline:
                        raise redis.exceptions.TimeoutError("no subscription confirmation")
                force = self._degraded or self._resync
                self._resync = False
                snapshot = self._load_with(client)
                # Redis answered: end the connection's cool-down (maybe another user's fault) before the
                # resync queues a push, which the sender would drop during a cool-down.
                self._conn.answered()
                self._resync_from(snapshot, force)
                self._listening.set()
                heard = time.monotonic()
                pinged = False
                while not self._shutdown and proc == self._proc and not self._resync:
                    msg = pubsub.get_message(timeout=LISTENER_PING_S)
                    now = time.monotonic()
                    if msg is not None:
                        heard = now
                        pinged = False
                        if msg["type"] == "message":
                            self._on_message(msg["data"])
                        continue
                    if now - heard > LISTENER_PING_S * 3:
                        raise redis.exceptions.TimeoutError("Redis stopped answering the listener's pings")
                    if not pinged and now - heard >= LISTENER_PING_S:
                        pubsub.ping()
                        pinged = True
            except _FAULTS as exc:
                self._listening.clear()
                if self._shutdown or proc != self._proc:
                    return
                self._fault(exc, "listener")
                time.sleep(FAULT_COOLDOWN_S)
            except Exception:  # never let the thread die: the worker would stop following the cluster
                logger.exception("circuit breaker %r: the listener failed; reconnecting", self.name)
                time.sleep(FAULT_COOLDOWN_S)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()
                with contextlib.suppress(Exception):
                    client.close()

    def _load_with(self, client: Any) -> list[int]:
        args = self._args("load")
        try:
            return _ints(client.evalsha(_SHA, 2, *args))
        except NoScriptError:
            return _ints(client.eval(BREAKER_SCRIPT, 2, *args))

    # ------------------------------------------------------------------------------- local -> shared

    def _queue_locked(self, unconditional: bool, st: Any, now: int) -> None:
        state = st.state
        wait_ms = max(1, -(-(st.deadline - now) // _NS_PER_MS)) if state is _OPEN else 0
        self._outbox.append(("set", unconditional, state.value, wait_ms, st.attempts))
        self._wake.set()

    def _transition_locked(
        self, to: State, now: int, out: _Pending, *, attempts: int | None = None, wait_ns: int | None = None
    ) -> None:
        CircuitBreaker._transition_locked(self, to, now, out, attempts=attempts, wait_ns=wait_ns)
        if not self._adopting:
            self._queue_locked(self._unconditional, self._st, now)

    def _manual(self, to: State, **kwargs: Any) -> None:
        self._ensure_started()
        out: _Pending = []
        with self._lock:
            now = self._now()
            if self._st.timed:
                self._poll_locked(now, out)
            self._unconditional = True
            try:
                self._transition_locked(to, now, out, **kwargs)
            finally:
                self._unconditional = False
        if out:
            self._flush(out)
        self._send_inline()

    def reset(self) -> None:
        """Back to ``initial_state`` with a fresh window, here and (unconditionally) in every worker."""
        super().reset()
        with self._lock:
            self._queue_locked(True, self._st, self._now())
        self._send_inline()

    def _send_inline(self) -> None:
        """Send queued transitions now (an operator's call returns once Redis has them), except on an
        event loop's thread, where the sender thread does it."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._drain() is not None:
                self._wake.set()  # held by a cool-down: the sender sends it when the cool-down ends
        else:
            self._wake.set()

    def _send_loop(self, proc: str) -> None:
        wait: float | None = None
        while not self._shutdown and proc == self._proc:
            self._wake.wait(wait)
            self._wake.clear()
            if self._shutdown or proc != self._proc:
                return
            try:
                wait = self._drain()
            except Exception:  # never let the thread die
                wait = None
                logger.exception("circuit breaker %r: the sender failed", self.name)

    def _drain(self) -> float | None:
        """Send what is queued; return the seconds until the URL's cool-down ends when it holds items back
        (the sender waits that long), else None."""
        with self._send_lock:
            while True:
                if self._degraded:
                    # This worker's own fault: the listener's resync reconciles with the shared state.
                    with self._lock:
                        self._outbox.clear()
                    return None
                if self._conn.is_down():
                    # Another user of the URL's connection faulted (a rate limiter, another breaker): keep
                    # the transitions for the end of the cool-down instead of dropping them, or this worker
                    # would stay alone in a state the cluster never hears of.
                    with self._lock:
                        if not self._outbox:
                            return None
                    return max(0.001, self._conn.down_until - time.monotonic())
                with self._lock:
                    if not self._outbox:
                        return None
                    item = self._outbox.popleft()
                    expected = -1 if item[0] == "set" and item[1] else self._epoch
                try:
                    self._send(item, expected)
                except _FAULTS as exc:
                    self._fault(exc, f"{item[0]} ({item[2] if item[0] == 'set' else item[1]})")
                    return None

    def _send(self, item: tuple[Any, ...], expected: int) -> None:
        kind = item[0]
        if kind == "set":
            _, _, state, wait_ms, attempts = item
            reply = self._run("set", expected, state, wait_ms, attempts)
            self._sent += 1
            if reply[0] == 1:
                with self._lock:
                    if reply[1] > self._epoch:
                        self._epoch = reply[1]
            else:
                self._adopt(reply)
                if reply[1] < expected:
                    self._resync = True  # Redis is behind us (restarted, flushed): the listener reads it again
        elif kind == "outcome":
            _, epoch, failed, slow, wait_ms, trial_id = item
            c = self.config
            needed = min(c.minimum_number_of_calls, c.permitted_number_of_calls_in_half_open_state)
            reply = self._run("outcome", epoch, failed, slow, needed, self._fthr, self._sthr, wait_ms, trial_id)
            if reply[0] == 2:
                self._sent += 1
            self._adopt(reply)
        else:  # release
            self._adopt(self._run("release", item[1], item[2]))

    # ------------------------------------------------------------------------------- half-open trials

    def _trial_seen(self) -> int | None:
        """The epoch to take a trial at, or None when the local state machine decides this call."""
        if self._degraded or self._conn.is_down():
            return None
        out: _Pending = []
        with self._lock:
            now = self._now()
            st = self._poll_locked(now, out) if self._st.timed else self._st
            state = st.state
            need = state is _HALF_OPEN or (state is _OPEN and now > st.deadline)  # type: ignore[operator]
            seen = self._epoch
        if out:
            self._flush(out)
        return seen if need else None

    def _new_trial_id(self) -> str:
        return f"{self._proc}:{next(self._trial_ids)}"

    def _after_trial(self, reply: list[int], trial_id: str) -> _Trial | None:
        """A trial granted, None (the local state machine decides: the state changed), or CallNotPermitted."""
        self._adopt(reply)
        if reply[0] == 1:
            return _Trial(trial_id, reply[1], reply[4])
        if reply[2] == _HALF_OPEN.value:
            with self._lock:
                self._st.window.not_permitted += 1
            raise self._rejection(_HALF_OPEN, 0)
        return None

    def _enter(self) -> _Trial | None:
        self._ensure_started()
        seen = self._trial_seen()
        if seen is None:
            return None
        trial_id = self._new_trial_id()
        try:
            reply = self._run("trial", seen, self._permitted, trial_id, self._trial_ttl_ms)
        except _FAULTS as exc:
            self._fault(exc, "half-open trial")
            return None
        return self._after_trial(reply, trial_id)

    async def _aenter(self) -> _Trial | None:
        await self._aensure_started()
        seen = self._trial_seen()
        if seen is None:
            return None
        trial_id = self._new_trial_id()
        try:
            reply = await self._arun("trial", seen, self._permitted, trial_id, self._trial_ttl_ms)
        except _FAULTS as exc:
            self._fault(exc, "half-open trial")
            return None
        except BaseException:  # cancelled: the script may have granted the trial; give it back
            self._trial_release(_Trial(trial_id, seen, 0))
            raise
        return self._after_trial(reply, trial_id)

    def _classify(self, exc: BaseException) -> bool | None:
        """Like the core's ``_error``: None if ignored, True if recorded as a failure, False as a success."""
        ignore, ignore_pred = self._ignore_exc, self._ignore_pred
        if (ignore is not None and isinstance(exc, ignore)) or (
            ignore_pred is not None and _test(ignore_pred, exc, False, self.name, "ignore_exception")
        ):
            return None
        record, record_pred = self._record_exc, self._record_pred
        return (
            (record is None and record_pred is None)
            or (record is not None and isinstance(exc, record))
            or (record_pred is not None and _test(record_pred, exc, True, self.name, "record_exception"))
        )

    def _trial_outcome(self, trial: _Trial, duration_ns: int, end: int, failed: bool) -> None:
        wait_ms = max(1, self._open_wait_ns(trial.attempts + 1) // _NS_PER_MS)
        with self._lock:
            self._outbox.append(
                ("outcome", trial.epoch, int(failed), int(duration_ns > self._slow_ns), wait_ms, trial.id)
            )
        self._wake.set()

    def _trial_release(self, trial: _Trial) -> None:
        with self._lock:
            self._outbox.append(("release", trial.epoch, trial.id))
        self._wake.set()

    def _trial_error(self, trial: _Trial, duration_ns: int, exc: BaseException, end: int) -> None:
        verdict = self._classify(exc)
        if verdict is None:
            with self._lock:
                self._tot_ignored += 1
                self._tot_ignored_ns += duration_ns
            if self.events.wants_calls:
                self._publish(
                    CircuitBreakerOnIgnoredErrorEvent("IGNORED_ERROR", self.name, elapsed_ns=duration_ns, exception=exc)
                )
            self._trial_release(trial)
            return
        if verdict:
            self._failure(duration_ns, exc, end)
        else:
            self._success(duration_ns, end)
        self._trial_outcome(trial, duration_ns, end, verdict)

    def _trial_result(self, trial: _Trial, duration_ns: int, result: Any, end: int) -> None:
        predicate: Any = self._record_result
        if predicate is not None and predicate(result):
            self._failure(duration_ns, ResultRecordedAsFailure(self.name, result), end)
            self._trial_outcome(trial, duration_ns, end, True)
        else:
            self._success(duration_ns, end)
            self._trial_outcome(trial, duration_ns, end, False)

    def _record(self, code: int, end: int, out: _Pending) -> None:
        st = self._st
        if st.timed:
            st = self._poll_locked(end, out)
        if st.state is _HALF_OPEN and self._live and not self._degraded:
            return  # trial outcomes are counted in Redis (_trial_outcome), where the verdict is taken
        CircuitBreaker._record(self, code, end, out)

    # ------------------------------------------------------------------------------- protected calls

    def _local(self) -> bool:
        """True when this call is decided by the local state machine with no round trip."""
        if not self._live:
            return False
        st = self._st
        return st.fast or self._degraded or st.state is _FORCED_OPEN

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` under the breaker (CLOSED: no round trip; half-open trials are taken in Redis)."""
        if self._live and (self._st.fast or self._degraded or self._st.state is _FORCED_OPEN):  # _local(), inlined
            return _core_call(self, fn, *args, **kwargs)
        trial = self._enter()
        if trial is None:
            return CircuitBreaker.call(self, fn, *args, **kwargs)
        now = self._now
        start = now()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            end = now()
            self._trial_error(trial, end - start, exc, end)
            raise
        except BaseException:
            self._trial_release(trial)
            raise
        end = now()
        self._trial_result(trial, end - start, result, end)
        return result

    async def acall(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn`` under the breaker (same rules as :meth:`call`; Redis through ``redis.asyncio``)."""
        if self._live and (self._st.fast or self._degraded or self._st.state is _FORCED_OPEN):  # _local(), inlined
            return await _core_acall(self, fn, *args, **kwargs)
        trial = await self._aenter()
        if trial is None:
            return await CircuitBreaker.acall(self, fn, *args, **kwargs)
        now = self._now
        start = now()
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            end = now()
            self._trial_error(trial, end - start, exc, end)
            raise
        except BaseException:
            self._trial_release(trial)
            raise
        end = now()
        self._trial_result(trial, end - start, result, end)
        return result

    # The manual protocol: a trial taken by try_acquire_permission is reported by the next outcome.

    def try_acquire_permission(self) -> bool:
        """Take a permission without raising; in HALF_OPEN one of the cluster's trial calls."""
        if self._local():
            return CircuitBreaker.try_acquire_permission(self)
        try:
            trial = self._enter()
        except CallNotPermitted:
            return False
        if trial is None:
            return CircuitBreaker.try_acquire_permission(self)
        with self._lock:
            self._held.append(trial)
        return True

    def acquire_permission(self) -> None:
        """Like :meth:`try_acquire_permission` but raises :class:`CallNotPermitted`."""
        if self._local():
            CircuitBreaker.acquire_permission(self)
            return
        trial = self._enter()
        if trial is None:
            CircuitBreaker.acquire_permission(self)
            return
        with self._lock:
            self._held.append(trial)

    def _take_held(self) -> _Trial | None:
        with self._lock:
            return self._held.popleft() if self._held else None

    def release_permission(self) -> None:
        """Give back a permission taken but not used (a cluster trial goes back to Redis)."""
        trial = self._take_held()
        if trial is None:
            CircuitBreaker.release_permission(self)
        else:
            self._trial_release(trial)

    def on_success(self, duration_ns: int) -> None:
        """Record a successful call (manual protocol); a trial's outcome also goes to Redis."""
        trial = self._take_held()
        if trial is None:
            CircuitBreaker.on_success(self, duration_ns)
        else:
            end = self._now()
            self._success(duration_ns, end)
            self._trial_outcome(trial, duration_ns, end, False)

    def on_error(self, duration_ns: int, exc: BaseException) -> None:
        """Classify and record a call that raised ``exc``; a trial's outcome also goes to Redis."""
        trial = self._take_held()
        if trial is None:
            CircuitBreaker.on_error(self, duration_ns, exc)
        else:
            self._trial_error(trial, duration_ns, exc, self._now())

    def on_result(self, duration_ns: int, result: Any) -> None:
        """Record a returned value; a trial's outcome also goes to Redis."""
        trial = self._take_held()
        if trial is None:
            CircuitBreaker.on_result(self, duration_ns, result)
        else:
            self._trial_result(trial, duration_ns, result, self._now())

    # ------------------------------------------------------------------------------- reads

    @property
    def state(self) -> State:
        """The current :class:`State`, as last heard from the cluster (read from Redis at first use)."""
        if not self._live:
            self._ensure_started()
        return CircuitBreaker.state.fget(self)  # type: ignore[attr-defined,no-any-return]

    def remaining_open_ns(self) -> int:
        """Nanoseconds left in OPEN (the cluster's open-until time, as of the transition heard)."""
        if not self._live:
            self._ensure_started()
        return CircuitBreaker.remaining_open_ns(self)

    def wait_listening(self, timeout: float | None = None) -> bool:
        """Start this process's listener if needed and wait until it is subscribed (True) or ``timeout``.

        Calls never wait for it: the state read at first use is current. Tests and benchmarks use it to know
        that every later transition will be heard (and published as a local event).
        """
        self._ensure_started()
        return self._listening.wait(timeout)

    def wait_epoch(self, epoch: int, timeout: float) -> bool:
        """Wait until this process has heard the shared transition ``epoch`` (or a later one), its state in
        place, and return True; False if ``timeout`` seconds pass first. Returns True at once while degraded:
        Redis is unreachable here, there is nothing to hear and this worker decides alone. (The control plane's
        follower of a broadcast transition made once, by the sender.)"""
        deadline = time.monotonic() + timeout
        while self._epoch < epoch and not self._degraded:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)  # a transition is heard within a millisecond or two (pub/sub)
        return True

    @property
    def epoch(self) -> int:
        """The number of the shared transition this process's state comes from (0: none yet)."""
        return self._epoch

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable and this process decides alone."""
        return self._degraded

    def shared_health(self) -> dict[str, Any]:
        """This process's view of the shared state, for ``r4 status``, the state endpoint and metrics."""
        since = self._degraded_since
        return {
            "backend": self.backend,
            "url": redact_url(self.url),
            "degraded": self._degraded,
            "degraded_seconds": None if since is None else round(max(0.0, time.time() - since), 3),
            "epoch": self._epoch,
            "transitions_sent": self._sent,
            "transitions_received": self._received,
            "last_error": self._last_error,
        }
