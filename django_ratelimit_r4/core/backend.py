"""What a rate limiter needs from the place its state lives: the backend protocols, the algorithm names, and
the in-process backends, injected.

``core/`` imports nothing outside ``core/`` (``tests/core/test_layering.py``). The in-process backends are
implemented in :mod:`django_ratelimit_r4.backends.memory`, which registers them here when it is imported (the
package imports it), so ``RateLimiter(name)`` without a ``backend`` keeps its in-memory default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from .clock import Clock

__all__ = [
    "ALGORITHMS",
    "CYCLE",
    "GCRA",
    "MAX_SLIDING_WINDOW_LIMIT",
    "SLIDING_WINDOW",
    "AllOrNothingPlace",
    "BackendFactory",
    "HealthReporting",
    "KeyedBackend",
    "LeaseReporting",
    "RateLimiterBackend",
    "RemoteRateLimiterBackend",
    "as_remote",
    "memory_backends",
    "register_memory_backends",
]

CYCLE = "cycle"
GCRA = "gcra"
SLIDING_WINDOW = "sliding_window"
#: Valid values of ``RateLimiterConfig.algorithm``; the first is the default.
ALGORITHMS: tuple[str, ...] = (CYCLE, GCRA, SLIDING_WINDOW)
#: Largest ``limit_for_period`` of a sliding window: its log holds that many 8-byte times (800 KB).
MAX_SLIDING_WINDOW_LIMIT = 100_000


@runtime_checkable
class RateLimiterBackend(Protocol):
    """Where one limiter's state lives; every method is atomic with respect to the others.

    ``acquire`` returns a single int so the hot path allocates nothing: ``>= 0`` means granted with the
    permits reserved (the value is how long the caller must wait before using them, usually 0); ``< 0`` means
    rejected with nothing reserved, and ``-value`` is the wait that was needed (always > 0).

    Every method is sync: an in-process backend decides in a few integer operations under a lock, which the
    event loop can afford. A backend doing I/O implements :class:`RemoteRateLimiterBackend` as well.
    """

    #: Decisions granted / rejected through :meth:`acquire` and :meth:`acquire_many` since the last reset.
    successful_calls: int
    failed_calls: int

    def acquire(self, permits: int, timeout_ns: int) -> int:
        """Decide and, when the wait fits in ``timeout_ns``, reserve ``permits``. See the class doc."""
        ...

    def state(self) -> tuple[int, int, int]:
        """``(cycle, available_permissions, nanos_to_wait for one permit)`` now, without changing anything."""
        ...

    def quota(self) -> tuple[int, int]:
        """``(remaining, reset_ns)`` for the RateLimit header fields, without changing anything.

        ``reset_ns`` is the time to the next cycle boundary while permits remain, else the wait for one
        permit; ``remaining`` may be negative (reservation debt).
        """
        ...

    def drain(self) -> int:
        """Set the refreshed current permissions to 0 (any debt stays) and return how many were removed."""
        ...

    def change_limit(self, limit_for_period: int) -> None:
        """Use ``limit_for_period`` from now on; the stored cycle and permissions are kept (Resilience4j)."""
        ...

    def reset(self, clock: Clock) -> None:
        """Forget all state and counters; cycles are counted again from ``clock``'s current time, full."""
        ...

    def acquire_many(self, backends: Sequence[RateLimiterBackend], permits: int) -> tuple[int, int] | None:
        """All-or-nothing over ``backends`` (all of this backend's type, ``self`` among them), timeout 0.

        Returns None when every backend granted and reserved ``permits``; otherwise nothing is reserved
        anywhere and the result is ``(index of the rejecting backend with the largest wait, that wait)``.
        """
        ...


