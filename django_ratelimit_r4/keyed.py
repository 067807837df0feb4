"""Per-client rate limits: one :class:`KeyedRateLimiter` for every store, and the in-memory cycle store.

A :class:`KeyedRateLimiter` gives every distinct key (client IP, user id, API key, ...) its own budget of
``limit_for_period`` permits per ``limit_refresh_period``. It is written once, for every store: it owns the
events, the wait for a reserved permit within ``timeout_duration``, the exceptions
(``RequestNotPermitted(..., key=)``), the metrics object and the per-key :class:`KeyedRateLimiterView`. Where
the keys' state lives, and by which algorithm it is decided, is its store's business: a
:class:`~django_ratelimit_r4.core.backend.KeyedBackend` (key-addressed, like the ``limits`` library's storage).

* :class:`MemoryKeyedStore` (here) -- the cycle algorithm in bounded memory, the default store;
* :class:`~django_ratelimit_r4.keyed_smooth.SmoothKeyedStore` -- GCRA and the sliding window in memory (built
  by default for a config with those algorithms);
* ``backends.redis.RedisKeyedStore`` and its GCRA, sliding-window and lease variants -- one budget per key
  for the whole cluster (``RedisStore`` builds ``KeyedRateLimiter(..., store=...)`` with them).

The memory cycle store. Its decision is the unkeyed limiter's, exactly:
:func:`django_ratelimit_r4.backends.base.decide` over two ints ``(cycle, permissions)``. A key's state is
packed into one int in one ``OrderedDict`` (about 200 bytes per live key including the key string;
``benchmarks/bench_keyed.py`` measures it). The store relies on one fact: **a key whose lazily refreshed state
is full (no debt, all permits) behaves exactly like an absent key**, because an absent key is read as
``(cycle 0, limit)``, which refreshes to full. So:

* a decision that leaves a key full stores nothing (and removes the entry);
* entries are kept in order of the cycle they were last used in, so the oldest are at the front; each
  insertion and each first use of a key in a new cycle looks at the two oldest entries and drops them
  when they are full (lossless) or idle longer than ``idle_timeout_ns``;
* at ``max_keys`` the oldest entry is evicted (least recently used by cycle). Only this can lose state
  (a key in debt, or that used permits in the current cycle); it is counted in ``lossy_evictions``.

All keys share one time anchor (creation, :meth:`~KeyedRateLimiter.reset` or
:meth:`~KeyedRateLimiter.set_clock`), so their cycles are aligned and the current cycle is cached
once for all keys (a key used in it is recognised with one subtraction); a new key starts full. One
lock guards the store and is held only for the dict operations and the integer decision.

The hot path: this store is the default, and :meth:`KeyedRateLimiter.acquire_quota` (the keyed
``@ratelimit`` fast path) inlines its common case -- a key used in the current cycle with a permit left
after the decision -- instead of calling :meth:`MemoryKeyedStore.decide_quota`, which it equals
(``tests/test_keyed_quota.py`` checks both against a decision then ``quota()``). A limiter on any other store
answers ``acquire_quota`` through the protocol (``_acquire_quota_of_store``, chosen when it is built, so neither
path pays a branch for the other).
"""

from __future__ import annotations

import threading
import types
from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice
from typing import Any

from .backends.base import decide, div_ceil, nanos_to_wait, refresh
from .backends.memory import _IN_MEMORY
from .backends.memory import acquire_many as _memory_acquire_many
from .core.backend import CYCLE, AllOrNothingPlace, KeyedBackend
from .core.clock import SYSTEM_CLOCK, Clock
from .core.exceptions import RequestNotPermitted
from .core.ratelimiter import (
    DRAINED,
    FAILED_ACQUIRE,
    SUCCESSFUL_ACQUIRE,
    RateLimiter,
    RateLimiterConfig,
    RateLimiterEvent,
    RateLimiterEvents,
    refuse_never_grantable,
)
from .core.waiting import Waiters

__all__ = [
    "DEFAULT_MAX_KEYS",
    "AllOrNothingPlan",
    "KeyMetrics",
    "KeyedRateLimiter",
    "KeyedRateLimiterMetrics",
    "KeyedRateLimiterView",
    "MemoryKeyedStore",
    "aacquire_all_keyed",
    "aacquire_all_quotas",
    "acquire_all_keyed",
    "acquire_all_quotas",
    "memory_keyed_store",
]

# (cycle, permissions) packed as cycle << 64 | (permissions + 2**63): one int object per key.
_SHIFT = 64
_OFFSET = 1 << 63
_STALE = -_OFFSET  # packed - _cycle_floor below this: stored in an earlier cycle (a constant: no int built per call)
_MASK = (1 << 64) - 1
_FRONT_CHECKS = 2  # oldest entries examined per insertion / cycle change: O(1), keeps the store clean

#: Default ``max_keys``: about 20 MB per keyed limiter at the cap (~200 bytes per live key, measured by
#: ``python benchmarks/bench_keyed_memory.py``); 1,000,000 was ~200 MB per limiter and per worker.
DEFAULT_MAX_KEYS = 100_000


def _check_bounds(max_keys: int, idle_timeout_ns: int | None) -> None:
    if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
        raise ValueError(f"max_keys must be an int >= 1, got {max_keys!r}")
    if idle_timeout_ns is not None and (not isinstance(idle_timeout_ns, int) or idle_timeout_ns < 0):
        raise ValueError(f"idle_timeout_ns must be None or an int >= 0, got {idle_timeout_ns!r}")


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")


class KeyedRateLimiterMetrics:
    """Aggregate figures of a :class:`KeyedRateLimiter`; plain reads, for exporters at scrape time.

    Calls and waiting callers are counted in this process (a shared store's budgets live elsewhere).
    """

    __slots__ = ("_limiter",)

    def __init__(self, limiter: KeyedRateLimiter) -> None:
        self._limiter = limiter

    @property
    def successful_calls(self) -> int:
        """Granted decisions, all keys, since the last full reset."""
        return self._limiter.store.successful_calls

    @property
    def failed_calls(self) -> int:
        """Rejected decisions, all keys, since the last full reset."""
        return self._limiter.store.failed_calls

    @property
    def live_keys(self) -> int:
        """Keys currently holding state (others are full, i.e. as if never seen); -1 when the store cannot
        count them cheaply (Redis: ``state.snapshot()`` reports null with a note, no Prometheus ``keys`` gauge)."""
        return self._limiter.store.live_keys()

    @property
    def lossy_evictions(self) -> int:
        """Keys evicted at ``max_keys`` while holding state (they came back with a fresh budget)."""
        return self._limiter.store.lossy_evictions

    @property
    def number_of_waiting_threads(self) -> int:
        """Callers currently waiting for a reserved permit (only with ``timeout_duration > 0``)."""
        return self._limiter._waiters.count

    def __repr__(self) -> str:
        return (
            f"KeyedRateLimiterMetrics(live_keys={self.live_keys}, successful_calls={self.successful_calls}, "
            f"failed_calls={self.failed_calls}, lossy_evictions={self.lossy_evictions})"
        )


