"""Per-client GCRA and sliding-window state in bounded memory (``algorithm`` ``"gcra"`` / ``"sliding_window"``).

:class:`SmoothKeyedStore` is the store ``KeyedRateLimiter(name, config)`` builds when the config's algorithm is
not ``"cycle"`` (for ``"sliding_window"`` it builds its subclass :class:`SlidingWindowKeyedStore`): a
:class:`~django_ratelimit_r4.core.backend.KeyedBackend` with the store policy of
:class:`~django_ratelimit_r4.keyed.MemoryKeyedStore` (an ``OrderedDict`` of live keys, a key whose state is full is
absent, the oldest entries swept two at a time when a key is inserted, the one at the front evicted at
``max_keys`` and counted in ``lossy_evictions``), with the decisions of
:mod:`django_ratelimit_r4.backends.algorithms` over absolute clock time.

State per live key: GCRA one int (the theoretical arrival time scaled by the limit), its entry moved to the end
at every grant (least recently used first); the sliding window a small object with an
``array('q')`` ring of its newest hand-over times (8 bytes a slot, oldest at ``ring[head]``, newest at
``ring[head - 1]``), the index of its oldest slot, the end of the slots known out of the window and when the
next one leaves it (see :class:`SlidingWindowKeyedStore`). The ring grows with use: a new key's holds
``first_slots`` (4) and it doubles, up to ``limit``, only when a permit would overwrite a time still in the
window, so it is at most twice the most permits the key held in one window: about 390 bytes with the key and
its entry for a client of one request whatever the limit, ``8 * limit`` more at most for one that used all of
it (``python benchmarks/bench_keyed_memory.py --algorithm sliding_window`` measures it), mutated in place under
the lock; its entry moves to the end at its first grant in each period
(from the store's anchor), so the store is ordered by the period of last use, as the cycle store is. A key is
full again, so dropped for free, at most ``burst * period / limit`` (GCRA) or one period (sliding window) after
its last hand-over, so ``idle_timeout_ns`` never needs to drop state.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Any

from .backends.algorithms import SLIDING_WINDOW, gcra_available, gcra_decide, gcra_quota
from .backends.memory import _INDEXES, _successors, ring_give_back
from .core.clock import Clock
from .core.ratelimiter import SUCCESSFUL_ACQUIRE, RateLimiterConfig
from .keyed import _FRONT_CHECKS, MemoryKeyedStore

__all__ = ["SlidingWindowKeyedStore", "SmoothKeyedStore"]


class SmoothKeyedStore(MemoryKeyedStore):
    """A :class:`~django_ratelimit_r4.keyed.MemoryKeyedStore` whose keys run GCRA; the base of
    :class:`SlidingWindowKeyedStore`, which ``SmoothKeyedStore(config, clock)`` builds for a sliding-window
    config (the store of ``config``'s algorithm either way)."""

    def __new__(cls, config: RateLimiterConfig, clock: Clock, **kw: Any) -> SmoothKeyedStore:
        """The sliding window's store for a sliding-window config, else this class."""
        if cls is SmoothKeyedStore and config.algorithm == SLIDING_WINDOW:
            cls = SlidingWindowKeyedStore
        return super().__new__(cls)

    def __init__(self, config: RateLimiterConfig, clock: Clock, **kw: Any) -> None:
        """See :class:`~django_ratelimit_r4.keyed.MemoryKeyedStore`; ``config.algorithm`` is not ``"cycle"``."""
        super().__init__(config, clock, **kw)
        self._burst = self._limit if self.config.burst is None else int(self.config.burst)
        # A one-permit request conforms when ``tat + _one_early <= now * limit`` (GCRA, scaled by the limit).
        self._one_early = (1 - self._burst) * self._period

    # -- one key's algorithm (caller holds the lock; ``now`` is absolute clock time) -----------------------

    def _wait(self, state: Any, now: int, permits: int) -> int:
        """Nanoseconds until ``permits`` could be handed over for a key in ``state`` (None: full)."""
        return gcra_decide(state or 0, permits, -1, now, self._period, self._limit, self._burst)[1]

    def _grantable(self, permits: int) -> bool:
        return permits <= self._burst

    def _take(self, key: str, state: Any, now: int, permits: int, wait: int) -> Any:
        """Hand ``permits`` over at ``now + wait`` and store the key's new state; returns what
        :meth:`give_back` needs to undo exactly this take (GCRA: the tat written)."""
        scaled = now * self._limit
        base = state if state is not None and state > scaled else scaled
        tat = base + permits * self._period
        self._put(key, state, tat)
        return tat

    def _full(self, state: Any, now: int) -> bool:
        return bool(state <= now * self._limit)

    def _available(self, state: Any, now: int) -> int:
        return gcra_available(state or 0, now, self._period, self._limit, self._burst)

    def _quota_of(self, state: Any, now: int) -> tuple[int, int]:
        return gcra_quota(state or 0, now, self._period, self._limit, self._burst)

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

    def _decide_locked(self, key: str, state: Any, now: int, permits: int, timeout_ns: int) -> int:
        """:meth:`decide` by the hooks above (any algorithm, any number of permits); caller holds the lock."""
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits!r}")
        wait = self._wait(state, now, permits)
        if self._grantable(permits) and (wait == 0 or (timeout_ns and timeout_ns >= wait)):
            self._take(key, state, now, permits, wait)
            self.successful_calls += 1
            return wait
        self.failed_calls += 1
        return -wait

    # -- the KeyedBackend protocol ---------------------------------------------------------------------------

    def decide(self, key: str, permits: int, timeout_ns: int) -> int:
        """Decide and commit for ``key``: wait ``>= 0`` granted (reserved), ``< 0`` rejected (``-wait``)."""
        lock = self._lock
        lock.acquire()
        try:
            states = self._states
            state = states.get(key)
            now = self._now()
            if permits == 1:
                # One permit granted now, spelled out: the key's state moves to the end (most recently used).
                if state is None:  # a new (or full, hence dropped) key: one permit is always granted
                    self._put(key, None, now * self._limit + self._period)
                    self.successful_calls += 1
                    return 0
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
            return self._decide_locked(key, state, now, permits, timeout_ns)
        finally:
            lock.release()

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
            return (
                (now - self._anchor) // self._period,
                self._available(state, now),
                self._wait(state, now, 1),
            )

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
        """Undo a grant of ``permits`` to ``key`` decided at or after ``since_ns``, as ``GcraBackend.give_back``
        does; ``taken`` is the tat its take wrote (:meth:`_commit_peek_locked`)."""
        with self._lock:
            state = self._states.get(key)
            if state is None or since_ns < self._anchor:
                return
            scaled = self._now() * self._limit
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
            f"{type(self).__name__}(algorithm={self.config.algorithm!r}, limit_for_period={self._limit}, "
            f"limit_refresh_period_ns={self._period}, live_keys={len(self)}, max_keys={self.max_keys})"
        )


