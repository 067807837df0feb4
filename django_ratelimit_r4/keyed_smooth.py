"""Per-client GCRA and sliding-window state in bounded memory (``algorithm`` ``"gcra"`` / ``"sliding_window"``).

:class:`SmoothKeyedStore` is the store ``KeyedRateLimiter(name, config)`` builds when the config's algorithm is
not ``"cycle"``: a :class:`~django_ratelimit_r4.core.backend.KeyedBackend` with the store policy of
:class:`~django_ratelimit_r4.keyed.MemoryKeyedStore` (an ``OrderedDict`` of live keys, a key whose state is full is absent, the oldest entries swept two at a time,
the least recently used evicted at ``max_keys`` and counted in ``lossy_evictions``), with the decisions of
:mod:`django_ratelimit_r4.backends.algorithms` over absolute clock time.

State per live key: GCRA one int (the theoretical arrival time scaled by the limit); the sliding window an
``array('q')`` of ``limit + 1`` slots (the ring of the last ``limit`` hand-over times and its head), about
``8 * limit + 80`` bytes. A key is full again, so dropped for free, at most ``burst * period / limit`` (GCRA)
or one period (sliding window) after its last hand-over, so ``idle_timeout_ns`` never needs to drop state.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Any

from .backends.algorithms import GCRA, gcra_available, gcra_decide, gcra_quota
from .backends.memory import ring_give_back
from .core.clock import Clock
from .core.ratelimiter import RateLimiterConfig
from .keyed import _FRONT_CHECKS, MemoryKeyedStore

__all__ = ["SmoothKeyedStore"]


class SmoothKeyedStore(MemoryKeyedStore):
    """A :class:`~django_ratelimit_r4.keyed.MemoryKeyedStore` whose keys run GCRA or the sliding window."""

    def __init__(self, config: RateLimiterConfig, clock: Clock, **kw: Any) -> None:
        """See :class:`~django_ratelimit_r4.keyed.MemoryKeyedStore`; ``config.algorithm`` is not ``"cycle"``."""
        super().__init__(config, clock, **kw)
        self._gcra = self.config.algorithm == GCRA
        self._burst = self._limit if self.config.burst is None else int(self.config.burst)
        # A one-permit request conforms when ``tat + _one_early <= now * limit`` (GCRA, scaled by the limit).
        self._one_early = (1 - self._burst) * self._period

    # -- one key's algorithm (caller holds the lock; ``now`` is absolute clock time) -----------------------

    def _wait(self, state: Any, now: int, permits: int) -> int:
        """Nanoseconds until ``permits`` could be handed over for a key in ``state`` (None: full)."""
        if self._gcra:
            return gcra_decide(state or 0, permits, -1, now, self._period, self._limit, self._burst)[1]
        if permits > self._limit:
            return self._period
        return 0 if state is None else _ring_at(state, self._limit, self._period, now, permits) - now

    def _grantable(self, permits: int) -> bool:
        return permits <= (self._burst if self._gcra else self._limit)

    def _take(self, key: str, state: Any, now: int, permits: int, wait: int) -> Any:
        """Hand ``permits`` over at ``now + wait`` and store the key's new state; GCRA returns the tat written
        (what :meth:`give_back` needs to undo exactly this take), the sliding window None."""
        if self._gcra:
            scaled = now * self._limit
            base = state if state is not None and state > scaled else scaled
            tat = base + permits * self._period
            self._put(key, state, tat)
            return tat
        ring = state if state is not None else _ring_new(self._limit, now - self._period)
        _ring_write(ring, self._limit, now + wait, permits)
        self._put(key, state, ring)

    def _full(self, state: Any, now: int) -> bool:
        if self._gcra:
            return bool(state <= now * self._limit)
        head = state[self._limit]
        return bool(state[head - 1 if head else self._limit - 1] <= now - self._period)

    def _available(self, state: Any, now: int) -> int:
        if self._gcra:
            return gcra_available(state or 0, now, self._period, self._limit, self._burst)
        return self._limit if state is None else _ring_available(state, self._limit, self._period, now)

    def _quota_of(self, state: Any, now: int) -> tuple[int, int]:
        if self._gcra:
            return gcra_quota(state or 0, now, self._period, self._limit, self._burst)
        remaining = self._available(state, now)
        if remaining < 1:
            return remaining, self._wait(state, now, 1)
        if state is None:
            return remaining, 0
        head = state[self._limit]
        return remaining, max(0, state[head - 1 if head else self._limit - 1] + self._period - now)

    def _put(self, key: str, old: Any, state: Any) -> None:
        """Store ``key``'s state as the most recently used entry; a new key sweeps and evicts like the parent."""
        states = self._states
        if old is not None:
            states[key] = state
            states.move_to_end(key)
            return
        self._sweep(self._now())
        if len(states) >= self.max_keys:
            states.popitem(last=False)  # the oldest holds state (the sweep stopped at it): lossy
            self.lossy_evictions += 1
        states[key] = state

    def _sweep(self, now: int) -> None:
        """Drop up to ``_FRONT_CHECKS`` oldest entries that are full now (lossless)."""
        states = self._states
        for _ in range(_FRONT_CHECKS):
            if not states:
                return
            key = next(iter(states))
            if not self._full(states[key], now):
                return
            del states[key]

    # -- the KeyedBackend protocol ---------------------------------------------------------------------------

    def decide(self, key: str, permits: int, timeout_ns: int) -> int:
        """Decide and commit for ``key``: wait ``>= 0`` granted (reserved), ``< 0`` rejected (``-wait``)."""
        if permits == 1:
            lock = self._lock
            lock.acquire()
            try:
                # One permit granted now, spelled out: the key's state moves to the end (most recently used).
                states = self._states
                state = states.get(key)
                now = self._now()
                if state is None:  # a new (or full, hence dropped) key: one permit is always granted
                    if self._gcra:
                        self._put(key, None, now * self._limit + self._period)
                    else:
                        ring = _ring_new(self._limit, now - self._period)
                        ring[0] = now
                        ring[self._limit] = 1 if self._limit > 1 else 0
                        self._put(key, None, ring)
                    self.successful_calls += 1
                    return 0
                if self._gcra:
                    scaled = now * self._limit
                    if state <= scaled:
                        states[key] = scaled + self._period
                        states.move_to_end(key)
                        self.successful_calls += 1
                        return 0
                    if state + self._one_early <= scaled:
                        states[key] = state + self._period
                        states.move_to_end(key)
                        self.successful_calls += 1
                        return 0
                else:
                    limit = self._limit
                    head = state[limit]
                    if state[head] + self._period <= now >= state[head - 1 if head else limit - 1]:
                        state[head] = now
                        state[limit] = head + 1 if head + 1 < limit else 0
                        states.move_to_end(key)
                        self.successful_calls += 1
                        return 0
            finally:
                lock.release()
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits!r}")
        with self._lock:
            now = self._now()
            state = self._states.get(key)
            wait = self._wait(state, now, permits)
            if self._grantable(permits) and (wait == 0 or (timeout_ns and timeout_ns >= wait)):
                self._take(key, state, now, permits, wait)
                self.successful_calls += 1
                return wait
            self.failed_calls += 1
            return -wait

    def decide_quota(self, key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """See :meth:`MemoryKeyedStore.decide_quota <django_ratelimit_r4.keyed.MemoryKeyedStore.decide_quota>`
        (written out under the lock: this is the keyed ``@ratelimit`` path of these algorithms)."""
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits!r}")
        with self._lock:
            now = self._now()
            state = self._states.get(key)
            wait = self._wait(state, now, permits)
            if not (self._grantable(permits) and (wait == 0 or (timeout_ns and timeout_ns >= wait))):
                self.failed_calls += 1
                # What quota() reads now: a rejection's figures are the 429's RateLimit fields (rejection_quotas).
                remaining, reset_ns = self._quota_of(state, now)
                return -wait, remaining, reset_ns
            self._take(key, state, now, permits, wait)
            self.successful_calls += 1
            remaining, reset_ns = self._quota_of(self._states.get(key), now)
            return wait, remaining, reset_ns

    def drain(self, key: str) -> int:
        """Take every permit ``key`` has now (pending reservations stay) and return how many."""
        with self._lock:
            now = self._now()
            state = self._states.get(key)
            drained = max(0, self._available(state, now))
            if drained:
                self._take(key, state, now, drained, 0)
        return drained

    def state(self, key: str) -> tuple[int, int, int]:
        """``(period number since the anchor, available_permissions, nanos_to_wait for 1 permit)``."""
        with self._lock:
            now = self._now()
            state = self._states.get(key)
            return (now - self._anchor) // self._period, self._available(state, now), self._wait(state, now, 1)

    def quota(self, key: str) -> tuple[int, int]:
        """``(remaining, reset_ns)`` for ``key``, as the unkeyed backend of the same algorithm answers."""
        with self._lock:
            return self._quota_of(self._states.get(key), self._now())

    def _peek_locked(self, key: str, permits: int) -> tuple[int, Any]:  # type: ignore[override]
        wait = self._wait(self._states.get(key), self._now(), permits)
        return (wait if self._grantable(permits) else max(wait, 1)), None

    def _commit_peek_locked(self, key: str, peek: Any, permits: int) -> Any:
        """Take ``permits`` after a :meth:`_peek_locked` with wait 0; returns :meth:`_take`'s (GCRA: its tat)."""
        return self._take(key, self._states.get(key), self._now(), permits, 0)

    def give_back(self, key: str, permits: int, since_ns: int, taken: Any = None) -> None:
        """Undo a grant of ``permits`` to ``key`` decided at or after ``since_ns``, as the unkeyed backends of
        the same algorithm do (``GcraBackend.give_back``, ``SlidingWindowBackend.give_back``); GCRA's
        ``taken`` is the tat its take wrote (:meth:`_commit_peek_locked`)."""
        with self._lock:
            state = self._states.get(key)
            if state is None or since_ns < self._anchor:
                return
            now = self._now()
            if self._gcra:
                scaled = now * self._limit
                if state <= scaled:
                    return
                step = permits * self._period
                back = min(step, (since_ns * self._limit + step if taken is None else taken) - scaled)
                if back <= 0:
                    return  # absorbed: the limiter was full again at a decision in between
                state = max(state - back, scaled)
                if state <= scaled:
                    del self._states[key]  # full again: absent
                else:
                    self._states[key] = state
            else:
                limit = self._limit
                head = ring_give_back(state, state[limit], limit, self._period, permits, since_ns, now)
                if head is None:
                    return  # nothing given back
                state[limit] = head
            self.successful_calls -= 1

    def purge(self) -> int:
        """Drop every full entry now; returns how many. O(live keys); for housekeeping."""
        with self._lock:
            now = self._now()
            dead = [key for key, state in self._states.items() if self._full(state, now)]
            for key in dead:
                del self._states[key]
            return len(dead)

    def __repr__(self) -> str:
        return (
            f"SmoothKeyedStore(algorithm={self.config.algorithm!r}, limit_for_period={self._limit}, "
            f"limit_refresh_period_ns={self._period}, live_keys={len(self)}, max_keys={self.max_keys})"
        )


# -- the sliding log of one key: ``limit`` hand-over times (a ring, oldest at the head) and the head ----------


def _ring_new(limit: int, old: int) -> array[int]:
    ring = array("q", [old]) * (limit + 1)
    ring[limit] = 0
    return ring


def _ring_at(ring: array[int], limit: int, period: int, now: int, permits: int) -> int:
    """When ``permits <= limit`` permits can be handed over (:func:`~.backends.algorithms.sliding_decide`)."""
    head = ring[limit]
    index = head + permits - 1
    if index >= limit:
        index -= limit
    at = ring[index] + period
    if at < now:
        at = now
    newest = ring[head - 1 if head else limit - 1]
    return newest if newest > at else at


def _ring_write(ring: array[int], limit: int, at: int, permits: int) -> None:
    head = ring[limit]
    for _ in range(permits):
        ring[head] = at
        head += 1
        if head == limit:
            head = 0
    ring[limit] = head


def _ring_available(ring: array[int], limit: int, period: int, now: int) -> int:
    head = ring[limit]
    if ring[head - 1 if head else limit - 1] > now:
        return 0
    edge = now - period
    count = bisect_right(ring, edge, head, limit) - head
    if count == limit - head and head:
        count += bisect_right(ring, edge, 0, head)
    return count
