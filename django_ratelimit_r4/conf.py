"""Parse and validate ``settings.RATELIMIT_R4`` once, collecting every problem.

:func:`analyse` turns the raw setting into an :class:`Analysis`: validated per-instance specs
(config object + extra options), the top-level :class:`R4Options`, and a list of :class:`Problem`
entries, each naming the exact setting path. The system checks (:mod:`.checks`) report those problems;
the registry (:mod:`.registry`) builds instances from the specs and raises the same problems at first
use of a broken instance. Field rules live in the config classes (one source of truth): this module
only walks the dict, merges inheritance and maps each :class:`FieldError` back to where it was written.

Importing this module never reads settings; :func:`get_analysis` and :func:`get_options` do, lazily,
and cache until ``RATELIMIT_R4`` changes (``setting_changed``, so ``override_settings`` works).
"""

from __future__ import annotations

import difflib
import enum
import importlib.util
import inspect
import ipaddress
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from .backends.base import (
    DEFAULT_LEASE_TTL,
    FAULT_POLICIES,
    ON_BACKEND_ERROR,
    ON_BACKEND_ERROR_OF,
    lease_ttl_value,
    lease_value,
    on_backend_error_value,
    redact_url,
)
from .core.adaptivethrottler import AdaptiveThrottlerConfig
from .core.bulkhead import BulkheadConfig
from .core.circuitbreaker import CircuitBreakerConfig
from .core.config import (
    InvalidValue,
    boolean_value,
    callable_value,
    field_names,
    import_string,
    integer_value,
    positive_duration_value,
)
from .core.durations import MAX_PERIOD_NS, Nanos, format_duration
from .core.exceptions import ConfigurationError
from .core.ratelimiter import RateLimiterConfig
from .core.rates import RateError, parse_rate
from .core.retry import RetryConfig
from .core.retrybudget import RetryBudgetConfig
from .core.timelimiter import TimeLimiterConfig
from .ip import parse_forwarded_header, parse_ipv6_prefix_length, parse_trusted_proxies
from .keyed import DEFAULT_MAX_KEYS as _KEYED_DEFAULT_MAX_KEYS
from .keyspec import BUILTIN_KEYS, validate_key_spec

__all__ = [
    "SECTIONS",
    "SETTING",
    "STORE_OPTIONS",
    "Analysis",
    "BackendSpec",
    "Code",
    "ControlOptions",
    "InstanceSpec",
    "Problem",
    "R4Options",
    "Section",
    "StallDetectorOptions",
    "analyse",
    "clear_cache",
    "drf_scope_path",
    "drf_throttle_rates",
    "get_analysis",
    "get_control",
    "get_options",
    "parse_key_spec",
    "per_process_rate_limiters",
    "raw_setting",
    "setting_path",
    "token_error",
]

#: Name of the Django setting.
SETTING = "RATELIMIT_R4"
#: DRF's setting; its ``DEFAULT_THROTTLE_RATES`` scopes not declared in ``RATELIMIT_R4`` become rate limiters.
DRF_SETTING = "REST_FRAMEWORK"
#: How an automatic limiter made from a DRF scope is keyed: per user, else per client IP (DRF's identity).
DRF_SCOPE_KEY = "user_or_ip"

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Code(enum.Enum):
    """Every problem the settings can have, with its stable system-check id (the one table).

    ``E`` ids are errors (the named instance or option cannot be used), ``W`` ids are warnings.
    docs/configuration.md lists the same table; a test keeps the two in sync.
    """

    title: str

    def __new__(cls, check_id: str, title: str) -> Code:
        member = object.__new__(cls)
        member._value_ = check_id
        member.title = title
        return member

    NOT_A_DICT = ("E001", "RATELIMIT_R4 is not a dict")
    UNKNOWN_KEY = (
        "E002",
        "unknown key (section, option, config field or per-instance option), with a 'did you mean'",
    )
    WRONG_CONTAINER = (
        "E003",
        "a section, 'configs', 'instances' or an entry is not a dict, or a name is not a non-empty string",
    )
    INVALID_FIELD = (
        "E004",
        "invalid value of a config field: unitless or malformed duration, out of range, wrong type, unimportable exception class or callable",
    )
    UNKNOWN_BASE_CONFIG = ("E005", "base_config names a config that does not exist (or is not a string)")
    CIRCULAR_BASE_CONFIG = ("E006", "circular base_config chain")
    INVALID_KEY = ("E007", "invalid rate limiter 'key' spec")
    INVALID_INSTANCE_OPTION = (
        "E008",
        "invalid per-instance option: max_keys, key_idle_timeout, retry_after or lease_ttl",
    )
    INVALID_BACKEND = (
        "E009",
        "backend / a backends entry's BACKEND is not 'memory', 'redis' or an importable dotted path to a backend factory",
    )
    REDIS_NOT_INSTALLED = ("E010", "a redis backend but the redis package is not installed")
    INVALID_REDIS_URL = ("E011", "a redis backend without a valid URL (redis_url or LOCATION)")
    INVALID_HEADERS = ("E012", "headers is not 'draft-10', 'draft-6' or None")
    INVALID_RESPONSE_BUILDER = (
        "E013",
        "response_builder cannot be imported, is not callable or cannot be called as builder(request, exc, "
        "status=..., retry_after=...)",
    )
    INVALID_TRUSTED_PROXIES = (
        "E014",
        "trusted_proxies is not a count >= 0 or a list of CIDR networks (and 'unix')",
    )
    INVALID_IPV6_PREFIX = ("E015", "ipv6_prefix_length is not an integer from 1 to 128")
    INVALID_TOKEN = ("E016", "state_endpoint_token is not a non-empty string or None")
    INVALID_STALL_DETECTOR = (
        "E017",
        "stall_detector 'enabled' is not a bool or 'threshold' is not a positive duration",
    )
    INVALID_METRICS = ("E018", "metrics is not True or False")
    INVALID_REDIS_OPTION = (
        "E019",
        "redis_fault_policy is not 'open' or 'closed', redis_key_prefix is not a non-empty string, or a "
        "redis backend's OPTIONS value is invalid",
    )
    INVALID_FORWARDED_HEADER = ("E020", "forwarded_header is not 'auto', 'x-forwarded-for' or 'forwarded'")
    RATE_CONFLICT = (
        "E021",
        "a rate limiter entry sets 'rate' together with limit_for_period or limit_refresh_period",
    )
    INVALID_DRF_RATE = (
        "E022",
        "a rate in DRF's REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'] (a scope not declared in RATELIMIT_R4) is not '<count>/<unit>'",
    )
    INVALID_ENABLED = ("E023", "enabled is not True or False")
    UNKNOWN_NAME = (
        "E024",
        "a decorator or DRF throttle on a routed view uses an instance name that is not configured",
    )
    PERMITS_ABOVE_LIMIT = (
        "E025",
        "a routed view asks for more permits per request than its rate limiter's limit_for_period",
    )
    UNKNOWN_RETRY_BUDGET = (
        "E026",
        "a retry's budget is not the name of a valid entry of retry_budgets",
    )
    ALGORITHM_NOT_ON_BACKEND = (
        "E027",
        "a bulkhead is adaptive with backend 'redis' (a cluster-wide bulkhead keeps a fixed limit)",
    )
    UNKNOWN_BACKEND = (
        "E028",
        "a rate limiter's, bulkhead's or circuit breaker's backend names no entry of RATELIMIT_R4['backends']",
    )
    INVALID_ON_BACKEND_ERROR = ("E029", "on_backend_error is not 'local', 'allow' or 'deny'")
    BACKEND_SHORTHAND_CONFLICT = (
        "E030",
        "backends['default'] is set together with the top-level shorthand backend, redis_url or redis_key_prefix",
    )
    INVALID_LEASE = (
        "E031",
        "a rate limiter's lease is not an int from 1 to its limit_for_period, or is set without a redis backend "
        "or with an algorithm other than 'cycle'",
    )
    INVALID_CONTROL = (
        "E032",
        "control is not a dict, its backend names no redis entry of backends, or heartbeat_interval is not a "
        "duration from 100ms to 1h",
    )
    BREAKER_BACKEND_NOT_SHARED = (
        "E033",
        "a circuit breaker's backend is not a redis backend (a shared circuit breaker keeps its state in Redis)",
    )
    REDIS_TOPOLOGY = (
        "E034",
        "a redis backend's cluster, sentinel or TLS options do not fit together or with its LOCATION",
    )
    NOT_ALL_OR_NOTHING = (
        "E035",
        "a routed view decides several rate limiters all-or-nothing that the first request could not decide: "
        "Redis limits on two Redis connections, or one on a third-party backend that cannot take part in such a "
        "decision",
    )
    INVALID_THROTTLE_ARGUMENTS = (
        "E036",
        "a routed view's rate-limit arguments fail every request: a decorator's dotted key= path that cannot be "
        "imported, or a DRF view's rate_limiter_permits, rate_limiter_methods, a name listed twice, or a drop-in "
        "throttle class's key or methods",
    )
    MEMORY_MULTIPROCESS = ("W001", "in-memory rate limiters in a deployment that looks multi-process")
    METRICS_WITHOUT_PROMETHEUS = ("W002", "metrics is True but prometheus_client is not installed")
    SHORT_TOKEN = ("W003", "state_endpoint_token is shorter than 32 characters")
    UNKNOWN_THROTTLE_SCOPE = (
        "W004",
        "a DRF view's throttle_scope names no rate limiter and no DEFAULT_THROTTLE_RATES scope: not limited",
    )
    SLIDING_WINDOW_MEMORY = (
        "W005",
        "a keyed in-memory sliding_window rate limiter could hold more than 256 MiB per process if its clients "
        "used their limits (max_keys x 8 bytes x limit_for_period)",
    )
    WIDE_TRUSTED_PROXIES = (
        "W006",
        "trusted_proxies names a public network wider than any proxy fleet (0.0.0.0/0, ::/0, a /7 or wider of IPv4, "
        "an /11 or wider of IPv6): any client can choose its address with X-Forwarded-For",
    )
    USER_KEY_WITHOUT_AUTHENTICATION = (
        "W007",
        "a routed view's rate limit is keyed by the user ('user', 'user_or_ip') but AuthenticationMiddleware is "
        "not in MIDDLEWARE: no request.user, so 'user' limits nothing and 'user_or_ip' keys every request by IP",
    )
    WIDE_IPV6_PREFIX = (
        "W008",
        "ipv6_prefix_length is below 32: one per-IP budget would hold a whole ISP's or region's IPv6 clients",
    )
    SESSION_KEY_WITHOUT_SESSIONS = (
        "W009",
        "a routed view's rate limit is keyed by the session ('session') but SessionMiddleware is not in MIDDLEWARE: "
        "no request.session, so every request is keyed by its client IP",
    )

    @property
    def check_id(self) -> str:
        """The full Django check id, e.g. ``"ratelimit_r4.E004"``."""
        return f"ratelimit_r4.{self.value}"


