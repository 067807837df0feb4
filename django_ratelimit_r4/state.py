"""Live state of every configured instance, and the operator actions on it.

Shared by ``manage.py r4`` and the state endpoint (:mod:`django_ratelimit_r4.views`), so both
print exactly the same data. :func:`snapshot` returns one JSON-ready dict per configured instance::

    {"type": "ratelimiter", "name": "api",
     "config": {"limit_for_period": 10, "limit_refresh_period": "1s", "timeout_duration": "0s", ...},
     "state": {"available_permissions": 0, "nanos_to_wait": 850000000, ...}}

Conventions: keys are snake_case; **durations in ``config`` are strings** from
:func:`~django_ratelimit_r4.core.durations.format_duration` (``"1s"``, ``"500ms"``), live
durations in ``state`` are integer nanoseconds (``*_ns``, ``nanos_to_wait``) and, for the breaker's
remaining open time, also float seconds. Exception classes and callables are dotted paths.

Client keys of keyed rate limiters are never included unless ``include_keys=True`` (the endpoint
asks for it only with ``?keys=1`` and the right permission); the key count always is. A store that
cannot count its keys (the Redis backend keeps only expiring digests of them) reports
``"live_keys": null`` with a ``"note"`` saying why, and lists no keys.

Actions: :func:`reset`, :func:`drain`, :func:`transition`. An instance name may be qualified with
its type (``"circuitbreaker:payments"``), which is required when the bare name is configured
for several types that the action applies to. Failures raise :class:`StateError` subclasses whose
message is meant for the operator.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable, Iterable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from . import registry
from .core.backend import HealthReporting, LeaseReporting
from .core.durations import Nanos, format_duration
from .core.exceptions import IllegalStateTransition

logger = logging.getLogger("django_ratelimit_r4.state")

__all__ = [
    "COUNTERS",
    "MAX_LISTED_KEYS",
    "SECTION_OF_TYPE",
    "TRANSITION_TARGETS",
    "TYPES",
    "UNCOUNTED_KEYS_NOTE",
    "IllegalAction",
    "StateError",
    "UnknownName",
    "check_action",
    "check_names",
    "cluster_counts",
    "drain",
    "parse_name",
    "reset",
    "snapshot",
    "transition",
    "transition_target",
]

#: Registry section -> the ``type`` written in the snapshot (the order ``r4 status`` lists them in).
TYPES: dict[str, str] = {section: registry.SECTIONS[section].type_name for section in registry.SECTIONS}
#: The other way round: snapshot ``type`` -> registry section.
SECTION_OF_TYPE: dict[str, str] = {type_name: section for section, type_name in TYPES.items()}
#: Deprecated: the old name of :data:`SECTION_OF_TYPE` ("kind" named a section before 0.2).
KIND_OF_TYPE = SECTION_OF_TYPE

#: Circuit breaker states an operator may transition to, and the method doing it.
TRANSITION_TARGETS: dict[str, str] = {
    "CLOSED": "transition_to_closed_state",
    "OPEN": "transition_to_open_state",
    "FORCED_OPEN": "transition_to_forced_open_state",
    "DISABLED": "transition_to_disabled_state",
    "METRICS_ONLY": "transition_to_metrics_only_state",
    "HALF_OPEN": "transition_to_half_open_state",
}

#: At most this many client keys are listed per keyed limiter with ``include_keys`` (oldest first).
MAX_LISTED_KEYS = 1000

#: The ``note`` of a keyed limiter whose store cannot count or list its keys (``live_keys`` is null).
UNCOUNTED_KEYS_NOTE = (
    "live_keys is unknown: this store (the Redis backend) keeps only hashed client keys that expire by "
    "themselves, so it can neither count them cheaply nor list them; successful_calls and failed_calls "
    "count this process's decisions only"
)


class StateError(Exception):
    """An action or a snapshot filter could not be carried out; ``str()`` is the operator message."""


class UnknownName(StateError, LookupError):
    """No configured instance has that name (for that action)."""


class IllegalAction(StateError, ValueError):
    """The instance exists but the action does not apply (wrong type, bad target state, ...)."""


# ----------------------------------------------------------------------------------------- rendering


def _dotted(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if module and qualname:
        return f"{module}.{qualname}"
    return repr(obj)


def _jsonable(value: Any) -> Any:
    """A config value as JSON: durations as ``"1s"``, classes and callables as dotted paths."""
    if isinstance(value, Nanos):
        return format_duration(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (tuple, list, frozenset, set)):
        return [_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a bulkhead's adaptive options
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, type) or callable(value):
        return _dotted(value)
    return repr(value)


def _config(instance: Any, section: str, name: str) -> dict[str, Any]:
    config = instance.config
    out = {f.name: _jsonable(getattr(config, f.name)) for f in dataclasses.fields(config)}
    for option, value in registry.instance_options(section, name).items():
        out[option] = _jsonable(value)
    return out


def _ratelimiter_state(limiter: Any, keyed: Any, include_keys: bool) -> dict[str, Any]:
    cycle, available, wait = limiter.backend.state()  # one consistent read instead of three
    metrics = limiter.metrics
    state: dict[str, Any] = {
        "available_permissions": available,
        "nanos_to_wait": wait,
        "number_of_waiting_threads": metrics.number_of_waiting_threads,
        "cycle": cycle,
        "successful_calls": metrics.successful_calls,
        "failed_calls": metrics.failed_calls,
        "keyed": None,
    }
    store = keyed.store if keyed is not None else None  # the keyed limiter's store (memory or Redis)
    health = _backend_health(limiter.backend, store)
    if health is not None:
        state["backend"] = health
    lease = _lease(limiter.backend, store)
    if lease is not None:
        state["lease"] = lease
    if keyed is not None:
        km = keyed.metrics
        live = km.live_keys
        counted = live is not None and live >= 0  # Redis: -1, i.e. unknown
        per_key: dict[str, Any] = {
            "live_keys": live if counted else None,
            "max_keys": keyed.max_keys,
            "successful_calls": km.successful_calls,
            "failed_calls": km.failed_calls,
            "lossy_evictions": km.lossy_evictions,
            "number_of_waiting_threads": km.number_of_waiting_threads,
        }
        if not counted:
            per_key["note"] = UNCOUNTED_KEYS_NOTE
        if include_keys:
            per_key["keys"] = _keys(keyed)
        state["keyed"] = per_key
    return state


def _lease(backend: Any, keyed: Any) -> dict[str, int] | None:
    """This process's permit-lease counters (``"lease": N``, backends/redis_lease.py), or None without leases.

    The shared and the keyed store of one name lease separately: their counters are added up."""
    parts = [x.lease_snapshot() for x in (backend, keyed) if isinstance(x, LeaseReporting)]
    if not parts:
        return None
    out = dict(parts[0])
    for part in parts[1:]:
        for field, value in part.items():
            if field != "lease":
                out[field] += value
    return out


def _backend_health(backend: Any, keyed: Any) -> dict[str, Any] | None:
    """A remote backend's health as this process sees it (Redis), or None for in-process state.

    The shared and the keyed store of one name use one connection: their fault decisions are added up.
    """
    reports = [x.backend_health() for x in (keyed, backend) if isinstance(x, HealthReporting)]
    if not reports:
        return None
    health = dict(reports[0])
    health["fault_decisions"] = sum(r["fault_decisions"] for r in reports)
    return health


def _keys(keyed: Any) -> dict[str, dict[str, int]]:
    """Live keys (oldest first, capped at :data:`MAX_LISTED_KEYS`) with their permissions and wait."""
    # A snapshot of the names first (the store stays locked only for the copy), then each key's state.
    # A store that cannot list its keys (Redis keeps only hashes of them: keys() is []) lists none.
    lister = getattr(keyed, "keys", None)
    out = {}
    for key in lister(MAX_LISTED_KEYS) if lister is not None else ():
        _, available, wait = keyed.state(key)
        out[key] = {"available_permissions": available, "nanos_to_wait": wait}
    return out


def _bulkhead_state(bulkhead: Any) -> dict[str, Any]:
    m = bulkhead.metrics
    out = {
        "available_concurrent_calls": m.available_concurrent_calls,
        "max_allowed_concurrent_calls": m.max_allowed_concurrent_calls,
        "concurrent_calls": m.concurrent_calls,
        "waiting_calls": m.waiting_calls,
        "permitted_calls": m.permitted_calls,
        "rejected_calls": m.rejected_calls,
        "finished_calls": m.finished_calls,
    }
    counts = cluster_counts(bulkhead)
    if counts is not None:  # a cluster-wide bulkhead: leases alive cluster-wide (one round trip)
        cluster, expired = counts
        out["cluster_concurrent_calls"] = cluster
        out["available_concurrent_calls"] = max(0, m.max_allowed_concurrent_calls - cluster)
        out["cluster_expired_leases"] = expired  # ever, cluster-wide: workers killed or stalled mid-call
        out["lost_leases"] = m.lost_leases  # this process's calls whose lease expired while they ran
    adaptive = getattr(bulkhead.config, "adaptive", None)
    if adaptive is not None:  # the limit moves: say which algorithm moves it (and, for littles_law, from what)
        limit = getattr(bulkhead, "adaptive_limit", None)
        out["adaptive"] = {
            "algorithm": adaptive.algorithm,
            "limit": m.max_allowed_concurrent_calls,
            "no_load_latency_ns": getattr(limit, "no_load_latency_ns", None),
            "probing": getattr(limit, "probing", None),
        }
    return out


def cluster_counts(bulkhead: Any) -> tuple[int, int | None] | None:
    """A cluster-wide (redis) bulkhead's ``(leases alive in the cluster, leases ever expired unreleased)``, read
    now in one round trip; while Redis does not answer, the alive count of its last reply and None. None for a
    per-process bulkhead. (The state endpoint and the Prometheus collector read it alike.)"""
    read = getattr(bulkhead, "cluster_counts", None)
    if read is None:
        return None
    try:
        alive, expired = read()
    except Exception:  # Redis unreachable
        return bulkhead.metrics.cluster_concurrent_calls, None
    return alive, expired


def _retry_budget_item(name: str) -> dict[str, Any]:
    """A retry budget's snapshot entry (``type`` ``"retrybudget"``): its config, balance and counters."""
    try:
        budget = registry.get_retry_budget(name)
        cfg, m = budget.config, budget.metrics
        return {
            "type": "retrybudget",
            "name": name,
            "config": {f.name: _jsonable(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)},
            "state": {
                "balance": budget.balance,
                "number_of_deposits": m.number_of_deposits,
                "number_of_retries": m.number_of_retries,
                "number_of_refused_retries": m.number_of_refused_retries,
            },
        }
    except Exception as exc:  # reported in the entry; the other instances are still read
        logger.warning("r4 state of retry budget %r failed: %r", name, exc)
        return {"type": "retrybudget", "name": name, "config": None, "state": None, "error": repr(exc)}


