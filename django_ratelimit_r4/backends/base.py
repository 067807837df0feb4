"""The rate-limiter backend interface and the pure decision every backend implements.

A :class:`~django_ratelimit_r4.core.ratelimiter.RateLimiter` keeps no limiter state of its own: it asks a
:class:`RateLimiterBackend` to decide and commit atomically, one call per decision. The in-process
implementation is :class:`~django_ratelimit_r4.backends.memory.MemoryBackend`; a Redis backend implements the
same protocol with one Lua round trip per decision, so callers never change.

The algorithm is Resilience4j's ``AtomicRateLimiter``. Its whole state is two integers, ``(cycle,
permissions)``, plus the time anchor the cycles are counted from. :func:`decide` is the decision as a pure
function over integers. Backends may inline it for speed, but must give the same answers (a property test
checks the memory backend against it); a Lua script should mirror it line by line, and a per-client keyed store
needs to keep only the two integers per key and call it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from ..core.backend import BackendFactory, KeyedBackend, RateLimiterBackend
from ..core.clock import Clock
from ..core.config import InvalidValue, integer_value, positive_duration_value
from ..core.durations import MAX_PERIOD_NS as _MAX_CONFIG_PERIOD_NS
from ..core.durations import Nanos

__all__ = [
    "DEFAULT_LEASE_TTL",
    "FAULT_POLICIES",
    "FAULT_POLICY_OF",
    "MAX_NS_PERIOD",
    "MAX_PERIOD_NS",
    "MIN_LEASE_TTL",
    "ON_BACKEND_ERROR",
    "ON_BACKEND_ERROR_OF",
    "REDIS_MAX_PERIOD_NS",
    "BackendFactory",
    "RateLimiterBackend",
    "Store",
    "StoreFactory",
    "check_fault_policy",
    "decide",
    "div_ceil",
    "lease_ttl_value",
    "lease_value",
    "nanos_to_wait",
    "on_backend_error_value",
    "redis_gcra_rate",
    "redis_period_error",
    "refresh",
]

# Here, not in ``backends.redis``, so ``manage.py check`` can enforce them without importing ``redis``.
#: Longest ``limit_refresh_period`` the Redis script counts in nanoseconds (period * 10 < 2**53): ~10.4 days.
MAX_NS_PERIOD = (2**53 - 1) // 10
#: Longest ``limit_refresh_period`` on Redis at all: longer than MAX_NS_PERIOD, periods are counted in whole
#: microseconds (period_us * 10 < 2**53): ~28.5 years (the configs stop at 366 days anyway).
MAX_PERIOD_NS = MAX_NS_PERIOD * 1000
REDIS_MAX_PERIOD_NS = MAX_PERIOD_NS

# ---------------------------------------------------------------------------- shared backends' policies
# Here, like the periods above, so conf checks them without importing redis; the Redis modules import them.

#: What an instance on a shared backend does while that backend fails, in the setting's words
#: (``on_backend_error``): decide with a per-process instance of the same config, admit, or reject.
ON_BACKEND_ERROR = ("local", "allow", "deny")
#: The same policies in the backends' words (``fault_policy``): "open" admits, "closed" rejects (with a 1 s
#: wait), "local" decides in process.
FAULT_POLICIES = ("open", "closed", "local")
#: ``on_backend_error`` -> ``fault_policy``; None (not written) is "local".
FAULT_POLICY_OF: Mapping[str | None, str] = MappingProxyType(
    {"allow": "open", "deny": "closed", "local": "local", None: "local"}
)
#: ``fault_policy`` -> ``on_backend_error`` (``redis_fault_policy``, the old top-level shorthand, is in these words).
ON_BACKEND_ERROR_OF: Mapping[str, str] = MappingProxyType(
    {policy: on_error for on_error, policy in FAULT_POLICY_OF.items() if on_error is not None}
)
#: A shared bulkhead's lease lives this long without renewal (a killed worker's slots come back within it).
DEFAULT_LEASE_TTL = Nanos(10_000_000_000)
#: The shortest lease TTL: each process renews its leases every third of it.
MIN_LEASE_TTL = Nanos(300_000_000)


_SECRET_IN_QUERY = re.compile(r"([?&;][^=&;#]*(?:password|secret|token)[^=&;#]*=)[^&;#]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` without its credentials, for logs, status and error messages.

    The user part (``user:password@``) becomes ``***@`` and a query value whose name contains
    ``password``, ``secret`` or ``token`` (redis-py reads ``?password=`` too) becomes ``***``. It works on a
    malformed URL as well, since the error that rejects one shows it: the user part ends at the last ``@``
    (a password may hold an unquoted one), wherever the ``://`` is or is not.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return scheme + sep + _SECRET_IN_QUERY.sub(r"\1***", rest)


def check_fault_policy(fault_policy: object) -> str:
    """``fault_policy`` when it is one of :data:`FAULT_POLICIES`; a ``ValueError`` (:class:`InvalidValue`) saying
    which are otherwise. Every shared backend's constructor checks with it."""
    if fault_policy not in FAULT_POLICIES:
        raise InvalidValue(f"fault_policy must be 'open', 'closed' or 'local', got {fault_policy!r}")
    return fault_policy