@dataclass(frozen=True, slots=True)
class Problem:
    """One mistake in ``RATELIMIT_R4``: where it is, what is wrong and how to fix it."""

    code: Code
    path: str
    message: str
    hint: str | None = None

    @property
    def check_id(self) -> str:
        """The Django check id, e.g. ``"ratelimit_r4.E002"``."""
        return self.code.check_id

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}"
        return f"{text} (hint: {self.hint})" if self.hint else text


@dataclass(frozen=True, slots=True)
class Section:
    """One section of the setting: which config class it validates with and which primitive it builds."""

    #: The key in ``RATELIMIT_R4`` (``"ratelimiters"``); a *type* (``type_name``) is what one instance is.
    name: str
    type_name: str
    config_class: type
    primitive_path: str
    accessor: str
    extras: tuple[str, ...] = ()
    #: Keys an entry may write instead of fields ("rate" for limit_for_period + limit_refresh_period).
    shorthands: tuple[str, ...] = ()

    @property
    def fields(self) -> tuple[str, ...]:
        """Config field names settable in this section."""
        return field_names(self.config_class)

    @property
    def section(self) -> str:
        """Deprecated alias of :attr:`name` (``conf.Kind.section`` before 0.2)."""
        warnings.warn("Section.section (Kind.section) is deprecated; use Section.name", DeprecationWarning, stacklevel=2)
        return self.name


#: The six sections, in the order ``manage.py r4 status`` lists them.
SECTIONS: dict[str, Section] = {
    s.name: s
    for s in (
        Section(
            "ratelimiters",
            "ratelimiter",
            RateLimiterConfig,
            "django_ratelimit_r4.core.ratelimiter.RateLimiter",
            "get_rate_limiter",
            ("key", "max_keys", "key_idle_timeout", "backend", "on_backend_error", "lease"),
            ("rate",),
        ),
        Section(
            "bulkheads",
            "bulkhead",
            BulkheadConfig,
            "django_ratelimit_r4.core.bulkhead.Bulkhead",
            "get_bulkhead",
            ("retry_after", "backend", "lease_ttl", "on_backend_error"),
        ),
        Section(
            "circuitbreakers",
            "circuitbreaker",
            CircuitBreakerConfig,
            "django_ratelimit_r4.core.circuitbreaker.CircuitBreaker",
            "get_circuit_breaker",
            ("backend",),
        ),
        Section(
            "retries",
            "retry",
            RetryConfig,
            "django_ratelimit_r4.core.retry.Retry",
            "get_retry",
            ("budget",),
        ),
        Section(
            "timelimiters",
            "timelimiter",
            TimeLimiterConfig,
            "django_ratelimit_r4.core.timelimiter.TimeLimiter",
            "get_time_limiter",
        ),
        Section(
            "adaptivethrottlers",
            "adaptivethrottler",
            AdaptiveThrottlerConfig,
            "django_ratelimit_r4.core.adaptivethrottler.AdaptiveThrottler",
            "get_adaptive_throttler",
        ),
    )
}

#: Default values of the per-instance extra options.
# ~200 bytes per live client (benchmarks/bench_keyed_memory.py): 100k clients is ~20 MB per keyed limiter
# and per worker (1,000,000 was ~200 MB). Raise it per instance for a limiter with more live clients.
DEFAULT_MAX_KEYS = _KEYED_DEFAULT_MAX_KEYS
DEFAULT_BULKHEAD_RETRY_AFTER = Nanos(1_000_000_000)

_OPTION_KEYS = (
    "backends",
    "backend",
    "redis_url",
    "redis_fault_policy",
    "redis_key_prefix",
    "headers",
    "response_builder",
    "trusted_proxies",
    "forwarded_header",
    "ipv6_prefix_length",
    "state_endpoint_token",
    "stall_detector",
    "metrics",
    "enabled",
    "control",
)
#: Top-level option holding the named retry budgets (``{name: RetryBudgetConfig fields}``).
RETRY_BUDGETS = "retry_budgets"
_BACKENDS = ("memory", "redis")
#: ``redis_fault_policy``'s values: the backends' fault policies but "local" (what not writing it means).
_FAULT_POLICIES = tuple(p for p in FAULT_POLICIES if p != "local")
#: The ``headers`` option's styles (the one list of them; :mod:`~django_ratelimit_r4.headers` formats each).
DRAFT_10 = "draft-10"
DRAFT_6 = "draft-6"
_HEADER_STYLES = (DRAFT_10, DRAFT_6)
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
#: The shorthand a rate limiter entry may use instead of the two fields it stands for.
RATE = "rate"
_RATE_FIELDS = ("limit_for_period", "limit_refresh_period")
_RATE_HINT = (
    "Write 'rate' as '<count>/<unit>' with unit s, m, h or d, e.g. {\"rate\": \"5/m\"} or {\"rate\": \"100/5m\"}, "
    "or set limit_for_period and limit_refresh_period instead."
)

_TOP_RATE_HINT = 'A rate belongs to a rate limiter: {"ratelimiters": {"instances": {"api": {"rate": "5/m"}}}}.'


def _is_rate(value: object) -> bool:
    try:
        parse_rate(value)
    except RateError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class StallDetectorOptions:
    """``RATELIMIT_R4["stall_detector"]``: the event-loop stall monitor (off by default)."""

    enabled: bool = False
    threshold_ns: int = 20_000_000


#: ``RATELIMIT_R4["control"]["heartbeat_interval"]`` when not written.
DEFAULT_HEARTBEAT_INTERVAL = Nanos(5_000_000_000)
#: The shortest and longest heartbeat interval accepted.
MIN_HEARTBEAT_INTERVAL = Nanos(100_000_000)
MAX_HEARTBEAT_INTERVAL = Nanos(3_600_000_000_000)
#: A worker whose heartbeat is older than this many intervals is gone from ``r4 status``.
HEARTBEAT_TTL_INTERVALS = 3


@dataclass(frozen=True, slots=True)
class ControlOptions:
    """``RATELIMIT_R4["control"]``: one control plane for every worker, through a shared (redis) backend.

    Off unless written: ``{"backend": "shared"}`` names an entry of ``RATELIMIT_R4["backends"]`` whose
    ``BACKEND`` is ``"redis"``. Every worker then publishes a heartbeat every ``heartbeat_interval_ns``
    (gone after :data:`HEARTBEAT_TTL_INTERVALS` of them without one) and applies ``r4 transition`` / ``reset``
    / ``drain`` broadcast on the backend (see :mod:`django_ratelimit_r4.control`).
    """

    backend: str
    heartbeat_interval_ns: int = DEFAULT_HEARTBEAT_INTERVAL

    @property
    def heartbeat_ttl_ns(self) -> int:
        """How long a heartbeat stays: a worker silent for this long is no longer listed."""
        return self.heartbeat_interval_ns * HEARTBEAT_TTL_INTERVALS


@dataclass(frozen=True, slots=True)
class R4Options:
    """The validated top-level options of ``RATELIMIT_R4`` (read by the HTTP and operations layers).

    ``response_builder`` is already imported (a callable or None); ``trusted_proxies`` is an int
    count or a tuple of :mod:`ipaddress` networks, with ``"unix"`` when a peer without an IP address
    (a Unix socket) is trusted; durations are integer nanoseconds.
    """

    backend: str = "memory"
    redis_url: str | None = None
    #: The default ``on_backend_error`` of rate limiters on a redis backend, in the old words: "open" is "allow",
    #: "closed" is "deny"; None (not written) means "local".
    redis_fault_policy: str | None = None
    #: Prefix of every Redis key (several apps or environments can share one Redis).
    redis_key_prefix: str = "r4"
    headers: str | None = "draft-10"
    response_builder: Callable[..., Any] | None = None
    trusted_proxies: int | tuple[IPNetwork | str, ...] = 0
    #: Which header the trusted proxies write: "auto" (either; if both are present and disagree, one
    #: is forged and REMOTE_ADDR is used), "x-forwarded-for" or "forwarded" (the other is ignored).
    forwarded_header: str = "auto"
    #: IPv6 clients are grouped by this prefix: one /64 (a household, a server) is one client.
    ipv6_prefix_length: int = 64
    state_endpoint_token: str | None = None
    stall_detector: StallDetectorOptions = field(default_factory=StallDetectorOptions)
    metrics: bool = True
    #: False makes every decorator and throttle a pass-through (django-ratelimit's RATELIMIT_ENABLE).
    enabled: bool = True