class MemoryKeyedStore:
    """The cycle algorithm's per-key state in bounded memory (a :class:`~.core.backend.KeyedBackend`); see the
    module doc. The default store of a :class:`KeyedRateLimiter` whose config's algorithm is ``"cycle"``."""

    remote = False
    #: A rejection's figures come with it (no second read for the 429's RateLimit fields).
    rejection_quotas = True

    def __init__(
        self,
        config: RateLimiterConfig,
        clock: Clock,
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
        idle_timeout_ns: int | None = None,
    ) -> None:
        """Build an empty store.

        :param max_keys: live keys kept at most (>= 1); the least recently used is evicted beyond it.
        :param idle_timeout_ns: also drop keys unused for this long even if not full (e.g. a long debt);
            ``None`` drops only full keys early. Precision is one refresh period.
        """
        _check_bounds(max_keys, idle_timeout_ns)
        self.config = config
        self.max_keys = max_keys
        self._limit = int(config.limit_for_period)
        self._period = int(config.limit_refresh_period)
        # Keys idle for this many whole cycles are dropped even with state; None = never.
        self._idle_cycles = None if idle_timeout_ns is None else -(-idle_timeout_ns // self._period) + 1
        self._lock = threading.Lock()
        self._states: OrderedDict[str, Any] = OrderedDict()
        self._reset_locked(clock)

    # -- internals (caller holds the lock) ----------------------------------------------------------------

    def _reset_locked(self, clock: Clock) -> None:
        self._clock = clock
        self._now = clock.now_ns
        self._anchor = self._now()
        self._set_cycle(0)
        self._states.clear()
        self.successful_calls = 0
        self.failed_calls = 0
        self.lossy_evictions = 0

    def _set_cycle(self, cycle: int) -> None:
        # The current cycle, shared by every key (one anchor), cached for the fast paths: its end on the
        # clock, and the packed value of (cycle, 0 permissions). A key stored in this cycle has
        # ``packed - _cycle_floor == permissions``; one stored earlier gives less than -2**63.
        self._cycle_end = self._anchor + (cycle + 1) * self._period
        self._cycle_floor = (cycle << _SHIFT) + _OFFSET

    def _load(self, key: str) -> tuple[int, int, int | None]:
        """``(cycle, permissions, packed or None)``; an absent key reads as ``(0, limit)``, i.e. full."""
        packed = self._states.get(key)
        if packed is None:
            return 0, self._limit, None
        return packed >> _SHIFT, (packed & _MASK) - _OFFSET, packed

    def _store(self, key: str, old_packed: int | None, old_cycle: int, cycle: int, permissions: int) -> None:
        """Write a key's new state, applying the full-equals-absent rule and the eviction policy."""
        states = self._states
        if permissions >= self._limit:
            if old_packed is not None:
                del states[key]  # full again: the entry carries no information
            return
        packed = (cycle << _SHIFT) | (permissions + _OFFSET)
        if old_packed is not None:
            states[key] = packed
            if cycle != old_cycle:
                states.move_to_end(key)  # keep the store ordered by cycle of last use
                self._sweep_front(cycle)
            return
        self._sweep_front(cycle)
        if len(states) >= self.max_keys:
            # The sweep stopped at the oldest entry because it holds state: evicting it loses that state.
            states.popitem(last=False)
            self.lossy_evictions += 1
        states[key] = packed

    def _sweep_front(self, cycle: int) -> None:
        """Drop up to ``_FRONT_CHECKS`` oldest entries that are full now or idle too long."""
        states = self._states
        limit = self._limit
        idle = self._idle_cycles
        for _ in range(_FRONT_CHECKS):
            if not states:
                return
            key = next(iter(states))
            packed = states[key]
            old_cycle = packed >> _SHIFT
            full = refresh(old_cycle, (packed & _MASK) - _OFFSET, cycle, limit) >= limit
            if not full and (idle is None or cycle - old_cycle < idle):
                return
            del states[key]

    def _decide_quota_locked(
        self, key: str, packed: int | None, now: int, permits: int, timeout_ns: int
    ) -> tuple[int, int, int]:
        """:meth:`decide_quota` under the lock: ``packed`` is ``key``'s entry and ``now`` the time since the
        anchor, both read under the lock."""
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits!r}")
        if packed is None:
            cycle, permissions = 0, self._limit
        else:
            cycle, permissions = packed >> _SHIFT, (packed & _MASK) - _OFFSET
        period = self._period
        current, permissions, wait, granted = decide(
            cycle, permissions, permits, timeout_ns, now, period, self._limit
        )
        if not granted:
            # Nothing stored; the refreshed figures are what quota() would read now (rejection_quotas).
            self.failed_calls += 1
            if permissions >= 1:
                return -wait, permissions, (current + 1) * period - now
            return -wait, permissions, wait if permits == 1 else nanos_to_wait(
                permissions, 1, current, now, period, self._limit
            )
        self.successful_calls += 1
        self._store(key, packed, cycle, current, permissions)
        if permissions >= 1:
            return wait, permissions, (current + 1) * period - now
        return wait, permissions, nanos_to_wait(permissions, 1, current, now, period, self._limit)

    # -- the KeyedBackend protocol ----------------------------------------------------------------------

    def decide(self, key: str, permits: int, timeout_ns: int) -> int:
        """Decide and commit for ``key``: wait ``>= 0`` granted (reserved), ``< 0`` rejected (``-wait``).

        ``timeout_ns`` is ``>= 0`` here (peeks go through :meth:`state`).
        """
        lock = self._lock
        lock.acquire()
        try:
            states = self._states
            packed = states.get(key)
            now = self._now()
            if now >= self._cycle_end:
                self._set_cycle((now - self._anchor) // self._period)
            if packed is not None and permits > 0:
                permissions = packed - self._cycle_floor
                if permissions >= _STALE:
                    # Stored in the current cycle (see _set_cycle), so decide() would not refresh: its
                    # answer is nanos_to_wait() against the stored permissions, granted when the timeout
                    # covers it. Spelled out here to skip decide()'s calls on the common paths.
                    # Subtracting from the packed int decrements its permissions field. A property test
                    # checks the store against decide() step by step.
                    if permissions >= permits:
                        states[key] = packed - permits
                        self.successful_calls += 1
                        return 0
                    wait = (
                        self._cycle_end
                        - now
                        + div_ceil(permits - permissions - self._limit, self._limit) * self._period
                    )
                    if timeout_ns >= wait:
                        states[key] = packed - permits
                        self.successful_calls += 1
                        return wait
                    self.failed_calls += 1
                    return -wait
            if packed is None:
                cycle, permissions = 0, self._limit
            else:
                cycle, permissions = packed >> _SHIFT, (packed & _MASK) - _OFFSET
            now -= self._anchor
            if permits < 1:
                raise ValueError(f"permits must be >= 1, got {permits!r}")
            new_cycle, new_permissions, wait, granted = decide(
                cycle, permissions, permits, timeout_ns, now, self._period, self._limit
            )
            if granted:
                self.successful_calls += 1
                self._store(key, packed, cycle, new_cycle, new_permissions)
                return wait
            self.failed_calls += 1
            return -wait
        finally:
            lock.release()

    async def adecide(self, key: str, permits: int, timeout_ns: int) -> int:
        """:meth:`decide` (integer work under a lock held for a few operations: nothing to await)."""
        return self.decide(key, permits, timeout_ns)

    def decide_quota(self, key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """``(wait, remaining, reset_ns)``: :meth:`decide`, and what :meth:`quota` answers right after it
        (a rejection's too: :attr:`rejection_quotas`)."""
        with self._lock:
            return self._decide_quota_locked(
                key, self._states.get(key), self._now() - self._anchor, permits, timeout_ns
            )

    async def adecide_quota(self, key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """:meth:`decide_quota` (nothing to await)."""
        return self.decide_quota(key, permits, timeout_ns)

    def drain(self, key: str) -> int:
        """Set ``key``'s refreshed permissions to 0 (debt kept) and return how many were drained."""
        with self._lock:
            cycle, permissions, packed = self._load(key)
            current, permissions, _, _ = decide(
                cycle, permissions, 1, -1, self._now() - self._anchor, self._period, self._limit
            )
            drained = permissions if permissions > 0 else 0
            self._store(key, packed, cycle, current, permissions - drained)
        return drained

    def give_back(self, key: str, permits: int, since_ns: int) -> None:
        """Undo a grant of ``permits`` to ``key`` decided at or after ``since_ns`` (a reading of this store's
        clock), while the cycle containing ``since_ns`` is still the current one (see
        :meth:`MemoryBackend.give_back <django_ratelimit_r4.backends.memory.MemoryBackend.give_back>`)."""
        with self._lock:
            if since_ns < self._anchor:
                return
            now = self._now() - self._anchor
            cycle = now // self._period
            if (since_ns - self._anchor) // self._period != cycle:
                return
            stored, permissions, packed = self._load(key)
            if packed is None or stored != cycle:
                return  # full or reset since: nothing of this grant is left to give back
            self._store(key, packed, stored, cycle, min(permissions + permits, self._limit))
            self.successful_calls -= 1

    def state(self, key: str) -> tuple[int, int, int]:
        """``(cycle, available_permissions, nanos_to_wait for 1 permit)`` for ``key``; changes nothing."""
        with self._lock:
            cycle, permissions, _ = self._load(key)
            current, permissions, wait, _ = decide(
                cycle, permissions, 1, -1, self._now() - self._anchor, self._period, self._limit
            )
        return current, permissions, wait

    def quota(self, key: str) -> tuple[int, int]:
        """``(remaining, reset_ns)`` for ``key`` now, for RateLimit headers; changes nothing.

        ``remaining`` may be negative (reservation debt). ``reset_ns`` is the time to the next cycle
        boundary while permits remain, else the wait for one permit.
        """
        # Lock-free snapshot: one dict read of one packed int (atomic), advisory figures only.
        packed = self._states.get(key)
        now = self._now() - self._anchor
        period = self._period
        current = now // period
        if packed is None:
            return self._limit, (current + 1) * period - now
        permissions = refresh(packed >> _SHIFT, (packed & _MASK) - _OFFSET, current, self._limit)
        if permissions >= 1:
            return permissions, (current + 1) * period - now
        return permissions, nanos_to_wait(permissions, 1, current, now, period, self._limit)

    async def aquota(self, key: str) -> tuple[int, int]:
        """:meth:`quota` (nothing to await)."""
        return self.quota(key)

    def _peek_locked(self, key: str, permits: int) -> tuple[int, int | None, int, int, int]:
        """``(wait, packed, stored cycle, current cycle, refreshed permissions)``; caller holds the lock."""
        cycle, permissions, packed = self._load(key)
        current, permissions, wait, _ = decide(
            cycle, permissions, permits, -1, self._now() - self._anchor, self._period, self._limit
        )
        return wait, packed, cycle, current, permissions

    def _commit_peek_locked(self, key: str, peek: Any, permits: int) -> None:
        """Take ``permits`` for ``key`` after :meth:`_peek_locked` gave ``peek`` with wait 0; caller holds the lock."""
        _, packed, cycle, current, permissions = peek
        self._store(key, packed, cycle, current, permissions - permits)

    def purge(self) -> int:
        """Drop every full (or idle-expired) entry now; returns how many. O(live keys); for housekeeping."""
        with self._lock:
            cycle = (self._now() - self._anchor) // self._period
            limit = self._limit
            idle = self._idle_cycles
            dead = [
                key
                for key, packed in self._states.items()
                if refresh(packed >> _SHIFT, (packed & _MASK) - _OFFSET, cycle, limit) >= limit
                or (idle is not None and cycle - (packed >> _SHIFT) >= idle)
            ]
            for key in dead:
                del self._states[key]
            return len(dead)

    def reset(self, key: str | None = None) -> None:
        """Forget ``key`` (it is full again), or with no key every key and the counters (time from now)."""
        with self._lock:
            if key is None:
                self._reset_locked(self._clock)
            else:
                self._states.pop(key, None)

    def set_clock(self, clock: Clock) -> None:
        """Read time from ``clock`` and reset everything, so cycles start at ``clock``'s current time."""
        with self._lock:
            self._reset_locked(clock)

    def keys(self, limit: int | None = None) -> list[str]:
        """The keys holding state, least recently used (by cycle) first: a snapshot copied under the lock
        (``limit`` caps the copy, and the time the lock is held, at the ``limit`` oldest keys)."""
        _check_limit(limit)
        with self._lock:
            if limit is None or limit >= len(self._states):
                return list(self._states)
            return list(islice(self._states, limit))

    def live_keys(self) -> int:
        """Keys holding state (an entry may be full already: full entries are dropped lazily)."""
        return len(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, key: object) -> bool:
        return key in self._states

    def __repr__(self) -> str:
        return (
            f"MemoryKeyedStore(limit_for_period={self._limit}, limit_refresh_period_ns={self._period}, "
            f"live_keys={len(self)}, max_keys={self.max_keys})"
        )


def memory_keyed_store(
    config: RateLimiterConfig, clock: Clock, *, max_keys: int = DEFAULT_MAX_KEYS, idle_timeout_ns: int | None = None
) -> KeyedBackend:
    """The in-memory store of ``config``'s algorithm: :class:`MemoryKeyedStore` for ``"cycle"``, else
    :class:`~django_ratelimit_r4.keyed_smooth.SmoothKeyedStore` (GCRA, sliding window)."""
    if config.algorithm == CYCLE:
        return MemoryKeyedStore(config, clock, max_keys=max_keys, idle_timeout_ns=idle_timeout_ns)
    from .keyed_smooth import SmoothKeyedStore

    return SmoothKeyedStore(config, clock, max_keys=max_keys, idle_timeout_ns=idle_timeout_ns)


class KeyedRateLimiter:
    """A rate limiter per key, with the instance's ``RateLimiterConfig``; the keys' state lives in ``store``.

    Follows the primitives' contract (``name``, ``config``, ``clock``, ``metrics``, ``events``,
    ``reset``, ``set_clock``) with a ``key`` first argument on every decision. ``get(key)`` returns a
    :class:`KeyedRateLimiterView` that looks like a ``RateLimiter`` for one key. One class for every store
    (see the module doc): the store decides and counts, this class publishes events, waits for reserved
    permits, raises and answers metrics.
    """

    def __init__(
        self,
        name: str,
        config: RateLimiterConfig | None = None,
        *,
        clock: Clock | None = None,
        max_keys: int = DEFAULT_MAX_KEYS,
        idle_timeout_ns: int | None = None,
        store: KeyedBackend | None = None,
    ) -> None:
        """Build a limiter over ``store`` (built on ``clock``), or by default over an empty in-memory store
        of ``config``'s algorithm (:func:`memory_keyed_store`).

        :param max_keys: live keys an in-memory store keeps at most (>= 1); the least recently used is
            evicted beyond it.
        :param idle_timeout_ns: an in-memory store also drops keys unused for this long even if not full
            (e.g. a long debt); ``None`` drops only full keys early. Precision is one refresh period.
        """
        self.name = name
        self.config: RateLimiterConfig = config if config is not None else RateLimiterConfig()
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        if store is None:
            store = memory_keyed_store(self.config, self.clock, max_keys=max_keys, idle_timeout_ns=idle_timeout_ns)
        self.max_keys = max_keys
        self.idle_timeout_ns = idle_timeout_ns
        self.events = RateLimiterEvents()
        self.metrics = KeyedRateLimiterMetrics(self)
        self._timeout_ns = int(self.config.timeout_duration)
        self._waiters = Waiters()
        #: Where the keys' state lives (a :class:`~django_ratelimit_r4.core.backend.KeyedBackend`).
        self.store: KeyedBackend = store
        # The store's decisions, bound once (the hot paths call them directly).
        self._decide = store.decide
        self._adecide = store.adecide
        self._decide_quota = store.decide_quota
        self._adecide_quota = store.adecide_quota
        if type(store) is not MemoryKeyedStore:
            # acquire_quota inlines the default store's common case; a store may write out its own
            # (limiter_acquire_quota, a function of the limiter bound as a method: the in-memory sliding window);
            # every other store decides through the protocol.
            inline = getattr(store, "limiter_acquire_quota", None)
            self.acquire_quota = (  # type: ignore[method-assign]
                self._acquire_quota_of_store if inline is None else types.MethodType(inline, self)
            )
        self._rejection_quotas = store.rejection_quotas

    @property
    def successful_calls(self) -> int:
        """Granted decisions, all keys, since the last full reset (the store counts them)."""
        return self.store.successful_calls

    @property
    def failed_calls(self) -> int:
        """Rejected decisions, all keys, since the last full reset (the store counts them)."""
        return self.store.failed_calls

    @property
    def lossy_evictions(self) -> int:
        """Keys the store lost with state at ``max_keys``."""
        return self.store.lossy_evictions

    # -- deciding ---------------------------------------------------------------------------------------

    def acquire_permission(self, key: str, permits: int = 1) -> bool:
        """Take ``permits`` from ``key``'s budget; True if granted.

        Waits with ``clock.sleep`` only when the wait fits in ``timeout_duration`` (permits reserved
        first); otherwise returns False at once. From async code use :meth:`aacquire_permission`.
        """
        wait = self._decide(key, permits, self._timeout_ns)
        if wait < 0:
            refuse_never_grantable(self, permits, self._timeout_ns)
            if self.events.wants_failed:
                self._publish(FAILED_ACQUIRE, permits)
            return False
        if wait > 0:
            self._waiters.sleep(self.clock, wait)
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)
        return True

    async def aacquire_permission(self, key: str, permits: int = 1) -> bool:
        """Async twin of :meth:`acquire_permission`; waits with ``await clock.asleep``, never blocks the loop."""
        wait = await self._adecide(key, permits, self._timeout_ns)
        if wait < 0:
            refuse_never_grantable(self, permits, self._timeout_ns)
            if self.events.wants_failed:
                self._publish(FAILED_ACQUIRE, permits)
            return False
        if wait > 0:
            await self._waiters.asleep(self.clock, wait)
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)
        return True

    def acquire_or_raise(self, key: str, permits: int = 1) -> None:
        """Like :meth:`acquire_permission` but raise :class:`RequestNotPermitted` on rejection.

        The exception's ``wait_ns`` is ``key``'s wait, computed with the decision; ``exc.key`` is the key
        (for logs; responses never echo it).
        """
        wait = self._decide(key, permits, self._timeout_ns)
        if wait < 0:
            refuse_never_grantable(self, permits, self._timeout_ns)
            raise self._rejection(key, permits, -wait)
        if wait > 0:
            self._waiters.sleep(self.clock, wait)
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)

    async def aacquire_or_raise(self, key: str, permits: int = 1) -> None:
        """Async twin of :meth:`acquire_or_raise`."""
        wait = await self._adecide(key, permits, self._timeout_ns)
        if wait < 0:
            refuse_never_grantable(self, permits, self._timeout_ns)
            raise self._rejection(key, permits, -wait)
        if wait > 0:
            await self._waiters.asleep(self.clock, wait)
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)

    def acquire_quota(self, key: str, permits: int = 1) -> tuple[int, int]:
        """:meth:`acquire_or_raise`, returning ``key``'s ``(remaining, reset_ns)`` as :meth:`quota` reads it
        when the permits are handed over: right after the decision, or after the wait for a reserved permit.

        One step instead of a decision and a second read for the RateLimit header fields (one round trip on
        a shared store); the figures are this decision's own (a concurrent request's permits are not
        subtracted from them). A store with :attr:`~.core.backend.KeyedBackend.rejection_quotas` gives a
        rejection its figures too (``RequestNotPermitted.quotas``).

        This is the default store's (:class:`MemoryKeyedStore`) code, its common case inlined (see the module
        doc); a limiter on any other store answers with :meth:`_acquire_quota_of_store` instead (set when built).
        """
        store: MemoryKeyedStore = self.store  # type: ignore[assignment]
        lock = store._lock
        lock.acquire()
        try:
            states = store._states
            packed = states.get(key)
            now = store._now()
            end = store._cycle_end
            if now >= end:
                store._set_cycle((now - store._anchor) // store._period)
                end = store._cycle_end
            # The common case, spelled out: the key was last used in the current cycle (else the difference is
            # below -2**63) and a permit is left after these, so decide() grants without a refresh and quota()
            # would answer (left, time to the cycle boundary).
            permissions = 0 if packed is None else packed - store._cycle_floor
            if 0 < permits < permissions:
                states[key] = packed - permits  # type: ignore[operator]
                store.successful_calls += 1
                wait, remaining, reset_ns = 0, permissions - permits, end - now
            elif packed is not None and permits - store._limit <= permissions < permits and end - now > self._timeout_ns:
                # The common rejection, spelled out too: used in this cycle, too few left, and the next cycle's
                # refill would be enough, so decide() waits exactly until the boundary (past the timeout):
                # nothing is stored, and quota() would answer (left, that same wait).
                store.failed_calls += 1
                wait, remaining, reset_ns = now - end, permissions, end - now
            else:
                wait, remaining, reset_ns = store._decide_quota_locked(
                    key, packed, now - store._anchor, permits, self._timeout_ns
                )
        finally:
            lock.release()
        if wait:
            if wait < 0:
                if permits > 1:  # one permit is always grantable (a limit and a burst are >= 1)
                    refuse_never_grantable(self, permits, self._timeout_ns)
                # The figures read with the decision (rejection_quotas). Raised without a local holding it:
                # that frame, kept by the traceback, would close a reference cycle for the cyclic GC.
                raise self._rejection(key, permits, -wait, ((remaining, reset_ns),))
            self._waiters.sleep(self.clock, wait)
            remaining, reset_ns = store.quota(key)
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)
        return remaining, reset_ns

    def _acquire_quota_of_store(self, key: str, permits: int = 1) -> tuple[int, int]:
        """:meth:`acquire_quota` through the store's ``decide_quota`` (every store but the default one)."""
        wait, remaining, reset_ns = self._decide_quota(key, permits, self._timeout_ns)
        if wait:
            if wait < 0:
                if permits > 1:  # one permit is always grantable (a limit and a burst are >= 1)
                    refuse_never_grantable(self, permits, self._timeout_ns)
                raise self._rejection(  # no local holding it (see acquire_quota)
                    key, permits, -wait, ((remaining, reset_ns),) if self._rejection_quotas else None
                )
            self._waiters.sleep(self.clock, wait)
            remaining, reset_ns = self.store.quota(key)
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)
        return remaining, reset_ns

    async def aacquire_quota(self, key: str, permits: int = 1) -> tuple[int, int]:
        """Async twin of :meth:`acquire_quota` (a reserved permit is awaited, never slept for), through the store's
        ``adecide_quota`` for every store."""
        wait, remaining, reset_ns = await self._adecide_quota(key, permits, self._timeout_ns)
        if wait:
            if wait < 0:
                if permits > 1:  # one permit is always grantable (a limit and a burst are >= 1)
                    refuse_never_grantable(self, permits, self._timeout_ns)
                raise self._rejection(  # no local holding it (see acquire_quota)
                    key, permits, -wait, ((remaining, reset_ns),) if self._rejection_quotas else None
                )
            await self._waiters.asleep(self.clock, wait)
            remaining, reset_ns = await self.store.aquota(key)
        if self.events.wants_successful:
            self._publish(SUCCESSFUL_ACQUIRE, permits)
        return remaining, reset_ns

    def reserve_permission(self, key: str, permits: int = 1) -> int:
        """Reserve without waiting: 0 (use now), ns the caller must wait (reserved), or -1 (rejected)."""
        wait = self._decide(key, permits, self._timeout_ns)
        if wait >= 0:
            if self.events.wants_successful:
                self._publish(SUCCESSFUL_ACQUIRE, permits)
            return wait
        refuse_never_grantable(self, permits, self._timeout_ns)
        if self.events.wants_failed:
            self._publish(FAILED_ACQUIRE, permits)
        return -1

    def give_back(self, key: str, permits: int, since_ns: int, taken: Any = None) -> None:
        """Undo a grant of ``permits`` to ``key`` decided at or after ``since_ns`` (in-memory stores only: the
        mixed all-or-nothing decision gives its in-memory permits back when Redis rejects); ``taken``: what the
        store's take returned, when not None (GCRA: the tat it wrote)."""
        if taken is None:
            self.store.give_back(key, permits, since_ns)  # type: ignore[attr-defined]
        else:
            self.store.give_back(key, permits, since_ns, taken)  # type: ignore[attr-defined]

    def drain_permissions(self, key: str) -> int:
        """Set ``key``'s refreshed permissions to 0 (debt kept) and return how many were drained (0 when a
        shared store cannot be reached)."""
        drained = self.store.drain(key)
        if self.events.wants_drained:
            self._publish(DRAINED, drained)
        return drained

    def state(self, key: str) -> tuple[int, int, int]:
        """``(cycle, available_permissions, nanos_to_wait for 1 permit)`` for ``key``; changes nothing."""
        return self.store.state(key)

    def quota(self, key: str) -> tuple[int, int]:
        """``(remaining, reset_ns)`` for ``key`` now, for RateLimit headers; changes nothing.

        ``remaining`` may be negative (reservation debt). ``reset_ns`` is the time to the next cycle
        boundary while permits remain, else the wait for one permit.
        """
        return self.store.quota(key)

    async def aquota(self, key: str) -> tuple[int, int]:
        """Async twin of :meth:`quota` (one round trip on a shared store, never blocking the loop)."""
        return await self.store.aquota(key)

    def get(self, key: str) -> KeyedRateLimiterView:
        """A ``RateLimiter``-like view of ``key`` (creates nothing until it is used)."""
        return KeyedRateLimiterView(self, key)

    # -- management -------------------------------------------------------------------------------------

    def purge(self) -> int:
        """Drop every full (or idle-expired) entry now; returns how many. O(live keys); for housekeeping."""
        return self.store.purge()

    def reset(self, key: str | None = None) -> None:
        """Forget ``key`` (it is full again), or with no key return to the freshly built state."""
        self.store.reset(key)

    def set_clock(self, clock: Clock) -> None:
        """Read time from ``clock`` and reset everything, so cycles start at ``clock``'s current time."""
        self.clock = clock
        self.store.set_clock(clock)

    def keys(self, limit: int | None = None) -> list[str]:
        """The keys holding state, least recently used (by cycle) first: a snapshot copied under the lock.

        ``limit`` caps the copy (and the time the lock is held) at the ``limit`` oldest keys; ``None``
        copies them all. A key may still be listed after it has refilled: full entries are dropped
        lazily (see :meth:`purge`). Use it for operator listings, not per request: it is O(keys). A store
        that keeps only digests of the keys (Redis) lists none.
        """
        return self.store.keys(limit)

    def __len__(self) -> int:
        """Number of keys holding state."""
        return len(self.store)

    def __contains__(self, key: object) -> bool:
        return key in self.store

    # -- internals --------------------------------------------------------------------------------------

    def _rejection(
        self, key: str, permits: int, wait_ns: int, quotas: tuple[tuple[int, int], ...] | None = None
    ) -> RequestNotPermitted:
        if self.events.wants_failed:
            self._publish(FAILED_ACQUIRE, permits)
        return RequestNotPermitted(self, wait_ns, key=key, quotas=quotas)  # type: ignore[arg-type]

    def _publish(self, event_type: str, permits: int) -> None:
        self.events.publish(RateLimiterEvent(event_type, self.name, number_of_permits=permits))

    def __repr__(self) -> str:
        return f"KeyedRateLimiter({self.name!r}, store={self.store!r})"


