"""Named instances built from ``settings.RATELIMIT_R4``: lazily, once, rebuilt when the setting changes.

Accessors (also importable from :mod:`django_ratelimit_r4`)::

    get_rate_limiter("api")                 # the shared limiter of instance "api"
    get_rate_limiter("api", key="1.2.3.4")  # the per-key limiter (a KeyedRateLimiter entry)
    get_bulkhead(name), get_circuit_breaker(name), get_retry(name), get_time_limiter(name)
    get_adaptive_throttler(name), get_retry_budget(name)

An unknown name raises :class:`UnknownInstance` (an ``ImproperlyConfigured`` *and* a ``KeyError``)
listing the configured names; a misconfigured instance raises :class:`MisconfiguredInstance` with
the same messages ``manage.py check`` prints. Nothing here reads settings at import time.

``generation`` is bumped on every rebuild (``setting_changed`` for ``RATELIMIT_R4``, e.g.
``override_settings``). Code that caches an instance uses :func:`lookup`, which returns the
generation the instance belongs to, and re-fetches when ``registry.generation`` differs: one int
compare per call.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from . import conf
from .core.clock import SYSTEM_CLOCK, Clock
from .core.config import import_string
from .core.rates import parse_rate

if TYPE_CHECKING:
    from .backends.base import Store, StoreFactory
    from .core.adaptivethrottler import AdaptiveThrottler
    from .core.bulkhead import Bulkhead
    from .core.circuitbreaker import CircuitBreaker
    from .core.ratelimiter import RateLimiter
    from .core.retry import Retry
    from .core.retrybudget import RetryBudget
    from .core.timelimiter import TimeLimiter
    from .keyed import KeyedRateLimiter, KeyedRateLimiterView

__all__ = [
    "SECTIONS",
    "MisconfiguredInstance",
    "UnknownInstance",
    "build_callbacks",
    "generation",
    "get_adaptive_throttler",
    "get_bulkhead",
    "get_circuit_breaker",
    "get_keyed_rate_limiter",
    "get_rate_limiter",
    "get_retry",
    "get_retry_budget",
    "get_time_limiter",
    "install_clock",
    "instance_options",
    "instances",
    "invalidate",
    "iter_instances",
    "keyed_rate_limiters",
    "lookup",
    "names",
    "reset_all",
    "restore_clock",
    "retry_budget_names",
    "retry_budgets",
    "unthrottled_scopes",
]

SECTIONS = conf.SECTIONS

#: Bumped on every rebuild. Compare with the value :func:`lookup` returned to detect a stale cache.
generation: int = 0

_lock = threading.RLock()
_state: _State | None = None
#: The clock new instances get: a test clock from :func:`install_clock`, else the system clock.
_clock: Clock = SYSTEM_CLOCK
#: States that lived while a test clock was installed, so restore_clock reaches instances that an
#: override_settings rebuild has since orphaned but a caller may still hold.
_clocked_states: list[_State] = []
_classes: dict[str, type] = {}
#: Called as ``callback(section, name, instance)`` right after an instance (or a keyed store, section
#: ``"ratelimiters"``) is built, under the registry lock; :mod:`.signals` wires its events here.
#: A callback must be quick and must not raise.
build_callbacks: list[Callable[[str, str, Any], None]] = []


def _looks_like_rate(name: object) -> bool:
    try:
        parse_rate(name)
    except ValueError:
        return False
    return True


logger = logging.getLogger("django_ratelimit_r4")

#: The process that already looked for a multi-process server (see :func:`_warn_if_multiprocess`).
_multiprocess_checked_pid: int | None = None


def _warn_if_multiprocess(state: _State) -> None:
    """Log once per process, when it builds its first in-memory rate limiter, that limits are per worker.

    ``ratelimit_r4.W001`` only reaches whoever runs ``manage.py check`` in the server's environment;
    this says it in the worker's own log. Runs at build time (under the registry lock), never per call.
    """
    global _multiprocess_checked_pid
    pid = os.getpid()
    if _multiprocess_checked_pid == pid:
        return
    _multiprocess_checked_pid = pid
    from django.conf import settings

    from .checks import detect_multiprocess

    check_id = conf.Code.MEMORY_MULTIPROCESS.check_id
    if check_id in getattr(settings, "SILENCED_SYSTEM_CHECKS", ()):
        return
    why = detect_multiprocess(os.environ, sys.argv)
    if why is None:
        return
    names = ", ".join(repr(n) for n in conf.per_process_rate_limiters(state.analysis))
    logger.warning(
        "rate limiters %s keep their state in this process's memory (pid %d), but the server looks "
        "multi-process (%s): every worker has its own budget, so a limit of 10 becomes 10 x N workers. "
        'For one budget across workers use the redis backend (%s = "redis", or a %s entry named by the '
        "instance's \"backend\"); if per-process limits are intended, silence this and the check with "
        'SILENCED_SYSTEM_CHECKS = ["%s"].',
        names,
        pid,
        why,
        conf.setting_path("backend"),
        conf.setting_path("backends"),
        check_id,
    )


def _recheck_in_child() -> None:
    # A worker forked after its parent built rate limiters (gunicorn --preload) may build none of its
    # own: look from here, so the warning still reaches the worker's log. No lock: right after fork the
    # child has one thread, and a lock another parent thread held would never be released here.
    state = _state
    if state is None or not (state.instances["ratelimiters"] or state.keyed):
        return
    if any(store.per_process for store in state.stores.values()):
        _warn_if_multiprocess(state)


def _deprecated_kind(error: UnknownInstance | MisconfiguredInstance) -> str:
    warnings.warn(
        f"{type(error).__name__}.kind is deprecated; use {type(error).__name__}.section",
        DeprecationWarning,
        stacklevel=3,
    )
    return error.section


class UnknownInstance(ImproperlyConfigured, KeyError):
    """No instance of that name is configured. Lists the configured names and the setting path."""

    def __init__(self, section: str, name: str, known: tuple[str, ...], extra: str = "") -> None:
        self.section = section
        self.name = name
        self.known = known
        where = f'{conf.SETTING}["{section}"]["instances"]'
        listing = ", ".join(repr(n) for n in known) if known else "none"
        if section == "ratelimiters" and _looks_like_rate(name):
            extra = (
                f" {name!r} is a rate, not a name: declare an instance with it, e.g. "
                f'{where}["api"] = {{"rate": "{name}"}}, and use that name.{extra}'
            )
        close = conf._did_you_mean(name, known)
        self.message = f"no {SECTIONS[section].type_name} named {name!r} in {where}; configured: {listing}."
        self.message += (f" {close}" if close else "") + extra
        super().__init__(self.message)

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message.
        return self.message

    @property
    def kind(self) -> str:
        """Deprecated alias of :attr:`section` (the ``RATELIMIT_R4`` section, e.g. ``"ratelimiters"``)."""
        return _deprecated_kind(self)


class MisconfiguredInstance(ImproperlyConfigured):
    """The named instance exists but its settings are invalid; ``problems`` lists every mistake."""

    def __init__(self, section: str, name: str, problems: list[conf.Problem]) -> None:
        self.section = section
        self.name = name
        self.problems = problems
        details = "\n".join(f"  - {p} [{p.check_id}]" for p in problems)
        super().__init__(
            f"{SECTIONS[section].type_name} {name!r} is misconfigured in {conf.SETTING} (run `manage.py check`):\n{details}"
        )

    @property
    def kind(self) -> str:
        """Deprecated alias of :attr:`section` (the ``RATELIMIT_R4`` section, e.g. ``"ratelimiters"``)."""
        return _deprecated_kind(self)


class _State:
    """Instances of one generation of the setting."""

    __slots__ = ("analysis", "budgets", "generation", "instances", "keyed", "stores")

    def __init__(self, analysis: conf.Analysis, generation: int) -> None:
        self.analysis = analysis
        self.generation = generation
        self.instances: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        self.keyed: dict[str, KeyedRateLimiter] = {}
        #: Retry budgets by name, built with the first retry that uses one (shared by every such retry).
        self.budgets: dict[str, RetryBudget] = {}
        #: The built entries of ``RATELIMIT_R4["backends"]``, by alias (one per generation).
        self.stores: dict[str, Store] = {}


def _current_state() -> _State:
    state = _state
    if state is None:
        state = _load_state()
    return state


_warned_not_installed = False


def _warn_if_not_installed() -> None:
    # Without the app in INSTALLED_APPS the decorators still work, but `manage.py check` never validates
    # RATELIMIT_R4 and no metrics are exported: say so once instead of failing silently.
    global _warned_not_installed
    if _warned_not_installed:
        return
    _warned_not_installed = True
    from django.apps import apps

    if apps.ready and not apps.is_installed("django_ratelimit_r4"):
        warnings.warn(
            '"django_ratelimit_r4" is not in INSTALLED_APPS: RATELIMIT_R4 is not checked by `manage.py check` '
            "and no Prometheus metrics are exported. Add it to INSTALLED_APPS.",
            RuntimeWarning,
            stacklevel=4,
        )


def _load_state() -> _State:
    global _state
    with _lock:
        if _state is None:
            _warn_if_not_installed()
            _state = _State(conf.get_analysis(), generation)
            if _clock is not SYSTEM_CLOCK:
                _clocked_states.append(_state)
        return _state


def _spec(state: _State, section: str, name: str) -> conf.InstanceSpec:
    """The spec of a configured instance, or the clear error explaining why there is none."""
    analysis = state.analysis
    spec = analysis.specs[section].get(name)
    if spec is not None:
        return spec
    if name in analysis.broken[section]:
        raise MisconfiguredInstance(section, name, analysis.broken[section][name])
    if analysis.section_problems[section]:
        raise MisconfiguredInstance(section, name, analysis.section_problems[section])
    extra = ""
    if analysis.problems:
        extra = f" ({conf.SETTING} has {len(analysis.problems)} problem(s), e.g. {analysis.problems[0]}; run `manage.py check`.)"
    raise UnknownInstance(section, name, analysis.names(section), extra)


def _primitive_class(section: str) -> type:
    cls = _classes.get(section)
    if cls is None:
        cls = _classes[section] = import_string(SECTIONS[section].primitive_path)
    return cls


def _build(state: _State, section: str, name: str) -> Any:
    with _lock:
        instance = state.instances[section].get(name)
        if instance is None:
            spec = _spec(state, section, name)
            if section == "ratelimiters":
                store = _store_of(state, spec)
                factory = store.backend_factory(spec.options["on_backend_error"], **_store_options(spec))
                instance = _primitive_class(section)(name, spec.config, clock=_clock, backend=factory)
            elif section == "bulkheads" and spec.options["backend"] is not None:
                instance = _shared_bulkhead(state, spec)
            elif section == "circuitbreakers" and spec.options.get("backend") is not None:
                instance = _shared_circuit_breaker(state, spec)
            elif section == "retries" and spec.options.get("budget") is not None:
                instance = _primitive_class(section)(
                    name, spec.config, clock=_clock, budget=_retry_budget(state, spec.options["budget"])
                )
            else:
                instance = _primitive_class(section)(name, spec.config, clock=_clock)
            state.instances[section][name] = instance
            for callback in build_callbacks:
                callback(section, name, instance)
        return instance


def _retry_budget(state: _State, name: str) -> RetryBudget:
    """The shared budget ``name`` of this generation, built on first use (call under ``_lock``)."""
    budget = state.budgets.get(name)
    if budget is None:
        config = state.analysis.retry_budgets.get(name)
        if config is None:
            problems = state.analysis.broken_retry_budgets.get(name) or [
                conf.Problem(
                    conf.Code.UNKNOWN_RETRY_BUDGET,
                    conf.setting_path(conf.RETRY_BUDGETS, name),
                    f"no retry budget named {name!r}; configured: "
                    + (", ".join(repr(n) for n in state.analysis.retry_budgets) or "none"),
                )
            ]
            details = "\n".join(f"  - {p} [{p.check_id}]" for p in problems)
            raise ImproperlyConfigured(f"retry budget {name!r} cannot be used (run `manage.py check`):\n{details}")
        from .core.retrybudget import RetryBudget

        budget = state.budgets[name] = RetryBudget(name, config, clock=_clock)
    return budget


def _store_of(state: _State, spec: conf.InstanceSpec) -> Store:
    """The built store (``RATELIMIT_R4["backends"]`` entry) of a rate limiter spec; caller holds the lock.

    Built once per generation through the entry's factory (``"memory"``, ``"redis"`` or a dotted path): the
    registry knows no backend by name. An instance on a per-process store logs the multi-process warning.
    """
    alias = spec.options["backend"]
    store = state.stores.get(alias)
    if store is None:
        backend = state.analysis.backends[alias]  # analyse() made every bound alias valid
        factory: StoreFactory = import_string(backend.factory_path)
        store = state.stores[alias] = factory(alias, backend.location, backend.options)
    if store.per_process:
        _warn_if_multiprocess(state)
    return store


def _store_options(spec: conf.InstanceSpec) -> dict[str, Any]:
    """The instance options a store interprets itself (:data:`conf.STORE_OPTIONS`, today ``lease``), those set.

    Passed as keywords to the store's ``backend_factory`` / ``keyed_store`` only when set, so a store that
    supports none of them keeps the two-argument protocol; ``manage.py check`` refuses them on a store that
    cannot honour them (a lease needs a redis backend, ``ratelimit_r4.E031``).
    """
    return {option: spec.options[option] for option in conf.STORE_OPTIONS if spec.options.get(option) is not None}


def _shared_bulkhead(state: _State, spec: conf.InstanceSpec) -> Any:
    """A bulkhead naming a backend: the store's cluster-wide bulkhead, or an in-process one on a memory store."""
    store = _store_of(state, spec)
    build = getattr(store, "bulkhead", None)
    if build is None:
        if store.per_process:
            return _primitive_class("bulkheads")(spec.name, spec.config, clock=_clock)
        raise ImproperlyConfigured(
            f"{spec.path}: backend {spec.options['backend']!r} ({type(store).__name__}) cannot hold a bulkhead"
        )
    return build(
        spec.name,
        spec.config,
        clock=_clock,
        lease_ttl_ns=spec.options["lease_ttl"],
        on_error=spec.options["on_backend_error"],
    )