#: The factories of the built-in ``BACKEND`` names (imported by the registry only when used).
BUILTIN_BACKENDS: Mapping[str, str] = MappingProxyType(
    {
        "memory": "django_ratelimit_r4.backends.memory.MemoryStore",
        "redis": "django_ratelimit_r4.backends.redis.RedisStore",
    }
)
#: ``redis_fault_policy`` (the shorthand default) in ``on_backend_error``'s words: the backends' mapping reversed.
_FAULT_POLICY_AS_ON_ERROR = MappingProxyType({p: ON_BACKEND_ERROR_OF[p] for p in _FAULT_POLICIES})
#: The ``OPTIONS`` a redis backend accepts; durations are converted to seconds for redis-py.
REDIS_OPTIONS = (
    "socket_timeout",
    "socket_connect_timeout",
    "max_connections",
    "timeout",
    "key_prefix",
    "cluster",
    "sentinel",
    *(
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_cert_reqs",
        "ssl_check_hostname",
    ),
)
#: The TLS options (redis-py's), valid with a ``rediss://`` LOCATION only.
REDIS_TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
_BACKEND_ENTRY_KEYS = ("BACKEND", "LOCATION", "OPTIONS")
#: The top-level keys that are shorthand for ``backends["default"]``.
_SHORTHAND_KEYS = ("backend", "redis_url", "redis_key_prefix")


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One validated entry of ``RATELIMIT_R4["backends"]``: where rate limiters naming it keep their state.

    ``backend`` is ``"memory"``, ``"redis"`` or the dotted path of a factory
    ``(alias, location, options) -> Store`` (see :class:`django_ratelimit_r4.backends.base.Store`);
    ``options`` are validated for the built-in backends (redis: durations in seconds, ``key_prefix``) and
    passed through as written to a factory.
    """

    alias: str
    backend: str
    location: str | None = None
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: Where it is written (``RATELIMIT_R4["backends"]["shared"]``, or ``RATELIMIT_R4["backend"]`` for the shorthand).
    path: str = ""

    @property
    def factory_path(self) -> str:
        """The dotted path the registry imports to build this backend."""
        return BUILTIN_BACKENDS.get(self.backend, self.backend)

    @property
    def per_process(self) -> bool:
        """True for the memory backend: every process has its own budgets."""
        return self.backend == "memory"


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """Everything needed to build one configured instance: its validated config and extra options."""

    section: str
    name: str
    config: Any
    options: Mapping[str, Any]
    path: str
    #: Where each field or option was written (setting path), for problems found after the spec is built.
    origins: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def kind(self) -> str:
        """Deprecated alias of :attr:`section` (it named the section before 0.2)."""
        warnings.warn("InstanceSpec.kind is deprecated; use InstanceSpec.section", DeprecationWarning, stacklevel=2)
        return self.section


@dataclass(slots=True)
class Analysis:
    """The parsed setting: valid specs, broken instances with their problems, and every problem."""

    raw: Any
    problems: list[Problem] = field(default_factory=list)
    specs: dict[str, dict[str, InstanceSpec]] = field(default_factory=lambda: {s: {} for s in SECTIONS})
    broken: dict[str, dict[str, list[Problem]]] = field(default_factory=lambda: {s: {} for s in SECTIONS})
    #: Problems that make a whole section unusable (not a dict, or the setting itself is not a dict).
    section_problems: dict[str, list[Problem]] = field(default_factory=lambda: {s: [] for s in SECTIONS})
    options: R4Options | None = None
    option_problems: list[Problem] = field(default_factory=list)
    #: Rate limiters made from DRF's ``DEFAULT_THROTTLE_RATES`` (scopes not declared in ``RATELIMIT_R4``).
    drf_scopes: set[str] = field(default_factory=set)
    #: DRF scopes whose rate is ``None``: DRF's way of saying "not throttled".
    unthrottled_scopes: set[str] = field(default_factory=set)
    #: Valid entries of ``RATELIMIT_R4["retry_budgets"]``, by name.
    retry_budgets: dict[str, RetryBudgetConfig] = field(default_factory=dict)
    #: Entries of ``retry_budgets`` that are misconfigured, with their problems.
    broken_retry_budgets: dict[str, list[Problem]] = field(default_factory=dict)
    #: Valid entries of ``RATELIMIT_R4["backends"]`` (``"default"`` always, made from the shorthand if absent).
    backends: dict[str, BackendSpec] = field(default_factory=dict)
    #: Entries of ``backends`` that cannot be built, with their problems (their instances are broken too).
    broken_backends: dict[str, list[Problem]] = field(default_factory=dict)
    #: The validated ``RATELIMIT_R4["control"]``; None when not written or when it has problems (then off).
    control: ControlOptions | None = None

    def names(self, section: str) -> tuple[str, ...]:
        """Every configured instance name of ``section``, valid or broken, in setting order."""
        return tuple(self.specs[section]) + tuple(n for n in self.broken[section] if n not in self.specs[section])


# --------------------------------------------------------------------------------------------- paths


def setting_path(*parts: object) -> str:
    """``setting_path("ratelimiters", "instances", "api")`` -> ``'RATELIMIT_R4["ratelimiters"]["instances"]["api"]'``."""
    return SETTING + "".join(f'["{p}"]' if isinstance(p, str) else f"[{p!r}]" for p in parts)


def _did_you_mean(word: object, options: Iterable[str]) -> str | None:
    if not isinstance(word, str):
        return None
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"Did you mean '{close[0]}'?" if close else None


def _known(options: Iterable[str]) -> str:
    return ", ".join(sorted(options))


#: One invalid value (message, hint), raised by the rules (core.config's and the backends') and by this module's
#: own settings rules; the walkers turn it into a Problem at the setting's path.
_Invalid = InvalidValue


# ------------------------------------------------------------------------------- per-instance extras


def parse_key_spec(value: object) -> str | Callable[..., Any] | None:
    """Deprecated (nothing uses it; it will go in 0.2): use :func:`django_ratelimit_r4.keys.validate_key_spec`.

    Validates a rate limiter ``key`` spec and returns it unchanged; raises ``ValueError`` when unusable.
    """
    warnings.warn(
        "conf.parse_key_spec is deprecated; use django_ratelimit_r4.keys.validate_key_spec",
        DeprecationWarning,
        stacklevel=2,
    )
    try:
        return _parse_key(value)
    except _Invalid as exc:
        raise ValueError(exc.message) from None


def _parse_key(value: object) -> str | Callable[..., Any] | None:
    # keyspec.validate_key_spec is the single source of the key rules (it imports dotted paths).
    try:
        error = validate_key_spec(value)
    except Exception as exc:  # a user module imported by the dotted path may raise anything
        error = f"cannot import key function {value!r}: {exc!r}"
    if error is None:
        return value  # type: ignore[return-value]
    hint = _did_you_mean(value, BUILTIN_KEYS) if isinstance(value, str) and "." not in value else None
    raise _Invalid(
        error,
        hint
        or "Use 'ip', 'user', 'user_or_ip', 'session', 'header:<Name>' or a dotted path to callable(request) -> str | None.",
    )


def _parse_max_keys(value: object) -> int:
    return integer_value(value, minimum=1)


def _parse_retry_after(value: object) -> Nanos:
    nanos = positive_duration_value(value)
    if nanos > MAX_PERIOD_NS:
        raise _Invalid(
            f"must be at most {format_duration(MAX_PERIOD_NS)}, got {format_duration(nanos)}",
            "It is sent as Retry-After with every 503 of this bulkhead: a few seconds is usual.",
        )
    return nanos


def _parse_idle_timeout(value: object) -> Nanos | None:
    return None if value is None else positive_duration_value(value)


def _parse_budget_name(value: object) -> str | None:
    # Only the type here: whether the name exists is checked once every budget is read (_check_retry_budgets).
    if value is None or (isinstance(value, str) and value):
        return value
    raise _Invalid(
        f"must be the name of an entry of {setting_path(RETRY_BUDGETS)} or None, got {value!r}",
        f'Declare the budget once, e.g. {setting_path(RETRY_BUDGETS)} = {{"payments": {{"percent_can_retry": 0.1}}}}, '
        'and write "budget": "payments" in every retry that calls that dependency.',
    )


def _parse_backend_alias(value: object) -> str:
    # Whether the name exists is checked once every backend is known (_bind_backends).
    if not isinstance(value, str) or not value:
        raise _Invalid(
            f"must be the name of an entry of {setting_path('backends')}, got {value!r}",
            'For example "backend": "shared" with RATELIMIT_R4["backends"]["shared"] = '
            '{"BACKEND": "redis", "LOCATION": "redis://127.0.0.1:6379/0"}.',
        )
    return value


def _parse_on_backend_error(value: object) -> str | None:
    try:
        return on_backend_error_value(value)  # the backends' rule
    except _Invalid as exc:
        raise _Invalid(exc.message, _did_you_mean(value, ON_BACKEND_ERROR) or exc.hint) from None


# (parser, default, problem code) of every extra option
_EXTRAS: dict[str, tuple[Callable[[Any], Any], Any, Code]] = {
    "backend": (_parse_backend_alias, "default", Code.UNKNOWN_BACKEND),
    "on_backend_error": (_parse_on_backend_error, None, Code.INVALID_ON_BACKEND_ERROR),
    "key": (_parse_key, None, Code.INVALID_KEY),
    "max_keys": (_parse_max_keys, DEFAULT_MAX_KEYS, Code.INVALID_INSTANCE_OPTION),
    "key_idle_timeout": (_parse_idle_timeout, None, Code.INVALID_INSTANCE_OPTION),
    "retry_after": (_parse_retry_after, DEFAULT_BULKHEAD_RETRY_AFTER, Code.INVALID_INSTANCE_OPTION),
    "budget": (_parse_budget_name, None, Code.UNKNOWN_RETRY_BUDGET),
    "lease_ttl": (lease_ttl_value, DEFAULT_LEASE_TTL, Code.INVALID_INSTANCE_OPTION),
    # The lease's bound (<= limit_for_period) and backend are checked once backends are bound (_check_leases).
    "lease": (lease_value, None, Code.INVALID_LEASE),
}

#: A rate limiter's extra options that its store interprets (the registry passes those set to the store's
#: ``backend_factory`` / ``keyed_store`` as keywords, knowing no store by name): permit leases, a Redis feature.
STORE_OPTIONS: tuple[str, ...] = ("lease",)

#: Extra options whose default differs in one section: a bulkhead stays in-process unless it names a backend.
_SECTION_DEFAULTS: dict[tuple[str, str], Any] = {("bulkheads", "backend"): None, ("circuitbreakers", "backend"): None}


# ------------------------------------------------------------------------------------------ sections


class _SectionReader:
    """Walks one section (``configs`` + ``instances``), resolving inheritance with origin tracking."""

    def __init__(self, section: Section, raw: object, analysis: Analysis) -> None:
        self.section = section
        self.analysis = analysis
        self.problems: list[Problem] = []
        self.allowed = (*section.fields, *section.extras, *section.shorthands, "base_config")
        self.configs: dict[str, Mapping[str, Any]] = {}
        self.instances: dict[str, Mapping[str, Any]] = {}
        # problems of one entry's own keys, keyed by ("configs"|"instances", name)
        self.entry_problems: dict[tuple[str, str], list[Problem]] = {}
        # fields an entry set through a shorthand ("rate"), so their errors point at what was written
        self.written_as: dict[tuple[str, str], dict[str, str]] = {}
        self._read(raw)

    def _add(self, problem: Problem, sink: list[Problem] | None = None) -> None:
        self.analysis.problems.append(problem)
        if sink is not None:
            sink.append(problem)

    def _read(self, raw: object) -> None:
        section = self.section.name
        sink = self.analysis.section_problems[section]
        if not isinstance(raw, Mapping):
            self._add(
                Problem(
                    Code.WRONG_CONTAINER,
                    setting_path(section),
                    f"must be a dict with 'configs' and/or 'instances', got {type(raw).__name__}",
                    'Write it as {"configs": {"default": {...}}, "instances": {"name": {...}}}.',
                ),
                sink,
            )
            return
        for key in raw:
            if key not in ("configs", "instances"):
                self._add(
                    Problem(
                        Code.UNKNOWN_KEY,
                        setting_path(section, key),
                        f"unknown key {key!r}; a section has only 'configs' and 'instances'",
                        _did_you_mean(key, ("configs", "instances")),
                    ),
                    sink,
                )
        for group, target in (("configs", self.configs), ("instances", self.instances)):
            entries = raw.get(group, {})
            if entries is None:
                continue
            if not isinstance(entries, Mapping):
                self._add(
                    Problem(
                        Code.WRONG_CONTAINER,
                        setting_path(section, group),
                        f"must be a dict of name -> options, got {type(entries).__name__}",
                    ),
                    sink,
                )
                continue
            for name, entry in entries.items():
                self._read_entry(group, name, entry, target)

    def _read_entry(
        self, group: str, name: object, entry: object, target: dict[str, Mapping[str, Any]]
    ) -> None:
        section = self.section.name
        if not isinstance(name, str) or not name:
            self._add(
                Problem(
                    Code.WRONG_CONTAINER,
                    setting_path(section, group, name),
                    f"names must be non-empty strings, got {name!r}",
                )
            )
            return
        own: list[Problem] = []
        self.entry_problems[(group, name)] = own
        if not isinstance(entry, Mapping):
            self._add(
                Problem(
                    Code.WRONG_CONTAINER,
                    setting_path(section, group, name),
                    f"must be a dict of options, got {type(entry).__name__}",
                    "Write {} for all defaults.",
                ),
                own,
            )
            entry = {}
        for key in entry:
            if key in self.allowed:
                continue
            hint = _did_you_mean(key, self.allowed)
            owners = [
                k.name
                for k in SECTIONS.values()
                if isinstance(key, str) and (key in k.fields or key in k.extras or key in k.shorthands)
            ]
            if _is_rate(entry[key]) and self.section.name == "ratelimiters":
                hint = f'Write the rate as {{"rate": "{entry[key]}"}}.'
            elif hint is None and owners:
                hint = f"'{key}' belongs to {', '.join(owners)}, not {section}."
            self._add(
                Problem(
                    Code.UNKNOWN_KEY,
                    setting_path(section, group, name, key),
                    f"unknown option {key!r} for {section}",
                    hint or f"Known options: {_known(self.allowed)}.",
                ),
                own,
            )
        if group == "configs" and name == "default" and "base_config" in entry:
            self._add(
                Problem(
                    Code.CIRCULAR_BASE_CONFIG,
                    setting_path(section, group, name, "base_config"),
                    "configs['default'] cannot have a base_config: it is the root every config inherits",
                    "Remove base_config from the default config.",
                ),
                own,
            )
            entry = {k: v for k, v in entry.items() if k != "base_config"}
        if RATE in entry and RATE in self.allowed:
            entry = self._expand_rate(group, name, entry, own)
        target[name] = entry

    def _expand_rate(
        self, group: str, name: str, entry: Mapping[str, Any], own: list[Problem]
    ) -> Mapping[str, Any]:
        """Replace ``"rate": "5/m"`` by the two fields it stands for (or record why it cannot be)."""
        section = self.section.name
        at = setting_path(section, group, name, RATE)
        rest = {k: v for k, v in entry.items() if k != RATE}
        both = [f for f in _RATE_FIELDS if f in entry]
        if both:
            self._add(
                Problem(
                    Code.RATE_CONFLICT,
                    at,
                    f"'rate' stands for limit_for_period and limit_refresh_period, but {' and '.join(both)} is set too",
                    "Keep one spelling: either 'rate' (e.g. '5/m') or limit_for_period + limit_refresh_period.",
                ),
                own,
            )
            return rest
        try:
            limit, period_ns = parse_rate(entry[RATE])
        except RateError as exc:
            self._add(Problem(Code.INVALID_FIELD, at, str(exc), _RATE_HINT), own)
            return rest
        self.written_as[(group, name)] = dict.fromkeys(_RATE_FIELDS, RATE)
        return {**rest, "limit_for_period": limit, "limit_refresh_period": Nanos(period_ns)}

    # ---- inheritance

    def lineage(
        self, group: str, name: str
    ) -> tuple[list[tuple[tuple[str, str], Mapping[str, Any]]], list[Problem]]:
        """Entries from the root config to ``name`` (leaf last), or the problem that stops the walk."""
        section = self.section.name
        source = self.configs if group == "configs" else self.instances
        chain: list[tuple[tuple[str, str], Mapping[str, Any]]] = [((group, name), source[name])]
        visited: list[str] = [name] if group == "configs" else []
        current, current_group, current_name = source[name], group, name
        problems: list[Problem] = []
        while True:
            base = current.get("base_config")
            if base is None:
                if (
                    current_group == "configs" and current_name == "default"
                ) or "default" not in self.configs:
                    break
                base = "default"
            at = setting_path(section, current_group, current_name, "base_config")
            if not isinstance(base, str) or base not in self.configs:
                hint = _did_you_mean(base, self.configs)
                if hint is None:
                    hint = (
                        f"Configured configs: {_known(self.configs)}."
                        if self.configs
                        else f"Define it under {setting_path(section, 'configs')}."
                    )
                problems.append(Problem(Code.UNKNOWN_BASE_CONFIG, at, f"unknown config {base!r}", hint))
                break
            if base in visited:
                cycle = visited[visited.index(base) :]
                start = cycle.index(min(cycle))  # one canonical report per cycle, whoever finds it
                cycle = cycle[start:] + cycle[:start]
                problems.append(
                    Problem(
                        Code.CIRCULAR_BASE_CONFIG,
                        setting_path(section, "configs", cycle[-1], "base_config"),
                        "circular base_config: " + " -> ".join([*cycle, cycle[0]]),
                        "Break the cycle: a config may inherit only from configs that do not inherit from it.",
                    )
                )
                break
            visited.append(base)
            current, current_group, current_name = self.configs[base], "configs", base
            chain.append((("configs", base), current))
        chain.reverse()
        return chain, problems

    def resolve(self, group: str, name: str) -> tuple[InstanceSpec | None, list[Problem]]:
        """Merge ``name``'s lineage, build its config and extras; return the spec or its problems."""
        section = self.section.name
        chain, problems = self.lineage(group, name)
        for entry_id, _entry in chain:
            problems.extend(self.entry_problems.get(entry_id, ()))
        merged: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for (g, n), entry in chain:
            written_as = self.written_as.get((g, n), {})
            for key, value in entry.items():
                if key != "base_config" and key in self.allowed:
                    merged[key] = value
                    origin[key] = setting_path(section, g, n, written_as.get(key, key))

        def where(fld: str) -> str:
            return origin.get(fld, setting_path(section, group, name, fld))

        config = None
        try:
            config = self.section.config_class(**{k: merged[k] for k in self.section.fields if k in merged})
        except ConfigurationError as exc:
            for err in exc.errors:
                hint = err.hint
                if err.field in _RATE_FIELDS and _is_rate(merged.get(err.field)):
                    hint = f'A rate is written as {{"rate": "{merged[err.field]}"}}, not as {err.field}.'
                problems.append(Problem(Code.INVALID_FIELD, where(err.field), err.message, hint))
        except Exception as exc:  # a user module imported by a dotted path may raise anything
            problems.append(
                Problem(Code.INVALID_FIELD, setting_path(section, group, name), f"cannot be built: {exc!r}")
            )
        options: dict[str, Any] = {}
        for extra in self.section.extras:
            parser, default, code = _EXTRAS[extra]
            if extra not in merged:
                options[extra] = _SECTION_DEFAULTS.get((section, extra), default)
                continue
            try:
                options[extra] = parser(merged[extra])
            except _Invalid as exc:
                problems.append(Problem(code, where(extra), exc.message, exc.hint))
        if problems:
            return None, problems
        return InstanceSpec(
            section,
            name,
            config,
            MappingProxyType(options),
            setting_path(section, group, name),
            MappingProxyType({f: where(f) for f in merged}),
        ), []

    def run(self) -> None:
        """Validate every config (used or not) and every instance; record specs and problems."""
        seen = {(p.code, p.path, p.message) for p in self.analysis.problems}
        for group, source in (("configs", self.configs), ("instances", self.instances)):
            for name in source:
                spec, problems = self.resolve(group, name)
                for problem in problems:
                    if (problem.code, problem.path, problem.message) not in seen:
                        seen.add((problem.code, problem.path, problem.message))
                        self.analysis.problems.append(problem)
                if group == "instances":
                    if spec is None:
                        self.analysis.broken[self.section.name][name] = problems
                    else:
                        self.analysis.specs[self.section.name][name] = spec