def _circuitbreaker_state(breaker: Any) -> dict[str, Any]:
    m = breaker.metrics
    remaining = breaker.remaining_open_ns()
    out = {
        "state": breaker.state.name,
        "failure_rate": m.failure_rate,
        "slow_call_rate": m.slow_call_rate,
        "number_of_buffered_calls": m.number_of_buffered_calls,
        "number_of_failed_calls": m.number_of_failed_calls,
        "number_of_successful_calls": m.number_of_successful_calls,
        "number_of_slow_calls": m.number_of_slow_calls,
        "number_of_not_permitted_calls": m.number_of_not_permitted_calls,
        "total_not_permitted_calls": m.total_not_permitted_calls,
        "remaining_open_ns": remaining,
        "remaining_open_seconds": remaining / 1e9,
    }
    shared = getattr(breaker, "shared_health", None)
    if shared is not None:  # a cluster-wide breaker: its backend, epoch, and whether it decides alone
        out["shared"] = shared()
    return out


#: The snapshot fields of the types that are plain counters (``rejection_probability`` aside), by registry
#: section: the state endpoint reads them and the control plane's cluster totals add them up.
COUNTERS: dict[str, tuple[str, ...]] = {
    "retries": (
        "number_of_successful_calls_without_retry_attempt",
        "number_of_successful_calls_with_retry_attempt",
        "number_of_failed_calls_without_retry_attempt",
        "number_of_failed_calls_with_retry_attempt",
        "number_of_total_calls",
        "number_of_budget_exhausted_calls",
    ),
    "timelimiters": ("number_of_successful_calls", "number_of_failed_calls", "number_of_timeout_calls"),
    "adaptivethrottlers": (
        "requests",
        "accepts",
        "rejection_probability",
        "number_of_accepted_calls",
        "number_of_rejected_calls",
        "number_of_throttled_calls",
    ),
}


