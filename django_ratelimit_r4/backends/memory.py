"""In-process rate-limiter state: two ints behind one ``threading.Lock``, per process.

The lock is held only for a few integer operations (never while anyone waits), which makes every decision
exact under concurrency and O(1). :meth:`MemoryBackend.acquire` inlines :func:`~.base.decide` because a
Python call plus a tuple costs about 40 ns on the hot path; ``tests/core/test_ratelimiter_properties.py``
checks that both give the same answers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..core.clock import Clock
from .base import RateLimiterBackend, div_ceil, nanos_to_wait, refresh

__all__ = ["MemoryBackend"]


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

    def change_limit(self, limit_for_period: int) -> None:
        """Use the new limit from now on; the current permissions are capped only at the next refresh."""
        with self._lock:
            self._limit = int(limit_for_period)

    def acquire_many(self, backends: Sequence[RateLimiterBackend], permits: int) -> tuple[int, int] | None:
        """All-or-nothing with timeout 0 over ``MemoryBackend`` instances (see the protocol).

        The locks are taken in ``id`` order, so two overlapping multi-limit calls can never deadlock; the
        decision and the commit happen while all of them are held.
        """
        members: list[MemoryBackend] = []
        for backend in backends:
            if not isinstance(backend, MemoryBackend):
                raise TypeError(f"cannot combine {type(backend).__name__} with MemoryBackend in one decision")
            members.append(backend)
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits!r}")
        if len({id(b) for b in members}) != len(members):
            raise ValueError("the same rate limiter appears more than once")
        ordered = sorted(members, key=id)
        held: list[MemoryBackend] = []
        try:
            for backend in ordered:
                backend._lock.acquire()
                held.append(backend)
            refreshed: list[tuple[int, int]] = []
            worst: tuple[int, int] | None = None
            for index, backend in enumerate(members):
                now, cycle, permissions = backend._refresh_locked()
                wait = nanos_to_wait(permissions, permits, cycle, now, backend._period, backend._limit)
                if wait > 0:
                    backend.failed_calls += 1
                    if worst is None or wait > worst[1]:
                        worst = (index, wait)
                refreshed.append((cycle, permissions))
            if worst is not None:
                return worst
            for backend, (cycle, permissions) in zip(members, refreshed, strict=True):
                backend._cycle = cycle
                backend._cycle_end = backend._anchor + (cycle + 1) * backend._period
                backend._permissions = permissions - permits
                backend.successful_calls += 1
            return None
        finally:
            for backend in reversed(held):
                backend._lock.release()

    def __repr__(self) -> str:
        return f"MemoryBackend(name={self.name!r}, limit={self._limit}, period_ns={self._period})"
