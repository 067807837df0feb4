"""GCRA (``algorithm="gcra"``) in Redis: one round trip per decision, exact, no ghost charges.

The cycle limiters' script is not touched: ``lua/gcra.lua`` is a script of its own (:data:`GCRA_SCRIPT`),
:func:`~.algorithms.gcra_decide` over a theoretical arrival time stored per limiter (or client key) as whole
seconds plus units of ``1/scale`` ns, so every value it forms is an exact integer below 2^53.

* :class:`RedisGcraBackend` -- a :class:`~.redis.RedisBackend` (same keys, fault policies, connection) whose
  decisions are GCRA; built by :func:`~.redis.redis_backend`'s factory for a GCRA config.
* :class:`RedisGcraKeyedRateLimiter` -- the same for :class:`~.redis.RedisKeyedRateLimiter` (one budget per
  client key, cluster-wide).

Time: the same two modes as the cycle limiters -- Redis server ``TIME`` (every call carries the deadline of
:meth:`~.redis.RedisConnection.deadline`; run after it, the script changes nothing and answers ``LATE``), or
the limiter's own clock (a ``FakeClock``) sent with each call. All-or-nothing decisions combine GCRA limiters
of one Redis in one script (:meth:`RedisGcraBackend.acquire_many`, :func:`gcra_acquire_all`); mixing them with
cycle limiters raises ``TypeError``.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Sequence
from importlib import resources
from typing import Any

from ..core.clock import Clock
from .memory import GcraBackend
from .redis import (
    _FAULTS,
    RedisBackend,
    RedisConnection,
    RedisKeyedRateLimiter,
    _entries_outcome,
    _Late,
    require_one_slot,
)

__all__ = [
    "GCRA_SCRIPT",
    "GCRA_SCRIPT_SHA",
    "RedisGcraBackend",
    "RedisGcraKeyedRateLimiter",
    "agcra_acquire_all",
    "agcra_entries",
    "gcra_acquire_all",
    "gcra_entries",
    "gcra_members",
]

#: The Lua source of the GCRA script, and its SHA1 for EVALSHA.
GCRA_SCRIPT = (resources.files(__package__) / "lua" / "gcra.lua").read_text(encoding="utf-8")
GCRA_SCRIPT_SHA = hashlib.sha1(GCRA_SCRIPT.encode("utf-8")).hexdigest()

_EXACT = 2**52  # the script's values stay below this (2^53 is where doubles stop being exact integers)
_NS_PER_S = 1_000_000_000


def _reply_of(conn: RedisConnection, reply: Any, started_ns: int, learn: bool) -> Any:
    if type(reply) is bytes:
        raise _Late(conn.was_late(started_ns))
    if learn:
        reply, (now_us,) = reply
        conn.learn_time(now_us, started_ns, time.monotonic_ns())
    return reply


def _call(conn: RedisConnection, keys: Sequence[str], args: list[Any], server_time: bool) -> Any:
    """One run of the GCRA script through :meth:`RedisConnection.run_script` (server time: the deadline in
    ``args[-1]``, taken once a pooled connection is held)."""
    reply, started, learn = conn.run_script(
        GCRA_SCRIPT_SHA, GCRA_SCRIPT, len(keys), [*keys, *args], len(keys) + len(args) - 1 if server_time else None
    )
    return _reply_of(conn, reply, started, learn)


async def _acall(conn: RedisConnection, keys: Sequence[str], args: list[Any], server_time: bool) -> Any:
    """Async twin of :func:`_call` on this loop's ``redis.asyncio`` client."""
    reply, started, learn = await conn.arun_script(
        GCRA_SCRIPT_SHA, GCRA_SCRIPT, len(keys), [*keys, *args], len(keys) + len(args) - 1 if server_time else None
    )
    return _reply_of(conn, reply, started, learn)


