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
    "BackendFactory",
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


def as_remote(backend: RateLimiterBackend) -> RemoteRateLimiterBackend | None:
    """``backend`` when it implements :class:`RemoteRateLimiterBackend`, else None (an in-process backend).

    A structural check costing microseconds: call it when a limiter is built and keep the answer.
    """
    return backend if isinstance(backend, RemoteRateLimiterBackend) else None


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