class KeyMetrics:
    """Per-key figures of a :class:`KeyedRateLimiterView`, computed when read (side-effect free)."""

    __slots__ = ("_key", "_parent")

    def __init__(self, parent: KeyedRateLimiter, key: str) -> None:
        self._parent = parent
        self._key = key

    @property
    def available_permissions(self) -> int:
        """Permissions available now for this key; negative while reservations are outstanding."""
        return self._parent.state(self._key)[1]

    @property
    def nanos_to_wait(self) -> int:
        """Nanoseconds until one permit is available for this key (0 if one is available now)."""
        return self._parent.state(self._key)[2]

    @property
    def cycle(self) -> int:
        """The current cycle, counted from the keyed limiter's anchor."""
        return self._parent.state(self._key)[0]

    def __repr__(self) -> str:
        cycle, available, wait = self._parent.state(self._key)
        return f"KeyMetrics(available_permissions={available}, nanos_to_wait={wait}, cycle={cycle})"


class KeyedRateLimiterView:
    """One key of a :class:`KeyedRateLimiter`, shaped like a ``RateLimiter``.

    ``name``, ``config`` and ``clock`` are the parent's; ``metrics`` are this key's. Holding a view
    keeps no state alive: it is a (parent, key) pair, and the key's state may be evicted as usual.
    """

    __slots__ = ("key", "metrics", "parent")

    def __init__(self, parent: KeyedRateLimiter, key: str) -> None:
        self.parent = parent
        self.key = key
        self.metrics = KeyMetrics(parent, key)

    @property
    def name(self) -> str:
        """The keyed limiter's name (never the key)."""
        return self.parent.name

    @property
    def config(self) -> RateLimiterConfig:
        """The keyed limiter's config."""
        return self.parent.config

    @property
    def clock(self) -> Clock:
        """The keyed limiter's clock."""
        return self.parent.clock

    def acquire_permission(self, permits: int = 1) -> bool:
        """See :meth:`KeyedRateLimiter.acquire_permission`."""
        return self.parent.acquire_permission(self.key, permits)

    async def aacquire_permission(self, permits: int = 1) -> bool:
        """See :meth:`KeyedRateLimiter.aacquire_permission`."""
        return await self.parent.aacquire_permission(self.key, permits)

    def acquire_or_raise(self, permits: int = 1) -> None:
        """See :meth:`KeyedRateLimiter.acquire_or_raise`."""
        self.parent.acquire_or_raise(self.key, permits)

    async def aacquire_or_raise(self, permits: int = 1) -> None:
        """See :meth:`KeyedRateLimiter.aacquire_or_raise`."""
        await self.parent.aacquire_or_raise(self.key, permits)

    def reserve_permission(self, permits: int = 1) -> int:
        """See :meth:`KeyedRateLimiter.reserve_permission`."""
        return self.parent.reserve_permission(self.key, permits)

    def drain_permissions(self) -> int:
        """See :meth:`KeyedRateLimiter.drain_permissions`."""
        return self.parent.drain_permissions(self.key)

    def reset(self) -> None:
        """Forget this key's state (full again)."""
        self.parent.reset(self.key)

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, KeyedRateLimiterView) and other.parent is self.parent and other.key == self.key
        )

    def __hash__(self) -> int:
        return hash((id(self.parent), self.key))

    def __repr__(self) -> str:
        return f"KeyedRateLimiterView({self.parent.name!r}, key=<{len(self.key)} chars>)"


