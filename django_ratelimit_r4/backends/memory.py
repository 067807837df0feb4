"""In-process rate-limiter state: two ints behind one ``threading.Lock``, per process.

The lock is held only for a few integer operations (never while anyone waits), which makes every decision
exact under concurrency and O(1). :meth:`MemoryBackend.acquire` inlines :func:`~.base.decide` because a
Python call plus a tuple costs about 40 ns on the hot path; ``tests/core/test_ratelimiter_properties.py``
checks that both give the same answers.
"""

from __future__ import annotations

import functools
import math
import threading
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.backend import register_memory_backends
from ..core.clock import Clock
from .algorithms import GCRA, SLIDING_WINDOW
from .base import BackendFactory, RateLimiterBackend, div_ceil, nanos_to_wait, refresh

__all__ = ["GcraBackend", "MemoryBackend", "MemoryStore", "SlidingWindowBackend", "acquire_many", "memory_backend"]


class MemoryBackend:
    """The default :class:`~.base.RateLimiterBackend`: state lives in this object, shared by threads and tasks.

    Its constructor has the :class:`~.base.BackendFactory` signature, so the class itself is the factory.
    """

    __slots__ = (
        "_anchor",
        "_cycle",
        "_cycle_end",
        "_limit",
        "_lock",
        "_now",
        "_period",
        "_permissions",
        "failed_calls",
        "name",
        "successful_calls",
    )

    def __init__(self, name: str, limit_for_period: int, limit_refresh_period_ns: int, clock: Clock) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._limit = int(limit_for_period)
        self._period = int(limit_refresh_period_ns)
        self.reset(clock)

    def reset(self, clock: Clock) -> None:
        """Start full at cycle 0 anchored at ``clock``'s current time, counters at 0."""
        with self._lock:
            self._now = clock.now_ns
            self._anchor = self._now()
            self._cycle = 0
            self._cycle_end = self._anchor + self._period
            self._permissions = self._limit
            self.successful_calls = 0
            self.failed_calls = 0

    def acquire(self, permits: int, timeout_ns: int) -> int:
        """Decide and commit (see :class:`~.base.RateLimiterBackend`): wait ``>= 0`` granted, ``< 0`` rejected.

        This is :func:`~.base.decide` with the cycle test turned into one comparison against the absolute
        end of the stored cycle, so a decision inside the current cycle does no division at all.
        """
        # acquire()/release() in try/finally: about 40 ns cheaper than ``with`` (whose __exit__ gets three
        # arguments) and just as safe, since the finally block runs on every exit.
        lock = self._lock
        lock.acquire()
        try:
            now = self._now()
            if now >= self._cycle_end:
                self._roll(now)
            permissions = self._permissions
            if permissions >= permits > 0:
                self._permissions = permissions - permits
                self.successful_calls += 1
                return 0
            if permits < 1:
                # Checked off the fast path: a non-positive count would otherwise mint permissions.
                raise ValueError(f"permits must be >= 1, got {permits!r}")
            # base.nanos_to_wait, inlined and negated (a rejection returns -wait; building it directly saves
            # an allocation). Here permissions < permits, so the deficit permits - permissions - limit is
            # > -limit, and floor division equals Java's truncating divCeil (0 for a deficit <= 0).
            neg_wait = now - self._cycle_end
            if permits - permissions > self._limit:
                neg_wait -= (permits - permissions - 1) // self._limit * self._period
            if timeout_ns and timeout_ns >= -neg_wait:
                self._permissions = permissions - permits
                self.successful_calls += 1
                return -neg_wait
            self.failed_calls += 1
            return neg_wait
        finally:
            lock.release()

    def _roll(self, now: int) -> None:
        """Move the stored state to the cycle containing ``now`` (lazy refresh); caller holds the lock."""
        cycle = (now - self._anchor) // self._period
        self._permissions = refresh(self._cycle, self._permissions, cycle, self._limit)
        self._cycle = cycle
        self._cycle_end = self._anchor + (cycle + 1) * self._period

    def _refresh_locked(self) -> tuple[int, int, int]:
        """``(now, cycle, permissions)`` refreshed to the current cycle; caller holds the lock. Stores nothing."""
        now = self._now() - self._anchor
        cycle = now // self._period
        return now, cycle, refresh(self._cycle, self._permissions, cycle, self._limit)

    def state(self) -> tuple[int, int, int]:
        """``(cycle, available_permissions, nanos_to_wait for 1 permit)``; side-effect free."""
        with self._lock:
            now, cycle, permissions = self._refresh_locked()
            return cycle, permissions, nanos_to_wait(permissions, 1, cycle, now, self._period, self._limit)

    def quota(self) -> tuple[int, int]:
        """``(remaining, reset_ns)`` now, for RateLimit headers; changes nothing.

        Same shape as ``RedisBackend.quota()``: ``reset_ns`` is the time to the next cycle boundary while
        permits remain, else the wait for one permit; ``remaining`` may be negative (reservation debt).
        Inside the stored cycle it is a lock-free snapshot of two ints (advisory figures, no second lock
        round trip per allowed request); after the cycle ended it refreshes under the lock.
        """
        permissions = self._permissions
        to_next = self._cycle_end - self._now()
        if to_next <= 0:
            with self._lock:
                now, cycle, permissions = self._refresh_locked()
            to_next = (cycle + 1) * self._period - now
        if permissions >= 1:
            return permissions, to_next
        limit = self._limit
        # nanos_to_wait for one permit: permissions < 1 here, so the deficit is exact with div_ceil.
        return permissions, to_next + div_ceil(1 - (permissions + limit), limit) * self._period

    def drain(self) -> int:
        """Drain the refreshed current permissions to 0, keep any debt, return how many were drained."""
        with self._lock:
            _, cycle, permissions = self._refresh_locked()
            drained = permissions if permissions > 0 else 0
            self._cycle = cycle
            self._cycle_end = self._anchor + (cycle + 1) * self._period
            self._permissions = permissions - drained
            return drained

    def give_back(self, permits: int, since_ns: int) -> None:
        """Undo a grant of ``permits`` decided at or after ``since_ns`` (a reading of this backend's clock).

        Given back only while the cycle containing ``since_ns`` is still the current one (capped at the
        limit); after a cycle boundary nothing is: that cycle is over, and crediting the next one would let it
        grant more than its limit. Used when another part of an all-or-nothing decision rejected.
        """
        with self._lock:
            if since_ns < self._anchor:
                return  # reset since
            now = self._now()
            if (since_ns - self._anchor) // self._period != (now - self._anchor) // self._period:
                return
            if now >= self._cycle_end:
                self._roll(now)
            self._permissions = min(self._permissions + permits, self._limit)
            self.successful_calls -= 1

    def change_limit(self, limit_for_period: int) -> None:
        """Use the new limit from now on; the current permissions are capped only at the next refresh."""
        with self._lock:
            self._limit = int(limit_for_period)

    def acquire_many(self, backends: Sequence[RateLimiterBackend], permits: int) -> tuple[int, int] | None:
        """All-or-nothing with timeout 0 over in-memory backends of any algorithm (see :func:`acquire_many`)."""
        return acquire_many(backends, permits)

    def _peek_locked(self, permits: int) -> int:
        """Refresh the stored state to now and return the wait for ``permits``; caller holds the lock."""
        now, cycle, permissions = self._refresh_locked()
        self._cycle = cycle
        self._cycle_end = self._anchor + (cycle + 1) * self._period
        self._permissions = permissions
        return nanos_to_wait(permissions, permits, cycle, now, self._period, self._limit)

    def _take_locked(self, permits: int) -> None:
        """Commit ``permits`` right after a :meth:`_peek_locked` that returned 0; caller holds the lock."""
        self._permissions -= permits

    def __repr__(self) -> str:
        return f"MemoryBackend(name={self.name!r}, limit={self._limit}, period_ns={self._period})"