def on_backend_error_value(value: object) -> str | None:
    """``on_backend_error`` as written (any case) -> one of :data:`ON_BACKEND_ERROR`, or None when not written."""
    if value is None:
        return None
    if isinstance(value, str) and value.lower() in ON_BACKEND_ERROR:
        return value.lower()
    fault_policy = value.lower() if isinstance(value, str) else ""
    raise InvalidValue(
        f"must be 'local', 'allow' or 'deny', got {value!r}",
        f"redis_fault_policy {fault_policy!r} is written {ON_BACKEND_ERROR_OF[fault_policy]!r} here."
        if fault_policy in ON_BACKEND_ERROR_OF
        else "'local' decides with a per-process limiter of the same config while the backend fails, "
        "'allow' admits every request, 'deny' rejects with a 1 s Retry-After.",
    )


_LEASE_HINT = (
    'A lease is a count of permits, e.g. "lease": 20: each process takes up to that many permits of the current '
    "cycle from the shared Redis budget per round trip (see docs/redis.md, Permit leases)."
)


def lease_value(value: object) -> int | None:
    """A rate limiter's ``lease``: permits per round trip (an int >= 1), or None for no lease."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue(f"must be a positive integer (permits per round trip) or None, got {value!r}", _LEASE_HINT)
    return integer_value(value, minimum=1, hint=_LEASE_HINT)


def lease_ttl_value(value: object) -> Nanos:
    """A shared bulkhead's ``lease_ttl``: a duration from :data:`MIN_LEASE_TTL` to the longest period."""
    return positive_duration_value(
        value,
        between=(MIN_LEASE_TTL, _MAX_CONFIG_PERIOD_NS),
        hint="A worker killed mid-call gives its slots back after this; keep it well above your longest pause "
        '(GC, CPU starvation): the default "10s" suits most.',
    )


def redis_period_error(period_ns: int) -> str | None:
    """Why the Redis backend cannot keep ``limit_refresh_period`` exact, or None when it can.

    Lua numbers are doubles (integers exact below 2**53). Periods up to :data:`MAX_NS_PERIOD` (~10.4 days)
    are counted in nanoseconds; longer ones, up to :data:`MAX_PERIOD_NS`, in microseconds, so they must be
    whole microseconds (every duration written in ms, s, m, h or d is).
    """
    if period_ns < 1:
        return f"limit_refresh_period must be at least 1 ns, got {period_ns} ns"
    if period_ns <= MAX_NS_PERIOD:
        return None
    if period_ns > MAX_PERIOD_NS:
        return (
            f"the Redis backend supports limit_refresh_period up to {MAX_PERIOD_NS} ns (~28.5 years), "
            f"got {period_ns} ns"
        )
    if period_ns % 1000:
        return (
            f"a limit_refresh_period over {MAX_NS_PERIOD} ns (~10.4 days) is counted in microseconds by the "
            f"Redis backend and must be a whole number of them, got {period_ns} ns"
        )
    return None


#: GCRA on Redis keeps its values below this: doubles are exact integers below 2**53 (``lua/gcra.lua``).
GCRA_EXACT = 2**52


def redis_gcra_rate(limit: int, period_ns: int, burst: int) -> tuple[int, int, int, int] | None:
    """The Redis GCRA script's figures for ``limit`` per ``period_ns`` with ``burst``, or None when they cannot
    stay exact: ``(step, span, scale, max_timeout_ns)``.

    Time is counted in units of ``1/scale`` ns (``scale = limit / gcd(limit, period)``, so the emission interval
    ``step`` is whole), or, for a period over :data:`MAX_NS_PERIOD` (like the cycle and sliding-window
    scripts), of ``1/scale`` µs, ``scale`` then sent negated. ``span`` is ``burst * step``; the script forms
    values up to ``2 * span`` plus a timeout plus two seconds of units, which must stay below :data:`GCRA_EXACT`.
    """
    micro = period_ns > MAX_NS_PERIOD
    period = period_ns // 1000 if micro else period_ns
    per_second = 1_000_000 if micro else 1_000_000_000
    common = math.gcd(limit, period)
    scale, step = limit // common, period // common
    span = burst * step
    max_timeout = (GCRA_EXACT - 2 * per_second * scale - 2 * span) // scale
    if max_timeout < 0:
        return None
    return step, span, -scale if micro else scale, max_timeout * 1000 if micro else max_timeout


def redis_gcra_error(limit: int, period_ns: int, burst: int | None) -> str | None:
    """Why the Redis GCRA script cannot keep ``limit`` per ``period_ns`` with ``burst`` (None: the limit) exact,
    or None when it can (:func:`redis_gcra_rate`)."""
    burst = limit if burst is None else burst
    if redis_gcra_rate(limit, period_ns, burst) is not None:
        return None
    unit = "µs" if period_ns > MAX_NS_PERIOD else "ns"
    return (
        f"algorithm 'gcra' on Redis cannot keep limit {limit} per {period_ns} ns with burst {burst} exact: "
        f"2 x burst x period / gcd(limit, period) (the period in {unit}) must stay below 2**52 "
        "(Lua's numbers are doubles)"
    )