def _shared_circuit_breaker(state: _State, spec: conf.InstanceSpec) -> Any:
    """A circuit breaker naming a backend: the store's cluster-wide breaker (``manage.py check`` refuses a
    memory backend, ``ratelimit_r4.E033``)."""
    store = _store_of(state, spec)
    build = getattr(store, "circuit_breaker", None)
    if build is None:
        raise ImproperlyConfigured(
            f"{spec.path}: backend {spec.options['backend']!r} ({type(store).__name__}) cannot share a circuit "
            "breaker; name a redis backend"
        )
    return build(spec.name, spec.config, clock=_clock)


def _get(section: str, name: str) -> Any:
    state = _current_state()
    instance = state.instances[section].get(name)
    if instance is None:
        instance = _build(state, section, name)
    return instance


def lookup(section: str, name: str) -> tuple[int, Any]:
    """Return ``(generation, instance)`` for caching callers (decorators, middleware).

    The generation is the one the instance was built for, so a rebuild racing with this call is
    always noticed: cache the pair and re-fetch when ``registry.generation != cached_generation``.
    """
    state = _current_state()
    instance = state.instances[section].get(name)
    if instance is None:
        instance = _build(state, section, name)
    return state.generation, instance


def get_rate_limiter(name: str, key: str | None = None) -> RateLimiter | KeyedRateLimiterView:
    """The rate limiter ``name``; with ``key``, that client's own limiter (same config, own budget).

    Without ``key`` this is the instance's single shared limiter, even when the instance has a
    ``key`` spec for requests (the HTTP layer then uses the per-key limiters). A key that is not a string
    (``key=user.pk``) is its text: ``42`` and ``"42"`` are one client, as on Redis, which hashes the text.
    """
    if key is not None:
        # Stored keys are strings (the decorators', the operators' --key): an int one broke r4 status --keys.
        return get_keyed_rate_limiter(name).get(key if isinstance(key, str) else str(key))
    return _get("ratelimiters", name)  # type: ignore[no-any-return]