@runtime_checkable
class RemoteRateLimiterBackend(RateLimiterBackend, Protocol):
    """A backend whose state lives in another process (Redis): each decision is a round trip.

    So it has async twins of the decisions (the async paths of ``RateLimiter``, ``aacquire_all`` and the gate
    await them instead of blocking the event loop), and decides and reads the quota in one round trip
    (``acquire_quota``). A limiter asks once, when it is built (:func:`as_remote`), never per call.
    """

    async def aacquire(self, permits: int, timeout_ns: int) -> int:
        """:meth:`acquire` without blocking the event loop (same result)."""
        ...

    async def aquota(self) -> tuple[int, int]:
        """:meth:`quota` without blocking the event loop (same result)."""
        ...

    async def aacquire_many(self, backends: Sequence[RateLimiterBackend], permits: int) -> tuple[int, int] | None:
        """:meth:`acquire_many` without blocking the event loop (same result)."""
        ...

    def acquire_quota(self, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """:meth:`acquire` and :meth:`quota` in one round trip: ``(wait, remaining, reset_ns)``, the quota read
        right after the decision (a rejection's too)."""
        ...

    async def aacquire_quota(self, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """:meth:`acquire_quota` without blocking the event loop (same result)."""
        ...


@runtime_checkable
class AllOrNothingPlace(Protocol):
    """Optional, for a remote backend or keyed store: it can decide several limits kept in its place at once.

    ``keyed.acquire_all_keyed`` (and a gate's plan) ask each remote entry's holder (``RateLimiter.backend``,
    ``KeyedRateLimiter.store``) for this, once per call or once per plan: entries whose ``place`` is the same
    object are handed together to that place's ``decider``. A remote holder without it is decided alone (an
    all-or-nothing decision may then hold one such limit, next to any number of in-process ones).
    """

    def all_or_nothing(self) -> tuple[Any, object]:
        """``(decider, place)``. ``decider`` has ``acquire_all_keyed(entries, permits)`` (timeout 0; None when
        all granted, else ``(index, wait)``, nothing consumed), ``acquire_all_quotas(entries, permits)`` (the
        same, with every entry's ``(remaining, reset_ns)`` read in the same step) and their async twins
        ``aacquire_all_keyed`` / ``aacquire_all_quotas``; ``entries`` are ``(RateLimiter, None)`` and
        ``(KeyedRateLimiter, key)`` pairs of this place. ``place`` is compared by identity (Redis: the
        connection, one per URL and OPTIONS in a process).

        Optionally the decider also has ``read_quotas(entries)`` / ``aread_quotas(entries)``: every entry's
        ``quota()`` figures read at once, nothing decided (a mixed decision refused in memory reads its remote
        limits' figures so, in one round trip; without them, one ``quota()`` each)."""
        ...


@runtime_checkable
class HealthReporting(Protocol):
    """Optional, for the operator tools: a backend or keyed store whose state lives elsewhere reports how that
    place answers as this process sees it (Redis: ``backends.redis._RedisCycleOps.backend_health``).

    ``state.snapshot`` (``r4 status``, the health check) and the Prometheus collector ask ``RateLimiter.backend``
    and ``KeyedRateLimiter.store`` with one ``isinstance`` each; plain reads, no round trip.
    """

    def backend_health(self) -> dict[str, Any]:
        """At least ``degraded`` (bool) and ``fault_decisions`` (decisions its fault policy made, an int)."""
        ...


@runtime_checkable
class LeaseReporting(Protocol):
    """Optional, for the operator tools: a backend or keyed store leasing permits in batches reports this
    process's lease counters (``backends.redis_lease``), read like :class:`HealthReporting`."""

    def lease_snapshot(self) -> dict[str, int]:
        """``lease`` (permits per batch), ``batches`` and ``<outcome>_permits`` counters of this process."""
        ...


def as_remote(backend: RateLimiterBackend) -> RemoteRateLimiterBackend | None:
    """``backend`` when it implements :class:`RemoteRateLimiterBackend`, else None (an in-process backend).

    A structural check costing microseconds: call it when a limiter is built and keep the answer.
    """
    return backend if isinstance(backend, RemoteRateLimiterBackend) else None


@runtime_checkable
class KeyedBackend(Protocol):
    """Where a keyed rate limiter's per-key state lives: addressed by client key, like the ``limits`` library's
    storage (the algorithm is the store's, everything around a decision is the limiter's).

    One :class:`~django_ratelimit_r4.keyed.KeyedRateLimiter` drives every store: it owns the events, the wait for
    a reserved permit (within ``timeout_duration``), the exceptions (``RequestNotPermitted(..., key=)``), the
    metrics object and the per-key view. A store decides, counts and forgets. Implemented in memory
    (``keyed.MemoryKeyedStore`` for the cycle algorithm, ``keyed_smooth.SmoothKeyedStore`` for GCRA and the
    sliding window) and in Redis (``backends.redis.RedisKeyedStore`` and its GCRA, sliding-window and lease
    variants).

    A decision returns one int as :meth:`RateLimiterBackend.acquire` does: ``>= 0`` granted with the permits
    reserved (the wait before using them), ``< 0`` rejected with nothing reserved (``-value`` the wait needed).
    The counters are kept by the store, in the step that decides (under its lock, or its counter lock after a
    round trip), so concurrent decisions never lose a count. Every async method has the same result as its
    sync twin; a store doing I/O awaits it there (``redis.asyncio``), an in-process store answers inline.
    """

    #: True when the state lives outside this process (a decision may do I/O): the request paths then use
    #: the async methods on the event loop and skip the in-process fast paths.
    remote: bool
    #: True when :meth:`decide_quota` also reads the figures after a rejection (then carried by the
    #: exception as ``quotas``); False when a rejection answers ``(wait, 0, 0)``.
    rejection_quotas: bool
    #: Decisions granted / rejected since the last full reset, keys lost with state at the store's bound.
    successful_calls: int
    failed_calls: int
    lossy_evictions: int

    def decide(self, key: str, permits: int, timeout_ns: int) -> int:
        """Decide for ``key`` and, when the wait fits in ``timeout_ns``, reserve ``permits`` (see the class doc)."""
        ...

    async def adecide(self, key: str, permits: int, timeout_ns: int) -> int:
        """Async twin of :meth:`decide`."""
        ...

    def decide_quota(self, key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """:meth:`decide` and :meth:`quota` in one step: ``(wait, remaining, reset_ns)``, the figures of ``key``
        right after the decision (after a rejection only when :attr:`rejection_quotas`)."""
        ...

    async def adecide_quota(self, key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        """Async twin of :meth:`decide_quota`."""
        ...

    def state(self, key: str) -> tuple[int, int, int]:
        """``(cycle, available_permissions, nanos_to_wait for one permit)`` of ``key`` now; changes nothing."""
        ...

    def quota(self, key: str) -> tuple[int, int]:
        """``(remaining, reset_ns)`` of ``key`` for the RateLimit fields (see :meth:`RateLimiterBackend.quota`)."""
        ...

    async def aquota(self, key: str) -> tuple[int, int]:
        """Async twin of :meth:`quota`."""
        ...

    def drain(self, key: str) -> int:
        """Set ``key``'s refreshed permissions to 0 (pending reservations stay); how many were removed."""
        ...

    def reset(self, key: str | None = None) -> None:
        """Forget ``key`` (full again), or with None every key and the counters."""
        ...

    def set_clock(self, clock: Clock) -> None:
        """Read time from ``clock`` and forget everything (:meth:`reset`), time counted from its current time."""
        ...

    def purge(self) -> int:
        """Drop the entries that carry no information now; how many (0 for a store that expires them itself)."""
        ...

    def keys(self, limit: int | None = None) -> list[str]:
        """Keys holding state, oldest first, at most ``limit`` (``[]`` for a store that keeps only digests)."""
        ...

    def live_keys(self) -> int:
        """Keys holding state now, or -1 when the store cannot count them cheaply."""
        ...

    def __len__(self) -> int:
        """Keys holding state (a store that cannot count them cheaply scans: for housekeeping only)."""
        ...

    def __contains__(self, key: object) -> bool:
        """True when ``key`` holds state."""
        ...


class BackendFactory(Protocol):
    """Builds one limiter's backend. ``MemoryBackend`` itself is such a factory (its constructor)."""

    def __call__(
        self, name: str, limit_for_period: int, limit_refresh_period_ns: int, clock: Clock
    ) -> RateLimiterBackend:
        """Return the backend for the limiter ``name``, full, anchored at ``clock``'s current time."""
        ...



_memory: tuple[BackendFactory, Callable[[Any], BackendFactory]] | None = None


def register_memory_backends(default: BackendFactory, for_config: Callable[[Any], BackendFactory]) -> None:
    """Install the in-process backends: ``default`` (the cycle algorithm's) and ``for_config(config)`` (any
    algorithm's). Called once by :mod:`django_ratelimit_r4.backends.memory` at import."""
    global _memory
    _memory = (default, for_config)


def memory_backends() -> tuple[BackendFactory, Callable[[Any], BackendFactory]]:
    """``(default, for_config)`` as registered; importing the package registers them."""
    memory = _memory
    if memory is None:  # only if backends.memory failed to import while the package was imported
        raise RuntimeError("no in-process rate limiter backend registered: import django_ratelimit_r4.backends.memory")
    return memory