class _Gcra:
    """What turns a Redis cycle limiter into a GCRA one: the script calls (the rest -- counters, fault
    policies, keys, waiting -- is the cycle limiter's). Mixed in first."""

    _gcra = True
    _burst: int
    _burst_default: bool
    _gargs: list[Any]
    _max_timeout: int

    def _gcra_rate(self: Any) -> None:
        """Scale, step and span as :class:`~.memory.GcraBackend`; refuse a rate the script cannot keep exact."""
        if self._burst_default:
            self._burst = self._limit
        common = math.gcd(self._limit, self._period)
        scale, step = self._limit // common, self._period // common
        span = self._burst * step
        self._max_timeout = (_EXACT - 2 * _NS_PER_S * scale - 2 * span) // scale
        if self._max_timeout < 0:
            raise ValueError(
                f"rate limiter {self.name!r}: algorithm 'gcra' on Redis cannot keep limit {self._limit} per "
                f"{self._period} ns with burst {self._burst} exact (use a rounder period or a smaller burst)"
            )
        self._unit = 1  # the script answers in ns
        self._gargs = [step, span, scale, self._period]

    def _gcra_args(self: Any, op: bytes, permits: int, timeout_ns: int) -> list[Any]:
        return [op, permits, min(timeout_ns, self._max_timeout), 1, *self._gargs, *self._gcra_tail()]

    def _gcra_tail(self: Any) -> list[Any]:
        """The deadline slot, then ``now_s, now_ns`` on a client clock."""
        now = self._now
        if now is None:
            return [b""]
        return [b"", *divmod(int(now()), _NS_PER_S)]

    def _gcra_reply(self: Any, reply: Any) -> Any:
        return tuple(reply) if type(reply) is list else reply

    def _roundtrip(self: Any, state_key: str, op: bytes, permits: int, timeout_ns: int) -> Any:
        """One script call (a LATE reply, nothing changed, is retried once with a fresh deadline)."""
        conn = self._connection()
        server = self._now is None
        try:
            return self._gcra_reply(
                _call(conn, (state_key,), self._gcra_args(op, permits, timeout_ns), server)
            )
        except _Late:
            pass
        return self._gcra_reply(_call(conn, (state_key,), self._gcra_args(op, permits, timeout_ns), server))

    async def _aroundtrip(self: Any, state_key: str, op: bytes, permits: int, timeout_ns: int) -> Any:
        """Async twin of :meth:`_roundtrip`."""
        conn = self._connection()
        server = self._now is None
        try:
            args = self._gcra_args(op, permits, timeout_ns)
            return self._gcra_reply(await _acall(conn, (state_key,), args, server))
        except _Late:
            pass
        args = self._gcra_args(op, permits, timeout_ns)
        return self._gcra_reply(await _acall(conn, (state_key,), args, server))

    def _reset_call(self: Any, conn: RedisConnection, keys: Sequence[Any], phase: Any = None) -> None:
        """Delete the states (``keys[1:]``; the first is the cycle anchor, unused by GCRA): full again."""
        conn.sync.delete(*keys)

    def _fault_decision(self: Any, state_key: str, permits: int, timeout_ns: int) -> int:
        local = self._local
        if local is None:
            return int(self._fault_wait)
        if isinstance(local, GcraBackend):
            return local.acquire(permits, timeout_ns)
        return int(local._decide(state_key, permits, timeout_ns))

    def _fault_state(self: Any, state_key: str) -> tuple[int, int, int, int]:
        local = self._local
        if local is None:
            return super()._fault_state(state_key)  # type: ignore[misc, no-any-return]
        if isinstance(local, GcraBackend):
            cycle, permissions, wait = local.state()
            _, reset_ns = local.quota()
        else:
            cycle, permissions, wait = local.state(state_key)
            _, reset_ns = local.quota(state_key)
        return cycle, permissions, wait, reset_ns