def div_ceil(x: int, y: int) -> int:
    """Java's ``(x + y - 1) / y`` for ``y > 0``: integer division that truncates toward zero.

    Resilience4j's ``divCeil`` gives 0 for every ``x <= 0`` with ``x > -y``; Python's ``//`` floors, which
    differs on negative numerators, so the truncation is spelled out here.
    """
    n = x + y - 1
    return n // y if n >= 0 else -((-n) // y)


def refresh(cycle: int, permissions: int, current_cycle: int, limit: int) -> int:
    """Lazy refresh: the permissions at ``current_cycle``, given ``permissions`` recorded at ``cycle``.

    ``min(permissions + elapsed_cycles * limit, limit)``: reservation debt (negative permissions) is repaid by
    later cycles, and an idle limiter never holds more than one period's worth.
    """
    if current_cycle == cycle:
        return permissions
    return min(permissions + (current_cycle - cycle) * limit, limit)


def nanos_to_wait(
    permissions: int, permits: int, current_cycle: int, now_ns: int, period_ns: int, limit: int
) -> int:
    """Nanoseconds until ``permits`` are available, from refreshed ``permissions`` at ``current_cycle``.

    Exactly Resilience4j's formula: 0 when enough permissions are there, otherwise the time to the next cycle
    boundary plus as many whole periods as the remaining deficit needs.
    """
    if permissions >= permits:
        return 0
    to_next_cycle = (current_cycle + 1) * period_ns - now_ns
    return to_next_cycle + div_ceil(permits - (permissions + limit), limit) * period_ns


def decide(
    cycle: int, permissions: int, permits: int, timeout_ns: int, now_ns: int, period_ns: int, limit: int
) -> tuple[int, int, int, bool]:
    """One rate-limiter decision as a pure function: ``(new_cycle, new_permissions, nanos_to_wait, granted)``.

    ``now_ns`` is nanoseconds since the limiter's anchor (its creation, ``set_clock`` or ``reset``), so
    cycle ``n`` covers ``[n * period_ns, (n + 1) * period_ns)``. The permits are reserved (``granted``) when
    the wait fits in ``timeout_ns``: ``timeout_ns >= nanos_to_wait``, so a wait of 0 is granted with timeout 0
    and a negative timeout never reserves (a side-effect-free peek). Reservations may drive permissions
    negative. The refreshed cycle and permissions are returned even when nothing is reserved; storing them
    is harmless because the refresh composes (refreshing twice equals refreshing once).
    """
    current_cycle = now_ns // period_ns
    permissions = refresh(cycle, permissions, current_cycle, limit)
    wait = nanos_to_wait(permissions, permits, current_cycle, now_ns, period_ns, limit)
    granted = timeout_ns >= wait
    if granted:
        permissions -= permits
    return current_cycle, permissions, wait, granted


@runtime_checkable
class Store(Protocol):
    """One entry of ``RATELIMIT_R4["backends"]``: builds the state holders of the rate limiters naming it.

    The registry builds one store per entry (through its ``BACKEND`` factory, see :class:`StoreFactory`)
    and asks it for every rate limiter configured with ``"backend": <alias>``. ``on_error`` is the
    instance's ``on_backend_error`` (``"local"``, ``"allow"``, ``"deny"``, or None when not written and
    the backend has no default): a store whose state lives elsewhere applies it while that place fails.

    The instance options a store interprets itself (``conf.STORE_OPTIONS``: ``lease``, which the Redis store
    implements) reach ``backend_factory`` and ``keyed_store`` as keyword arguments, and only when set, so a
    store that supports none of them needs no parameter for them: the registry knows no store by name.
    """

    #: The entry's name in ``RATELIMIT_R4["backends"]``.
    alias: str
    #: True when every process has its own budgets (the memory store): the registry warns (W001) under a
    #: multi-process server.
    per_process: bool

    def backend_factory(self, on_error: str | None) -> BackendFactory:
        """The :class:`BackendFactory` a ``RateLimiter`` of this store is built with."""
        ...

    def keyed_store(
        self,
        name: str,
        config: Any,
        *,
        clock: Clock,
        max_keys: int,
        idle_timeout_ns: int | None,
        on_error: str | None,
    ) -> KeyedBackend:
        """The per-key state of rate limiter ``name``, a :class:`~django_ratelimit_r4.core.backend.KeyedBackend`
        on ``clock``; the registry builds the one ``KeyedRateLimiter`` over it (events, waiting, exceptions and
        metrics are the limiter's, whatever the store). ``max_keys`` / ``idle_timeout_ns`` bound a store kept
        in this process (a remote store may use them for its in-process fallback)."""
        ...


class StoreFactory(Protocol):
    """What a ``BACKEND`` dotted path names: ``factory(alias, location, options) -> Store`` (a class works)."""

    def __call__(self, alias: str, location: str | None, options: Mapping[str, Any]) -> Store:
        """Build the store of ``RATELIMIT_R4["backends"][alias]`` from its ``LOCATION`` and ``OPTIONS``."""
        ...