def _peek_unkeyed(limiter: RateLimiter, permits: int) -> int:
    """Wait in ns before ``permits`` are available on an unkeyed limiter, from its public state.

    Exact for one permit; for several it is exact when none are left and otherwise 0 (the time to the
    cycle boundary is not public) -- only used to enlarge a Retry-After that another limiter set. Backends
    of the other algorithms answer exactly (their ``peek``).
    """
    peek = getattr(limiter.backend, "peek", None)
    if peek is not None:
        return peek(permits)  # type: ignore[no-any-return]
    _, available, wait_one = limiter.backend.state()
    if available >= permits:
        return 0
    if permits == 1 or available >= 1:
        return wait_one if available < 1 else 0
    limit = int(limiter.config.limit_for_period)
    period = int(limiter.config.limit_refresh_period)
    to_next = wait_one - div_ceil(1 - (available + limit), limit) * period
    return to_next + div_ceil(permits - (available + limit), limit) * period


def _is_remote(limiter: Any) -> bool:
    """Whether ``limiter``'s state lives outside this process, as the limiter says (found when it was built)."""
    if isinstance(limiter, KeyedRateLimiter):
        return bool(limiter.store.remote)
    return limiter.remote_backend is not None


def _remote_decider(limiters: Sequence[Any]) -> Any | None:
    """The all-or-nothing decider of remote ``limiters``, asked of their holders
    (:class:`~.core.backend.AllOrNothingPlace`); None for one limiter whose holder has none (decided alone).

    TypeError when they live in several places (two Redis connections), or several have no decider.
    """
    deciders: dict[int, Any] = {}
    for limiter in limiters:
        holder = limiter.store if isinstance(limiter, KeyedRateLimiter) else limiter.backend
        if not isinstance(holder, AllOrNothingPlace):
            if len(limiters) == 1:
                return None
            raise TypeError(
                f"cannot decide rate limiters {[lim.name for lim in limiters]} all-or-nothing in one call: "
                f"{type(holder).__name__} (of {limiter.name!r}) cannot decide several limits at once "
                "(it has no all_or_nothing()); an all-or-nothing decision may hold one such limit"
            )
        decider, place = holder.all_or_nothing()
        deciders[id(place)] = decider
    if len(deciders) > 1:
        raise TypeError(
            f"cannot decide rate limiters {[lim.name for lim in limiters]} all-or-nothing in one call: they live "
            "in different places (different Redis servers, or backends with different connection OPTIONS), and "
            "one script cannot reach both; give them one redis backend"
        )
    return next(iter(deciders.values()))