# ------------------------------------------------------------------------------------------- options


def _option_backend(value: object, raw: Mapping[str, Any]) -> str:
    if not isinstance(value, str) or value.lower() not in _BACKENDS:
        raise _Invalid(f"must be 'memory' or 'redis', got {value!r}", _did_you_mean(value, _BACKENDS))
    return value.lower()


def _option_fault_policy(value: object, raw: Mapping[str, Any]) -> str:
    if not isinstance(value, str) or value.lower() not in _FAULT_POLICIES:
        raise _Invalid(
            f"must be 'open' or 'closed', got {value!r}",
            _did_you_mean(value, _FAULT_POLICIES) or "'open' allows requests while Redis is down, 'closed' rejects them.",
        )
    return value.lower()


def _option_key_prefix(value: object, raw: Mapping[str, Any]) -> str:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise _Invalid(f"must be a non-empty string without spaces, got {value!r}", "For example 'r4' or 'myapp:r4'.")
    return value


def _option_headers(value: object, raw: Mapping[str, Any]) -> str | None:
    if value is None or value is False:
        return None
    if not isinstance(value, str) or value.lower() not in _HEADER_STYLES:
        raise _Invalid(
            f"must be 'draft-10', 'draft-6' or None, got {value!r}",
            _did_you_mean(value, _HEADER_STYLES) or "None turns the RateLimit headers off.",
        )
    return value.lower()


