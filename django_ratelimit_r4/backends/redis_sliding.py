"""The exact sliding window (``algorithm="sliding_window"``) in Redis: one round trip per decision, no ghost charges.

``lua/sliding_window.lua`` is a script of its own (:data:`SLIDING_SCRIPT`): :func:`~.algorithms.sliding_decide`
over the hand-over times of the last ``limit`` permits, kept per limiter (or client key) in one Redis string
(a ring of fixed-width slots: a decision for ``k`` permits reads two slots and writes ``k``; the header
figures use a binary search). Same guarantee as in memory: **never more than ``limit`` permits in any window
of length ``period``**, for the whole cluster. Memory in Redis: 16 bytes per logged permit plus a 56-byte
header, growing with use up to ``limit`` slots; the key expires at most a period after every logged permit
has left the window.

* :class:`RedisSlidingBackend` -- a :class:`~.redis.RedisBackend` (same keys, fault policies, connection)
  deciding by the sliding log; built by :func:`~.redis.redis_backend`'s factory for a sliding-window config.
* :class:`RedisSlidingKeyedRateLimiter` -- the same for :class:`~.redis.RedisKeyedRateLimiter`.

Time: the same two modes as the other Redis limiters -- Redis server ``TIME`` (every call carries the deadline
of :meth:`~.redis.RedisConnection.deadline`; run after it, the script changes nothing and answers ``LATE``),
or the limiter's own clock (a ``FakeClock``) sent with each call. Times are counted in ns (in whole µs for
periods over ~10.4 days, like the cycle limiters). All-or-nothing decisions combine sliding-window limiters
of one Redis in one script (:meth:`RedisSlidingBackend.acquire_many`, :func:`sliding_acquire_all`); mixing
them with cycle or GCRA Redis limiters raises ``TypeError``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from importlib import resources
from typing import Any

from ..core.clock import Clock
from .memory import SlidingWindowBackend
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
    "SLIDING_SCRIPT",
    "SLIDING_SCRIPT_SHA",
    "RedisSlidingBackend",
    "RedisSlidingKeyedRateLimiter",
    "asliding_acquire_all",
    "asliding_entries",
    "asliding_entries_quotas",
    "sliding_acquire_all",
    "sliding_entries",
    "sliding_entries_quotas",
    "sliding_members",
]

#: The Lua source of the sliding-window script, and its SHA1 for EVALSHA.
SLIDING_SCRIPT = (resources.files(__package__) / "lua" / "sliding_window.lua").read_text(encoding="utf-8")
SLIDING_SCRIPT_SHA = hashlib.sha1(SLIDING_SCRIPT.encode("utf-8")).hexdigest()

_MAX_TIMEOUT_UNITS = 2**51  # the script's times stay below 2^52 units (see sliding_window.lua)
_NS_PER_S = 1_000_000_000


def _reply_of(conn: RedisConnection, reply: Any, started_ns: int, learn: bool) -> Any:
    if type(reply) is bytes:
        raise _Late(conn.was_late(started_ns))
    if learn:
        reply, (now_us,) = reply
        conn.learn_time(now_us, started_ns, time.monotonic_ns())
    return reply


def _call(conn: RedisConnection, keys: Sequence[str], args: list[Any], server_time: bool) -> Any:
    """One run of the script through :meth:`RedisConnection.run_script` (server time: the deadline in
    ``args[-1]``, taken once a pooled connection is held)."""
    reply, started, learn = conn.run_script(
        SLIDING_SCRIPT_SHA,
        SLIDING_SCRIPT,
        len(keys),
        [*keys, *args],
        len(keys) + len(args) - 1 if server_time else None,
    )
    return _reply_of(conn, reply, started, learn)


async def _acall(conn: RedisConnection, keys: Sequence[str], args: list[Any], server_time: bool) -> Any:
    """Async twin of :func:`_call` on this loop's ``redis.asyncio`` client."""
    reply, started, learn = await conn.arun_script(
        SLIDING_SCRIPT_SHA,
        SLIDING_SCRIPT,
        len(keys),
        [*keys, *args],
        len(keys) + len(args) - 1 if server_time else None,
    )
    return _reply_of(conn, reply, started, learn)