class RedisGcraBackend(_Gcra, RedisBackend):
    """A :class:`~.redis.RedisBackend` deciding by GCRA (``burst`` defaults to the limit and follows it).

    Key: ``<prefix>:rl:{<name>}:state`` (``"<tat_s> <tat_units> <scale>"``; expires once full again).
    """

    def __init__(
        self,
        name: str,
        limit_for_period: int,
        limit_refresh_period_ns: int,
        clock: Clock,
        *,
        burst: int | None = None,
        **kw: Any,
    ) -> None:
        self._burst_default = burst is None
        self._burst = 0 if burst is None else int(burst)
        self._limit = int(limit_for_period)
        self._period = int(limit_refresh_period_ns)
        self.name = name
        self._gcra_rate()
        super().__init__(name, limit_for_period, limit_refresh_period_ns, clock, **kw)
        self._gcra_rate()  # after RedisBackend's own unit setup
        if self.fault_policy == "local":
            self._local = GcraBackend(name, self._limit, self._period, clock, burst=burst)

    def change_limit(self, limit_for_period: int) -> None:
        """Use the new rate from the next decision on (stored states are rescaled by the script)."""
        super().change_limit(limit_for_period)
        self._gcra_rate()

    def acquire_many(self, backends: Sequence[Any], permits: int) -> tuple[int, int] | None:
        """All-or-nothing with timeout 0 over ``RedisGcraBackend`` instances of one Redis, in one round trip."""
        return gcra_acquire_all(self, [(b, b.state_key) for b in backends], permits)  # type: ignore[no-any-return]

    async def aacquire_many(self, backends: Sequence[Any], permits: int) -> tuple[int, int] | None:
        """Async twin of :meth:`acquire_many` (runs the same one round trip on ``redis.asyncio``)."""
        return await agcra_acquire_all(self, [(b, b.state_key) for b in backends], permits)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"RedisGcraBackend(name={self.name!r}, limit={self._limit}, period_ns={self._period}, burst={self._burst})"


class RedisGcraKeyedRateLimiter(_Gcra, RedisKeyedRateLimiter):
    """A :class:`~.redis.RedisKeyedRateLimiter` deciding by GCRA for every client key (``config.burst``)."""

    def __init__(self, name: str, config: Any = None, **kw: Any) -> None:
        burst = None if config is None else config.burst
        self._burst_default = burst is None
        self._burst = 0 if burst is None else int(burst)
        super().__init__(name, config, **kw)
        self._gcra_rate()

    def __repr__(self) -> str:
        return (
            f"RedisGcraKeyedRateLimiter({self.name!r}, limit_for_period={self._limit}, burst={self._burst})"
        )


def _many_args(
    leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m"
) -> tuple[list[str], list[Any]]:
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits!r}")
    conn = leader._connection()
    for owner, _ in members:
        if not isinstance(owner, _Gcra):
            raise TypeError(
                f"cannot combine {type(owner).__name__} with GCRA Redis limiters in one decision "
                "(all-or-nothing decisions on Redis take limiters of one algorithm)"
            )
        if owner._connection() is not conn:  # type: ignore[attr-defined]
            raise ValueError("all Redis limiters of one decision must use the same Redis (URL and OPTIONS)")
    keys = [key for _, key in members]
    if len(set(keys)) != len(keys):
        raise ValueError("the same rate limiter (and key) appears more than once")
    args: list[Any] = [op, permits, 0, len(members)]
    for owner, _ in members:
        args += owner._gargs
    return keys, args + leader._gcra_tail()


def _many_outcome(members: list[tuple[Any, str]], reply: Any) -> tuple[int, int] | None:
    for owner, _ in members:
        owner._count(0 if reply[0] == 0 else -1)
    return None if reply[0] == 0 else (int(reply[0]) - 1, int(reply[1]))


def _outcome(members: list[tuple[Any, str]], reply: Any, op: bytes) -> Any:
    if op == b"M":
        head, flat = reply
        quotas = [(int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)]
        return _many_outcome(members, head), quotas
    return _many_outcome(members, reply)


def _fault_outcome(leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes) -> Any:
    # The leader's fault policy decides for all ("local": its in-process limiter alone).
    wait = leader._fault_decision(members[0][1], permits, 0)
    outcome = None if wait >= 0 else (0, -wait)
    if op == b"M":
        return outcome, [_quota_of(owner._fault_state(key)) for owner, key in members]
    return outcome


def _quota_of(state4: tuple[int, int, int, int]) -> tuple[int, int]:
    _, permissions, wait, reset_ns = state4
    return permissions, reset_ns if permissions >= 1 else wait