class AllOrNothingPlan:
    """How a fixed list of limiters is decided all-or-nothing, found once (a gate's plan, per registry
    generation) by asking the limiters where their state lives, so a request pays no classification.

    ``remote``: some limit lives outside this process; ``mixed``: some in it too. ``acquire_all`` /
    ``aacquire_all`` (None when every limit is in this process: decided inline) decide a subset of the
    limiters in their order (entries as :func:`acquire_all_keyed`'s).
    """

    __slots__ = ("aacquire_all", "aacquire_all_quotas", "acquire_all", "acquire_all_quotas", "decider", "mixed", "remote")

    def __init__(self, limiters: Sequence[Any]) -> None:
        flags = [_is_remote(limiter) for limiter in limiters]
        self.remote = any(flags)
        self.mixed = self.remote and not all(flags)
        #: The remote limits' one decider (None: no remote limit, or one without a decider).
        remote = [limiter for limiter, flag in zip(limiters, flags, strict=True) if flag]
        self.decider = _remote_decider(remote) if remote else None
        self.acquire_all: Any = _acquire_memory
        self.aacquire_all: Any = None
        #: The same with every entry's ``(remaining, reset_ns)`` after it, one remote round trip at most (None
        #: when every limit is in this process: the gate reads their snapshots itself).
        self.acquire_all_quotas: Any = None
        self.aacquire_all_quotas: Any = None
        decider = self.decider
        if decider is not None and not self.mixed:  # all in one remote place: its decider, bound
            self.acquire_all, self.aacquire_all = decider.acquire_all_keyed, decider.aacquire_all_keyed
            self.acquire_all_quotas = decider.acquire_all_quotas
            self.aacquire_all_quotas = decider.aacquire_all_quotas
        elif self.remote:  # in memory and elsewhere (or one remote limit without a decider): the mixed path
            self.acquire_all, self.aacquire_all = acquire_all_keyed, aacquire_all_keyed
            self.acquire_all_quotas, self.aacquire_all_quotas = acquire_all_quotas, aacquire_all_quotas