def _counters(names: Iterable[str]) -> Callable[[Any], dict[str, Any]]:
    def read(instance: Any) -> dict[str, Any]:
        return {n: getattr(instance.metrics, n) for n in names}

    return read


_READERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "bulkheads": _bulkhead_state,
    "circuitbreakers": _circuitbreaker_state,
    **{section: _counters(fields) for section, fields in COUNTERS.items()},
}


def snapshot(names: Iterable[str] | None = None, *, include_keys: bool = False) -> list[dict[str, Any]]:
    """One dict per configured instance (``type``, ``name``, ``config``, ``state``), in setting order.

    ``names`` keeps only those instances (bare or ``"type:name"``); an unknown one raises
    :class:`UnknownName`. Misconfigured instances are skipped (``manage.py check`` reports them). An instance
    that fails while being built or read is listed with ``"state": null`` and an ``"error"``: one instance
    never hides the others. Reading changes nothing, except that instances not used yet are built (fresh
    and full).
    """
    wanted = None if names is None else [parse_name(n) for n in names]
    keyed, keyed_failures = keyed_stores()
    out: list[dict[str, Any]] = []
    matched: set[tuple[str | None, str]] = set()
    for section in registry.SECTIONS:
        for name in registry.names(section):
            if wanted is not None:
                hits = [w for w in wanted if w[1] == name and w[0] in (None, section)]
                if not hits:
                    continue
            try:
                instance = registry.lookup(section, name)[1]
            except ImproperlyConfigured:
                continue  # misconfigured: manage.py check reports it
            except Exception as exc:
                instance = None
                failure: Exception | None = exc
            else:
                failure = keyed_failures.get(name) if section == "ratelimiters" else None
            if wanted is not None:
                matched.update(hits)
            out.append(_item(section, name, instance, failure, keyed.get(name), include_keys))
    for name in registry.retry_budget_names():  # shared by retries, in no section: listed last
        if wanted is not None:
            hits = [w for w in wanted if w[0] is None and w[1] in (name, f"retrybudget:{name}")]
            if not hits:
                continue
            matched.update(hits)
        out.append(_retry_budget_item(name))
    if wanted is not None:
        missing = [w for w in wanted if w not in matched]
        if missing:
            missing_kind, missing_name = missing[0]
            raise UnknownName(_unknown_message(missing_name, missing_kind, None))
    return out


