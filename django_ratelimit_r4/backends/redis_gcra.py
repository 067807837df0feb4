"""GCRA (``algorithm="gcra"``) in Redis: one round trip per decision, exact, no ghost charges.

The cycle limiters' script is not touched: ``lua/gcra.lua`` is a script of its own (:data:`GCRA_SCRIPT`),
:func:`~.algorithms.gcra_decide` over a theoretical arrival time stored per limiter (or client key) as whole
seconds plus units of ``1/scale`` ns (µs for a period over ~10.4 days), so every value it forms is an exact
integer below 2^53.

* :class:`RedisGcraBackend` -- a :class:`~.redis.RedisBackend` (same keys, fault policies, connection) whose
  decisions are GCRA; built by :func:`~.redis.redis_backend`'s factory for a GCRA config.
* :class:`RedisGcraKeyedStore` -- the same for :class:`~.redis.RedisKeyedStore` (one budget per client key,
  cluster-wide; :class:`RedisGcraKeyedRateLimiter` is a ``KeyedRateLimiter`` on it, built directly).

Time: the same two modes as the cycle limiters -- Redis server ``TIME`` (every call carries the deadline of
:meth:`~.redis.RedisConnection.deadline`; run after it, the script changes nothing and answers ``LATE``), or
the limiter's own clock (a ``FakeClock``) sent with each call. All-or-nothing decisions combine GCRA limiters
of one Redis in one script (:meth:`RedisGcraBackend.acquire_many`, :func:`gcra_acquire_all`); with limiters of
other algorithms, :func:`~.redis.mixed_many` runs :mod:`.redis_mixed`'s composed script, which gives a granted
take back (op ``"g"``, :func:`~.algorithms.gcra_give_back`) in the same run when another algorithm's limiter
rejects (across cluster slots: one call per algorithm and slot, and a give-back round trip).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.clock import Clock
from . import redis_scripted as scripted
from .base import redis_gcra_error, redis_gcra_rate
from .memory import GcraBackend
from .redis import RedisBackend, RedisKeyedRateLimiter, RedisKeyedStore, packed_args

__all__ = [
    "GCRA",
    "GCRA_SCRIPT",
    "GCRA_SCRIPT_SHA",
    "RedisGcraBackend",
    "RedisGcraKeyedRateLimiter",
    "RedisGcraKeyedStore",
    "agcra_acquire_all",
    "gcra_acquire_all",
]

#: The GCRA script (``lua/gcra.lua``); its source and SHA1 as constants too.
GCRA = scripted.Script("gcra.lua", "GCRA")
GCRA_SCRIPT = GCRA.text
GCRA_SCRIPT_SHA = GCRA.sha


class _Gcra(scripted.ScriptedLimiter):
    """What turns a Redis cycle limiter into a GCRA one: its script and per-limiter arguments. Mixed in first."""

    _script = GCRA
    _local_type: Any = GcraBackend
    _burst: int
    _burst_default: bool

    def _gcra_rate(self: Any) -> None:
        """Scale, step and span as :class:`~.memory.GcraBackend` (:func:`~.base.redis_gcra_rate`: in µs for a
        period over ~10.4 days); refuse a rate the script cannot keep exact."""
        if self._burst_default:
            self._burst = self._limit
        step, span, scale, self._max_timeout_units = self._fit(self._limit)
        self._unit = 1  # the script answers in ns
        self._margs = [step, span, scale, self._period]
        self._margs_resp = packed_args(self._margs)

    def _fit(self: Any, limit: int) -> tuple[int, int, int, int]:
        """:func:`~.base.redis_gcra_rate` at ``limit`` (the burst following it when not configured), or raise."""
        burst = limit if self._burst_default else self._burst
        rate = redis_gcra_rate(limit, self._period, burst)
        if rate is None:  # (the settings' rule, E004)
            error = redis_gcra_error(limit, self._period, burst)
            raise ValueError(f"rate limiter {self.name!r}: {error} (use a rounder period or a smaller burst)")
        return rate


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
        """Use the new rate from the next decision on (stored states are rescaled by the script); one the script
        cannot keep exact raises ``ValueError`` and changes nothing."""
        self._fit(int(limit_for_period))
        super().change_limit(limit_for_period)
        self._gcra_rate()

    def acquire_many(self, backends: Sequence[Any], permits: int) -> tuple[int, int] | None:
        """All-or-nothing with timeout 0 over ``RedisGcraBackend`` instances of one Redis, in one round trip."""
        return gcra_acquire_all(self, [(b, getattr(b, "state_key", "")) for b in backends], permits)  # type: ignore[no-any-return]

    async def aacquire_many(self, backends: Sequence[Any], permits: int) -> tuple[int, int] | None:
        """Async twin of :meth:`acquire_many` (runs the same one round trip on ``redis.asyncio``)."""
        return await agcra_acquire_all(self, [(b, getattr(b, "state_key", "")) for b in backends], permits)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"RedisGcraBackend(name={self.name!r}, limit={self._limit}, period_ns={self._period}, burst={self._burst})"


class RedisGcraKeyedStore(_Gcra, RedisKeyedStore):
    """A :class:`~.redis.RedisKeyedStore` deciding by GCRA for every client key (``config.burst``)."""

    def __init__(self, name: str, config: Any = None, **kw: Any) -> None:
        burst = None if config is None else config.burst
        self._burst_default = burst is None
        self._burst = 0 if burst is None else int(burst)
        super().__init__(name, config, **kw)
        self._gcra_rate()

    def __repr__(self) -> str:
        return f"RedisGcraKeyedStore({self.name!r}, limit_for_period={self._limit}, burst={self._burst})"


class RedisGcraKeyedRateLimiter(RedisKeyedRateLimiter):
    """A :class:`~django_ratelimit_r4.keyed.KeyedRateLimiter` on a :class:`RedisGcraKeyedStore` (built directly)."""

    store_type = RedisGcraKeyedStore


def gcra_acquire_all(leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m") -> Any:
    """:func:`~.redis_scripted.acquire_all` over GCRA limiters (one script call, all-or-nothing)."""
    return scripted.acquire_all(leader, members, permits, op)


async def agcra_acquire_all(leader: Any, members: list[tuple[Any, str]], permits: int, op: bytes = b"m") -> Any:
    """Async twin of :func:`gcra_acquire_all`."""
    return await scripted.aacquire_all(leader, members, permits, op)