def _keyed_class() -> type[KeyedRateLimiter]:
    from .keyed import KeyedRateLimiter  # imported at the first keyed build, like the primitives' classes

    return KeyedRateLimiter


def get_keyed_rate_limiter(name: str) -> KeyedRateLimiter:
    """The per-key store of rate limiter ``name`` (bounded by its ``max_keys``)."""
    state = _current_state()
    keyed = state.keyed.get(name)
    if keyed is None:
        with _lock:
            keyed = state.keyed.get(name)
            if keyed is None:
                spec = _spec(state, "ratelimiters", name)
                store = _store_of(state, spec)
                bounds = {"max_keys": spec.options["max_keys"], "idle_timeout_ns": spec.options["key_idle_timeout"]}
                keyed_store = store.keyed_store(
                    name, spec.config, clock=_clock, on_error=spec.options["on_backend_error"],
                    **bounds, **_store_options(spec),
                )
                keyed = _keyed_class()(  # one limiter for every store: the store decides, it does the rest
                    name, spec.config, clock=_clock, store=keyed_store, **bounds
                )
                state.keyed[name] = keyed
                for callback in build_callbacks:
                    callback("ratelimiters", name, keyed)
    return keyed


def get_bulkhead(name: str) -> Bulkhead:
    """The bulkhead ``name`` from ``RATELIMIT_R4["bulkheads"]["instances"]``."""
    return _get("bulkheads", name)  # type: ignore[no-any-return]