class SlidingWindowKeyedStore(SmoothKeyedStore):
    """The exact sliding window per key (:func:`~.backends.algorithms.sliding_decide` over absolute clock time).

    A key's state is a ``_Log`` (``ring``, ``head``, ``edge``, ``after``, ``mark``, ``next``, ``spare``; see the
    module doc), mutated in place under the lock: the ``array('q')`` ring of its newest hand-over times, sorted
    from the oldest at ``ring[head]`` to the newest at ``ring[head - 1]`` (8 bytes a slot, no int object per
    time). The reference's log (:func:`~.backends.algorithms.sliding_decide`) holds the last ``limit`` times;
    the ring holds its newest ``len(ring)`` and the ``spare = limit - len(ring)`` older ones are free (outside
    every window, as a new key's are), so they are counted, never stored. A new key's ring has
    ``first_slots`` slots; a write that would overwrite a time still in the window while ``spare`` is not 0
    copies the ring into one twice as large (or large enough; at most ``limit``), its new slots free and oldest
    (:meth:`_grow`): ``O(1)`` amortised per permit, and the ring is at most twice the most permits the key held
    in one window. Overwriting a time out of the window instead of a free slot changes no answer: from then on
    both are out of every window. No reservation is pending while ``spare`` is not 0: a decision waits only
    for the reference's ``times[k - 1]`` or a pending reservation, the first is a free slot unless
    ``k > spare``, and a write of ``k > spare`` permits whose ``times[k - 1]`` is in the window grows the ring
    to the limit (``_fit``: at most ``k - 1 - spare`` of its times are out of the window). ``next`` is the
    successor list of the ring's size, ``spare`` its count of free slots not held, both shared by every log of
    that size (:meth:`_shape`).

    The slots from ``head`` up to ``edge`` (excluded, around the ring) are known to have left the window: time
    only moves on, so they stay out. ``edge`` is kept by every write (a one-permit grant that takes one of them
    leaves it; any other write sets it to the new head: none known). While ``head != edge`` a one-permit grant
    reads nothing of the ring and writes one slot and the head (from the log's successor list ``next``: no
    int built): the common case of a client below its limit. Then the newest time is not ahead of now either
    (a reservation needs the oldest slot in the window or a later reservation, and a grant that makes ``edge``
    known is a grant at now; clocks are monotonic and read under the lock), so none is pending. Only when none
    is known out does a decision read the oldest slot and the newest.

    The header figures need how many logged permits have left the window exactly (the known slots plus
    ``spare``): ``after`` is when the slot at ``edge`` leaves it (its time plus the period; None: not known). A
    grant that takes a known slot keeps it; every other write sets it to None. While ``after > now``, the known
    slots are all of them, so the figures of a one-permit grant cost one comparison; one slot read when one
    more has left the window; without ``after``, a binary search of the ring (``bisect`` on an array: 0.4-0.8
    us at 1000 slots on this machine, about a decision's time; reading the next slot every time was a second
    cache line per decision).
    ``decide_quota`` and the limiter's ``acquire_quota`` (written out here: :meth:`limiter_acquire_quota`)
    compute it when it is not known.

    ``head`` and ``edge`` are the shared int objects of :data:`~.backends.memory._INDEXES` (no object per key to
    read). A one-permit grant from a known-out slot reads ``next`` where it read the store's list and no
    ``spare``; its figures read ``spare`` (when the known slots do not wrap); a decision that found the oldest
    slot in the window reads it before rejecting. The entry moves to the end of the store only at a key's first
    grant in each period (the period of the store's anchor, as the cycle store's; ``mark`` is the store's token
    of the period of its last move): a move per grant cost as much as the decision.
    """

    #: Slots of a new key's ring (at most ``limit``); it doubles from there with use (see the class doc).
    first_slots: int = 4

    def _reset_locked(self, clock: Clock) -> None:
        super()._reset_locked(clock)
        # A free slot's time: a period before the anchor, outside every window (no logged time is older).
        self._free = self._anchor - self._period
        self._shapes: dict[int, tuple[list[int], int]] = {}
        # A new key's ring (copied, a memcpy): every slot free.
        self._fresh = array("q", [self._free]) * min(self._limit, max(1, int(self.first_slots)))
        self._first_next, self._first_spare = self._shape(len(self._fresh))

    def _shape(self, size: int) -> tuple[list[int], int]:
        """``(next, spare)`` of a ring of ``size`` slots, made once per size and shared by its logs: the
        successor list (8 bytes a slot) and ``limit - size``. Sizes are ``first_slots`` doubled, and ``limit``,
        so a store makes a handful of lists, none larger than the largest ring it holds."""
        shape = self._shapes.get(size)
        if shape is None:
            shape = self._shapes[size] = (_successors(size), self._limit - size)
        return shape

    def _size_for(self, size: int, need: int) -> int:
        """``size`` doubled until it holds ``need`` slots, at most ``limit``."""
        while size < need:
            size *= 2
        return min(size, self._limit)

    def _fit(self, state: _Log, now: int, permits: int) -> None:
        """Before ``permits`` are written over the oldest slots of a ring smaller than the limit: grow it unless
        they are all known out of the window or out by its times (the reference would drop free ones there:
        the same answers, see the class doc), so that they overwrite only free slots and times out of it."""
        ring = state.ring
        head = state.head
        size = len(ring)
        known = state.edge - head
        if known < 0:
            known += size
        if permits <= known:
            return
        out = _ring_count(ring, head, size, now - self._period)
        if permits > out:
            self._grow(state, self._size_for(2 * size, size + permits - out))

    def _grow(self, state: _Log, size: int) -> None:
        """Copy ``state``'s ring into one of ``size`` slots, oldest first from slot 0: the new slots free (known
        out of the window: no reservation is pending while a ring is below the limit, see the class doc), then
        the times it held."""
        ring = state.ring
        head = state.head
        old = len(ring)
        added = size - old
        grown = array("q", [self._free]) * size  # exactly ``size`` slots (an extended array over-allocates)
        grown[added : size - head] = ring[head:]
        if head:
            grown[size - head :] = ring[:head]
        known = state.edge - head
        if known < 0:
            known += old
        state.next, state.spare = self._shape(size)  # also makes _INDEXES cover the new slots
        state.ring = grown
        state.head = _INDEXES[0]
        state.edge = _INDEXES[added + known]  # the same time as before: ``after`` is still when it leaves

    def _set_cycle(self, cycle: int) -> None:
        super()._set_cycle(cycle)
        self._mark = object()  # this period's token: a log whose mark is another was last moved before it

    # -- one key's algorithm (caller holds the lock; ``now`` is absolute clock time) -----------------------

    def _wait(self, state: Any, now: int, permits: int) -> int:
        if permits > self._limit:
            return self._period
        return 0 if state is None else _ring_at(state, self._period, now, permits) - now

    def _grantable(self, permits: int) -> bool:
        return permits <= self._limit

    def _new(self, now: int) -> _Log:
        """A new key's state after one permit handed over at ``now``: the other slots are free, so known out, and
        the slot past them is slot 0 (``now``)."""
        ring = self._fresh[:]
        ring[0] = now
        successors = self._first_next
        return _Log(ring, successors[0], 0, now + self._period, successors, self._first_spare)

    def _take(self, key: str, state: Any, now: int, permits: int, wait: int) -> None:
        """Hand ``permits`` over at ``now + wait`` (the key's state is written in place; a new key is inserted)."""
        if state is None:
            size = self._size_for(len(self._fresh), permits)
            successors, spare = self._shape(size)
            state = _Log(array("q", [self._free]) * size, 0, 0, None, successors, spare)
            _ring_write(state, now + wait, permits)
            self._insert(key, state, now)
            return
        if state.spare:
            self._fit(state, now, permits)
        _ring_write(state, now + wait, permits)
        self._touch(key, state, now)

    def _full(self, state: Any, now: int) -> bool:
        return bool(state.ring[state.head - 1] <= now - self._period)

    def _available(self, state: Any, now: int) -> int:
        return self._limit if state is None else _ring_available(state, self._period, now)

    def _quota_of(self, state: Any, now: int) -> tuple[int, int]:
        remaining = self._available(state, now)
        if remaining < 1:
            return remaining, self._wait(state, now, 1)
        return remaining, 0 if state is None else max(0, state.ring[state.head - 1] + self._period - now)

    def _roll(self, now: int) -> None:
        """Move the current period on to ``now``'s."""
        if now >= self._cycle_end:
            self._set_cycle((now - self._anchor) // self._period)

    def _touch(self, key: str, state: _Log, now: int) -> None:
        """After a grant to a stored key: move it to the end at its first grant in this period."""
        self._roll(now)
        if state.mark is not self._mark:
            state.mark = self._mark
            self._states.move_to_end(key)

    def _insert(self, key: str, state: _Log, now: int) -> None:
        """Store a new key last, after sweeping up to ``_FRONT_CHECKS`` full entries off the front; at
        ``max_keys`` the front entry (holding state: the sweep stopped at it) is evicted, lossy."""
        self._roll(now)
        state.mark = self._mark
        states = self._states
        edge = now - self._period
        for _ in range(_FRONT_CHECKS):
            if not states:
                break
            front = next(iter(states))
            log = states[front]
            if log.ring[log.head - 1] > edge:
                break
            del states[front]
        if len(states) >= self.max_keys:
            states.popitem(last=False)
            self.lossy_evictions += 1
        states[key] = state

    def _out(self, state: _Log, now: int) -> tuple[int, int]:
        """``(out, after)`` after a one-permit grant at ``now`` (the newest is in the window): how many logged
        permits have left the window and when the next one leaves it; one step past the known ones when
        ``after`` is known (and has passed) and the slot past it is still in the window, else a binary search;
        leaves them known (see the class doc)."""
        ring = state.ring
        head = state.head
        period = self._period
        if state.after is not None:
            edge = state.next[state.edge]  # below the newest: it is in the window, so not among the known out
            after = ring[edge] + period
            if after > now:  # the common step: exactly one more has left the window
                state.edge = edge
                state.after = after
                out = edge - head  # plus the free slots not held (wrapped: plus the ring's size too)
                if out < 0:
                    out += self._limit
                elif state.spare:  # no ``+ 0``: an int above 256 plus 0 is a new object
                    out += state.spare
                return out, after
        size = len(ring)
        out = _ring_count(ring, head, size, now - period)
        index = head + out
        if index >= size:
            index -= size
        after = ring[index] + period
        state.edge = _INDEXES[index]
        state.after = after
        return (out + state.spare if state.spare else out), after

    # -- the KeyedBackend protocol ---------------------------------------------------------------------------

    def decide(self, key: str, permits: int, timeout_ns: int) -> int:
        """Decide and commit for ``key``: wait ``>= 0`` granted (reserved), ``< 0`` rejected (``-wait``)."""
        lock = self._lock
        lock.acquire()
        try:
            state: _Log | None = self._states.get(key)
            now = self._now()
            if permits == 1:
                # One permit, spelled out (sliding_decide for k = 1): handed over at max(oldest + T, newest, now).
                if state is None:  # a new (or full, hence dropped) key: one permit is always granted now
                    self._insert(key, self._new(now), now)
                    self.successful_calls += 1
                    return 0
                head = state.head
                if head != state.edge:
                    # The oldest slot is known out of the window (and no reservation is pending: see the class
                    # doc): granted now without reading the ring; ``edge`` and ``after`` are kept.
                    state.ring[head] = now
                    state.head = state.next[head]
                    if now >= self._cycle_end or state.mark is not self._mark:
                        self._touch(key, state, now)
                    self.successful_calls += 1
                    return 0
                ring = state.ring
                at = ring[head] + self._period
                newest = ring[head - 1]  # index -1 when head is 0: the last slot
                if newest > at:
                    at = newest
                if at <= now:
                    ring[head] = now
                    state.edge = state.head = state.next[head]  # none known out still
                    state.after = None  # the slot written was the one at edge
                    if now >= self._cycle_end or state.mark is not self._mark:
                        self._touch(key, state, now)
                    self.successful_calls += 1
                    return 0
                if state.spare:
                    # The ring's oldest is in the window or a reservation is pending, but the reference's oldest
                    # is a free slot the ring does not hold: the general path (it grows the ring when needed).
                    return self._decide_locked(key, state, now, 1, timeout_ns)
                wait = at - now  # > 0: the oldest is in the window, or a reservation is pending
                if timeout_ns >= wait:
                    ring[head] = at
                    state.edge = state.head = state.next[head]
                    state.after = None
                    self._touch(key, state, now)
                    self.successful_calls += 1
                    return wait
                self.failed_calls += 1
                if now >= self._cycle_end:
                    self._set_cycle((now - self._anchor) // self._period)
                return -wait
            return self._decide_locked(key, state, now, permits, timeout_ns)
        finally:
            lock.release()

    def decide_quota(self, key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """See :meth:`MemoryKeyedStore.decide_quota <django_ratelimit_r4.keyed.MemoryKeyedStore.decide_quota>`;
        one permit granted now or rejected is written out (the keyed ``@ratelimit`` path)."""
        lock = self._lock
        lock.acquire()
        try:
            state: _Log | None = self._states.get(key)
            now = self._now()
            if permits == 1:
                period = self._period
                if state is None:  # a new key: granted; its newest is now, the other slots are free
                    self._insert(key, self._new(now), now)
                    self.successful_calls += 1
                    return 0, self._limit - 1, period
                head = state.head
                edge = state.edge
                if head != edge:
                    # Granted now without reading the ring (see decide); ``edge`` and ``after`` are kept.
                    state.ring[head] = now
                    state.head = head = state.next[head]
                    if now >= self._cycle_end or state.mark is not self._mark:
                        self._touch(key, state, now)
                    self.successful_calls += 1
                    # The figures (sliding_quota): the newest is now, so reset is one period while a permit
                    # remains; remaining is how many logged permits have left the window (see the class doc).
                    after = state.after
                    if after is not None and after > now:  # the common case: the known ones are all of them
                        out = edge - head  # plus the free slots not held (wrapped: plus the ring's size too)
                        if out < 0:
                            out += self._limit
                        elif state.spare:  # no ``+ 0``: an int above 256 plus 0 is a new object
                            out += state.spare
                        return (0, out, period) if out else (0, 0, after - now)
                    out, after = self._out(state, now)
                    # None left: reset is the wait for one, when the oldest leaves the window.
                    return (0, out, period) if out else (0, 0, after - now)
                ring = state.ring
                at = ring[head] + period
                newest = ring[head - 1]
                if newest > at:
                    at = newest
                if at <= now:
                    ring[head] = now
                    state.edge = state.head = state.next[head]
                    state.after = None  # the slot written was the one at edge
                    if now >= self._cycle_end or state.mark is not self._mark:
                        self._touch(key, state, now)
                    self.successful_calls += 1
                    out, after = self._out(state, now)
                    return (0, out, period) if out else (0, 0, after - now)
                wait = at - now
                if timeout_ns < wait and not state.spare:  # a ring with free slots not held: see decide
                    # Rejected: the oldest is in the window or a reservation is pending, so none remains
                    # and reset is this wait (what quota() reads: rejection_quotas).
                    self.failed_calls += 1
                    if now >= self._cycle_end:
                        self._set_cycle((now - self._anchor) // self._period)
                    return -wait, 0, wait
            elif permits < 1:
                raise ValueError(f"permits must be >= 1, got {permits!r}")
            wait = self._decide_locked(key, state, now, permits, timeout_ns)
            remaining, reset_ns = self._quota_of(self._states.get(key), now)
            return wait, remaining, reset_ns
        finally:
            lock.release()

    @staticmethod
    def limiter_acquire_quota(limiter: Any, key: str, permits: int = 1) -> tuple[int, int]:
        """``limiter.acquire_quota(key, permits)`` for a :class:`~django_ratelimit_r4.keyed.KeyedRateLimiter` on
        this store (a function of the limiter: it binds it as its ``acquire_quota`` method, whose call is cheaper
        than a ``partial``'s), its common cases written out: one permit granted now from the slots known out of
        the window while they are all of them (``after > now``: its figures are their count less this one), and
        one permit rejected (its figures: none left, reset is the wait). Everything else (a new key, a key whose
        ``after`` is not known or has passed, a reservation, several permits) goes through the limiter's
        ``_acquire_quota_of_store`` (``decide_quota``), which leaves ``after`` known."""
        if permits == 1:
            store: SlidingWindowKeyedStore = limiter.store
            granted = False
            wait = 0
            lock = store._lock
            lock.acquire()
            try:
                state: _Log | None = store._states.get(key)
                if state is not None:
                    now = store._now()
                    head = state.head
                    edge = state.edge
                    if head != edge:
                        after = state.after
                        if after is not None and after > now:
                            state.ring[head] = now
                            state.head = head = state.next[head]
                            if now >= store._cycle_end or state.mark is not store._mark:
                                store._touch(key, state, now)
                            store.successful_calls += 1
                            granted = True
                            spare = state.spare
                    else:
                        ring = state.ring
                        at = ring[head] + store._period
                        newest = ring[head - 1]
                        if newest > at:
                            at = newest
                        # Rejected (no reservation could cover it); a ring with free slots not held: see decide.
                        if at - now > limiter._timeout_ns and not state.spare:
                            wait = at - now
                            store.failed_calls += 1
                            store._roll(now)
            finally:
                lock.release()
            if granted:
                if limiter.events.wants_successful:
                    limiter._publish(SUCCESSFUL_ACQUIRE, 1)
                out = edge - head  # plus the free slots not held (wrapped: plus the ring's size too)
                if out < 0:
                    out += store._limit
                elif spare:  # no ``+ 0``: an int above 256 plus 0 is a new object
                    out += spare
                # One at least remains: reset is one period; none: reset is when the next slot leaves the window.
                return (out, store._period) if out else (0, after - now)  # type: ignore[operator]
            if wait:
                # One permit is always grantable (no refuse_never_grantable); raised without a local holding it.
                raise limiter._rejection(key, 1, wait, ((0, wait),))
        return limiter._acquire_quota_of_store(key, permits)  # type: ignore[no-any-return]

    def give_back(self, key: str, permits: int, since_ns: int, taken: Any = None) -> None:
        """Undo a grant of ``permits`` to ``key`` decided at or after ``since_ns``, as
        ``SlidingWindowBackend.give_back`` does (:func:`~.backends.memory.ring_give_back`)."""
        with self._lock:
            state: _Log | None = self._states.get(key)
            if state is None or since_ns < self._anchor:
                return
            ring = state.ring  # its free slots not held are older than any grant: as if it held them
            head = ring_give_back(ring, state.head, len(ring), self._period, permits, since_ns, self._now())
            if head is None:
                return  # nothing given back
            state.edge = state.head = _INDEXES[head]  # slots moved: none known out of the window
            state.after = None
            self.successful_calls -= 1


# -- the sliding log of one key ----------------------------------------------------------------------------------


class _Log:
    """One key's sliding log (caller holds the store's lock): ``ring`` the ``array('q')`` of the newest
    ``len(ring)`` of its last ``limit`` hand-over times (the ``spare`` older ones are free: not held), oldest
    at ``ring[head]``, newest at ``ring[head - 1]``; the slots from ``head`` up to ``edge`` are known to have
    left the window and ``after`` is when the one at ``edge`` leaves it (None: not known); ``next`` the
    successor list of the ring's size; ``mark`` the store's token of the period of the entry's last move (see
    :class:`SlidingWindowKeyedStore`).

    Its own object with slots rather than a list: one memory block holds the fields (a list keeps its items in
    a second one), a cache line fewer per decision across many keys. No field holds an int made per key on the
    common path: ``head`` and ``edge`` are shared index objects, the times are in the array.
    """

    __slots__ = ("after", "edge", "head", "mark", "next", "ring", "spare")

    def __init__(
        self, ring: array[int], head: int, edge: int, after: int | None, successors: list[int], spare: int
    ) -> None:
        self.ring = ring
        self.head = head
        self.edge = edge
        self.after = after
        self.next = successors
        self.spare = spare
        self.mark: object = None


def _ring_at(state: _Log, period: int, now: int, permits: int) -> int:
    """When ``permits <= limit`` permits can be handed over (:func:`~.backends.algorithms.sliding_decide`)."""
    ring = state.ring
    head = state.head
    index = permits - 1 - state.spare  # the reference's times[permits - 1] in the ring; < 0: a free slot
    if index < 0:
        at = now
    else:
        index += head
        size = len(ring)
        if index >= size:
            index -= size
        at = ring[index] + period
        if at < now:
            at = now
    newest = ring[head - 1]
    return newest if newest > at else at


def _ring_write(state: _Log, at: int, permits: int) -> None:
    """Log ``permits <= len(ring)`` handed over at ``at``: they replace the oldest slots (two slice copies at
    most; the store grew the ring first when they were in the window and it holds fewer than the limit)."""
    ring = state.ring
    head = state.head
    size = len(ring)
    end = head + permits
    if end <= size:
        ring[head:end] = array("q", [at]) * permits
    else:
        ring[head:] = array("q", [at]) * (size - head)
        end -= size
        ring[:end] = array("q", [at]) * end
    state.head = new_head = _INDEXES[end if end < size else 0]
    out = state.edge - head
    if out < 0:
        out += size
    if permits > out:  # slots not known out were written: none is known now
        state.edge = new_head
        state.after = None
    # else the slots written were known out: the rest still are, and ``edge`` and ``after`` are unchanged


def _ring_available(state: _Log, period: int, now: int) -> int:
    """:func:`~.backends.algorithms.sliding_available`: the free slots not held, and a binary search of the
    ring's two sorted runs."""
    ring = state.ring
    head = state.head
    if ring[head - 1] > now:
        return 0
    return state.spare + _ring_count(ring, head, len(ring), now - period)


def _ring_count(ring: array[int], head: int, limit: int, edge: int) -> int:
    """How many logged times are at or before ``edge``: a prefix of the ring from ``head`` (two sorted runs)."""
    count = bisect_right(ring, edge, head, limit) - head
    if count == limit - head and head:
        count += bisect_right(ring, edge, 0, head)
    return count