def keyed_stores() -> tuple[dict[str, Any], dict[str, Exception]]:
    """The keyed stores in use by name, and the error of any that cannot be built (its entry shows it)."""
    try:
        return dict(registry.keyed_rate_limiters()), {}
    except Exception:  # one store failed: build the others one by one, keeping each failure for its entry
        stores: dict[str, Any] = {}
        failures: dict[str, Exception] = {}
        for name in registry.names("ratelimiters"):
            try:
                if registry.instance_options("ratelimiters", name)["key"] is not None:
                    stores[name] = registry.get_keyed_rate_limiter(name)
            except ImproperlyConfigured:
                continue
            except Exception as exc:
                failures[name] = exc
        return stores, failures


def _item(
    section: str, name: str, instance: Any, failure: Exception | None, keyed: Any, include_keys: bool
) -> dict[str, Any]:
    """One snapshot entry; an instance that cannot be built or read gets ``"error"`` instead of a state."""
    try:
        if failure is not None:
            raise failure
        if section == "ratelimiters":
            state = _ratelimiter_state(instance, keyed, include_keys)
        else:
            state = _READERS[section](instance)
        return {"type": TYPES[section], "name": name, "config": _config(instance, section, name), "state": state}
    except Exception as exc:  # reported in the entry; the other instances are still read
        logger.warning("r4 state of %s %r failed: %r", TYPES[section], name, exc)
        return {"type": TYPES[section], "name": name, "config": None, "state": None, "error": repr(exc)}