def _give_back(entries: Sequence[tuple[Any, Any]], since: Sequence[tuple[int, Any]], permits: int) -> None:
    """Undo the grants of in-memory entries, each ``(clock reading before the take, what the take returned)``
    (see ``MemoryBackend.give_back``; GCRA undoes exactly the tat its take wrote)."""
    for (limiter, key), (since_ns, taken) in zip(entries, since, strict=True):
        if isinstance(limiter, KeyedRateLimiter):
            limiter.give_back(key, permits, since_ns, taken)
        elif taken is None:
            limiter.backend.give_back(permits, since_ns)
        else:
            limiter.backend.give_back(permits, since_ns, taken)


def _split(entries: Sequence[tuple[Any, Any]], flags: list[bool]) -> tuple[list[int], list[int]]:
    local = [i for i, flag in enumerate(flags) if not flag]
    remote = [i for i, flag in enumerate(flags) if flag]
    return local, remote


def _mixed_first_half(
    entries: Sequence[tuple[Any, Any]], local: list[int], permits: int
) -> tuple[tuple[int, int] | None, list[tuple[Any, Any]], list[tuple[int, Any]]]:
    """Decide the in-memory entries (all-or-nothing, committed); per entry, the clock reading taken before it
    and what its take returned (what a give-back needs)."""
    local_entries = [entries[i] for i in local]
    readings = [limiter.clock.now_ns() for limiter, _ in local_entries]
    taken: list[Any] = [None] * len(local_entries)
    outcome = _acquire_memory(local_entries, permits, publish_granted=False, taken=taken)
    since = list(zip(readings, taken, strict=True))
    if outcome is not None:
        return (local[outcome[0]], outcome[1]), local_entries, since
    return None, local_entries, since


def _mixed_second_half(
    entries: Sequence[tuple[Any, Any]],
    local_entries: list[tuple[Any, Any]],
    since: list[tuple[int, Any]],
    remote: list[int],
    outcome: tuple[int, int] | None,
    permits: int,
) -> tuple[int, int] | None:
    """After the Redis entries answered: give the in-memory permits back on a rejection; publish."""
    if outcome is None:
        for limiter, _ in local_entries:
            if limiter.events.wants_successful:
                limiter._publish(SUCCESSFUL_ACQUIRE, permits)
        return None
    _give_back(local_entries, since, permits)
    return remote[outcome[0]], outcome[1]


def _not_combinable(entries: Sequence[tuple[Any, str | None]], store: Any) -> TypeError:
    """The error of an all-or-nothing decision over a keyed store with only the protocol (a third party's)."""
    name = next(limiter.name for limiter, _ in entries if getattr(limiter, "store", None) is store)
    return TypeError(
        f"cannot combine rate limiter {name!r} ({type(store).__name__}) with other limits in one all-or-nothing "
        "decision: a store with only the KeyedBackend protocol decides its limits one at a time (the memory and "
        "Redis backends take part in all-or-nothing decisions)"
    )


def _refuse_without_give_back(plain: Sequence[tuple[int, Any]]) -> None:
    """Before a mixed decision takes an unkeyed in-process limit that is not ours: a TypeError naming the first
    whose backend has no ``give_back`` (not in the protocol), which the mixed path needs when the remote limits
    refuse (it was an AttributeError then, with the permit spent)."""
    for _, limiter in plain:
        if not hasattr(limiter.backend, "give_back"):
            raise TypeError(
                f"cannot combine rate limiter {limiter.name!r} ({type(limiter.backend).__name__}) with Redis limits "
                "in one all-or-nothing decision: its permits are taken first and given back when Redis refuses, and "
                "it has no give_back (a backend with only the RateLimiterBackend protocol decides alone or with "
                "in-process limits)"
            )


