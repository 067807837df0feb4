"""The exact sliding window (``algorithm="sliding_window"``) in Redis: one round trip per decision, no ghost charges.

``lua/sliding_window.lua`` is a script of its own (:data:`SLIDING_SCRIPT`): :func:`~.algorithms.sliding_decide`
over the hand-over times of the last ``limit`` permits, kept per limiter (or client key) in one Redis string
(a ring of fixed-width slots: a decision for ``k`` permits reads two slots and writes ``k``; the header
figures start from a hint kept in the header, usually one read of a few slots). Same guarantee as in memory:
**never more than ``limit`` permits in any window of length ``period``**, for the whole cluster. Memory in
Redis: 8 bytes per logged permit plus a 48-byte header, growing with use up to ``limit`` slots; the key
expires at most a period after every logged permit has left the window.

* :class:`RedisSlidingBackend` -- a :class:`~.redis.RedisBackend` (same keys, fault policies, connection)
  deciding by the sliding log; built by :func:`~.redis.redis_backend`'s factory for a sliding-window config.
* :class:`RedisSlidingKeyedStore` -- the same for :class:`~.redis.RedisKeyedStore` (:class:`RedisSlidingKeyedRateLimiter`
  is a ``KeyedRateLimiter`` on it, built directly).

Time: the same two modes as the other Redis limiters -- Redis server ``TIME`` (every call carries the deadline
of :meth:`~.redis.RedisConnection.deadline`; run after it, the script changes nothing and answers ``LATE``),
or the limiter's own clock (a ``FakeClock``) sent with each call. Times are counted in ns (in whole µs for
periods over ~10.4 days, like the cycle limiters). All-or-nothing decisions combine sliding-window limiters
of one Redis in one script (:meth:`RedisSlidingBackend.acquire_many`, :func:`sliding_acquire_all`); with
limiters of other algorithms, :func:`~.redis.mixed_many` runs :mod:`.redis_mixed`'s composed script, which
gives a granted take back (op ``"g"``, :func:`~.algorithms.sliding_give_back`) in the same run when another
algorithm's limiter rejects (across cluster slots: one call per algorithm and slot, and a give-back round trip).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.clock import Clock
from . import redis_scripted as scripted
from .memory import SlidingWindowBackend
from .redis import RedisBackend, RedisKeyedRateLimiter, RedisKeyedStore, packed_args

__all__ = [
    "SLIDING",
    "SLIDING_SCRIPT",
    "SLIDING_SCRIPT_SHA",
    "RedisSlidingBackend",
    "RedisSlidingKeyedRateLimiter",
    "RedisSlidingKeyedStore",
    "asliding_acquire_all",
    "sliding_acquire_all",
]

#: The sliding-window script (``lua/sliding_window.lua``); its source and SHA1 as constants too.
SLIDING = scripted.Script("sliding_window.lua", "sliding-window")
SLIDING_SCRIPT = SLIDING.text
SLIDING_SCRIPT_SHA = SLIDING.sha

_MAX_TIMEOUT_UNITS = 2**51  # the script's times stay below 2^52 units (see sliding_window.lua)


class _Sliding(scripted.ScriptedLimiter):
    """What turns a Redis cycle limiter into a sliding-window one: its script and per-limiter arguments.
    Mixed in first."""

    _script = SLIDING
    _local_type: Any = SlidingWindowBackend
    _max_timeout_units = _MAX_TIMEOUT_UNITS

    def _sliding_rate(self: Any) -> None:
        """The script's three limiter arguments: limit, period in units, ns per unit (set by ``_use_period``)."""
        self._margs = [self._limit, self._period // self._unit, self._unit]
        self._margs_resp = packed_args(self._margs)


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
        return sliding_acquire_all(self, [(b, getattr(b, "state_key", "")) for b in backends], permits)  # type: ignore[no-any-return]

    async def aacquire_many(self, backends: Sequence[Any], permits: int) -> tuple[int, int] | None:
        """Async twin of :meth:`acquire_many` (runs the same one round trip on ``redis.asyncio``)."""
        return await asliding_acquire_all(self, [(b, getattr(b, "state_key", "")) for b in backends], permits)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"RedisSlidingBackend(name={self.name!r}, limit={self._limit}, period_ns={self._period})"


class RedisSlidingKeyedStore(_Sliding, RedisKeyedStore):
    """A :class:`~.redis.RedisKeyedStore` keeping an exact sliding log per client key."""

    def __init__(self, name: str, config: Any = None, **kw: Any) -> None:
        super().__init__(name, config, **kw)
        self._sliding_rate()

    def __repr__(self) -> str:
        return f"RedisSlidingKeyedStore({self.name!r}, limit_for_period={self._limit})"


class RedisSlidingKeyedRateLimiter(RedisKeyedRateLimiter):
    """A :class:`~django_ratelimit_r4.keyed.KeyedRateLimiter` on a :class:`RedisSlidingKeyedStore` (built directly)."""

    store_type = RedisSlidingKeyedStore


# ------------------------------------------------------------------------------------------ all-or-nothing


def sliding_acquire_all(leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m") -> Any:
    """:func:`~.redis_scripted.acquire_all` over sliding-window limiters (one script call, all-or-nothing)."""
    return scripted.acquire_all(leader, members, permits, op)


async def asliding_acquire_all(leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m") -> Any:
    """Async twin of :func:`sliding_acquire_all`."""
    return await scripted.aacquire_all(leader, members, permits, op)