class GcraBackend:
    """In-process GCRA state (``algorithm="gcra"``): one int, the theoretical arrival time, behind one lock.

    It is :func:`~.algorithms.gcra_decide` over absolute clock time (``tat`` scaled by the limit, 0 = full);
    ``tests/core/test_algorithms_backends.py`` checks both give the same answers. Constructed through
    :func:`memory_backend`, which binds ``burst``.
    """

    __slots__ = (
        "_anchor",
        "_burst",
        "_burst_default",
        "_burst_span",
        "_limit",
        "_lock",
        "_now",
        "_one_early",
        "_period",
        "_scale",
        "_step",
        "_tat",
        "failed_calls",
        "name",
        "successful_calls",
    )

    def __init__(
        self,
        name: str,
        limit_for_period: int,
        limit_refresh_period_ns: int,
        clock: Clock,
        burst: int | None = None,
    ) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._limit = int(limit_for_period)
        self._period = int(limit_refresh_period_ns)
        # Without an explicit burst, the burst follows the limit (also through change_limit).
        self._burst_default = burst is None
        self._burst = self._limit if burst is None else int(burst)
        self._set_rate()
        self.reset(clock)

    def _set_rate(self) -> None:
        """Time is counted in units of ``1/scale`` ns so the emission interval ``period / limit`` is a whole
        number of them, ``step`` (the pure function's ``limit`` and ``period`` divided by their gcd: the
        numbers stay small, e.g. scale 1 and step 100 ms for 10 per second)."""
        common = math.gcd(self._limit, self._period)
        self._scale = self._limit // common
        self._step = self._period // common
        self._burst_span = self._burst * self._step
        self._one_early = self._step - self._burst_span

    def reset(self, clock: Clock) -> None:
        """Full (``tat`` 0), anchored at ``clock``'s current time, counters at 0."""
        with self._lock:
            self._now = clock.now_ns
            self._anchor = self._now()
            self._tat = 0
            self.successful_calls = 0
            self.failed_calls = 0

    def acquire(self, permits: int, timeout_ns: int) -> int:
        """Decide and commit (see :class:`~.base.RateLimiterBackend`): wait ``>= 0`` granted, ``< 0`` rejected."""
        lock = self._lock
        lock.acquire()
        try:
            now = self._now() * self._scale
            tat = self._tat
            if permits == 1:  # the common case, spelled out (burst >= 1, so an idle limiter always grants)
                if tat <= now:
                    self._tat = now + self._step
                    self.successful_calls += 1
                    return 0
                early = tat + self._one_early - now  # _one_early = step - burst_span
                if early <= 0:
                    self._tat = tat + self._step
                    self.successful_calls += 1
                    return 0
                wait = -(-early // self._scale)
                if timeout_ns and timeout_ns >= wait:
                    self._tat = tat + self._step
                    self.successful_calls += 1
                    return wait
                self.failed_calls += 1
                return -wait
            if tat < now:
                tat = now
            tat += permits * self._step
            early = tat - now - self._burst_span
            if early <= 0 < permits:
                self._tat = tat
                self.successful_calls += 1
                return 0
            if permits < 1:
                raise ValueError(f"permits must be >= 1, got {permits!r}")
            wait = -(-early // self._scale)
            if timeout_ns and timeout_ns >= wait and permits <= self._burst:
                self._tat = tat
                self.successful_calls += 1
                return wait
            self.failed_calls += 1
            return -wait
        finally:
            lock.release()

    def _available_locked(self, now: int) -> int:
        """:func:`~.algorithms.gcra_available` at absolute ``now``; caller holds the lock."""
        scaled = now * self._scale
        tat = self._tat if self._tat > scaled else scaled
        return (scaled + self._burst_span - tat) // self._step

    def _wait_locked(self, now: int, permits: int) -> int:
        """Nanoseconds until ``permits`` conform at absolute ``now`` (they may never: ``permits > burst``)."""
        scaled = now * self._scale
        tat = self._tat if self._tat > scaled else scaled
        early = tat + permits * self._step - self._burst_span - scaled
        return -(-early // self._scale) if early > 0 else 0

    def state(self) -> tuple[int, int, int]:
        """``(period number since the anchor, available_permissions, nanos_to_wait for 1 permit)``."""
        with self._lock:
            now = self._now()
            return (
                (now - self._anchor) // self._period,
                self._available_locked(now),
                self._wait_locked(now, 1),
            )

    def quota(self) -> tuple[int, int]:
        """``(remaining, reset_ns)`` as :func:`~.algorithms.gcra_quota`: while a permit remains, the time until
        the limiter is full again (``remaining == burst``), else the wait for one permit."""
        with self._lock:
            now = self._now()
            remaining = self._available_locked(now)
            if remaining < 1:
                return remaining, self._wait_locked(now, 1)
            ahead = self._tat - now * self._scale
            return remaining, -(-ahead // self._scale) if ahead > 0 else 0

    def peek(self, permits: int) -> int:
        """Nanoseconds until ``permits`` could be granted now (0: now); changes nothing."""
        with self._lock:
            return self._wait_locked(self._now(), permits)

    def drain(self) -> int:
        """Take every available permit (debt stays) and return how many."""
        with self._lock:
            now = self._now()
            drained = max(0, self._available_locked(now))
            if drained:
                scaled = now * self._scale
                self._tat = max(self._tat, scaled) + drained * self._step
            return drained

    def give_back(self, permits: int, since_ns: int, taken: Any = None) -> None:
        """Undo a grant of ``permits`` decided at or after ``since_ns`` (another part of an all-or-nothing
        decision rejected): :func:`~.algorithms.gcra_give_back` with the tat the take wrote, ``taken`` (what
        :meth:`_take_locked` returned). Only what is still ahead of now of that grant comes back: when the
        limiter was full again at a decision in between, that decision absorbed the grant and nothing (or less)
        comes back. Never more permissive than had the grant not happened; exact when nothing came in between.

        Without ``taken`` (or after a change of scale), the take's tat is bounded below by a take at
        ``since_ns`` on a full limiter: as safe, exact only when the limiter was full at the take.
        """
        with self._lock:
            if since_ns < self._anchor:
                return  # reset since
            scaled = self._now() * self._scale
            tat = self._tat
            if tat <= scaled:
                return  # full again: nothing of the grant is left
            step = permits * self._step
            granted = taken[0] if taken is not None and taken[1] == self._scale else since_ns * self._scale + step
            back = min(step, granted - scaled)
            if back <= 0:
                return
            self._tat = max(tat - back, scaled)
            self.successful_calls -= 1

    def change_limit(self, limit_for_period: int) -> None:
        """Use the new rate from now on; the time until full is kept (``tat`` is rescaled)."""
        with self._lock:
            old_scale = self._scale
            scaled = self._now() * old_scale
            ahead = max(0, self._tat - scaled)  # in 1/old_scale ns
            self._limit = int(limit_for_period)
            if self._burst_default:
                self._burst = self._limit
            self._set_rate()
            self._tat = (scaled // old_scale) * self._scale + ahead * self._scale // old_scale

    def acquire_many(self, backends: Sequence[RateLimiterBackend], permits: int) -> tuple[int, int] | None:
        """All-or-nothing with timeout 0 over in-memory backends of any algorithm (see :func:`acquire_many`)."""
        return acquire_many(backends, permits)

    def _peek_locked(self, permits: int) -> int:
        return self._wait_locked(self._now(), permits) if permits <= self._burst else max(1, self._period)

    def _take_locked(self, permits: int) -> tuple[int, int]:
        """Commit ``permits``; returns what :meth:`give_back` needs to undo exactly this take (tat, scale)."""
        scaled = self._now() * self._scale
        self._tat = tat = max(self._tat, scaled) + permits * self._step
        return tat, self._scale

    def __repr__(self) -> str:
        return (
            f"GcraBackend(name={self.name!r}, limit={self._limit}, period_ns={self._period}, burst={self._burst})"
        )


# _INDEXES[i] is i: the int objects of every sliding log's successor list (see _successors), made once.
_INDEXES: list[int] = [0]
_INDEXES_LOCK = threading.Lock()


def ring_give_back(
    ring: Any, head: int, limit: int, period: int, permits: int, since_ns: int, now: int
) -> int | None:
    """Undo a grant of ``permits`` with timeout 0, decided at ``since_ns`` or later, in a sliding log kept as a
    ring (``ring[:limit]``, oldest at ``head``); returns the new head, None when nothing was given back.

    The ``permits`` oldest logged times at or after ``since_ns`` leave the log (newer ones move down) and free
    slots take the old end (``min(oldest, now - period)``: outside every window from now on). A grant with
    timeout 0 is logged at its decision time and finds no later time in the log, so those times are at most
    the grant's own (its own when ``since_ns`` is its time): never more permissive than the log without the
    grant (:func:`~.algorithms.sliding_give_back` with the grant's exact time). The slots the grant
    overwrote held times outside every later window. Nothing is given back when a time ``period`` or more
    after ``since_ns`` was logged since (later grants may have overwritten the grant's times).
    """
    if permits > limit or ring[head - 1 if head else limit - 1] >= since_ns + period:
        return None
    lo, hi = 0, limit  # the first slot, oldest first, at or after since_ns
    while lo < hi:
        mid = (lo + hi) // 2
        index = head + mid
        if index >= limit:
            index -= limit
        if ring[index] < since_ns:
            lo = mid + 1
        else:
            hi = mid
    if lo + permits > limit:
        return None
    free = min(ring[head], now - period)
    for j in range(lo, limit - permits):
        dst = head + j
        if dst >= limit:
            dst -= limit
        src = dst + permits
        if src >= limit:
            src -= limit
        ring[dst] = ring[src]
    for j in range(limit - permits, limit):
        dst = head + j
        if dst >= limit:
            dst -= limit
        ring[dst] = free
    head -= permits
    return head + limit if head < 0 else head


def _successors(limit: int) -> list[int]:
    """``[1, 2, ..., limit - 1, 0]``: the slot after each slot of a ring of ``limit``.

    A plain list (subscripting a list subclass is slower) of 8 bytes per slot; its ints are shared by every
    log (each above 256 is an object of its own, made once per process up to the largest limit).
    """
    with _INDEXES_LOCK:
        if len(_INDEXES) < limit:
            _INDEXES.extend(range(len(_INDEXES), limit))
        successors = _INDEXES[1:limit]
    successors.append(0)
    return successors


class SlidingWindowBackend:
    """In-process exact sliding log (``algorithm="sliding_window"``): the hand-over times of the last
    ``limit`` permits in a ring (a list: 8 bytes per slot plus 32 per distinct time, and 8 per slot of the
    successor list, under 5 MB at the 100,000 cap; a list reads faster than an ``array``), oldest at
    ``_head``, behind one lock.

    It is :func:`~.algorithms.sliding_decide` over absolute clock time; a decision for ``k`` permits reads two
    slots and writes ``k`` (one slice assignment), the header figures use a binary search.
    """

    __slots__ = (
        "_anchor",
        "_head",
        "_limit",
        "_lock",
        "_newest",
        "_next",
        "_now",
        "_period",
        "_ring",
        "failed_calls",
        "name",
        "successful_calls",
    )

    # The one-permit grant is the hot path: besides the ring it keeps ``_newest`` (always ``ring[head - 1]``, the
    # latest logged time) and ``_next`` (``_next[i]`` is the slot after ``i``), so a grant does no index
    # arithmetic: above 256, ``head - 1`` and ``head + 1`` would each allocate an int.

    def __init__(self, name: str, limit_for_period: int, limit_refresh_period_ns: int, clock: Clock) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._limit = int(limit_for_period)
        self._period = int(limit_refresh_period_ns)
        self.reset(clock)

    def reset(self, clock: Clock) -> None:
        """An empty log (every slot outside the window) anchored at ``clock``'s current time, counters at 0."""
        with self._lock:
            self._now = clock.now_ns
            self._anchor = self._now()
            self._ring: list[int] = [self._anchor - self._period] * self._limit
            self._head = 0
            self._newest = self._ring[-1]
            self._next = _successors(self._limit)
            self.successful_calls = 0
            self.failed_calls = 0

    def _at_locked(self, now: int, permits: int) -> int:
        """When ``permits <= limit`` permits can be handed over, from absolute ``now``; caller holds the lock."""
        ring = self._ring
        index = self._head + permits - 1
        if index >= self._limit:
            index -= self._limit
        at = ring[index] + self._period
        if at < now:
            at = now
        newest = ring[self._head - 1]  # index -1 when head is 0: the last slot
        return newest if newest > at else at

    def _write_locked(self, at: int, permits: int) -> None:
        """Log ``permits`` handed over at ``at`` (they replace the oldest slots); caller holds the lock."""
        ring = self._ring
        head = self._head
        end = head + permits
        limit = self._limit
        self._newest = at
        if permits == 1:
            ring[head] = at
        elif end <= limit:
            ring[head:end] = [at] * permits
        else:
            ring[head:] = [at] * (limit - head)
            end -= limit
            ring[:end] = [at] * end
        self._head = end if end < limit else end - limit

    def acquire(self, permits: int, timeout_ns: int) -> int:
        """Decide and commit (see :class:`~.base.RateLimiterBackend`): wait ``>= 0`` granted, ``< 0`` rejected."""
        lock = self._lock
        lock.acquire()
        try:
            now = self._now()
            if permits == 1:
                # _at_locked and _write_locked for one permit, inlined (the common case): granted now when
                # the oldest logged permit has left the window and no reservation is pending.
                ring = self._ring
                head = self._head
                if ring[head] + self._period <= now >= self._newest:  # max(oldest + T, newest) <= now
                    ring[head] = self._newest = now
                    self._head = self._next[head]
                    self.successful_calls += 1
                    return 0
                at = ring[head] + self._period
                newest = self._newest
                if newest > at:
                    at = newest
                wait = at - now  # > 0 here
                if timeout_ns and timeout_ns >= wait:
                    ring[head] = self._newest = at
                    self._head = self._next[head]
                    self.successful_calls += 1
                    return wait
                self.failed_calls += 1
                return -wait
            if 0 < permits <= self._limit:
                at = self._at_locked(now, permits)
                wait = at - now
                if wait == 0 or (timeout_ns and timeout_ns >= wait):
                    self._write_locked(at, permits)
                    self.successful_calls += 1
                    return wait
                self.failed_calls += 1
                return -wait
            if permits < 1:
                raise ValueError(f"permits must be >= 1, got {permits!r}")
            self.failed_calls += 1
            return -self._period  # more than the log holds: never grantable
        finally:
            lock.release()

    def _available_locked(self, now: int) -> int:
        """:func:`~.algorithms.sliding_available` by binary search over the two sorted runs of the ring."""
        ring = self._ring
        head = self._head
        limit = self._limit
        if ring[head - 1] > now:
            return 0
        edge = now - self._period
        count = bisect_right(ring, edge, head, limit) - head
        if count == limit - head and head:
            count += bisect_right(ring, edge, 0, head)
        return count

    def state(self) -> tuple[int, int, int]:
        """``(period number since the anchor, available_permissions, nanos_to_wait for 1 permit)``."""
        with self._lock:
            now = self._now()
            return (
                (now - self._anchor) // self._period,
                self._available_locked(now),
                self._at_locked(now, 1) - now,
            )

    def quota(self) -> tuple[int, int]:
        """``(remaining, reset_ns)`` as :func:`~.algorithms.sliding_quota`: while a permit remains, the time until
        the whole log has left the window, else the wait for one permit."""
        with self._lock:
            now = self._now()
            remaining = self._available_locked(now)
            if remaining < 1:
                return remaining, self._at_locked(now, 1) - now
            return remaining, max(0, self._ring[self._head - 1] + self._period - now)

    def peek(self, permits: int) -> int:
        """Nanoseconds until ``permits`` could be granted now (0: now); changes nothing."""
        with self._lock:
            now = self._now()
            return self._at_locked(now, permits) - now if permits <= self._limit else self._period

    def drain(self) -> int:
        """Log every available permit as used now (pending reservations stay) and return how many."""
        with self._lock:
            now = self._now()
            drained = self._available_locked(now)
            if drained:
                self._write_locked(now, drained)
            return drained

    def give_back(self, permits: int, since_ns: int) -> None:
        """Undo a grant of ``permits`` (timeout 0) decided at or after ``since_ns`` (another part of an
        all-or-nothing decision rejected): see :func:`ring_give_back`. Grants of other callers in between stay
        logged (the newest times were freed before, whoever's they were: a later grant's could go while the
        take's stayed, letting one permit too many through a window)."""
        with self._lock:
            if since_ns < self._anchor:
                return
            head = ring_give_back(self._ring, self._head, self._limit, self._period, permits, since_ns, self._now())
            if head is not None:
                self._head = head
                self._newest = self._ring[head - 1]
                self.successful_calls -= 1

    def change_limit(self, limit_for_period: int) -> None:
        """Use the new limit from now on, keeping the newest logged times (a larger log starts the new slots
        outside the window)."""
        with self._lock:
            new_limit = int(limit_for_period)
            ring, head = self._ring, self._head
            ordered = ring[head:] + ring[:head]
            if new_limit <= self._limit:
                ordered = ordered[self._limit - new_limit :]
            else:
                old = min(ordered[0], self._now() - self._period)
                ordered = [old] * (new_limit - self._limit) + ordered
            self._ring, self._head, self._limit = ordered, 0, new_limit
            self._newest = ordered[-1]
            self._next = _successors(new_limit)

    def acquire_many(self, backends: Sequence[RateLimiterBackend], permits: int) -> tuple[int, int] | None:
        """All-or-nothing with timeout 0 over in-memory backends of any algorithm (see :func:`acquire_many`)."""
        return acquire_many(backends, permits)

    def _peek_locked(self, permits: int) -> int:
        if permits > self._limit:
            return self._period
        now = self._now()
        return self._at_locked(now, permits) - now

    def _take_locked(self, permits: int) -> None:
        now = self._now()
        self._write_locked(self._at_locked(now, permits), permits)

    def __repr__(self) -> str:
        return f"SlidingWindowBackend(name={self.name!r}, limit={self._limit}, period_ns={self._period})"


_IN_MEMORY = (MemoryBackend, GcraBackend, SlidingWindowBackend)


def acquire_many(
    backends: Sequence[RateLimiterBackend], permits: int, taken: list[Any] | None = None
) -> tuple[int, int] | None:
    """All-or-nothing with timeout 0 over in-memory backends, algorithms mixed (see the protocol).

    ``taken``: when given and granted, gets what each backend's take returned, in order (GCRA: what its
    ``give_back`` needs to undo exactly that take; None for the others). The locks are taken in ``id`` order, so two overlapping multi-limit calls can never deadlock; every
    backend is peeked and, only when all waits are 0, committed while all of them are held.
    """
    members: list[Any] = []
    for backend in backends:
        if not isinstance(backend, _IN_MEMORY):
            raise TypeError(f"cannot combine {type(backend).__name__} with in-memory backends in one decision")
        members.append(backend)
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits!r}")
    if len({id(b) for b in members}) != len(members):
        raise ValueError("the same rate limiter appears more than once")
    held: list[Any] = []
    try:
        for backend in sorted(members, key=id):
            backend._lock.acquire()
            held.append(backend)
        worst: tuple[int, int] | None = None
        for index, backend in enumerate(members):
            wait = backend._peek_locked(permits)
            if wait > 0:
                backend.failed_calls += 1
                if worst is None or wait > worst[1]:
                    worst = (index, wait)
        if worst is not None:
            return worst
        for backend in members:
            token = backend._take_locked(permits)
            if taken is not None:
                taken.append(token)
            backend.successful_calls += 1
        return None
    finally:
        for backend in reversed(held):
            backend._lock.release()


def acquire_local_many(
    members: Sequence[tuple[Any, str | None]], permits: int, commit: bool = True
) -> tuple[int, int] | None:
    """All-or-nothing with timeout 0 over in-process limiters of any algorithms: in-memory backends
    ``(backend, None)`` and keyed in-memory stores ``(store, key)`` (the Redis limiters' fallbacks under the
    "local" fault policy: ``backends.redis._fault_many_reply``).

    Every lock is held at once (each once, in ``id`` order: no deadlock with another such call), the members are
    peeked in order, and only when all of them can grant now are they committed (``commit=False``: none is).
    Nothing is taken from the members of a refused decision, so nothing is given back: exact for every
    algorithm, whatever time passes between the members' clock readings. Returns None when granted, else
    ``(index, wait)`` of the first member that cannot grant (its ``failed_calls`` counted; the members after it
    are not asked).
    """
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits!r}")
    held: list[Any] = []
    try:
        for owner in sorted({id(owner): owner for owner, _ in members}.values(), key=id):
            owner._lock.acquire()
            held.append(owner)
        peeks: list[Any] = []
        for index, (owner, key) in enumerate(members):
            if key is None:
                peek, wait = None, owner._peek_locked(permits)
            else:
                peek = owner._peek_locked(key, permits)
                wait = peek[0]
            if wait > 0:
                owner.failed_calls += 1
                return index, wait
            peeks.append(peek)
        if commit:
            for (owner, key), peek in zip(members, peeks, strict=True):
                if key is None:
                    owner._take_locked(permits)
                else:
                    owner._commit_peek_locked(key, peek, permits)
                owner.successful_calls += 1
        return None
    finally:
        for owner in reversed(held):
            owner._lock.release()


def memory_backend(config: Any) -> BackendFactory:
    """The in-memory :class:`~.base.BackendFactory` for a ``RateLimiterConfig``'s ``algorithm``."""
    if config.algorithm == GCRA:
        return functools.partial(GcraBackend, burst=config.burst)
    if config.algorithm == SLIDING_WINDOW:
        return SlidingWindowBackend
    return MemoryBackend


class MemoryStore:
    """``{"BACKEND": "memory"}``: every rate limiter naming it keeps its state in this process.

    A :class:`~.base.Store`; it takes no ``LOCATION`` and no ``OPTIONS``, and never fails, so an instance's
    ``on_backend_error`` does not apply.
    """

    per_process = True

    def __init__(self, alias: str, location: str | None = None, options: Mapping[str, Any] | None = None) -> None:
        self.alias = alias

    def backend_factory(self, on_error: str | None) -> BackendFactory:
        """:class:`MemoryBackend` itself (its constructor is the factory)."""
        return MemoryBackend

    def keyed_store(
        self,
        name: str,
        config: Any,
        *,
        clock: Clock,
        max_keys: int,
        idle_timeout_ns: int | None,
        on_error: str | None,
    ) -> Any:
        """The in-process store of ``config``'s algorithm (:func:`~django_ratelimit_r4.keyed.memory_keyed_store`)."""
        from ..keyed import memory_keyed_store  # the keyed stores import this module's package

        return memory_keyed_store(config, clock, max_keys=max_keys, idle_timeout_ns=idle_timeout_ns)

    def __repr__(self) -> str:
        return f"MemoryStore({self.alias!r})"


register_memory_backends(MemoryBackend, memory_backend)  # core's RateLimiter defaults to these (core.backend)
