"""What the Redis limiters with a script of their own share: GCRA (:mod:`.redis_gcra`) and the sliding window
(:mod:`.redis_sliding`).

Each algorithm is a :class:`Script` (its Lua source and SHA) and a mixin of :class:`ScriptedLimiter` that says
which arguments its script takes per limiter (``_margs``) and which in-process limiter decides under the
"local" fault policy (``_local_type``). Everything else is here once: the script call with its deadline stamp
and ``LATE`` retry, the reset, the fault policy's figures, and the all-or-nothing decision over several limiters
of one algorithm in one script call (sync and async twins, differing only in ``await``). A decision over
limiters of several algorithms is :func:`~.redis.mixed_many`'s: one run of the composed script of
:mod:`.redis_mixed` when their keys share a slot, else (several cluster slots) one call per algorithm and slot,
sent at once, with a give-back (op ``"g"`` of every script) when one rejects.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from importlib import resources
from typing import Any, ClassVar

from ..core.ratelimiter import RateLimiter
from .redis import (
    _FAULTS,
    RedisConnection,
    RedisKeyedStore,
    _entries_outcome,
    _Late,
    amixed_many,
    mixed_many,
    several_slots,
)

__all__ = ["Script", "ScriptedLimiter", "aacquire_all", "acquire_all", "aentries", "aentries_quotas", "entries",
           "entries_quotas", "members_of"]

_NS_PER_S = 1_000_000_000


class Script:
    """One algorithm's Lua script (``lua/<filename>``), its SHA1 for EVALSHA, and its name in messages."""

    __slots__ = ("filename", "label", "sha", "text")

    def __init__(self, filename: str, label: str) -> None:
        self.filename = filename
        self.text = (resources.files(__package__) / "lua" / filename).read_text(encoding="utf-8")
        self.sha = hashlib.sha1(self.text.encode("utf-8")).hexdigest()
        self.label = label


def _reply_of(conn: RedisConnection, reply: Any, started_ns: int, learn: bool) -> Any:
    if type(reply) is bytes:
        raise _Late(conn.was_late(started_ns))
    if learn:
        reply, (now_us,) = reply
        conn.learn_time(now_us, started_ns, time.monotonic_ns())
    return reply


def _deadline_at(keys: Sequence[str], args: list[Any], server_time: bool) -> int | None:
    return len(keys) + len(args) - 1 if server_time else None  # the deadline slot ends the arguments


def call(script: Script, conn: RedisConnection, keys: Sequence[str], args: list[Any], server_time: bool) -> Any:
    """One run of ``script`` through :meth:`RedisConnection.run_script` (server time: the deadline in
    ``args[-1]``, taken once a pooled connection is held); a ``LATE`` reply raises ``_Late``."""
    reply, started, learn = conn.run_script(
        script.sha, script.text, len(keys), [*keys, *args], _deadline_at(keys, args, server_time)
    )
    return _reply_of(conn, reply, started, learn)


async def acall(
    script: Script, conn: RedisConnection, keys: Sequence[str], args: list[Any], server_time: bool
) -> Any:
    """Async twin of :func:`call` on this loop's ``redis.asyncio`` client."""
    reply, started, learn = await conn.arun_script(
        script.sha, script.text, len(keys), [*keys, *args], _deadline_at(keys, args, server_time)
    )
    return _reply_of(conn, reply, started, learn)


def _as_tuple(reply: Any) -> Any:
    return tuple(reply) if type(reply) is list else reply