def get_circuit_breaker(name: str) -> CircuitBreaker:
    """The circuit breaker ``name`` from ``RATELIMIT_R4["circuitbreakers"]["instances"]``."""
    return _get("circuitbreakers", name)  # type: ignore[no-any-return]


def get_retry(name: str) -> Retry:
    """The retry ``name`` from ``RATELIMIT_R4["retries"]["instances"]``."""
    return _get("retries", name)  # type: ignore[no-any-return]


def get_time_limiter(name: str) -> TimeLimiter:
    """The time limiter ``name`` from ``RATELIMIT_R4["timelimiters"]["instances"]``."""
    return _get("timelimiters", name)  # type: ignore[no-any-return]


def get_adaptive_throttler(name: str) -> AdaptiveThrottler:
    """The adaptive throttler ``name`` from ``RATELIMIT_R4["adaptivethrottlers"]["instances"]``."""
    return _get("adaptivethrottlers", name)  # type: ignore[no-any-return]


def get_retry_budget(name: str) -> RetryBudget:
    """The shared retry budget ``name`` from ``RATELIMIT_R4["retry_budgets"]`` (the one its retries use)."""
    state = _current_state()
    budget = state.budgets.get(name)
    if budget is None:
        with _lock:
            budget = _retry_budget(state, name)
    return budget


