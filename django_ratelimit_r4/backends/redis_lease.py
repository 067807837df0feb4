"""Permit leases (``"lease": N``): a cluster-wide cycle limit at local speed.

A rate limiter on Redis makes one round trip per decision. With a lease of N, a process that finds its local
lease empty takes a batch of up to N permits of the *current cycle* from the shared budget in one round trip
(``lua/lease.lua``, on ``decide.lua``'s functions, reading and writing the very keys and state format of the
per-request script), spends one of them at once and the rest locally, with no round trip, until the batch is
spent or the cycle ends. Redis sees one round trip per batch instead of one per request.

Guarantee (exact in the direction that matters):

* The cluster never admits more than ``limit_for_period`` in a cycle: a leased permit is taken from the shared
  budget of that cycle (it counts as spent there), and a process spends it only before that cycle ends.
* A leased permit dies at its cycle's end. The cycle comes from the shared anchor (Redis), and the script
  answers how long the cycle has left; the lease expires that long after the moment the call was *sent*
  (earlier than the script ran), less :data:`LEASE_DRIFT_PPM` of it for clock-rate drift between this host
  and the Redis server, so it dies at or before the server's cycle boundary. On a client clock (a
  ``FakeClock``) the call carries its time, and the lease dies exactly at the boundary. Leftovers of an
  earlier cycle are discarded (counted in :attr:`LeaseStats.expired_permits`), never carried over.
* Under-use is bounded: a batch is ``max(permits, min(N, floor(left / 2) + 1))`` of the ``left`` permits of
  the shared budget (it shrinks as the budget nears empty), and every batch spends at least one permit at
  once, so a process holds at most ``max(N, permits) - 1`` unspent permits. When a request is rejected
  (shared budget empty, its own lease short), the permits the cluster can still admit in that cycle but
  did not is at most ``(processes - 1) * (N - 1)`` (1-permit requests; ``benchmarks/bench_leases.py`` and
  ``tests/backends/test_redis_lease.py`` measure it).
* Retry-After comes from the shared state: a rejection is always made by the script, when the local lease
  cannot pay and the shared budget cannot either; its wait is the shared time to the next permit.
* ``remaining`` (RateLimit headers, :meth:`quota`): the shared budget's remaining permits plus the permits
  this process holds in its live lease, i.e. the most *this process* can still be granted this cycle.
  Permits leased by other processes count as spent. On a decision served from the lease (no round trip) the
  shared part is the one read by this process's latest round trip of the cycle (the shared budget only
  falls within a cycle, so it may over-state by what other processes took since); :meth:`quota` and
  ``state()`` read it afresh (one round trip, no write), and later lease decisions use that read.

Not leased: reservations (a wait within ``timeout_duration``) and all-or-nothing decisions over several
limiters decide on the shared state as without leases. Keyed limiters lease per client key, in a bounded
table (:data:`LEASE_MAX_KEYS`, or ``max_keys`` if smaller; the least recently used lease is dropped, its
permits counted as under-use). Faults: a live lease keeps being spent while Redis fails (its permits were
taken); once it is empty the instance's ``on_backend_error`` policy decides, as without leases. A reset
(``r4 reset``) of the shared state does not reach the leases other processes hold: they die at their
cycle's end.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

from ..core.clock import Clock
from ..core.ratelimiter import RateLimiterConfig
from .base import lease_value
from .redis import (
    _FAULTS,
    DEFAULT_PREFIX,
    LostCancellation,
    RedisBackend,
    RedisConnection,
    RedisKeyedRateLimiter,
    RedisKeyedStore,
    _factory_of,
    _Late,
)

__all__ = [
    "LEASE_DRIFT_PPM",
    "LEASE_MAX_KEYS",
    "LEASE_SCRIPT",
    "LEASE_SCRIPT_SHA",
    "LeaseStats",
    "RedisLeaseBackend",
    "RedisLeaseKeyedRateLimiter",
    "RedisLeaseKeyedStore",
    "redis_lease_backend",
]


def _load_script() -> str:
    lua = resources.files(__package__) / "lua"
    return "\n".join((lua / name).read_text(encoding="utf-8") for name in ("decide.lua", "lease.lua"))


#: The Lua source of the lease script (decide.lua + lease.lua), and its SHA1 for EVALSHA.
LEASE_SCRIPT = _load_script()
LEASE_SCRIPT_SHA = hashlib.sha1(LEASE_SCRIPT.encode("utf-8")).hexdigest()
#: With Redis server time a lease dies this many millionths of the cycle's remaining time early: the local
#: monotonic clock may run slower than the server's (NTP keeps drift within 500 ppm).
LEASE_DRIFT_PPM = 1000
#: Most client keys a keyed limiter holds leases for in one process (``max_keys`` if smaller).
LEASE_MAX_KEYS = 10_000

# Argument index of the deadline in a lease call (anchor, state, op, permits, timeout, lease, limit, period,
# m, deadline).
_DEADLINE_AT = 9


@dataclass
class LeaseStats:
    """What one process's leases did (plain counters, this process only)."""

    #: Round trips to Redis made by leased decisions (each takes a batch, reserves, or rejects).
    round_trips: int = 0
    #: Decisions granted from a local lease, with no round trip.
    local_grants: int = 0
    #: Round trips that took a batch larger than the decision's permits (the leftover became a lease).
    batches: int = 0
    #: Permits taken into leases beyond the ones spent at once.
    leased_permits: int = 0
    #: Leased permits spent by local grants.
    spent_permits: int = 0
    #: Leased permits that died unspent at their cycle's end (under-use).
    expired_permits: int = 0
    #: Leased permits dropped unspent by ``reset``, ``drain``, ``change_limit`` or the keyed table's bound.
    dropped_permits: int = 0