def _call_error(fn: Callable[..., Any], positional: int, **keywords: Any) -> str | None:
    """Why ``fn`` cannot be called with ``positional`` arguments and ``keywords`` (the ``TypeError`` it would raise
    when the package calls it: a 500 at a request), or None; None too when it has no signature to read."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one: the first call will tell
        return None
    try:
        signature.bind(*([None] * positional), **keywords)
    except TypeError as exc:
        return str(exc)
    return None


def _option_response_builder(value: object, raw: Mapping[str, Any]) -> Callable[..., Any] | None:
    hint = (
        "Give a dotted path to callable(request, exc) -> HttpResponse that also takes the keywords status and "
        "retry_after, e.g. 'myproject.responses.too_many'."
    )
    if value is None:
        return None
    builder = callable_value(value, import_hint=hint, hint=hint)
    # How responses.response_for_exception calls it: a mismatch is a TypeError at every 429, a 500.
    error = _call_error(builder, 2, status=429, retry_after=1)
    if error is not None:
        raise _Invalid(f"cannot be called as builder(request, exc, status=..., retry_after=...): {error}", hint)
    return builder


def _option_trusted_proxies(value: object, raw: Mapping[str, Any]) -> int | tuple[IPNetwork | str, ...]:
    # ip.parse_trusted_proxies is the one source of the rule (ClientIPResolver checks with it too).
    try:
        return parse_trusted_proxies(value)
    except ValueError as exc:
        message = str(exc)
    if message.startswith("not valid CIDR networks"):
        hint = (
            "Write networks with their prefix, e.g. '10.0.0.0/8', '2001:db8::/32', '203.0.113.7/32', "
            "and 'unix' to trust a proxy that reaches Django over a Unix socket."
        )
    else:
        hint = "Give the number of proxies in front of Django (e.g. 1) or a list of CIDRs, e.g. ['10.0.0.0/8']."
    raise _Invalid(message, hint)


def _option_ipv6_prefix(value: object, raw: Mapping[str, Any]) -> int:
    try:
        return parse_ipv6_prefix_length(value)  # ip.py's rule, shared with ClientIPResolver
    except ValueError as exc:
        raise _Invalid(str(exc), "64 groups every client of one /64 network.") from None


def _option_forwarded_header(value: object, raw: Mapping[str, Any]) -> str:
    try:
        return parse_forwarded_header(value)  # ip.py's rule, shared with ClientIPResolver
    except ValueError as exc:
        raise _Invalid(
            str(exc),
            "Pin the header your proxy writes, e.g. 'x-forwarded-for' behind nginx or a cloud load balancer.",
        ) from None


_TOKEN_HINT = "Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'."


def token_error(value: object) -> str | None:
    """Why ``value`` (stripped, as the endpoint strips the credentials it is sent) cannot be the state endpoint's
    bearer token, or None. Never shows the value: it is a secret.

    Django reads a header as latin-1 where clients (curl, a browser) send UTF-8, and urllib (``r4 --url``) refuses
    control characters or sends latin-1: a token with a control or a non-ASCII character never matches as written.
    """
    if not isinstance(value, str):
        return f"must be a non-empty string or None, got a {type(value).__name__}"
    if not value.strip():
        return "must be a non-empty string or None, got a blank string"
    if not (value.isascii() and value.strip().isprintable()):
        return "holds a control or non-ASCII character, which no Authorization header carries as written"
    return None


def _option_token(value: object, raw: Mapping[str, Any]) -> str | None:
    if value is None:
        return None
    error = token_error(value)
    if error is not None:
        raise _Invalid(error, _TOKEN_HINT)
    # Stripped, as the endpoint strips the credentials it is sent: a token read from a file keeps its line ending,
    # which never matched (every bearer request a 404) and which r4 --url could not send.
    return cast(str, value).strip()  # a str: token_error says so


def _option_metrics(value: object, raw: Mapping[str, Any]) -> bool:
    return boolean_value(value)


def _option_enabled(value: object, raw: Mapping[str, Any]) -> bool:
    return boolean_value(
        value,
        "False turns every decorator and throttle into a pass-through, e.g. "
        'RATELIMIT_R4["enabled"] = os.environ.get("RATELIMIT_ENABLE", "1") == "1".',
    )


_OPTION_PARSERS: dict[str, tuple[Callable[[Any, Mapping[str, Any]], Any], Code]] = {
    "backend": (_option_backend, Code.INVALID_BACKEND),
    "redis_fault_policy": (_option_fault_policy, Code.INVALID_REDIS_OPTION),
    "redis_key_prefix": (_option_key_prefix, Code.INVALID_REDIS_OPTION),
    "headers": (_option_headers, Code.INVALID_HEADERS),
    "response_builder": (_option_response_builder, Code.INVALID_RESPONSE_BUILDER),
    "trusted_proxies": (_option_trusted_proxies, Code.INVALID_TRUSTED_PROXIES),
    "forwarded_header": (_option_forwarded_header, Code.INVALID_FORWARDED_HEADER),
    "ipv6_prefix_length": (_option_ipv6_prefix, Code.INVALID_IPV6_PREFIX),
    "state_endpoint_token": (_option_token, Code.INVALID_TOKEN),
    "metrics": (_option_metrics, Code.INVALID_METRICS),
    "enabled": (_option_enabled, Code.INVALID_ENABLED),
}


def _parse_stall_detector(value: object, problems: list[Problem]) -> StallDetectorOptions:
    default = StallDetectorOptions()
    if value is None:
        return default
    if not isinstance(value, Mapping):
        problems.append(
            Problem(
                Code.WRONG_CONTAINER,
                setting_path("stall_detector"),
                f"must be a dict, got {type(value).__name__}",
                'Write it as {"enabled": True, "threshold": "20ms"}.',
            )
        )
        return default
    for key in value:
        if key not in ("enabled", "threshold"):
            problems.append(
                Problem(
                    Code.UNKNOWN_KEY,
                    setting_path("stall_detector", key),
                    f"unknown option {key!r}",
                    _did_you_mean(key, ("enabled", "threshold")) or "Known options: enabled, threshold.",
                )
            )
    enabled = default.enabled
    try:
        enabled = boolean_value(value.get("enabled", default.enabled))
    except _Invalid as exc:
        problems.append(
            Problem(Code.INVALID_STALL_DETECTOR, setting_path("stall_detector", "enabled"), exc.message, exc.hint)
        )
    threshold = default.threshold_ns
    if "threshold" in value:
        try:
            threshold = positive_duration_value(value["threshold"])
        except _Invalid as exc:
            problems.append(
                Problem(
                    Code.INVALID_STALL_DETECTOR,
                    setting_path("stall_detector", "threshold"),
                    exc.message,
                    exc.hint,
                )
            )
    return StallDetectorOptions(enabled=enabled, threshold_ns=threshold)


def _parse_options(raw: Mapping[str, Any], analysis: Analysis) -> None:
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    for key, (parser, code) in _OPTION_PARSERS.items():
        if key in raw:
            try:
                values[key] = parser(raw[key], raw)
            except _Invalid as exc:
                problems.append(Problem(code, setting_path(key), exc.message, exc.hint))
    values["stall_detector"] = _parse_stall_detector(raw.get("stall_detector"), problems)
    redis_url = raw.get("redis_url")
    if redis_url is not None and (not isinstance(redis_url, str) or not redis_url.startswith(_REDIS_SCHEMES)):
        problems.append(
            Problem(
                Code.INVALID_REDIS_URL,
                setting_path("redis_url"),
                f"must be a redis://, rediss:// or unix:// URL, got {_shown_url(redis_url)}",
                "For example 'redis://127.0.0.1:6379/0'.",
            )
        )
    elif redis_url is not None and (error := _redis_url_error(redis_url)) is not None:
        problems.append(Problem(Code.INVALID_REDIS_URL, setting_path("redis_url"), error, _REDIS_URL_HINT))
    elif redis_url is not None:
        values["redis_url"] = redis_url
    if values.get("backend") == "redis":
        if importlib.util.find_spec("redis") is None:
            problems.append(
                Problem(
                    Code.REDIS_NOT_INSTALLED,
                    setting_path("backend"),
                    "backend 'redis' needs the redis package, which is not installed",
                    "pip install 'django-ratelimit-r4[redis]'",
                )
            )
        if redis_url is None:
            problems.append(
                Problem(
                    Code.INVALID_REDIS_URL,
                    setting_path("redis_url"),
                    "backend 'redis' needs redis_url",
                    'Set RATELIMIT_R4["redis_url"] = "redis://127.0.0.1:6379/0".',
                )
            )
    analysis.problems.extend(problems)
    analysis.option_problems = problems
    if not problems:
        analysis.options = R4Options(**values)


# ------------------------------------------------------------------------------------------ backends


def _backend_problem(problems: list[Problem], code: Code, path: str, message: str, hint: str | None = None) -> None:
    problems.append(Problem(code, path, message, hint))


def _shown_url(value: object) -> str:
    # A rejected URL may still carry the real password: an error message must not print it.
    return repr(redact_url(value)) if isinstance(value, str) else f"a {type(value).__name__}"


def _parse_redis_location(location: object, at: str, problems: list[Problem]) -> str | None:
    if location is None:
        _backend_problem(
            problems,
            Code.INVALID_REDIS_URL,
            at,
            "a redis backend needs LOCATION",
            'Set it to the server\'s URL, e.g. "LOCATION": "redis://127.0.0.1:6379/0".',
        )
        return None
    if not isinstance(location, str) or not location.startswith(_REDIS_SCHEMES):
        _backend_problem(
            problems,
            Code.INVALID_REDIS_URL,
            at,
            f"must be a redis://, rediss:// or unix:// URL, got {_shown_url(location)}",
            "For example 'redis://127.0.0.1:6379/0'.",
        )
        return None
    error = _redis_url_error(location)
    if error is not None:
        _backend_problem(problems, Code.INVALID_REDIS_URL, at, error, _REDIS_URL_HINT)
        return None
    return location


_REDIS_URL_HINT = "For example 'redis://[:password@]127.0.0.1:6379/0' (the db a number, as the port)."


def _redis_url_error(url: str) -> str | None:
    """Why redis-py cannot use ``url`` (a ValueError at the first request: a 500), or None. The message shows
    the URL redacted and never a query value (``?password=`` is one)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError: not a number, out of range
        if importlib.util.find_spec("redis") is not None:  # (without it: E010 already)
            from redis.connection import parse_url

            parse_url(url)  # type: ignore[no-untyped-call]  # the query values, as redis-py reads them
    except ValueError as exc:
        return f"is not a URL redis-py can use ({exc}): {_shown_url(url)}"
    db = parts.path.strip("/")
    if parts.scheme != "unix" and db and not db.isdigit():
        # redis-py ignores a db it cannot read and uses db 0: another app's or environment's keys, maybe.
        return f"names db {db!r}, which is not a number (redis-py would use db 0 instead): {_shown_url(url)}"
    return None


def _parse_redis_options(options: object, at: str, problems: list[Problem]) -> dict[str, Any]:
    """``OPTIONS`` of a redis backend in redis-py's terms (timeouts in seconds) plus ``key_prefix``."""
    parsed: dict[str, Any] = {}
    if options is None:
        return parsed
    if not isinstance(options, Mapping):
        _backend_problem(
            problems,
            Code.WRONG_CONTAINER,
            at,
            f"must be a dict, got {type(options).__name__}",
            'Write it as {"socket_timeout": "50ms", "key_prefix": "r4"}.',
        )
        return parsed
    for key, value in options.items():
        where = f'{at}["{key}"]' if isinstance(key, str) else f"{at}[{key!r}]"
        if key not in REDIS_OPTIONS:
            _backend_problem(
                problems,
                Code.UNKNOWN_KEY,
                where,
                f"unknown option {key!r} for a redis backend",
                _did_you_mean(key, REDIS_OPTIONS) or f"Known options: {_known(REDIS_OPTIONS)}.",
            )
            continue
        if key in ("cluster", "sentinel") or key in REDIS_TLS_OPTIONS:
            parsed[key] = value  # checked with the LOCATION: _check_redis_topology
            continue
        try:
            if key == "key_prefix":
                parsed[key] = _option_key_prefix(value, {})
            elif key == "max_connections":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise _Invalid(
                        f"must be an integer >= 1, got {value!r}",
                        "Connections per pool (this process's, and each event loop's); 16 by default.",
                    )
                parsed[key] = value
            else:
                parsed[key] = positive_duration_value(value) / 1e9
        except _Invalid as exc:
            _backend_problem(problems, Code.INVALID_REDIS_OPTION, where, exc.message, exc.hint)
    return parsed