def instance_options(section: str, name: str) -> Mapping[str, Any]:
    """The per-instance options that are not config fields, with defaults filled in.

    ``ratelimiters``: ``key`` (spec or None), ``max_keys`` (int), ``key_idle_timeout`` (ns or None),
    ``backend`` (the ``RATELIMIT_R4["backends"]`` alias) and ``on_backend_error`` (``"local"``, ``"allow"``,
    ``"deny"``; the redis default filled in, None on a memory backend unless written).
    ``bulkheads``: ``retry_after`` (ns). ``retries``: ``budget`` (a retry budget's name or None). Other sections:
    empty. Raises like the accessors.
    """
    return _spec(_current_state(), section, name).options


def names(section: str) -> tuple[str, ...]:
    """Every configured instance name of ``section`` (``"ratelimiters"``, ...), including broken ones."""
    return _current_state().analysis.names(section)


def unthrottled_scopes() -> frozenset[str]:
    """DRF scopes whose ``DEFAULT_THROTTLE_RATES`` rate is ``None`` (and not declared here): not limited."""
    return frozenset(_current_state().analysis.unthrottled_scopes)


def instances(section: str) -> Iterator[tuple[str, Any]]:
    """``(name, instance)`` for every valid configured instance of ``section``, building as needed.

    Misconfigured instances are skipped (``manage.py check`` reports them).
    """
    state = _current_state()
    for name in state.analysis.specs[section]:
        instance = state.instances[section].get(name)
        yield name, instance if instance is not None else _build(state, section, name)