def acquire_all_keyed(
    entries: Sequence[tuple[RateLimiter | KeyedRateLimiter, str | None]], permits: int = 1
) -> tuple[int, int] | None:
    """All-or-nothing over unkeyed limiters ``(limiter, None)`` and per-key ones ``(keyed, key)``.

    Timeout 0, like :func:`~django_ratelimit_r4.core.ratelimiter.acquire_all`. Returns None when every
    entry granted ``permits`` (all consumed); otherwise nothing is consumed anywhere and the result is
    ``(index of the rejecting entry with the largest wait, that wait in ns)``.

    How: the keyed stores' locks are taken (in ``id`` order, always before any backend lock, so
    overlapping calls cannot deadlock) and every key is peeked. Only when all keys pass are the
    unkeyed limiters decided, atomically, by their backend's ``acquire_many``; the keys are committed
    if that grants too. Events are published after every lock is released.

    Redis-backed entries (a keyed limiter on a ``RedisKeyedStore``, or a ``RateLimiter`` on a ``RedisBackend``) are
    handed to :func:`django_ratelimit_r4.backends.redis.acquire_all_keyed` (one atomic script, same
    result). When some entries are in memory and others in Redis (backends chosen per instance), the
    in-memory ones are decided first (all-or-nothing, under their locks, no I/O), then the Redis ones in
    one round trip; if Redis rejects, the in-memory permits are given back. So each backend stays exact
    (never more than its limit); the only cost is that a concurrent in-memory decision may be rejected
    during that round trip by permits that are then given back (and none is given back across a cycle
    boundary). Entries on two different Redis connections raise ``TypeError``.
    """
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits}")
    flags = [_is_remote(limiter) for limiter, _ in entries]
    if True not in flags:
        return _acquire_memory(entries, permits)
    local, remote = _split(entries, flags)
    decider = _remote_decider([entries[i][0] for i in remote])
    if not local:
        if decider is not None:
            return decider.acquire_all_keyed(entries, permits)  # type: ignore[no-any-return]
        return _one_remote(entries[0], _one_remote_wait(entries[0], permits), permits)
    worst, local_entries, since = _mixed_first_half(entries, local, permits)
    if worst is not None:
        return worst
    if len(remote) == 1:
        outcome = _one_remote(entries[remote[0]], _one_remote_wait(entries[remote[0]], permits), permits)
    else:
        outcome = decider.acquire_all_keyed([entries[i] for i in remote], permits)  # type: ignore[union-attr]
    return _mixed_second_half(entries, local_entries, since, remote, outcome, permits)


async def aacquire_all_keyed(
    entries: Sequence[tuple[Any, str | None]], permits: int = 1
) -> tuple[int, int] | None:
    """Async twin of :func:`acquire_all_keyed`: Redis entries are awaited on ``redis.asyncio``; in-memory
    ones are decided inline (integer work under locks, never across an ``await``)."""
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits}")
    flags = [_is_remote(limiter) for limiter, _ in entries]
    if True not in flags:
        return _acquire_memory(entries, permits)
    local, remote = _split(entries, flags)
    decider = _remote_decider([entries[i][0] for i in remote])
    if not local and decider is not None:
        return await decider.aacquire_all_keyed(entries, permits)  # type: ignore[no-any-return]
    worst, local_entries, since = _mixed_first_half(entries, local, permits)
    if worst is not None:
        return worst
    if len(remote) == 1:
        limiter, key = entries[remote[0]]
        wait = await (
            limiter.remote_backend.aacquire(permits, 0) if key is None else limiter._adecide(key, permits, 0)
        )
        outcome = _one_remote(entries[remote[0]], wait, permits)
    else:
        outcome = await decider.aacquire_all_keyed([entries[i] for i in remote], permits)  # type: ignore[union-attr]
    return _mixed_second_half(entries, local_entries, since, remote, outcome, permits)


def _quota_of(entry: tuple[Any, Any]) -> tuple[int, int]:
    """``(remaining, reset_ns)`` of an entry now (in memory: a snapshot; remote: a round trip)."""
    limiter, key = entry
    return limiter.backend.quota() if key is None else limiter.quota(key)  # type: ignore[no-any-return]


async def _aquota_of(entry: tuple[Any, Any]) -> tuple[int, int]:
    limiter, key = entry
    if key is not None:
        return await limiter.aquota(key)  # type: ignore[no-any-return]
    remote = limiter.remote_backend
    return await remote.aquota() if remote is not None else limiter.backend.quota()  # type: ignore[no-any-return]


def _quotas_now(
    entries: Sequence[tuple[Any, Any]], remote: list[int], decider: Any
) -> list[tuple[int, int]]:
    """Every entry's figures now, no decision made (the in-memory limits refused first): in-memory snapshots, and
    the remote ones read in one round trip by their decider's ``read_quotas`` (else one read each)."""
    read = getattr(decider, "read_quotas", None)
    if read is None:
        return [_quota_of(entry) for entry in entries]
    quotas: list[Any] = [None] * len(entries)
    for index, quota in zip(remote, read([entries[i] for i in remote]), strict=True):
        quotas[index] = quota
    return [quota if quota is not None else _quota_of(entry) for entry, quota in zip(entries, quotas, strict=True)]


async def _aquotas_now(
    entries: Sequence[tuple[Any, Any]], remote: list[int], decider: Any
) -> list[tuple[int, int]]:
    """Async twin of :func:`_quotas_now` (the decider's ``aread_quotas``)."""
    read = getattr(decider, "aread_quotas", None)
    if read is None:
        return [await _aquota_of(entry) for entry in entries]
    quotas: list[Any] = [None] * len(entries)
    for index, quota in zip(remote, await read([entries[i] for i in remote]), strict=True):
        quotas[index] = quota
    return [quota if quota is not None else _quota_of(entry) for entry, quota in zip(entries, quotas, strict=True)]


def _one_remote_quota(entry: tuple[Any, Any], wait: int, remaining: int, reset_ns: int) -> tuple[int, int] | None:
    """After a lone remote entry's ``acquire_quota`` / ``decide_quota``: its figures, None when a rejection
    did not read them (a keyed store without ``rejection_quotas``)."""
    limiter, key = entry
    if wait < 0 and key is not None and not limiter.store.rejection_quotas:
        return None
    return remaining, reset_ns


def _known_quotas(
    entries: Sequence[tuple[Any, Any]], remote: list[int], remote_quotas: Sequence[tuple[int, int] | None]
) -> list[tuple[int, int] | None]:
    """Every entry's figures in entry order: the remote ones as given (None: not read), the in-memory ones read
    now (after the decision and any give-back)."""
    quotas: list[tuple[int, int] | None] = [None] * len(entries)
    for index, quota in zip(remote, remote_quotas, strict=True):
        quotas[index] = quota
    return [
        quota if quota is not None or index in remote else _quota_of(entries[index])
        for index, quota in enumerate(quotas)
    ]