def _check_redis_topology(location: str, options: dict[str, Any], at: str, problems: list[Problem]) -> None:
    """E031 for cluster / Sentinel / TLS options that cannot work together or with ``location``; the bad
    options are removed from ``options`` (the backend is not built anyway)."""

    def bad(key: str, message: str, hint: str) -> None:
        _backend_problem(problems, Code.REDIS_TOPOLOGY, f'{at}["{key}"]', message, hint)
        options.pop(key, None)

    from urllib.parse import urlsplit

    parts = urlsplit(location)
    cluster = options.get("cluster", False)
    if not isinstance(cluster, bool):
        bad("cluster", f"must be True or False, got {cluster!r}", '"cluster": True for a Redis Cluster.')
        cluster = False
    elif cluster:
        if parts.scheme == "unix":
            bad("cluster", "a Redis Cluster is reached over TCP, not a unix:// socket",
                'Give any node\'s URL, e.g. "redis://node-a:7000/0".')
        elif parts.path.strip("/") not in ("", "0"):
            bad("cluster", f"a Redis Cluster has only db 0, the LOCATION names db {parts.path.strip('/')!r}",
                "End the LOCATION with /0 (or nothing).")
    if "sentinel" in options:
        if cluster:
            bad("sentinel", "a backend is either a Redis Cluster or a Sentinel-managed primary, not both",
                'Remove "cluster" (Sentinel) or "sentinel" (Cluster).')
        elif importlib.util.find_spec("redis") is not None:  # (without it: E010 already)
            from .backends.redis import sentinel_settings

            try:
                sentinel_settings(location, options["sentinel"])
            except ValueError as exc:
                bad("sentinel", str(exc),
                    'Write "OPTIONS": {"sentinel": ["10.0.0.1:26379", "10.0.0.2:26379"]} with LOCATION '
                    '"redis://[:password@]<service name>/0" (rediss:// for TLS).')
    for key in REDIS_TLS_OPTIONS:
        if key not in options:
            continue
        value = options[key]
        if parts.scheme != "rediss":
            bad(key, f"{key} is a TLS option, but the LOCATION is not rediss://",
                "Use a rediss:// LOCATION for TLS, or remove the ssl_* options.")
        elif key == "ssl_check_hostname":
            if not isinstance(value, bool):
                bad(key, f"must be True or False, got {value!r}", "True checks the server's name (default).")
        elif key == "ssl_cert_reqs":
            if value not in ("required", "optional", "none"):
                bad(key, f"must be 'required', 'optional' or 'none', got {value!r}", "'required' by default.")
        elif not isinstance(value, str) or not os.path.isfile(value):
            bad(key, f"must be the path of a readable file, got {value!r}", "A PEM file (CA, certificate or key).")


def _parse_backend_entry(alias: str, entry: object, problems: list[Problem]) -> BackendSpec | None:
    """Validate one ``backends`` entry; append its problems and return None when it cannot be built."""
    at = setting_path("backends", alias)
    before = len(problems)
    if not isinstance(entry, Mapping):
        _backend_problem(
            problems,
            Code.WRONG_CONTAINER,
            at,
            f"must be a dict with BACKEND (and LOCATION, OPTIONS), got {type(entry).__name__}",
            'For example {"BACKEND": "redis", "LOCATION": "redis://127.0.0.1:6379/0"}.',
        )
        return None
    for key in entry:
        if key not in _BACKEND_ENTRY_KEYS:
            close = _did_you_mean(key.upper() if isinstance(key, str) else key, _BACKEND_ENTRY_KEYS)
            _backend_problem(
                problems,
                Code.UNKNOWN_KEY,
                setting_path("backends", alias, key),
                f"unknown key {key!r} of a backend",
                close or f"Known keys: {', '.join(_BACKEND_ENTRY_KEYS)} (upper case, as in CACHES).",
            )
    backend = entry.get("BACKEND")
    location = entry.get("LOCATION")
    raw_options = entry.get("OPTIONS")
    options: Mapping[str, Any] = {}
    name = backend.lower() if isinstance(backend, str) and backend.lower() in BUILTIN_BACKENDS else backend
    if name == "memory":
        if location is not None:
            _backend_problem(
                problems,
                Code.UNKNOWN_KEY,
                setting_path("backends", alias, "LOCATION"),
                "a memory backend has no LOCATION (its state lives in each process)",
                "Remove LOCATION, or use a redis backend for one budget across processes.",
            )
        if raw_options:
            _backend_problem(
                problems,
                Code.UNKNOWN_KEY,
                setting_path("backends", alias, "OPTIONS"),
                f"a memory backend takes no OPTIONS, got {raw_options!r}",
                "Remove OPTIONS.",
            )
    elif name == "redis":
        if importlib.util.find_spec("redis") is None:
            _backend_problem(
                problems,
                Code.REDIS_NOT_INSTALLED,
                setting_path("backends", alias, "BACKEND"),
                "BACKEND 'redis' needs the redis package, which is not installed",
                "pip install 'django-ratelimit-r4[redis]'",
            )
        location = _parse_redis_location(location, setting_path("backends", alias, "LOCATION"), problems)
        options = _parse_redis_options(raw_options, setting_path("backends", alias, "OPTIONS"), problems)
        if location is not None:
            _check_redis_topology(location, options, setting_path("backends", alias, "OPTIONS"), problems)
    elif isinstance(name, str) and "." in name:
        try:
            factory = import_string(name)
        except Exception as exc:  # a user module imported by the dotted path may raise anything
            _backend_problem(
                problems,
                Code.INVALID_BACKEND,
                setting_path("backends", alias, "BACKEND"),
                f"cannot import {name!r}: {exc}",
                "Give 'memory', 'redis' or a dotted path to callable(alias, location, options) -> Store.",
            )
        else:
            if not callable(factory):
                _backend_problem(
                    problems,
                    Code.INVALID_BACKEND,
                    setting_path("backends", alias, "BACKEND"),
                    f"{name!r} is not callable",
                    "Give a dotted path to callable(alias, location, options) -> Store (a class works).",
                )
            elif (error := _call_error(factory, 3)) is not None:
                # The registry calls factory(alias, location, options) at the first request: a TypeError, a 500 each.
                _backend_problem(
                    problems,
                    Code.INVALID_BACKEND,
                    setting_path("backends", alias, "BACKEND"),
                    f"{name!r} cannot be called as factory(alias, location, options): {error}",
                    "Give a dotted path to callable(alias, location, options) -> Store (a class works).",
                )
        if raw_options is not None and not isinstance(raw_options, Mapping):
            _backend_problem(
                problems,
                Code.WRONG_CONTAINER,
                setting_path("backends", alias, "OPTIONS"),
                f"must be a dict, got {type(raw_options).__name__}",
            )
        else:
            options = dict(raw_options or {})
    else:
        _backend_problem(
            problems,
            Code.INVALID_BACKEND,
            setting_path("backends", alias, "BACKEND"),
            f"must be 'memory', 'redis' or a dotted path to a backend factory, got {backend!r}"
            if backend is not None
            else "BACKEND is missing",
            _did_you_mean(backend, BUILTIN_BACKENDS)
            or "For example \"BACKEND\": \"redis\" with \"LOCATION\": \"redis://127.0.0.1:6379/0\".",
        )
    if len(problems) > before:
        return None
    return BackendSpec(alias, str(name), location, MappingProxyType(dict(options)), at)


def _shorthand_backend(raw: Mapping[str, Any], analysis: Analysis) -> tuple[BackendSpec | None, list[Problem]]:
    """``backends["default"]`` written the old way: top-level backend, redis_url and redis_key_prefix."""
    shorthand_paths = {setting_path(k) for k in (*_SHORTHAND_KEYS, "redis_fault_policy")}
    problems = [p for p in analysis.option_problems if p.path in shorthand_paths]
    if problems:
        return None, problems
    backend = str(raw.get("backend", "memory")).lower()
    if backend == "memory":
        return BackendSpec("default", "memory", path=setting_path("backend")), []
    options = {"key_prefix": raw.get("redis_key_prefix", "r4")}
    return BackendSpec(
        "default", "redis", raw.get("redis_url"), MappingProxyType(options), setting_path("backend")
    ), []


def _parse_backends(raw: Mapping[str, Any], analysis: Analysis) -> None:
    """Fill ``analysis.backends`` / ``broken_backends`` from ``backends`` and the top-level shorthand."""
    section = raw.get("backends")
    entries: Mapping[Any, Any] = {}
    if section is not None and not isinstance(section, Mapping):
        analysis.problems.append(
            Problem(
                Code.WRONG_CONTAINER,
                setting_path("backends"),
                f"must be a dict of name -> backend, got {type(section).__name__}",
                'Write it as {"shared": {"BACKEND": "redis", "LOCATION": "redis://127.0.0.1:6379/0"}}.',
            )
        )
    elif section is not None:
        entries = section
    for alias, entry in entries.items():
        if not isinstance(alias, str) or not alias:
            analysis.problems.append(
                Problem(
                    Code.WRONG_CONTAINER,
                    setting_path("backends", alias),
                    f"names must be non-empty strings, got {alias!r}",
                )
            )
            continue
        problems: list[Problem] = []
        spec = _parse_backend_entry(alias, entry, problems)
        analysis.problems.extend(problems)
        if spec is None:
            analysis.broken_backends[alias] = problems
        else:
            analysis.backends[alias] = spec
    if "default" in entries:
        written = [k for k in _SHORTHAND_KEYS if k in raw]
        if written:
            problem = Problem(
                Code.BACKEND_SHORTHAND_CONFLICT,
                setting_path("backends", "default"),
                f"set twice: here and by the top-level shorthand {', '.join(written)}",
                f"Keep one: move {', '.join(written)} into backends['default'] "
                '(e.g. {"BACKEND": "redis", "LOCATION": <redis_url>, "OPTIONS": {"key_prefix": <redis_key_prefix>}}) '
                "and remove the top-level keys.",
            )
            analysis.problems.append(problem)
            analysis.backends.pop("default", None)
            analysis.broken_backends.setdefault("default", []).append(problem)
        return
    spec, problems = _shorthand_backend(raw, analysis)
    if spec is None:
        analysis.broken_backends["default"] = problems
    else:
        analysis.backends["default"] = spec


def _bind_backends(raw: Mapping[str, Any], analysis: Analysis) -> None:
    """Check the backend name of each rate limiter and bulkhead, and fill in its ``on_backend_error`` default.

    An instance naming an unknown backend, or one whose backend is broken, becomes broken itself (first use
    raises the same problems ``manage.py check`` prints); other instances are unaffected.
    """
    policy = raw.get("redis_fault_policy")
    shorthand = _FAULT_POLICY_AS_ON_ERROR.get(policy.lower(), "local") if isinstance(policy, str) else "local"
    for section in ("ratelimiters", "bulkheads", "circuitbreakers"):
        _bind_section_backends(analysis, section, shorthand)