# ------------------------------------------------------------------------------------------- actions


def parse_name(qualified: str) -> tuple[str | None, str]:
    """``"circuitbreaker:payments"`` -> ``("circuitbreakers", "payments")``; a bare name -> ``(None, name)``."""
    prefix, sep, rest = qualified.partition(":")
    if sep and prefix in SECTION_OF_TYPE:
        return SECTION_OF_TYPE[prefix], rest
    return None, qualified


def transition_target(to: object) -> str:
    """The breaker state ``to`` names (case-insensitive, ``-`` for ``_``), a key of :data:`TRANSITION_TARGETS`;
    an unknown one raises :class:`IllegalAction`."""
    target = str(to).strip().upper().replace("-", "_")
    if target not in TRANSITION_TARGETS:
        raise IllegalAction(f"unknown circuit breaker state {to!r}; use one of {', '.join(TRANSITION_TARGETS)}")
    return target


def check_names(names: Iterable[str]) -> None:
    """Raise :class:`UnknownName` (as :func:`snapshot` would) if one of ``names`` is not configured."""
    for qualified in names:
        section, name = parse_name(qualified)
        sections = [section] if section is not None else list(TYPES)
        if not any(name in registry.names(k) for k in sections):
            raise UnknownName(_unknown_message(name, section, None))


def check_action(action: str, name: str, *, key: str | None = None, to: str | None = None) -> None:
    """Raise the :class:`StateError` that :func:`reset`, :func:`drain` or :func:`transition` would raise for these
    arguments before acting (unknown name or state, wrong type, a bulkhead reset), without acting.

    Whether a transition is allowed depends on each process's current state: only the action itself knows.
    """
    if action == "transition":
        transition_target(to)
        _resolve_section(name, ("circuitbreakers",), "transition")
    elif action == "reset":
        _refuse_bulkhead_reset(name, _RESETTABLE)
        _check_key(*_resolve_section(name, _RESETTABLE, "reset"), key)
    elif action == "drain":
        _resolve_section(name, ("ratelimiters",), "drain")
    else:
        raise IllegalAction(f"unknown action {action!r}; use transition, reset or drain")


def _unknown_message(name: str, section: str | None, allowed: tuple[str, ...] | None) -> str:
    sections = [section] if section is not None else list(allowed or TYPES)
    listing = "; ".join(f"{TYPES[k]}: {', '.join(registry.names(k)) or 'none'}" for k in sections)
    what = " or ".join(TYPES[k] for k in sections)
    return f"no {what} named {name!r} is configured ({listing})"


def _resolve(qualified: str, allowed: tuple[str, ...], action: str) -> tuple[str, str, Any]:
    """Find the one instance ``qualified`` names among the ``allowed`` sections."""
    section, name = _resolve_section(qualified, allowed, action)
    # The registry raises MisconfiguredInstance (an ImproperlyConfigured) for broken instances.
    return section, name, registry.lookup(section, name)[1]


def _resolve_section(qualified: str, allowed: tuple[str, ...], action: str) -> tuple[str, str]:
    """The section and bare name of the one instance ``qualified`` names among the ``allowed`` sections."""
    section, name = parse_name(qualified)
    if section is not None:
        if section not in allowed:
            raise IllegalAction(
                f"{action} applies to {' and '.join(TYPES[k] for k in allowed)} instances, not to {TYPES[section]} {name!r}"
            )
        candidates = [section]
    else:
        candidates = [k for k in allowed if name in registry.names(k)]
        if not candidates:
            other = [TYPES[k] for k in TYPES if k not in allowed and name in registry.names(k)]
            if other:
                raise IllegalAction(
                    f"{name!r} is a {' and '.join(other)}; {action} applies to "
                    f"{' and '.join(TYPES[k] for k in allowed)} instances only"
                )
            raise UnknownName(_unknown_message(name, None, allowed))
        if len(candidates) > 1:
            spelled = ", ".join(f"{TYPES[k]}:{name}" for k in candidates)
            raise IllegalAction(f"{name!r} is configured as several types; name one: {spelled}")
    if name not in registry.names(candidates[0]):
        raise UnknownName(_unknown_message(name, candidates[0], allowed))
    return candidates[0], name


