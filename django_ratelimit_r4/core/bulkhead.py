"""Semaphore bulkhead usable from threads and from the event loop at once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from threading import get_ident
from typing import Any, ParamSpec, TypeVar

from .adaptivelimit import AdaptiveLimit, AdaptiveLimitConfig, make_limit
from .clock import SYSTEM_CLOCK, Clock, MonotonicClock
from .config import Validator
from .coroutines import twin_wrapper
from .events import Event, EventPublisher
from .exceptions import BulkheadFull, ConfigurationError

__all__ = [
    "CALL_FINISHED",
    "CALL_PERMITTED",
    "CALL_REJECTED",
    "Bulkhead",
    "BulkheadConfig",
    "BulkheadEvent",
    "BulkheadEvents",
    "BulkheadMetrics",
]


@dataclass(frozen=True, slots=True)
class BulkheadConfig:
    """Configuration of a :class:`Bulkhead` (Resilience4j's semaphore ``BulkheadConfig``).

    ``adaptive`` (not in Resilience4j): a dict of :class:`~django_ratelimit_r4.core.adaptivelimit.AdaptiveLimitConfig`
    fields (or one) making ``max_concurrent_calls`` the initial limit of an adaptive concurrency limit.
    """

    max_concurrent_calls: int = 25
    max_wait_duration: Any = 0
    fair_call_handling: bool = True
    writable_stack_trace_enabled: bool = True
    adaptive: Any = None

    def __post_init__(self) -> None:
        v = Validator(self)
        v.integer("max_concurrent_calls", minimum=0)
        v.duration("max_wait_duration")
        v.boolean("fair_call_handling")
        v.boolean("writable_stack_trace_enabled")
        self._check_adaptive(v)
        v.done()

    def _check_adaptive(self, v: Validator) -> None:
        value = self.adaptive
        if value is None or isinstance(value, AdaptiveLimitConfig):
            adaptive = value
        elif isinstance(value, Mapping):
            known = tuple(f.name for f in dataclasses.fields(AdaptiveLimitConfig))
            unknown = [k for k in value if k not in known]
            if unknown:
                v.error(
                    "adaptive",
                    f"unknown option(s) {', '.join(repr(k) for k in unknown)}",
                    f"Known options: {', '.join(known)}.",
                )
                return
            try:
                adaptive = AdaptiveLimitConfig(**value)
            except ConfigurationError as exc:
                for err in exc.errors:
                    v.error("adaptive", f'["{err.field}"] {err.message}', err.hint)
                return
            object.__setattr__(self, "adaptive", adaptive)
        else:
            v.error(
                "adaptive",
                f"must be None or a dict of adaptive limit options, got {type(value).__name__}",
                'For example {"algorithm": "gradient2", "min_limit": 5, "max_limit": 500}.',
            )
            return
        initial = self.max_concurrent_calls
        if adaptive is not None and isinstance(initial, int) and not adaptive.min_limit <= initial <= adaptive.max_limit:
            v.error(
                "max_concurrent_calls",
                f"is the initial limit of the adaptive bulkhead and must be within min_limit..max_limit "
                f"({adaptive.min_limit}..{adaptive.max_limit}), got {initial}",
                "Set max_concurrent_calls to the limit to start from (e.g. the Little's-law value for the healthy case).",
            )


# --------------------------------------------------------------------------------------------------
# The bulkhead
# --------------------------------------------------------------------------------------------------

#: Event types, as Resilience4j's ``BulkheadEvent.Type``.
CALL_PERMITTED = "CALL_PERMITTED"
CALL_REJECTED = "CALL_REJECTED"
CALL_FINISHED = "CALL_FINISHED"

# With an injected (fake) clock a waiter re-reads the clock this often (seconds of real time).
_FAKE_CLOCK_POLL_S = 0.001

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class BulkheadEvent(Event):
    """A bulkhead event: ``event_type`` is ``CALL_PERMITTED``, ``CALL_REJECTED`` or ``CALL_FINISHED``."""


class BulkheadEvents(EventPublisher[BulkheadEvent]):
    """Listeners of one bulkhead (Resilience4j's ``onCallPermitted`` / ``onCallRejected`` / ``onCallFinished``)."""

    EVENT_TYPES = (CALL_PERMITTED, CALL_REJECTED, CALL_FINISHED)
    __slots__ = ()

    def on_call_permitted(
        self, listener: Callable[[BulkheadEvent], object]
    ) -> Callable[[BulkheadEvent], object]:
        """Call ``listener`` each time a call gets a permit."""
        return self._on(CALL_PERMITTED, listener)

    def on_call_rejected(
        self, listener: Callable[[BulkheadEvent], object]
    ) -> Callable[[BulkheadEvent], object]:
        """Call ``listener`` each time a call gets no permit within the wait budget."""
        return self._on(CALL_REJECTED, listener)

    def on_call_finished(
        self, listener: Callable[[BulkheadEvent], object]
    ) -> Callable[[BulkheadEvent], object]:
        """Call ``listener`` each time a permitted call completes (:meth:`Bulkhead.on_complete`)."""
        return self._on(CALL_FINISHED, listener)


def _resolve(future: asyncio.Future[None]) -> None:
    """Wake an async waiter (a timer or a grant, whichever comes first; the bulkhead's state decides)."""
    if not future.done():
        future.set_result(None)


class _Waiter:
    """One parked caller. ``granted`` is written under the bulkhead lock when a permit is handed over.

    A thread waiter parks on its own pre-acquired ``lock``; an async waiter awaits ``future`` on ``loop``.
    """

    __slots__ = ("future", "granted", "lock", "loop", "thread_id")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.granted = False
        self.thread_id = get_ident()
        self.loop = loop
        if loop is None:
            self.lock: threading.Lock | None = threading.Lock()
            self.lock.acquire()
            self.future: asyncio.Future[None] | None = None
        else:
            self.lock = None
            self.future = loop.create_future()


class BulkheadMetrics:
    """Live numbers of one bulkhead, read without locking (plain ints; exporters read them at scrape time)."""

    __slots__ = ("_bulkhead",)

    def __init__(self, bulkhead: Bulkhead) -> None:
        self._bulkhead = bulkhead

    @property
    def available_concurrent_calls(self) -> int:
        """Free slots. Never negative: after a shrinking :meth:`Bulkhead.change_config` it stays 0
        until the calls already in flight drain below the new limit."""
        b = self._bulkhead
        return max(0, b._max - b._in_use)

    @property
    def max_allowed_concurrent_calls(self) -> int:
        """The configured ``max_concurrent_calls``; for an adaptive bulkhead, the current limit."""
        return self._bulkhead._max

    @property
    def concurrent_calls(self) -> int:
        """Permits currently held (may exceed the limit for a while after a shrink)."""
        return self._bulkhead._in_use

    @property
    def waiting_calls(self) -> int:
        """Callers parked waiting for a slot."""
        return len(self._bulkhead._waiters)

    @property
    def permitted_calls(self) -> int:
        """Cumulative count of calls that got a permit."""
        return self._bulkhead._permitted

    @property
    def rejected_calls(self) -> int:
        """Cumulative count of calls refused (no slot within the budget, or cancelled while waiting)."""
        return self._bulkhead._rejected

    @property
    def finished_calls(self) -> int:
        """Cumulative count of :meth:`Bulkhead.on_complete` calls."""
        return self._bulkhead._finished


class Bulkhead:
    """Resilience4j's semaphore bulkhead: at most ``max_concurrent_calls`` calls in flight.

    One instance serves threads and the event loop at once. A single :class:`threading.Lock` guards an
    int counter and a FIFO deque of waiters and is held only for a few integer operations. A thread
    waiter parks on its own lock; an async waiter awaits a future that the releasing side resolves
    with ``loop.call_soon_threadsafe``, so the event loop never blocks.

    A released slot is handed straight to the oldest waiter (no barging), so waiters are served in
    FIFO order whatever ``fair_call_handling`` says; ``False`` is accepted for Resilience4j
    compatibility. ``max_concurrent_calls=0`` rejects every call at once, without waiting.
    ``max_wait_duration`` keeps nanosecond precision (Resilience4j truncates it to milliseconds).

    With the default clock a wait is measured in real time. With an injected clock (a FakeClock) a
    waiter gives up when *either* that clock passes its deadline (tests advance it instead of
    sleeping) or the budget elapses in real time, so a forgotten fake clock never hangs a caller.

    Every exit path returns the permit, including a task cancelled while waiting after the slot was
    already handed to it (it passes the slot on). Like any Python lock, a KeyboardInterrupt delivered
    in the few bytecodes between the grant and the start of the ``with`` block can still leak one.
    ``writable_stack_trace_enabled`` is accepted for compatibility and has no effect.
    """

    __slots__ = (
        "_adaptive",
        "_drop_types",
        "_finished",
        "_in_use",
        "_lock",
        "_max",
        "_max_wait_ns",
        "_now",
        "_permitted",
        "_real_time",
        "_rejected",
        "_waiters",
        "clock",
        "config",
        "events",
        "metrics",
        "name",
    )

    def __init__(
        self, name: str, config: BulkheadConfig | None = None, *, clock: Clock | None = None
    ) -> None:
        self.name = name
        self.config = config if config is not None else BulkheadConfig()
        self._lock = threading.Lock()
        self._waiters: deque[_Waiter] = deque()
        self._max: int = self.config.max_concurrent_calls
        self._max_wait_ns: int = int(self.config.max_wait_duration)
        self._in_use = 0
        self._permitted = 0
        self._rejected = 0
        self._finished = 0
        self._set_adaptive()
        self.events = BulkheadEvents()
        self.metrics = BulkheadMetrics(self)
        self._set_clock(clock if clock is not None else SYSTEM_CLOCK)

    def __repr__(self) -> str:
        return f"Bulkhead({self.name!r}, in_use={self._in_use}/{self._max}, waiting={len(self._waiters)})"

    def _set_adaptive(self) -> None:
        """Build the adaptive limit (if configured) starting at ``max_concurrent_calls``."""
        adaptive = self.config.adaptive
        self._adaptive: AdaptiveLimit | None = (
            make_limit(adaptive, self.config.max_concurrent_calls) if adaptive is not None else None
        )
        self._drop_types: tuple[type[BaseException], ...] = (
            (adaptive.drop_exceptions or (Exception,)) if adaptive is not None else ()
        )

    @property
    def adaptive_limit(self) -> AdaptiveLimit | None:
        """The algorithm moving an adaptive bulkhead's limit (None for a fixed one): read its ``limit`` and, for
        ``littles_law``, ``no_load_latency_ns`` and ``probing``. Reading only: it is updated under the lock."""
        return getattr(self, "_adaptive", None)

    # -- permits ---------------------------------------------------------------------------------

    def try_acquire_permission(self) -> bool:
        """Take a slot, waiting up to ``max_wait_duration`` (blocking this thread only). False if none came."""
        with self._lock:
            if self._in_use < self._max:
                self._in_use += 1
                self._permitted += 1
                ok = True
            else:
                ok = False
        if not ok:
            ok = self._wait_sync()
        if self.events.has_listeners:
            self._emit(CALL_PERMITTED if ok else CALL_REJECTED)
        return ok

    async def atry_acquire_permission(self) -> bool:
        """Async twin of :meth:`try_acquire_permission`: waits with asyncio only, never blocks the loop."""
        with self._lock:
            if self._in_use < self._max:
                self._in_use += 1
                self._permitted += 1
                ok = True
            else:
                ok = False
        if not ok:
            ok = await self._wait_async()
        if self.events.has_listeners:
            self._emit(CALL_PERMITTED if ok else CALL_REJECTED)
        return ok

    def acquire_permission(self) -> None:
        """Like :meth:`try_acquire_permission` but raise :class:`BulkheadFull` when no slot came.

        Resilience4j's naming, kept: on a bulkhead and a circuit breaker ``acquire_permission`` raises and
        ``try_acquire_permission`` answers a bool, while ``RateLimiter.acquire_permission`` answers a bool
        (its raising form is ``acquire_or_raise``).
        """
        if not self.try_acquire_permission():
            raise BulkheadFull(self)

    async def aacquire_permission(self) -> None:
        """Like :meth:`atry_acquire_permission` but raise :class:`BulkheadFull` when no slot came."""
        if not await self.atry_acquire_permission():
            raise BulkheadFull(self)

    def release_permission(self) -> None:
        """Give back a permit that was acquired but not used (no event, not counted as finished)."""
        with self._lock:
            waiter = self._release_locked()
        if waiter is not None:
            self._wake(waiter)

    def on_complete(self, *, start_ns: int | None = None, dropped: bool = False) -> None:
        """Give back the permit of a finished call and publish ``CALL_FINISHED``.

        For an adaptive bulkhead, ``start_ns`` (the clock's ``now_ns()`` when the call started) makes the call a
        sample of the limit algorithm (latency = now - start_ns; ``dropped``: it failed as a drop). ``call`` and
        ``acall`` pass both; without ``start_ns`` the limit does not move.
        """
        if start_ns is not None and self._adaptive is not None:
            self._complete_sample(start_ns, dropped)
            return
        with self._lock:
            self._finished += 1
            waiter = self._release_locked()
        if waiter is not None:
            self._wake(waiter)
        if self.events.has_listeners:
            self._emit(CALL_FINISHED)

    def _complete_sample(self, start_ns: int, dropped: bool) -> None:
        """:meth:`on_complete` of an adaptive bulkhead's call that started at ``start_ns``: the sample moves the limit."""
        with self._lock:
            self._finished += 1
            now = self._now()
            before = self._max
            self._max = limit = self._adaptive.update(now - start_ns, self._in_use, dropped, now)  # type: ignore[union-attr]
            if self._waiters:
                waiter = self._release_locked()
                granted = self._grant_free_slots_locked() if limit > before else None
            else:  # the common case, inlined: nobody waits, the permit is simply freed
                if self._in_use > 0:
                    self._in_use -= 1
                waiter = granted = None
        if waiter is not None:
            self._wake(waiter)
        if granted:
            for other in granted:
                self._wake(other)
        if self.events.has_listeners:
            self._emit(CALL_FINISHED)

    # -- context managers and decorators ---------------------------------------------------------

    def __enter__(self) -> Bulkhead:
        if not self.try_acquire_permission():
            raise BulkheadFull(self)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.on_complete()

    async def __aenter__(self) -> Bulkhead:
        if not await self.atry_acquire_permission():
            raise BulkheadFull(self)
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.on_complete()

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` holding a permit; raise :class:`BulkheadFull` if none came."""
        if not self.try_acquire_permission():
            raise BulkheadFull(self)
        if self._adaptive is None:
            try:
                return fn(*args, **kwargs)
            finally:
                self.on_complete()
        # Adaptive: the call's latency and outcome are a sample of the limit algorithm.
        start = self._now()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            self._complete_sample(start, isinstance(exc, self._drop_types))
            raise
        except BaseException:
            self.on_complete()  # interrupted: the permit goes back, the limit learns nothing
            raise
        # _complete_sample(start, False) inlined for the common case (nobody waits): the hot path of issue 12's
        # cost target (benchmarks/bench_bulkhead.py).
        with self._lock:
            if self._waiters:
                done = False
            else:
                self._finished += 1
                now = self._now()
                self._max = self._adaptive.update(now - start, self._in_use, False, now)
                if self._in_use > 0:
                    self._in_use -= 1
                done = True
        if not done:
            self._complete_sample(start, False)
        elif self.events.has_listeners:
            self._emit(CALL_FINISHED)
        return result

    async def acall(self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Await ``fn(*args, **kwargs)`` holding a permit; raise :class:`BulkheadFull` if none came."""
        if not await self.atry_acquire_permission():
            raise BulkheadFull(self)
        if self._adaptive is None:
            try:
                return await fn(*args, **kwargs)
            finally:
                self.on_complete()
        start = self._now()
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            self._complete_sample(start, isinstance(exc, self._drop_types))
            raise
        except BaseException:  # cancelled: the permit goes back, the limit learns nothing
            self.on_complete()
            raise
        with self._lock:  # _complete_sample(start, False) inlined, as in call()
            if self._waiters:
                done = False
            else:
                self._finished += 1
                now = self._now()
                self._max = self._adaptive.update(now - start, self._in_use, False, now)
                if self._in_use > 0:
                    self._in_use -= 1
                done = True
        if not done:
            self._complete_sample(start, False)
        elif self.events.has_listeners:
            self._emit(CALL_FINISHED)
        return result

    def decorate(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Wrap ``fn`` (sync or ``async def``) so each call runs through :meth:`call` / :meth:`acall`."""
        return twin_wrapper(fn, self.call, self.acall)

    # -- configuration and lifecycle -------------------------------------------------------------

    def change_config(self, new_config: BulkheadConfig) -> None:
        """Swap the config. Growing hands the new slots to waiters at once. Shrinking blocks nobody
        (Resilience4j blocks the caller): the limit drops and calls in flight drain below it, during
        which ``metrics.available_concurrent_calls`` reads 0."""
        if not isinstance(new_config, BulkheadConfig):
            raise TypeError(f"expected a BulkheadConfig, got {type(new_config).__name__}")
        with self._lock:
            self.config = new_config
            self._max = new_config.max_concurrent_calls
            self._max_wait_ns = int(new_config.max_wait_duration)
            self._set_adaptive()
            granted = self._grant_free_slots_locked()
        for waiter in granted:
            self._wake(waiter)

    def reset(self) -> None:
        """Return to the freshly-built state: every permit free, counters zero, same config and clock.

        Waiters still parked are handed the freed slots in FIFO order. Permits held by calls in flight
        are forgotten: their later release is ignored while the count is 0, but until they finish
        more than ``max_concurrent_calls`` may run. Meant for tests, not for a bulkhead under load.
        """
        with self._lock:
            self._in_use = 0
            self._permitted = self._rejected = self._finished = 0
            self._max = self.config.max_concurrent_calls  # an adaptive limit starts over too
            self._set_adaptive()
            granted = self._grant_free_slots_locked()
        for waiter in granted:
            self._wake(waiter)

    def set_clock(self, clock: Clock) -> None:
        """Use ``clock`` for wait deadlines from now on. A bulkhead has no time-anchored state to reset."""
        with self._lock:
            self._set_clock(clock)

    def _set_clock(self, clock: Clock) -> None:
        self.clock = clock
        self._now = clock.now_ns
        self._real_time = isinstance(clock, MonotonicClock)

    # -- internals (the lock is held only where a name ends in _locked) --------------------------

    def _emit(self, event_type: str) -> None:
        self.events.publish(BulkheadEvent(event_type, self.name))

    def _release_locked(self) -> _Waiter | None:
        """Return one permit: hand it to the oldest waiter if the limit allows, else free it."""
        if self._in_use <= 0:
            return None  # a permit forgotten by reset(): nothing to give back
        if self._waiters and self._in_use <= self._max:
            waiter = self._waiters.popleft()
            waiter.granted = True  # the permit moves to the waiter; _in_use is unchanged
            return waiter
        self._in_use -= 1
        return None

    def _grant_free_slots_locked(self) -> list[_Waiter]:
        granted = []
        while self._waiters and self._in_use < self._max:
            waiter = self._waiters.popleft()
            waiter.granted = True
            self._in_use += 1
            granted.append(waiter)
        return granted

    def _enqueue_locked(self, loop: asyncio.AbstractEventLoop | None) -> _Waiter | bool:
        """Retake the lock-side decision: True (got a slot), False (reject now) or a queued waiter."""
        if self._in_use < self._max:
            self._in_use += 1
            self._permitted += 1
            return True
        if self._max_wait_ns <= 0 or self._max <= 0:
            self._rejected += 1
            return False
        waiter = _Waiter(loop)
        self._waiters.append(waiter)
        return waiter

    def _unqueue_locked(self, waiter: _Waiter) -> None:
        # Absent only when a closed loop's waiter had its permit passed on (see _wake).
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def _settle(self, waiter: _Waiter) -> bool:
        """After a wait ended normally (grant or timeout): the state under the lock decides."""
        with self._lock:
            if waiter.granted:
                self._permitted += 1
                return True
            self._unqueue_locked(waiter)
            self._rejected += 1
            return False

    def _abandon(self, waiter: _Waiter) -> None:
        """The wait was interrupted (KeyboardInterrupt, CancelledError): never keep or leak a permit."""
        with self._lock:
            self._rejected += 1
            if waiter.granted:
                successor = self._release_locked()  # the slot was already ours: pass it on
            else:
                self._unqueue_locked(waiter)
                successor = None
        if successor is not None:
            self._wake(successor)
        if self.events.has_listeners:
            self._emit(CALL_REJECTED)

    def _wake(self, waiter: _Waiter | None) -> None:
        """Wake a waiter that was granted a permit (called without the lock)."""
        while waiter is not None:
            if waiter.lock is not None:
                waiter.lock.release()
                return
            future = waiter.future
            assert future is not None and waiter.loop is not None
            try:
                if waiter.thread_id == get_ident():
                    _resolve(future)  # we are on the waiter's loop thread
                else:
                    waiter.loop.call_soon_threadsafe(_resolve, future)
                return
            except RuntimeError:
                # Its loop is closed, so that task never runs again: give the permit to the next one.
                with self._lock:
                    waiter.granted = False  # if its coroutine is closed later, it must not release twice
                    waiter = self._release_locked()

    def _wait_sync(self) -> bool:
        with self._lock:
            decision = self._enqueue_locked(None)
        if decision is True or decision is False:
            return decision
        waiter = decision
        budget_ns = self._max_wait_ns
        try:
            if self._real_time:
                # Capped: a longer timeout (a wait of centuries, or ~49 days on Windows) raises OverflowError.
                waiter.lock.acquire(True, min(budget_ns / 1e9, threading.TIMEOUT_MAX))  # type: ignore[union-attr]
            else:
                self._park_fake_clock(waiter, budget_ns)
        except BaseException:
            self._abandon(waiter)
            raise
        return self._settle(waiter)

    def _park_fake_clock(self, waiter: _Waiter, budget_ns: int) -> None:
        lock = waiter.lock
        assert lock is not None
        now = self._now
        deadline = now() + budget_ns
        real_deadline = time.monotonic_ns() + budget_ns
        while not lock.acquire(True, _FAKE_CLOCK_POLL_S):
            if now() >= deadline or time.monotonic_ns() >= real_deadline:
                return

    async def _wait_async(self) -> bool:
        loop = asyncio.get_running_loop()
        with self._lock:
            decision = self._enqueue_locked(loop)
        if decision is True or decision is False:
            return decision
        waiter = decision
        future = waiter.future
        assert future is not None
        budget_ns = self._max_wait_ns
        timer = loop.call_later(budget_ns / 1e9, _resolve, future) if self._real_time else None
        try:
            if timer is not None:
                await future
            else:
                await self._apark_fake_clock(future, budget_ns)
        except BaseException:
            self._abandon(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return self._settle(waiter)

    async def _apark_fake_clock(self, future: asyncio.Future[None], budget_ns: int) -> None:
        now = self._now
        deadline = now() + budget_ns
        real_deadline = time.monotonic_ns() + budget_ns
        while not future.done():
            if now() >= deadline or time.monotonic_ns() >= real_deadline:
                return
            # asyncio.wait leaves the future alone on timeout or cancellation; the state decides later.
            await asyncio.wait((future,), timeout=_FAKE_CLOCK_POLL_S)