def gcra_acquire_all(leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m") -> Any:
    """All-or-nothing (timeout 0) over ``(gcra limiter, its Redis state key)`` pairs in one script call:
    None when all are granted, else ``(index of the largest wait, that wait)`` with nothing taken; with
    ``op=b"M"`` a pair ``(that, [(remaining, reset_ns), ...])`` read right after the decision.

    A Redis fault answers with the leader's fault policy ("local": its in-process limiter alone decides).
    """
    keys, args = _many_args(leader, members, permits, op)
    conn = leader._connection()
    require_one_slot(conn, keys, "GCRA")
    server = leader._now is None
    if not conn.is_down():
        replies = conn.replies
        try:
            try:
                return _outcome(members, _call(conn, keys, args, server), op)
            except _Late:
                keys, args = _many_args(leader, members, permits, op)
                return _outcome(members, _call(conn, keys, args, server), op)
        except _FAULTS as exc:
            leader._fault(conn, exc, "acquire_many", replies)
    return _fault_outcome(leader, members, permits, op)


async def agcra_acquire_all(
    leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m"
) -> Any:
    """Async twin of :func:`gcra_acquire_all` on ``redis.asyncio``."""
    keys, args = _many_args(leader, members, permits, op)
    conn = leader._connection()
    require_one_slot(conn, keys, "GCRA")
    server = leader._now is None
    if not conn.is_down():
        replies = conn.replies
        try:
            try:
                return _outcome(members, await _acall(conn, keys, args, server), op)
            except _Late:
                keys, args = _many_args(leader, members, permits, op)
                return _outcome(members, await _acall(conn, keys, args, server), op)
        except _FAULTS as exc:
            leader._fault(conn, exc, "acquire_many", replies)
    return _fault_outcome(leader, members, permits, op)


def gcra_members(entries: Sequence[tuple[Any, str | None]]) -> tuple[list[Any], list[tuple[Any, str]]]:
    """``acquire_all_keyed``'s ``(limiter, key|None)`` entries as (owners, ``(gcra limiter, state key)`` pairs)."""
    owners: list[Any] = []
    members: list[tuple[Any, str]] = []
    for limiter, key in entries:
        owners.append(limiter)
        target = getattr(limiter, "backend", limiter)
        if isinstance(target, RedisGcraBackend):
            members.append((target, target.state_key))
        elif isinstance(target, RedisGcraKeyedRateLimiter):
            if key is None:
                raise ValueError(f"keyed rate limiter {target.name!r} needs a key")
            members.append((target, target._state_key(key)))
        else:
            raise TypeError(
                f"cannot combine {type(target).__name__} with GCRA Redis limiters in one decision"
            )
    return owners, members


def gcra_entries(entries: Sequence[tuple[Any, str | None]], permits: int) -> tuple[int, int] | None:
    """:func:`~.redis.acquire_all_keyed` over GCRA entries: one script call, events published as there."""
    owners, members = gcra_members(entries)
    return _entries_outcome(owners, gcra_acquire_all(members[0][0], members, permits), permits)


async def agcra_entries(entries: Sequence[tuple[Any, str | None]], permits: int) -> tuple[int, int] | None:
    """Async twin of :func:`gcra_entries`."""
    owners, members = gcra_members(entries)
    return _entries_outcome(owners, await agcra_acquire_all(members[0][0], members, permits), permits)


def gcra_entries_quotas(entries: Sequence[tuple[Any, str | None]], permits: int) -> Any:
    """:func:`~.redis.acquire_all_quotas` over GCRA entries: one script call decides and reads the figures."""
    owners, members = gcra_members(entries)
    outcome, quotas = gcra_acquire_all(members[0][0], members, permits, b"M")
    return _entries_outcome(owners, outcome, permits), quotas


async def agcra_entries_quotas(entries: Sequence[tuple[Any, str | None]], permits: int) -> Any:
    """Async twin of :func:`gcra_entries_quotas`."""
    owners, members = gcra_members(entries)
    outcome, quotas = await agcra_acquire_all(members[0][0], members, permits, b"M")
    return _entries_outcome(owners, outcome, permits), quotas