def _bind_section_backends(analysis: Analysis, section: str, shorthand: str) -> None:
    specs = analysis.specs[section]
    for name, spec in list(specs.items()):
        alias = spec.options["backend"]
        if alias is None:
            continue  # a bulkhead naming no backend: in-process
        backend = analysis.backends.get(alias)
        if backend is None:
            problems = analysis.broken_backends.get(alias)
            if problems is None:
                known = sorted({*analysis.backends, *analysis.broken_backends})
                problem = Problem(
                    Code.UNKNOWN_BACKEND,
                    spec.origins.get("backend", f'{spec.path}["backend"]'),
                    f"unknown backend {alias!r}; configured: {', '.join(repr(k) for k in known)}",
                    _did_you_mean(alias, known)
                    or f'Declare it: {setting_path("backends", alias)} = {{"BACKEND": "redis", "LOCATION": "redis://..."}}.',
                )
                if problem not in analysis.problems:
                    analysis.problems.append(problem)
                problems = [problem]
            del specs[name]
            analysis.broken[section][name] = list(problems)
            continue
        if spec.options.get("on_backend_error", 0) is None and backend.backend == "redis":
            options = {**spec.options, "on_backend_error": shorthand}
            specs[name] = InstanceSpec(
                spec.section, spec.name, spec.config, MappingProxyType(options), spec.path, spec.origins
            )


def per_process_rate_limiters(analysis: Analysis) -> tuple[str, ...]:
    """Rate limiter names whose state lives in each process (a memory backend, or a broken setting)."""

    def on_memory(name: str) -> bool:
        spec = analysis.specs["ratelimiters"].get(name)
        alias = spec.options["backend"] if spec is not None else "default"
        backend = analysis.backends.get(alias)
        return backend is None or backend.per_process

    return tuple(n for n in analysis.names("ratelimiters") if on_memory(n))


# ------------------------------------------------------------------------------------------ analyse


def drf_scope_path(scope: object) -> str:
    """``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["uploads"]``: where a DRF scope's rate is written."""
    return f'{DRF_SETTING}["DEFAULT_THROTTLE_RATES"]' + (f'["{scope}"]' if scope is not None else "")


def _add_drf_scopes(rates: object, analysis: Analysis) -> None:
    """Turn DRF's scopes that ``RATELIMIT_R4`` does not declare into rate limiters, as DRF would limit them.

    ``"uploads": "3/min"`` becomes 3 permits per 60 s, keyed per user or client IP (DRF's identity),
    failing fast (DRF never waits). A ``None`` rate is DRF's "not throttled"; an unreadable rate is a problem
    and the scope a broken instance, so first use raises the same message ``manage.py check`` prints.
    """
    if rates is None:
        return
    if not isinstance(rates, Mapping):
        analysis.problems.append(
            Problem(
                Code.INVALID_DRF_RATE,
                drf_scope_path(None),
                f"must be a dict of scope -> rate, got {type(rates).__name__}",
                'Write it as {"uploads": "3/min"}.',
            )
        )
        return
    declared = set(analysis.names("ratelimiters"))
    for scope, rate in rates.items():
        if not isinstance(scope, str) or not scope or scope in declared:
            continue
        if rate is None:
            analysis.unthrottled_scopes.add(scope)
            continue
        try:
            limit, period_ns = parse_rate(rate)
        except RateError as exc:
            problem = Problem(
                Code.INVALID_DRF_RATE,
                drf_scope_path(scope),
                str(exc).split("; ")[0],
                "Write DRF rates as '<count>/<unit>' (unit s, m, h or d: '3/min', '1000/day') or '<count>/<n><unit>' "
                f"('100/5m'), or declare {scope!r} in {setting_path('ratelimiters', 'instances')}.",
            )
            analysis.problems.append(problem)
            analysis.broken["ratelimiters"][scope] = [problem]
            continue
        try:
            config = RateLimiterConfig(
                limit_for_period=limit, limit_refresh_period=f"{period_ns}ns", timeout_duration="0s"
            )
        except ConfigurationError as exc:
            problem = Problem(Code.INVALID_DRF_RATE, drf_scope_path(scope), "; ".join(e.message for e in exc.errors))
            analysis.problems.append(problem)
            analysis.broken["ratelimiters"][scope] = [problem]
            continue
        options = {
            "key": DRF_SCOPE_KEY,
            "max_keys": DEFAULT_MAX_KEYS,
            "key_idle_timeout": None,
            "backend": "default",
            "on_backend_error": None,
        }
        analysis.specs["ratelimiters"][scope] = InstanceSpec(
            "ratelimiters", scope, config, MappingProxyType(options), drf_scope_path(scope)
        )
        analysis.drf_scopes.add(scope)


def analyse(raw: object, drf_rates: object = None) -> Analysis:
    """Validate a ``RATELIMIT_R4`` value and report every problem in it (never raises).

    ``drf_rates`` is DRF's ``DEFAULT_THROTTLE_RATES`` (see :func:`drf_throttle_rates`): its scopes that
    ``RATELIMIT_R4`` does not declare become rate limiters.
    """
    analysis = Analysis(raw=raw)
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        problem = Problem(
            Code.NOT_A_DICT,
            SETTING,
            f"must be a dict, got {type(raw).__name__}",
            'Write it as RATELIMIT_R4 = {"ratelimiters": {"instances": {"api": {"limit_for_period": 10}}}}.',
        )
        analysis.problems.append(problem)
        analysis.option_problems = [problem]
        for problems in analysis.section_problems.values():
            problems.append(problem)
        return analysis
    allowed = (*SECTIONS, RETRY_BUDGETS, *_OPTION_KEYS)
    for key in raw:
        if key not in allowed:
            analysis.problems.append(
                Problem(
                    Code.UNKNOWN_KEY,
                    setting_path(key),
                    f"unknown key {key!r}",
                    (_TOP_RATE_HINT if key == RATE or _is_rate(raw[key]) else None)
                    or _did_you_mean(key, allowed)
                    or f"Known keys: {_known(allowed)}.",
                )
            )
    for section in SECTIONS.values():
        if section.name in raw:
            _SectionReader(section, raw[section.name], analysis).run()
    _parse_options(raw, analysis)
    _parse_retry_budgets(raw.get(RETRY_BUDGETS), analysis)
    _check_retry_budgets(analysis)
    _parse_backends(raw, analysis)
    _add_drf_scopes(drf_rates, analysis)
    _bind_backends(raw, analysis)
    _parse_control(raw.get("control"), analysis)
    _check_redis_periods(analysis)
    _check_redis_adaptive(analysis)
    _check_leases(analysis)
    _check_breaker_backends(analysis)
    return analysis


_CONTROL_KEYS = ("backend", "heartbeat_interval")
_CONTROL_HINT = 'Write it as {"backend": "shared", "heartbeat_interval": "5s"}, "shared" being a redis entry of backends.'


def _parse_control(value: object, analysis: Analysis) -> None:
    """Read ``RATELIMIT_R4["control"]`` (after the backends): its problems turn the control plane off, nothing else."""
    if value is None:
        return
    problems: list[Problem] = []
    if not isinstance(value, Mapping):
        problems.append(
            Problem(Code.INVALID_CONTROL, setting_path("control"), f"must be a dict, got {type(value).__name__}", _CONTROL_HINT)
        )
        analysis.problems.extend(problems)
        return
    for key in value:
        if key not in _CONTROL_KEYS:
            problems.append(
                Problem(
                    Code.UNKNOWN_KEY,
                    setting_path("control", key),
                    f"unknown option {key!r}",
                    _did_you_mean(key, _CONTROL_KEYS) or f"Known options: {_known(_CONTROL_KEYS)}.",
                )
            )
    alias = value.get("backend")
    at = setting_path("control", "backend")
    redis_aliases = sorted(a for a, b in analysis.backends.items() if b.backend == "redis")
    if alias is None:
        problems.append(Problem(Code.INVALID_CONTROL, at, "is missing: name the redis backend workers share", _CONTROL_HINT))
    elif not isinstance(alias, str) or alias not in analysis.backends:
        if isinstance(alias, str) and alias in analysis.broken_backends:
            message = f"names backend {alias!r}, which is misconfigured"
            hint = f"Fix {setting_path('backends', alias)} (its problems are listed with it)."
        else:
            message = f"names no entry of {setting_path('backends')}: {alias!r}"
            hint = _did_you_mean(alias, analysis.backends) or (
                f"Redis backends configured: {', '.join(repr(a) for a in redis_aliases)}."
                if redis_aliases
                else 'Declare one: RATELIMIT_R4["backends"] = {"shared": {"BACKEND": "redis", "LOCATION": "redis://..."}}.'
            )
        problems.append(Problem(Code.INVALID_CONTROL, at, message, hint))
    elif analysis.backends[alias].backend != "redis":
        problems.append(
            Problem(
                Code.INVALID_CONTROL,
                at,
                f"backend {alias!r} is {analysis.backends[alias].backend!r}; the control plane needs a redis backend "
                "that every worker reaches",
                f"Redis backends configured: {', '.join(repr(a) for a in redis_aliases)}."
                if redis_aliases
                else "Without a shared backend, r4 commands reach one worker (they say which).",
            )
        )
    interval = DEFAULT_HEARTBEAT_INTERVAL
    if "heartbeat_interval" in value:
        try:
            interval = positive_duration_value(
                value["heartbeat_interval"],
                between=(MIN_HEARTBEAT_INTERVAL, MAX_HEARTBEAT_INTERVAL),
                hint=f"A worker is listed until {HEARTBEAT_TTL_INTERVALS} intervals pass without its heartbeat; "
                'the default "5s" suits most.',
            )
        except _Invalid as exc:
            problems.append(
                Problem(Code.INVALID_CONTROL, setting_path("control", "heartbeat_interval"), exc.message, exc.hint)
            )
    analysis.problems.extend(problems)
    if not problems:
        analysis.control = ControlOptions(str(alias), interval)


def _parse_retry_budgets(value: object, analysis: Analysis) -> None:
    """Read ``RATELIMIT_R4["retry_budgets"]``: ``{name: {ttl, min_retries_per_second, percent_can_retry}}``."""
    if value is None:
        return
    where = setting_path(RETRY_BUDGETS)
    if not isinstance(value, Mapping):
        analysis.problems.append(
            Problem(
                Code.WRONG_CONTAINER,
                where,
                f"must be a dict of name -> budget options, got {type(value).__name__}",
                'Write it as {"payments": {"percent_can_retry": 0.1, "min_retries_per_second": 5}}.',
            )
        )
        return
    fields = field_names(RetryBudgetConfig)
    for name, entry in value.items():
        if not isinstance(name, str) or not name:
            analysis.problems.append(
                Problem(Code.WRONG_CONTAINER, setting_path(RETRY_BUDGETS, name), f"names must be non-empty strings, got {name!r}")
            )
            continue
        problems: list[Problem] = []
        if not isinstance(entry, Mapping):
            problems.append(
                Problem(
                    Code.WRONG_CONTAINER,
                    setting_path(RETRY_BUDGETS, name),
                    f"must be a dict of options, got {type(entry).__name__}",
                    "Write {} for Finagle's defaults (10s window, 10 retries/s, 20 % of calls).",
                )
            )
            entry = {}
        for key in entry:
            if key not in fields:
                problems.append(
                    Problem(
                        Code.UNKNOWN_KEY,
                        setting_path(RETRY_BUDGETS, name, key),
                        f"unknown option {key!r} for a retry budget",
                        _did_you_mean(key, fields) or f"Known options: {_known(fields)}.",
                    )
                )
        try:
            config = RetryBudgetConfig(**{k: v for k, v in entry.items() if k in fields})
        except ConfigurationError as exc:
            problems.extend(
                Problem(Code.INVALID_FIELD, setting_path(RETRY_BUDGETS, name, e.field), e.message, e.hint)
                for e in exc.errors
            )
        analysis.problems.extend(problems)
        if problems:
            analysis.broken_retry_budgets[name] = problems
        else:
            analysis.retry_budgets[name] = config