class _Sliding:
    """What turns a Redis cycle limiter into a sliding-window one: the script calls (the rest -- counters, fault
    policies, keys, waiting -- is the cycle limiter's). Mixed in first."""

    _sliding = True
    _sargs: list[Any]

    def _sliding_rate(self: Any) -> None:
        """The script's three limiter arguments: limit, period in units, ns per unit (set by ``_use_period``)."""
        self._sargs = [self._limit, self._period // self._unit, self._unit]

    def _sliding_args(self: Any, op: bytes, permits: int, timeout_ns: int) -> list[Any]:
        return [op, permits, min(timeout_ns // self._unit, _MAX_TIMEOUT_UNITS), 1, *self._sargs, *self._tail()]

    def _tail(self: Any) -> list[Any]:
        """The deadline slot, then ``now_s, now_ns`` on a client clock."""
        now = self._now
        if now is None:
            return [b""]
        return [b"", *divmod(int(now()), _NS_PER_S)]

    @staticmethod
    def _sliding_reply(reply: Any) -> Any:
        return tuple(reply) if type(reply) is list else reply

    def _roundtrip(self: Any, state_key: str, op: bytes, permits: int, timeout_ns: int) -> Any:
        """One script call (a LATE reply, nothing changed, is retried once with a fresh deadline)."""
        conn = self._connection()
        server = self._now is None
        try:
            return self._sliding_reply(
                _call(conn, (state_key,), self._sliding_args(op, permits, timeout_ns), server)
            )
        except _Late:
            pass
        return self._sliding_reply(_call(conn, (state_key,), self._sliding_args(op, permits, timeout_ns), server))

    async def _aroundtrip(self: Any, state_key: str, op: bytes, permits: int, timeout_ns: int) -> Any:
        """Async twin of :meth:`_roundtrip`."""
        conn = self._connection()
        server = self._now is None
        try:
            args = self._sliding_args(op, permits, timeout_ns)
            return self._sliding_reply(await _acall(conn, (state_key,), args, server))
        except _Late:
            pass
        args = self._sliding_args(op, permits, timeout_ns)
        return self._sliding_reply(await _acall(conn, (state_key,), args, server))

    def _reset_call(self: Any, conn: RedisConnection, keys: Sequence[Any], phase: Any = None) -> None:
        """Delete the logs (``keys[1:]``; the first is the cycle anchor, unused here): empty again."""
        conn.sync.delete(*keys)

    def _fault_decision(self: Any, state_key: str, permits: int, timeout_ns: int) -> int:
        local = self._local
        if local is None:
            return int(self._fault_wait)
        if isinstance(local, SlidingWindowBackend):
            return local.acquire(permits, timeout_ns)
        return int(local._decide(state_key, permits, timeout_ns))

    def _fault_state(self: Any, state_key: str) -> tuple[int, int, int, int]:
        local = self._local
        if local is None:
            return super()._fault_state(state_key)  # type: ignore[misc, no-any-return]
        if isinstance(local, SlidingWindowBackend):
            cycle, permissions, wait = local.state()
            _, reset_ns = local.quota()
        else:
            cycle, permissions, wait = local.state(state_key)
            _, reset_ns = local.quota(state_key)
        return cycle, permissions, wait, reset_ns


class RedisSlidingBackend(_Sliding, RedisBackend):
    """A :class:`~.redis.RedisBackend` deciding by the exact sliding log (``algorithm="sliding_window"``).

    Key: ``<prefix>:rl:{<name>}:state`` (the log; expires at most a period after every logged permit left the window).
    """

    def __init__(
        self, name: str, limit_for_period: int, limit_refresh_period_ns: int, clock: Clock, **kw: Any
    ) -> None:
        self._limit = int(limit_for_period)
        self._unit = 1
        self._period = int(limit_refresh_period_ns)
        self._sliding_rate()
        super().__init__(name, limit_for_period, limit_refresh_period_ns, clock, **kw)
        self._sliding_rate()  # after RedisBackend's own unit setup
        if self.fault_policy == "local":
            self._local = SlidingWindowBackend(name, self._limit, self._period, clock)

    def change_limit(self, limit_for_period: int) -> None:
        """Use the new limit from the next decision on (the script keeps the newest logged times)."""
        super().change_limit(limit_for_period)
        self._sliding_rate()

    def acquire_many(self, backends: Sequence[Any], permits: int) -> tuple[int, int] | None:
        """All-or-nothing with timeout 0 over ``RedisSlidingBackend`` instances of one Redis, in one round trip."""
        return sliding_acquire_all(self, [(b, b.state_key) for b in backends], permits)  # type: ignore[no-any-return]

    async def aacquire_many(self, backends: Sequence[Any], permits: int) -> tuple[int, int] | None:
        """Async twin of :meth:`acquire_many` (runs the same one round trip on ``redis.asyncio``)."""
        return await asliding_acquire_all(self, [(b, b.state_key) for b in backends], permits)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"RedisSlidingBackend(name={self.name!r}, limit={self._limit}, period_ns={self._period})"


class RedisSlidingKeyedRateLimiter(_Sliding, RedisKeyedRateLimiter):
    """A :class:`~.redis.RedisKeyedRateLimiter` keeping an exact sliding log per client key."""

    def __init__(self, name: str, config: Any = None, **kw: Any) -> None:
        super().__init__(name, config, **kw)
        self._sliding_rate()

    def __repr__(self) -> str:
        return f"RedisSlidingKeyedRateLimiter({self.name!r}, limit_for_period={self._limit})"


# ------------------------------------------------------------------------------------------ all-or-nothing


def _many_args(
    leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m"
) -> tuple[list[str], list[Any]]:
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits!r}")
    conn = leader._connection()
    for owner, _ in members:
        if not isinstance(owner, _Sliding):
            raise TypeError(
                f"cannot combine {type(owner).__name__} with sliding-window Redis limiters in one decision "
                "(all-or-nothing decisions on Redis take limiters of one algorithm)"
            )
        if owner._connection() is not conn:  # type: ignore[attr-defined]
            raise ValueError("all Redis limiters of one decision must use the same Redis (URL and OPTIONS)")
    keys = [key for _, key in members]
    if len(set(keys)) != len(keys):
        raise ValueError("the same rate limiter (and key) appears more than once")
    args: list[Any] = [op, permits, 0, len(members)]
    for owner, _ in members:
        args += owner._sargs
    return keys, args + leader._tail()


def _many_outcome(members: list[tuple[Any, str]], reply: Any) -> tuple[int, int] | None:
    for owner, _ in members:
        owner._count(0 if reply[0] == 0 else -1)
    if reply[0] == 0:
        return None
    index = int(reply[0]) - 1
    return index, int(reply[1]) * members[index][0]._unit


def _outcome(members: list[tuple[Any, str]], reply: Any, op: bytes) -> Any:
    if op == b"M":
        head, flat = reply
        quotas = [
            (int(flat[2 * i]), int(flat[2 * i + 1]) * owner._unit) for i, (owner, _) in enumerate(members)
        ]
        return _many_outcome(members, head), quotas
    return _many_outcome(members, reply)


def _quota_of(state4: tuple[int, int, int, int]) -> tuple[int, int]:
    _, permissions, wait, reset_ns = state4
    return permissions, reset_ns if permissions >= 1 else wait


def _fault_outcome(leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes) -> Any:
    # The leader's fault policy decides for all ("local": its in-process limiter alone).
    wait = leader._fault_decision(members[0][1], permits, 0)
    outcome = None if wait >= 0 else (0, -wait)
    if op == b"M":
        return outcome, [_quota_of(owner._fault_state(key)) for owner, key in members]
    return outcome


def sliding_acquire_all(leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m") -> Any:
    """All-or-nothing (timeout 0) over ``(sliding-window limiter, its Redis state key)`` pairs in one script
    call: None when all are granted, else ``(index of the largest wait, that wait)`` with nothing taken; with
    ``op=b"M"`` a pair ``(that, [(remaining, reset_ns), ...])`` read right after the decision.

    A Redis fault answers with the leader's fault policy ("local": its in-process limiter alone decides).
    """
    keys, args = _many_args(leader, members, permits, op)
    conn = leader._connection()
    require_one_slot(conn, keys, "sliding_window")
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
    else:
        leader._fault(conn, None, "acquire_many")
    return _fault_outcome(leader, members, permits, op)


async def asliding_acquire_all(
    leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m"
) -> Any:
    """Async twin of :func:`sliding_acquire_all` on ``redis.asyncio``."""
    keys, args = _many_args(leader, members, permits, op)
    conn = leader._connection()
    require_one_slot(conn, keys, "sliding_window")
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
    else:
        leader._fault(conn, None, "acquire_many")
    return _fault_outcome(leader, members, permits, op)


def sliding_members(entries: Sequence[tuple[Any, str | None]]) -> tuple[list[Any], list[tuple[Any, str]]]:
    """``acquire_all_keyed``'s ``(limiter, key|None)`` entries as (owners, ``(limiter, state key)`` pairs)."""
    owners: list[Any] = []
    members: list[tuple[Any, str]] = []
    for limiter, key in entries:
        owners.append(limiter)
        target = getattr(limiter, "backend", limiter)
        if isinstance(target, RedisSlidingBackend):
            members.append((target, target.state_key))
        elif isinstance(target, RedisSlidingKeyedRateLimiter):
            if key is None:
                raise ValueError(f"keyed rate limiter {target.name!r} needs a key")
            members.append((target, target._state_key(key)))
        else:
            raise TypeError(
                f"cannot combine {type(target).__name__} with sliding-window Redis limiters in one decision"
            )
    return owners, members


def sliding_entries(entries: Sequence[tuple[Any, str | None]], permits: int) -> tuple[int, int] | None:
    """:func:`~.redis.acquire_all_keyed` over sliding-window entries: one script call, events published as there."""
    owners, members = sliding_members(entries)
    return _entries_outcome(owners, sliding_acquire_all(members[0][0], members, permits), permits)


async def asliding_entries(entries: Sequence[tuple[Any, str | None]], permits: int) -> tuple[int, int] | None:
    """Async twin of :func:`sliding_entries`."""
    owners, members = sliding_members(entries)
    return _entries_outcome(owners, await asliding_acquire_all(members[0][0], members, permits), permits)


def sliding_entries_quotas(entries: Sequence[tuple[Any, str | None]], permits: int) -> Any:
    """:func:`~.redis.acquire_all_quotas` over sliding-window entries: one script call decides and reads the
    figures."""
    owners, members = sliding_members(entries)
    outcome, quotas = sliding_acquire_all(members[0][0], members, permits, b"M")
    return _entries_outcome(owners, outcome, permits), quotas


async def asliding_entries_quotas(entries: Sequence[tuple[Any, str | None]], permits: int) -> Any:
    """Async twin of :func:`sliding_entries_quotas`."""
    owners, members = sliding_members(entries)
    outcome, quotas = await asliding_acquire_all(members[0][0], members, permits, b"M")
    return _entries_outcome(owners, outcome, permits), quotas