def acquire_all_quotas(
    entries: Sequence[tuple[Any, str | None]], permits: int = 1
) -> tuple[tuple[int, int] | None, list[tuple[int, int]]]:
    """:func:`acquire_all_keyed` that also gives every entry's RateLimit figures ``(remaining, reset_ns)`` after
    the decision, in entry order, with one round trip to a remote place at most (a gate's header fields).

    The remote entries' decider decides them and reads their figures in one call (``acquire_all_quotas``;
    a lone remote entry: its ``acquire_quota`` / ``decide_quota``); the in-memory figures are snapshots read
    after the decision (and any give-back). When the in-memory limits refuse first, the remote ones are not
    decided: their figures are read instead, all in one round trip (the decider's ``read_quotas``).
    """
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits}")
    flags = [_is_remote(limiter) for limiter, _ in entries]
    if True not in flags:
        return _acquire_memory(entries, permits), [_quota_of(entry) for entry in entries]
    local, remote = _split(entries, flags)
    decider = _remote_decider([entries[i][0] for i in remote])
    if not local and decider is not None:
        return decider.acquire_all_quotas(entries, permits)  # type: ignore[no-any-return]
    worst, local_entries, since = _mixed_first_half(entries, local, permits)
    if worst is not None:
        return worst, _quotas_now(entries, remote, decider)
    remote_quotas: list[tuple[int, int] | None]
    if len(remote) == 1:
        entry = entries[remote[0]]
        limiter, key = entry
        if key is None:
            wait, remaining, reset_ns = limiter.remote_backend.acquire_quota(permits, 0)
        else:
            wait, remaining, reset_ns = limiter._decide_quota(key, permits, 0)
        outcome = _one_remote(entry, wait, permits)
        remote_quotas = [_one_remote_quota(entry, wait, remaining, reset_ns)]
    else:
        outcome, remote_quotas = decider.acquire_all_quotas([entries[i] for i in remote], permits)  # type: ignore[union-attr]
    outcome = _mixed_second_half(entries, local_entries, since, remote, outcome, permits)
    known = _known_quotas(entries, remote, remote_quotas)
    return outcome, [
        quota if quota is not None else _quota_of(entry) for entry, quota in zip(entries, known, strict=True)
    ]


async def aacquire_all_quotas(
    entries: Sequence[tuple[Any, str | None]], permits: int = 1
) -> tuple[tuple[int, int] | None, list[tuple[int, int]]]:
    """Async twin of :func:`acquire_all_quotas`: remote calls awaited, in-memory work inline."""
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits}")
    flags = [_is_remote(limiter) for limiter, _ in entries]
    if True not in flags:
        return _acquire_memory(entries, permits), [_quota_of(entry) for entry in entries]
    local, remote = _split(entries, flags)
    decider = _remote_decider([entries[i][0] for i in remote])
    if not local and decider is not None:
        return await decider.aacquire_all_quotas(entries, permits)  # type: ignore[no-any-return]
    worst, local_entries, since = _mixed_first_half(entries, local, permits)
    if worst is not None:
        return worst, await _aquotas_now(entries, remote, decider)
    remote_quotas: list[tuple[int, int] | None]
    if len(remote) == 1:
        entry = entries[remote[0]]
        limiter, key = entry
        if key is None:
            wait, remaining, reset_ns = await limiter.remote_backend.aacquire_quota(permits, 0)
        else:
            wait, remaining, reset_ns = await limiter._adecide_quota(key, permits, 0)
        outcome = _one_remote(entry, wait, permits)
        remote_quotas = [_one_remote_quota(entry, wait, remaining, reset_ns)]
    else:
        outcome, remote_quotas = await decider.aacquire_all_quotas(  # type: ignore[union-attr]
            [entries[i] for i in remote], permits
        )
    outcome = _mixed_second_half(entries, local_entries, since, remote, outcome, permits)
    known = _known_quotas(entries, remote, remote_quotas)
    return outcome, [
        quota if quota is not None else await _aquota_of(entry) for entry, quota in zip(entries, known, strict=True)
    ]



def _one_remote_wait(entry: tuple[Any, Any], permits: int) -> int:
    """The one Redis entry of a mixed decision, decided alone (one round trip, timeout 0): wait or -wait."""
    limiter, key = entry
    if key is None:
        return int(limiter.backend.acquire(permits, 0))
    return int(limiter._decide(key, permits, 0))


def _one_remote(entry: tuple[Any, Any], wait: int, permits: int) -> tuple[int, int] | None:
    """Shape a single Redis decision like ``acquire_all_keyed``'s result, publishing its events."""
    limiter = entry[0]
    if wait >= 0:
        if limiter.events.wants_successful:
            limiter._publish(SUCCESSFUL_ACQUIRE, permits)
        return None
    refuse_never_grantable(limiter, permits, 0)
    if limiter.events.wants_failed:
        limiter._publish(FAILED_ACQUIRE, permits)
    return 0, -wait


def _acquire_memory(
    entries: Sequence[tuple[Any, str | None]],
    permits: int,
    publish_granted: bool = True,
    taken: list[Any] | None = None,
) -> tuple[int, int] | None:
    """:func:`acquire_all_keyed` over in-memory entries only (see there).

    ``publish_granted=False`` leaves the SUCCESSFUL_ACQUIRE events to the caller (a mixed decision publishes
    them only once Redis granted too). ``taken`` (one slot per entry): when granted, what each entry's take
    returned (GCRA: the tat it wrote, for an exact give-back; None otherwise).
    """
    keyed: list[tuple[int, Any, str]] = []  # (index, the limiter's in-memory store, key)
    plain: list[tuple[int, RateLimiter]] = []
    for index, (limiter, key) in enumerate(entries):
        if isinstance(limiter, KeyedRateLimiter):
            if key is None:
                raise ValueError(f"keyed rate limiter {limiter.name!r} needs a key")
            keyed.append((index, limiter.store, key))
        else:
            plain.append((index, limiter))
    if len({(id(store), key) for _, store, key in keyed}) != len(keyed):
        raise ValueError("the same (rate limiter, key) appears more than once")
    stores = sorted({id(store): store for _, store, _ in keyed}.values(), key=id)
    worst: tuple[int, int] | None = None
    held: list[Any] = []
    rejected = False
    try:
        for store in stores:
            try:
                lock = store._lock
            except AttributeError:  # not an in-memory store of ours: the protocol has no all-or-nothing step
                raise _not_combinable(entries, store) from None
            lock.acquire()
            held.append(store)
        peeks = []
        for index, store, key in keyed:
            peek = store._peek_locked(key, permits)
            peeks.append(peek)
            if peek[0] > 0:
                store.failed_calls += 1
                rejected = True
                if worst is None or peek[0] > worst[1]:
                    worst = (index, peek[0])
        if worst is None:
            outcome = None
            if plain:
                backends = [lim.backend for _, lim in plain]
                if taken is None or not all(isinstance(b, _IN_MEMORY) for b in backends):
                    if taken is not None:  # a mixed decision over a backend not ours (never on our backends' path)
                        _refuse_without_give_back(plain)
                    outcome = backends[0].acquire_many(backends, permits)
                else:
                    tokens: list[Any] = []
                    outcome = _memory_acquire_many(backends, permits, tokens)
                    for (index, _), token in zip(plain, tokens, strict=False):
                        taken[index] = token
            if outcome is not None:
                worst = (plain[outcome[0]][0], outcome[1])
            else:
                for (index, store, key), peek in zip(keyed, peeks, strict=True):
                    store.successful_calls += 1
                    token = store._commit_peek_locked(key, peek, permits)
                    if taken is not None:
                        taken[index] = token
    finally:
        for store in reversed(held):
            store._lock.release()
    if worst is None:
        for limiter, _ in entries if publish_granted else ():
            if limiter.events.wants_successful:
                limiter._publish(SUCCESSFUL_ACQUIRE, permits)
        return None
    if rejected:
        # A key said no, so the unkeyed limiters were not asked: peek them for a larger wait.
        for index, unkeyed in plain:
            wait = _peek_unkeyed(unkeyed, permits)
            if wait > worst[1]:
                worst = (index, wait)
    for limiter, _ in entries:
        refuse_never_grantable(limiter, permits, 0)  # all-or-nothing decides with timeout 0
    loser = entries[worst[0]][0]
    if loser.events.wants_failed:
        loser._publish(FAILED_ACQUIRE, permits)
    return worst