def _check_retry_budgets(analysis: Analysis) -> None:
    """A retry whose ``budget`` names no valid retry budget is broken (E026), the other retries work."""
    specs = analysis.specs["retries"]
    for name, spec in list(specs.items()):
        budget = spec.options.get("budget")
        if budget is None or budget in analysis.retry_budgets:
            continue
        at = spec.origins.get("budget", f'{spec.path}["budget"]')
        if budget in analysis.broken_retry_budgets:
            message = f"names retry budget {budget!r}, which is misconfigured"
            hint = f"Fix {setting_path(RETRY_BUDGETS, budget)} (its problems are listed with it)."
        else:
            message = f"names retry budget {budget!r}, which is not in {setting_path(RETRY_BUDGETS)}"
            known = tuple(analysis.retry_budgets) + tuple(analysis.broken_retry_budgets)
            hint = _did_you_mean(budget, known) or (
                f"Configured budgets: {_known(known)}."
                if known
                else f'Declare it: {setting_path(RETRY_BUDGETS)} = {{"{budget}": {{"percent_can_retry": 0.1}}}}.'
            )
        problem = Problem(Code.UNKNOWN_RETRY_BUDGET, at, message, hint)
        if problem not in analysis.problems:
            analysis.problems.append(problem)
        del specs[name]
        analysis.broken["retries"][name] = [problem]


def _check_leases(analysis: Analysis) -> None:
    """A rate limiter's ``lease`` needs a redis backend, algorithm ``"cycle"`` and at most ``limit_for_period``.

    Only that instance breaks (it raises on use); the others and ``r4 status`` work.
    """
    specs = analysis.specs["ratelimiters"]
    for name, spec in list(specs.items()):
        lease = spec.options.get("lease")
        if lease is None:
            continue
        where = spec.origins.get("lease", f'{spec.path}["lease"]')
        backend = analysis.backends.get(spec.options["backend"])
        limit = int(spec.config.limit_for_period)
        if backend is None or backend.backend != "redis":
            message = (
                f"lease {lease} needs a redis backend (permits are leased from a budget shared through Redis), "
                f"but backend {spec.options['backend']!r} is {'per process' if backend is not None else 'unknown'}"
            )
            hint = (
                f"Point {setting_path('ratelimiters', 'instances', name, 'backend')} at a redis entry of "
                f"{setting_path('backends')}, or remove {where}: an in-memory limiter decides locally already."
            )
        elif spec.config.algorithm != "cycle":
            message = f"lease is implemented for algorithm 'cycle' only, got {spec.config.algorithm!r}"
            hint = (
                f"Remove {where}, or use algorithm 'cycle' "
                f"({setting_path('ratelimiters', 'instances', name, 'algorithm')}): a leased permit dies at its "
                "cycle's end, and gcra and sliding_window have no cycles."
            )
        elif lease > limit:
            message = f"lease {lease} is larger than limit_for_period {limit}"
            hint = f"Use a lease from 1 to {limit}, e.g. {max(1, limit // 10)} (a tenth of the limit)."
        else:
            continue
        problem = Problem(Code.INVALID_LEASE, where, message, hint)
        if problem not in analysis.problems:
            analysis.problems.append(problem)
        del specs[name]
        analysis.broken["ratelimiters"][name] = [problem]


def _check_redis_adaptive(analysis: Analysis) -> None:
    """A cluster-wide (redis) bulkhead cannot be adaptive: its limit lives in Redis, the algorithm in one process."""
    specs = analysis.specs["bulkheads"]
    for name, spec in list(specs.items()):
        backend = analysis.backends.get(spec.options.get("backend"))  # type: ignore[arg-type]
        if spec.config.adaptive is None or backend is None or backend.backend != "redis":
            continue
        problem = Problem(
            Code.ALGORITHM_NOT_ON_BACKEND,
            spec.origins.get("adaptive", f'{spec.path}["adaptive"]'),
            "an adaptive limit is implemented by the in-process bulkhead only, but this bulkhead's backend is 'redis'",
            f"Drop 'adaptive' for the cluster-wide bulkhead, or remove its backend "
            f"({setting_path('bulkheads', 'instances', name, 'backend')}) to keep an adaptive limit per process.",
        )
        if problem not in analysis.problems:
            analysis.problems.append(problem)
        del specs[name]
        analysis.broken["bulkheads"][name] = [problem]


def _check_breaker_backends(analysis: Analysis) -> None:
    """A circuit breaker naming a backend shares its state through it: only a redis backend can (or a custom
    store with a ``circuit_breaker`` method, checked when it is built). A memory backend is an error: a breaker
    without ``backend`` is already per process, and writing one says the author expected it shared."""
    specs = analysis.specs["circuitbreakers"]
    for name, spec in list(specs.items()):
        backend = analysis.backends.get(spec.options.get("backend"))  # type: ignore[arg-type]
        if backend is None or backend.backend != "memory":
            continue
        problem = Problem(
            Code.BREAKER_BACKEND_NOT_SHARED,
            spec.origins.get("backend", f'{spec.path}["backend"]'),
            f"backend {backend.alias!r} is a memory backend, but a circuit breaker's backend must be a redis backend "
            "(its state is shared by every worker through it)",
            f"Name a redis entry of {setting_path('backends')} (e.g. \"backend\": \"shared\" with "
            f'{setting_path("backends", "shared")} = {{"BACKEND": "redis", "LOCATION": "redis://..."}}), or remove '
            f"{setting_path('circuitbreakers', 'instances', name, 'backend')} to keep the breaker per process.",
        )
        if problem not in analysis.problems:
            analysis.problems.append(problem)
        del specs[name]
        analysis.broken["circuitbreakers"][name] = [problem]


def _check_redis_periods(analysis: Analysis) -> None:
    """On a redis backend, a period its script cannot keep exact is an error (found at check time).

    Periods up to ~10.4 days are counted in nanoseconds, longer ones (monthly, yearly quotas) in whole
    microseconds. Only that instance breaks: it raises on use, while the others and ``r4 status`` work.
    """
    from .backends.base import MAX_NS_PERIOD, redis_gcra_error, redis_period_error

    specs = analysis.specs["ratelimiters"]
    for name, spec in list(specs.items()):
        backend = analysis.backends.get(spec.options["backend"])
        if backend is None or backend.backend != "redis":
            continue
        config = spec.config
        error = redis_period_error(int(config.limit_refresh_period))
        if error is not None:
            hint = (
                f"Write it in whole microseconds (ms, s, m, h or d), e.g. '30d'; periods up to "
                f"{format_duration(MAX_NS_PERIOD)} are exact to the nanosecond."
                if "microseconds" in error
                else "Use a shorter period, or a memory backend for this limit "
                f"({setting_path('ratelimiters', 'instances', name, 'backend')})."
            )
        elif config.algorithm == "gcra":
            error = redis_gcra_error(int(config.limit_for_period), int(config.limit_refresh_period), config.burst)
            hint = (
                "Use a smaller burst or a rounder limit (a divisor of the period in ns, or in µs over ~10.4 "
                "days), algorithm 'cycle' or 'sliding_window', or a memory backend for this limit "
                f"({setting_path('ratelimiters', 'instances', name, 'backend')})."
            )
        if error is not None:
            problem = Problem(
                Code.INVALID_FIELD,
                spec.origins.get("limit_refresh_period", f'{spec.path}["limit_refresh_period"]'),
                error,
                hint,
            )
            if problem not in analysis.problems:
                analysis.problems.append(problem)
            del specs[name]
            analysis.broken["ratelimiters"][name] = [problem]


# ------------------------------------------------------------------------------------------ caching

_lock = threading.Lock()
_cached: Analysis | None = None


def raw_setting() -> object:
    """The current ``settings.RATELIMIT_R4`` as written (``{}`` when unset)."""
    from django.conf import settings

    return getattr(settings, SETTING, {})


def drf_throttle_rates() -> object:
    """``settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` as written (None when unset).

    Read from Django's settings, not from DRF's ``api_settings``: DRF need not be installed, and DRF's
    throttle classes bind the rates at import time while this follows ``override_settings``.
    """
    from django.conf import settings

    drf = getattr(settings, DRF_SETTING, None)
    return drf.get("DEFAULT_THROTTLE_RATES") if isinstance(drf, Mapping) else None


def get_analysis() -> Analysis:
    """The analysis of the current ``settings.RATELIMIT_R4`` (and DRF's rates), cached until either changes."""
    global _cached
    analysis = _cached
    if analysis is None:
        with _lock:
            analysis = _cached
            if analysis is None:
                analysis = _cached = analyse(raw_setting(), drf_throttle_rates())
    return analysis


def get_options() -> R4Options:
    """The validated top-level options. Raises ``ImproperlyConfigured`` listing every bad option."""
    analysis = get_analysis()
    if analysis.options is None:
        details = "\n".join(f"  - {p}" for p in analysis.option_problems)
        raise ImproperlyConfigured(f"{SETTING} has invalid options (run `manage.py check`):\n{details}")
    return analysis.options


def get_control() -> ControlOptions | None:
    """The validated ``RATELIMIT_R4["control"]``, or None when it is not written or is misconfigured (then the
    control plane is off and ``manage.py check`` says why)."""
    return get_analysis().control


def clear_cache() -> None:
    """Forget the cached analysis; the next :func:`get_analysis` re-reads the setting."""
    global _cached
    with _lock:
        _cached = None


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in (SETTING, DRF_SETTING):
        clear_cache()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_ratelimit_r4.conf")


#: Old names of :data:`SECTIONS` / :class:`Section` ("kind" named a section before 0.2): still importable, with a
#: DeprecationWarning.
_DEPRECATED_NAMES = {"KINDS": "SECTIONS", "Kind": "Section"}


def __getattr__(name: str) -> Any:
    new = _DEPRECATED_NAMES.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"conf.{name} is deprecated; use conf.{new}", DeprecationWarning, stacklevel=2)
    return globals()[new]