def iter_instances() -> Iterator[tuple[str, str, Any]]:
    """``(section, name, instance)`` for every valid configured instance of every section."""
    for section in SECTIONS:
        for name, instance in instances(section):
            yield section, name, instance


def retry_budget_names() -> tuple[str, ...]:
    """The names of the valid entries of ``RATELIMIT_R4["retry_budgets"]``, in setting order."""
    return tuple(_current_state().analysis.retry_budgets)


def retry_budgets() -> Iterator[tuple[str, RetryBudget]]:
    """``(name, RetryBudget)`` for every valid entry of ``RATELIMIT_R4["retry_budgets"]``, building as needed."""
    for name in _current_state().analysis.retry_budgets:
        yield name, get_retry_budget(name)


def keyed_rate_limiters() -> Iterator[tuple[str, KeyedRateLimiter]]:
    """``(name, KeyedRateLimiter)`` for rate limiters with a ``key`` spec or already used per key."""
    state = _current_state()
    for name, spec in state.analysis.specs["ratelimiters"].items():
        if name in state.keyed or spec.options["key"] is not None:
            yield name, get_keyed_rate_limiter(name)


def _built(state: _State) -> list[Any]:
    with _lock:
        return (
            [i for per_kind in state.instances.values() for i in per_kind.values()]
            + list(state.keyed.values())
            + list(state.budgets.values())
        )


def install_clock(clock: Clock) -> None:
    """Make every instance, built or future (keyed too), use ``clock``, with its state reset.

    Each limiter's first cycle then starts at ``clock``'s current time. Used by the ``r4_clock``
    pytest fixture; pair it with :func:`restore_clock`.
    """
    global _clock
    with _lock:
        _clock = clock
        state = _state
        if state is not None:
            if state not in _clocked_states:
                _clocked_states.append(state)
            for instance in _built(state):
                instance.set_clock(clock)
                instance.reset()


def restore_clock() -> None:
    """Undo :func:`install_clock`: back to the system clock, every built instance reset.

    Also reaches instances of registry generations replaced while the test clock was installed.
    """
    global _clock
    with _lock:
        _clock = SYSTEM_CLOCK
        states = list(_clocked_states)
        _clocked_states.clear()
        if _state is not None and _state not in states:
            states.append(_state)
        for state in states:
            for instance in _built(state):
                instance.set_clock(SYSTEM_CLOCK)
                instance.reset()


def reset_all() -> None:
    """Reset every built instance to its freshly-built state (same config and clock)."""
    state = _state
    if state is not None:
        for instance in _built(state):
            instance.reset()


def invalidate() -> None:
    """Drop every instance and re-read ``RATELIMIT_R4`` on next use; bumps :data:`generation`.

    Called automatically on ``setting_changed``; call it yourself only if you mutate settings by hand.
    """
    global _state, generation
    with _lock:
        conf.clear_cache()
        dropped, _state = _state, None
        generation += 1
    if dropped is not None:
        _close(dropped)


def _close(state: _State) -> None:
    # Instances with threads of their own (cluster-wide breakers and bulkheads) stop them and give back their
    # leases: else every changed setting (override_settings in a test suite) leaves its threads and connections.
    for instance in _built(state):
        close = getattr(instance, "close", None)
        if close is None:
            continue
        try:
            close()
        except Exception:  # never let one instance's shutdown fail the settings change
            logger.warning("closing %r after a settings change failed", instance, exc_info=True)


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in (conf.SETTING, conf.DRF_SETTING):  # DRF's rates make limiters too
        invalidate()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_ratelimit_r4.registry")
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_recheck_in_child)


def __getattr__(name: str) -> Any:
    # registry.KINDS: the old name of SECTIONS ("kind" named a section before 0.2).
    if name == "KINDS":
        warnings.warn("registry.KINDS is deprecated; use registry.SECTIONS", DeprecationWarning, stacklevel=2)
        return SECTIONS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