class _Lease:
    __slots__ = ("anchor", "cycle", "expires", "held", "shared")

    def __init__(self, anchor: bytes, cycle: int, expires: int, held: int, shared: int) -> None:
        self.anchor = anchor
        self.cycle = cycle
        #: Local time (this limiter's timeline, ns) from which the lease is dead.
        self.expires = expires
        #: Unspent permits of the lease.
        self.held = held
        #: The shared budget's remaining permits at this lease's latest round trip.
        self.shared = shared


class _Leasing:
    """Mixed in first over a Redis cycle limiter: decisions spend a local lease before asking Redis."""

    lease: int
    _leases: OrderedDict[str, _Lease]
    _lease_lock: threading.Lock
    _lease_cap: int
    lease_stats: LeaseStats

    def _init_leases(self, lease: int, cap: int) -> None:
        try:
            valid = lease_value(lease)  # the settings' rule
        except ValueError as exc:
            raise ValueError(f"lease {exc}") from None
        if valid is None:
            raise ValueError("lease must be a positive int, got None")
        self.lease = lease
        self._leases = OrderedDict()
        self._lease_lock = threading.Lock()
        self._lease_cap = max(1, cap)
        self.lease_stats = LeaseStats()

    # -- local lease ----------------------------------------------------------------------------------

    def _local_ns(self: Any) -> int:
        now = self._now
        return int(now()) if now is not None else time.monotonic_ns()

    def _spend_local(self, state_key: str, permits: int) -> tuple[int, int, int] | None:
        """Pay ``permits`` from the live lease of ``state_key``: ``(0, remaining, reset_ns)``, or None."""
        with self._lease_lock:
            lease = self._leases.get(state_key)
            if lease is None:
                return None
            now = self._local_ns()
            if now >= lease.expires:
                self.lease_stats.expired_permits += lease.held
                del self._leases[state_key]
                return None
            if lease.held < permits:
                return None
            lease.held -= permits
            self.lease_stats.local_grants += 1
            self.lease_stats.spent_permits += permits
            if len(self._leases) > 1:
                self._leases.move_to_end(state_key)
            return 0, lease.held + lease.shared, lease.expires - now

    def _held(self, state_key: str) -> int:
        """Unspent permits of ``state_key``'s live lease (0 when none)."""
        with self._lease_lock:
            lease = self._leases.get(state_key)
            if lease is None:
                return 0
            if self._local_ns() >= lease.expires:
                self.lease_stats.expired_permits += lease.held
                del self._leases[state_key]
                return 0
            return lease.held

    def _drop_leases(self, state_key: str | None = None) -> int:
        """Forget the lease of ``state_key`` (every lease with None); returns the live permits dropped."""
        with self._lease_lock:
            if state_key is None:
                leases = list(self._leases.values())
                self._leases.clear()
            else:
                one = self._leases.pop(state_key, None)
                leases = [] if one is None else [one]
            now = self._local_ns()
            dropped = sum(lease.held for lease in leases if now < lease.expires)
            self.lease_stats.dropped_permits += dropped
            self.lease_stats.expired_permits += sum(lease.held for lease in leases if now >= lease.expires)
            return dropped

    def lease_snapshot(self) -> dict[str, int]:
        """This process's lease counters (:class:`LeaseStats`) plus ``lease`` (the batch size) and
        ``held_permits`` (unspent permits of the live leases now); plain reads, no round trip."""
        with self._lease_lock:
            now = self._local_ns()
            held = sum(lease.held for lease in self._leases.values() if now < lease.expires)
            stats = asdict(self.lease_stats)
        return {"lease": self.lease, **stats, "held_permits": held}

    def _keep(self, state_key: str, reply: Any, permits: int, sent_local: int) -> tuple[int, int, int]:
        """Settle a lease reply: keep the batch's leftover; ``(wait_ns, remaining, reset_ns)``."""
        taken, wait, left, reset, to_next, cycle, anchor = reply
        unit = self._unit  # type: ignore[attr-defined]
        stats = self.lease_stats
        stats.round_trips += 1
        if wait != 0 or taken <= permits:
            return wait * unit, left + self._held(state_key), reset * unit
        leftover = taken - permits
        to_next_ns = to_next * unit
        if self._now is None:  # type: ignore[attr-defined]
            to_next_ns -= to_next_ns * LEASE_DRIFT_PPM // 1_000_000 + 1
        expires = sent_local + to_next_ns
        with self._lease_lock:
            stats.batches += 1
            stats.leased_permits += leftover
            now = self._local_ns()
            lease = self._leases.get(state_key)
            if now >= expires:  # already dead (a slow reply, or one overtaken by the next cycle's)
                stats.expired_permits += leftover
            elif lease is not None and now < lease.expires and lease.anchor == anchor and lease.cycle == cycle:
                lease.held += leftover
                lease.expires = max(lease.expires, expires)
                lease.shared = min(lease.shared, left)
            else:
                if lease is not None:
                    stats.expired_permits += lease.held
                self._leases[state_key] = _Lease(anchor, cycle, expires, leftover, left)
                self._leases.move_to_end(state_key)
                while len(self._leases) > self._lease_cap:
                    _, evicted = self._leases.popitem(last=False)
                    if now < evicted.expires:
                        stats.dropped_permits += evicted.held
                    else:
                        stats.expired_permits += evicted.held
            lease = self._leases.get(state_key)
            held = lease.held if lease is not None and now < lease.expires else 0
        return 0, left + held, reset * unit

    # -- round trip -----------------------------------------------------------------------------------

    def _lease_args(self: Any, state_key: str, permits: int, timeout_ns: int) -> tuple[list[Any], int]:
        unit = self._unit
        args: list[Any] = [
            self._phase_of(state_key).anchor_key,  # the anchor of state_key's slot (its shard's on a cluster)
            state_key,
            b"l",
            permits,
            max(timeout_ns, 0) // unit,
            self.lease,
            self._limit,
            self._period_u,
            self._m,
            b"",  # the deadline: stamped by RedisConnection.run_script once a connection is held
        ]
        now = self._now
        if now is None:
            return args, 0
        at = int(now())
        args += divmod(at, 1_000_000_000)
        return args, at

    def _lease_reply(self, conn: RedisConnection, out: tuple[Any, int, bool], sent: int) -> tuple[Any, int]:
        reply, started, learn = out
        if type(reply) is bytes:
            raise _Late(conn.was_late(started))
        if learn:
            reply, (now_us,) = reply
            conn.learn_time(now_us, started, time.monotonic_ns())
        return reply, (sent if self._now is not None else started)  # type: ignore[attr-defined]

    def _lease_call(self: Any, conn: RedisConnection, state_key: str, permits: int, timeout_ns: int) -> Any:
        at = None if self._now is not None else _DEADLINE_AT
        for attempt in (0, 1):
            args, sent = self._lease_args(state_key, permits, timeout_ns)
            try:
                out = conn.run_script(LEASE_SCRIPT_SHA, LEASE_SCRIPT, 2, args, at)
                return self._lease_reply(conn, out, sent)
            except _Late:
                if attempt:  # nothing was changed: once more with a fresh deadline, then a fault
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _alease_call(
        self: Any, conn: RedisConnection, state_key: str, permits: int, timeout_ns: int
    ) -> Any:
        at = None if self._now is not None else _DEADLINE_AT
        for attempt in (0, 1):
            args, sent = self._lease_args(state_key, permits, timeout_ns)
            try:
                out = await conn.arun_script(LEASE_SCRIPT_SHA, LEASE_SCRIPT, 2, args, at)
                return self._lease_reply(conn, out, sent)
            except LostCancellation as lost:
                # Cancelled, yet the batch was taken from the shared budget: the request's permits are spent
                # (as any decision's, in memory too), the rest stays in this process's lease for the next
                # requests (else nobody would spend it before the cycle ends). Then the cancellation goes on.
                with contextlib.suppress(_Late):
                    reply, sent = self._lease_reply(conn, lost.reply, sent)
                    self._keep(state_key, reply, permits, sent)
                raise
            except _Late:
                if attempt:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _lease_decide(self: Any, state_key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """``(wait_ns, remaining, reset_ns)``: from the lease, else one round trip, else the fault policy."""
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits!r}")
        local = self._spend_local(state_key, permits)
        if local is not None:
            self._count(0)
            return local  # type: ignore[no-any-return]
        conn = self._connection()
        if not conn.is_down():
            replies = conn.replies
            try:
                reply, sent = self._lease_call(conn, state_key, permits, timeout_ns)
            except _FAULTS as exc:
                self._fault(conn, exc, "acquire", replies)
            else:
                wait, remaining, reset = self._keep(state_key, reply, permits, sent)
                return self._count(wait), remaining, reset
        else:
            self._fault(conn, None, "acquire")
        return self._fault_quota(state_key, permits, timeout_ns)  # type: ignore[no-any-return]

    async def _alease_decide(self: Any, state_key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """Async twin of :meth:`_lease_decide` on ``redis.asyncio``."""
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits!r}")
        local = self._spend_local(state_key, permits)
        if local is not None:
            self._count(0)
            return local  # type: ignore[no-any-return]
        conn = self._connection()
        if not conn.is_down():
            replies = conn.replies
            try:
                reply, sent = await self._alease_call(conn, state_key, permits, timeout_ns)
            except _FAULTS as exc:
                self._fault(conn, exc, "acquire", replies)
            else:
                wait, remaining, reset = self._keep(state_key, reply, permits, sent)
                return self._count(wait), remaining, reset
        else:
            self._fault(conn, None, "acquire")
        return self._fault_quota(state_key, permits, timeout_ns)  # type: ignore[no-any-return]

    # -- the _RedisCycleOps hooks every public method goes through --------------------------------------------

    def _acquire_at(self: Any, state_key: str, permits: int, timeout_ns: int) -> int:
        return self._lease_decide(state_key, permits, timeout_ns)[0]  # type: ignore[no-any-return]

    async def _aacquire_at(self: Any, state_key: str, permits: int, timeout_ns: int) -> int:
        return (await self._alease_decide(state_key, permits, timeout_ns))[0]  # type: ignore[no-any-return]

    def _acquire_quota_at(self: Any, state_key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        return self._lease_decide(state_key, permits, timeout_ns)  # type: ignore[no-any-return]

    async def _aacquire_quota_at(
        self: Any, state_key: str, permits: int, timeout_ns: int
    ) -> tuple[int, int, int]:
        return await self._alease_decide(state_key, permits, timeout_ns)  # type: ignore[no-any-return]

    def _with_held(self, state_key: str, state: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        held = self._held(state_key)
        if not held:
            return state
        cycle, permissions, wait, to_next = state
        with self._lease_lock:
            lease = self._leases.get(state_key)
            if lease is not None:
                lease.shared = permissions  # the freshest read of the shared budget
        permissions += held
        return cycle, permissions, 0 if permissions >= 1 else wait, to_next

    #: A state read with the others (``redis.read_quotas``) counts the live lease too.
    _shown = _with_held

    def _state_at(self, state_key: str) -> tuple[int, int, int, int]:
        """The shared state, with this process's live lease counted as available."""
        return self._with_held(state_key, super()._state_at(state_key))  # type: ignore[misc]

    async def _astate_at(self, state_key: str) -> tuple[int, int, int, int]:
        """Async twin of :meth:`_state_at`."""
        return self._with_held(state_key, await super()._astate_at(state_key))  # type: ignore[misc]

    def _drain_at(self, state_key: str) -> int:
        """Drain the shared budget and this process's lease of ``state_key``."""
        return self._drop_leases(state_key) + super()._drain_at(state_key)  # type: ignore[misc, no-any-return]


class RedisLeaseBackend(_Leasing, RedisBackend):
    """A :class:`~.redis.RedisBackend` (same keys, shared budget, fault policies) whose process leases up to
    ``lease`` permits of the current cycle per round trip (see the module doc for the guarantee)."""

    def __init__(
        self,
        name: str,
        limit_for_period: int,
        limit_refresh_period_ns: int,
        clock: Clock,
        *,
        lease: int,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        fault_policy: str = "open",
        connection_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._init_leases(lease, 1)
        super().__init__(
            name,
            limit_for_period,
            limit_refresh_period_ns,
            clock,
            url=url,
            prefix=prefix,
            fault_policy=fault_policy,
            connection_options=connection_options,
        )

    def change_limit(self, limit_for_period: int) -> None:
        """Use ``limit_for_period`` from the next decision on; this process's lease is dropped."""
        self._drop_leases()
        super().change_limit(limit_for_period)

    def reset(self, clock: Clock) -> None:
        """As :meth:`RedisBackend.reset <.redis.RedisBackend.reset>`; this process's lease is dropped (other
        processes' leases die at their cycle's end)."""
        self._drop_leases()
        super().reset(clock)

    def __repr__(self) -> str:
        return f"RedisLeaseBackend(name={self.name!r}, limit={self._limit}, lease={self.lease})"


class RedisLeaseKeyedStore(_Leasing, RedisKeyedStore):
    """A :class:`~.redis.RedisKeyedStore` leasing per client key (at most :data:`LEASE_MAX_KEYS` or
    ``max_keys`` leases held in this process; the least recently used is dropped)."""

    def __init__(self, name: str, config: RateLimiterConfig | None = None, *, lease: int, **kw: Any) -> None:
        self._init_leases(lease, min(int(kw.get("max_keys", LEASE_MAX_KEYS)), LEASE_MAX_KEYS))
        super().__init__(name, config, **kw)

    def reset(self, key: str | None = None) -> None:
        """As :meth:`RedisKeyedStore.reset <.redis.RedisKeyedStore.reset>`, dropping this process's leases of
        ``key`` (of every key with None)."""
        self._drop_leases(None if key is None else self._state_key(key))
        super().reset(key)

    def __repr__(self) -> str:
        return f"RedisLeaseKeyedStore({self.name!r}, limit_for_period={self._limit}, lease={self.lease})"


class RedisLeaseKeyedRateLimiter(RedisKeyedRateLimiter):
    """A :class:`~django_ratelimit_r4.keyed.KeyedRateLimiter` on a :class:`RedisLeaseKeyedStore` (built
    directly; ``lease=`` is the store's)."""

    store_type = RedisLeaseKeyedStore


def redis_lease_backend(
    url: str,
    *,
    lease: int,
    prefix: str = DEFAULT_PREFIX,
    fault_policy: str = "open",
    connection_options: Mapping[str, Any] | None = None,
) -> Any:
    """A :class:`~.base.BackendFactory` building :class:`RedisLeaseBackend` (``algorithm="cycle"`` only)."""
    factory = _factory_of(
        RedisLeaseBackend,
        url,
        prefix=prefix,
        fault_policy=fault_policy,
        connection_options=connection_options,
        lease=lease,
    )

    def for_config(config: Any) -> Any:
        if config.algorithm != "cycle":
            raise ValueError(f"lease is implemented for algorithm 'cycle' only, got {config.algorithm!r}")
        return factory

    factory.for_config = for_config
    return factory