def _keyed(name: str) -> Any:
    """The keyed store of rate limiter ``name``, if one is in use."""
    return dict(registry.keyed_rate_limiters()).get(name)


#: The sections :func:`reset` applies to (a bulkhead is refused: :func:`_refuse_bulkhead_reset`).
_RESETTABLE = ("ratelimiters", "circuitbreakers", "retries", "timelimiters")


def _check_key(section: str, bare: str, key: str | None) -> None:
    if key is not None and section != "ratelimiters":
        raise IllegalAction(f"--key applies to rate limiters only, not to {TYPES[section]} {bare!r}")


def _refuse_bulkhead_reset(name: str, allowed: tuple[str, ...]) -> None:
    section_hint, bare = parse_name(name)
    if (
        section_hint is None
        and bare in registry.names("bulkheads")
        and not any(bare in registry.names(k) for k in allowed)
    ):
        raise IllegalAction(
            f"bulkhead {bare!r} cannot be reset: a reset forgets the permits held by calls in flight, so more "
            "than max_concurrent_calls could run; restart the worker instead"
        )


def reset(name: str, key: str | None = None) -> dict[str, Any]:
    """Return an instance to its freshly-built state; with ``key``, forget one client of a keyed limiter.

    Applies to rate limiters (the shared limiter and all per-key state), circuit breakers (back to
    ``initial_state``; lifetime totals stay), retries and time limiters (counters zeroed). Bulkheads
    are refused: a reset forgets permits held by calls in flight, letting more than
    ``max_concurrent_calls`` run until they finish.
    """
    _refuse_bulkhead_reset(name, _RESETTABLE)
    section, bare, instance = _resolve(name, _RESETTABLE, "reset")
    _check_key(section, bare, key)
    result: dict[str, Any] = {"action": "reset", "type": TYPES[section], "name": bare}
    if key is not None:
        registry.get_keyed_rate_limiter(bare).reset(key)
        result["key"] = key
        return result
    instance.reset()
    keyed = _keyed(bare) if section == "ratelimiters" else None
    if keyed is not None:
        keyed.reset()
    return result


def drain(name: str, key: str | None = None) -> dict[str, Any]:
    """Set a rate limiter's current permissions to 0 (debt kept); with ``key``, only that client's.

    Returns ``{"action": "drain", ..., "drained": n}``.
    """
    section, bare, instance = _resolve(name, ("ratelimiters",), "drain")
    result: dict[str, Any] = {"action": "drain", "type": TYPES[section], "name": bare}
    if key is not None:
        result["key"] = key
        result["drained"] = registry.get_keyed_rate_limiter(bare).drain_permissions(key)
    else:
        result["drained"] = instance.drain_permissions()
    return result


def transition(name: str, to: str) -> dict[str, Any]:
    """Move circuit breaker ``name`` to state ``to`` (``CLOSED``, ``OPEN``, ``FORCED_OPEN``, ``DISABLED``,
    ``METRICS_ONLY`` or ``HALF_OPEN``; case-insensitive), following Resilience4j's transition table.

    Returns ``{"action": "transition", ..., "from_state": ..., "to_state": ...}``; an unknown target or
    a transition Resilience4j forbids (e.g. ``METRICS_ONLY`` -> ``HALF_OPEN``) raises :class:`IllegalAction`.
    """
    target = transition_target(to)
    method = TRANSITION_TARGETS[target]
    section, bare, breaker = _resolve(name, ("circuitbreakers",), "transition")
    before = breaker.state.name
    try:
        getattr(breaker, method)()
    except IllegalStateTransition as exc:
        raise IllegalAction(
            f"circuit breaker {bare!r}: {before} -> {target} is not an allowed transition ({exc})"
        ) from None
    return {
        "action": "transition",
        "type": TYPES[section],
        "name": bare,
        "from_state": before,
        "to_state": breaker.state.name,
    }