class ScriptedLimiter:
    """Mixed in first over a Redis cycle limiter (:class:`~.redis.RedisBackend`) or keyed store
    (:class:`~.redis.RedisKeyedStore`): decisions go to the algorithm's own script; counters, fault policies
    and keys stay the cycle one's (waiting is the limiter's)."""

    _script: ClassVar[Script]
    #: The in-process limiter of the same algorithm that the "local" fault policy builds (unkeyed); the cycle
    #: limiter's fault decisions and states ask it.
    _local_type: Any
    #: The script's per-limiter arguments (an all-or-nothing decision concatenates them), and the same packed
    #: once in RESP (``redis.packed_args``: a decision copies them instead of formatting each).
    _margs: list[Any]
    _margs_resp: bytes
    #: The longest wait the script can express exactly, in its units.
    _max_timeout_units: int

    def _script_args(self: Any, op: bytes, permits: int, timeout_ns: int) -> list[Any]:
        timeout = min(timeout_ns // self._unit, self._max_timeout_units)
        return [op, permits, timeout, 1, self._margs_resp, *self._tail()]

    def _tail(self: Any) -> list[Any]:
        """The deadline slot, then ``now_s, now_ns`` on a client clock."""
        now = self._now
        if now is None:
            return [b""]
        return [b"", *divmod(int(now()), _NS_PER_S)]

    def _roundtrip(self: Any, state_key: str, op: bytes, permits: int, timeout_ns: int) -> Any:
        """One script call (a LATE reply, nothing changed, is retried once with a fresh deadline)."""
        conn, server, script = self._connection(), self._now is None, self._script
        try:
            return _as_tuple(call(script, conn, (state_key,), self._script_args(op, permits, timeout_ns), server))
        except _Late:
            pass
        return _as_tuple(call(script, conn, (state_key,), self._script_args(op, permits, timeout_ns), server))

    async def _aroundtrip(self: Any, state_key: str, op: bytes, permits: int, timeout_ns: int) -> Any:
        """Async twin of :meth:`_roundtrip`."""
        conn, server, script = self._connection(), self._now is None, self._script
        try:
            args = self._script_args(op, permits, timeout_ns)
            return _as_tuple(await acall(script, conn, (state_key,), args, server))
        except _Late:
            pass
        args = self._script_args(op, permits, timeout_ns)
        return _as_tuple(await acall(script, conn, (state_key,), args, server))

    def _state_call(self: Any, state_key: str) -> tuple[tuple[str, str], Any]:
        """The state read ("s") as one call of ``RedisConnection.run_scripts`` (see ``redis.read_quotas``)."""
        script = self._script
        args = [state_key, *self._script_args(b"s", 1, 0)]
        return (script.sha, script.text), (1, args, _deadline_at((), args, self._now is None), ())

    def _state_of(self: Any, conn: RedisConnection, state_key: str, outcome: tuple[Any, int, bool]) -> Any:
        """The state of a :meth:`_state_call`'s outcome; raises its fault (``_Late``: LATE)."""
        reply, started, learn = outcome
        if isinstance(reply, BaseException):
            raise reply
        return self._state_reply(_as_tuple(_reply_of(conn, reply, started, learn)))

    def _reset_call(self: Any, conn: RedisConnection, keys: Sequence[Any], phase: Any = None) -> None:
        """Delete the states (``keys[1:]``; the first is the cycle anchor, unused here): full again."""
        conn.sync.delete(*keys)


# ------------------------------------------------------------------------------------------ all-or-nothing


def _many_args(
    leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m"
) -> tuple[list[str], list[Any]]:
    if permits < 1:
        raise ValueError(f"permits must be >= 1, got {permits!r}")
    conn, script = leader._connection(), leader._script
    for owner, _ in members:
        if getattr(owner, "_script", None) is not script:
            raise TypeError(
                f"cannot combine {type(owner).__name__} with {script.label} Redis limiters in one decision "
                "(all-or-nothing decisions on Redis take limiters of one algorithm)"
            )
        if owner._connection() is not conn:
            raise ValueError("all Redis limiters of one decision must use the same Redis (URL and OPTIONS)")
    keys = [key for _, key in members]
    if len(set(keys)) != len(keys):
        raise ValueError("the same rate limiter (and key) appears more than once")
    args: list[Any] = [op, permits, 0, len(members)]
    for owner, _ in members:
        args.append(owner._margs_resp)
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


def _split(leader: Any, members: list[tuple[Any, str]]) -> bool:
    """True when one call of ``leader``'s script cannot decide ``members``: another algorithm (or not a Redis
    limiter) among them, or keys in several cluster slots."""
    script = leader._script
    for owner, _ in members:
        if getattr(owner, "_script", None) is not script:
            return True
    conn = leader._connection()
    return bool(conn.cluster) and several_slots(conn, [key for _, key in members])


def acquire_all(leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m") -> Any:
    """All-or-nothing (timeout 0) over ``(limiter, its Redis state key)`` pairs of ``leader``'s algorithm in one
    script call: None when all are granted, else ``(index of the largest wait, that wait)`` with nothing taken;
    with ``op=b"M"`` a pair ``(that, [(remaining, reset_ns), ...])`` read right after the decision.

    A Redis fault (or a connection cooling down after one) answers with the leader's fault policy ("local": its
    in-process limiter alone decides), counted as a fault decision. Limiters of other algorithms among
    ``members``, or keys in several cluster slots: :func:`~.redis.mixed_many` decides (one run of the mixed
    script in one slot; across slots one call per algorithm and slot, sent at once, a give-back when one
    rejects).
    """
    if _split(leader, members):
        return mixed_many(leader, members, permits, op)
    keys, args = _many_args(leader, members, permits, op)
    conn = leader._connection()
    server = leader._now is None
    if not conn.is_down():
        replies = conn.replies
        try:
            try:
                return _outcome(members, call(leader._script, conn, keys, args, server), op)
            except _Late:
                keys, args = _many_args(leader, members, permits, op)
                return _outcome(members, call(leader._script, conn, keys, args, server), op)
        except _FAULTS as exc:
            leader._fault(conn, exc, "acquire_many", replies)
    else:
        leader._fault(conn, None, "acquire_many")
    return _fault_outcome(leader, members, permits, op)


async def aacquire_all(leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m") -> Any:
    """Async twin of :func:`acquire_all` on ``redis.asyncio``."""
    if _split(leader, members):
        return await amixed_many(leader, members, permits, op)
    keys, args = _many_args(leader, members, permits, op)
    conn = leader._connection()
    server = leader._now is None
    if not conn.is_down():
        replies = conn.replies
        try:
            try:
                return _outcome(members, await acall(leader._script, conn, keys, args, server), op)
            except _Late:
                keys, args = _many_args(leader, members, permits, op)
                return _outcome(members, await acall(leader._script, conn, keys, args, server), op)
        except _FAULTS as exc:
            leader._fault(conn, exc, "acquire_many", replies)
    else:
        leader._fault(conn, None, "acquire_many")
    return _fault_outcome(leader, members, permits, op)


def members_of(entries: Sequence[tuple[Any, str | None]]) -> tuple[list[Any], list[tuple[Any, str]]]:
    """``acquire_all_keyed``'s ``(limiter, key|None)`` entries as (owners, ``(limiter, state key)`` pairs), every
    limiter (unkeyed, or keyed with its key) of the first one's algorithm (its :class:`Script`)."""
    owners: list[Any] = []
    members: list[tuple[Any, str]] = []
    script = None
    for limiter, key in entries:
        owners.append(limiter)
        target: Any = limiter.backend if isinstance(limiter, RateLimiter) else limiter.store
        if script is None:
            script = target._script
        if getattr(target, "_script", None) is not script:
            raise TypeError(
                f"cannot combine {type(target).__name__} with {script.label} Redis limiters in one decision"
            )
        if isinstance(target, RedisKeyedStore):
            if key is None:
                raise ValueError(f"keyed rate limiter {target.name!r} needs a key")
            members.append((target, target._state_key(key)))
        else:
            members.append((target, target.state_key))
    return owners, members


def entries(members: tuple[list[Any], list[tuple[Any, str]]], permits: int) -> tuple[int, int] | None:
    """:func:`~.redis.acquire_all_keyed` over :func:`members_of`'s result: one script call, events as there."""
    owners, pairs = members
    return _entries_outcome(owners, acquire_all(pairs[0][0], pairs, permits), permits)


async def aentries(members: tuple[list[Any], list[tuple[Any, str]]], permits: int) -> tuple[int, int] | None:
    """Async twin of :func:`entries`."""
    owners, pairs = members
    return _entries_outcome(owners, await aacquire_all(pairs[0][0], pairs, permits), permits)


def entries_quotas(members: tuple[list[Any], list[tuple[Any, str]]], permits: int) -> Any:
    """:func:`~.redis.acquire_all_quotas` over :func:`members_of`'s result: one call decides and reads figures."""
    owners, pairs = members
    outcome, quotas = acquire_all(pairs[0][0], pairs, permits, b"M")
    return _entries_outcome(owners, outcome, permits), quotas


async def aentries_quotas(members: tuple[list[Any], list[tuple[Any, str]]], permits: int) -> Any:
    """Async twin of :func:`entries_quotas`."""
    owners, pairs = members
    outcome, quotas = await aacquire_all(pairs[0][0], pairs, permits, b"M")
    return _entries_outcome(owners, outcome, permits), quotas
