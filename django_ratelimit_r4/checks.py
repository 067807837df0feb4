"""System checks for ``RATELIMIT_R4``: every mistake at once, each with its setting path and a hint.

The errors come from :func:`django_ratelimit_r4.conf.analyse` (which reuses the config classes'
validators); the ids are the :class:`~django_ratelimit_r4.conf.Code` table. Warnings that depend on
the environment (multi-process deployment, missing optional packages) are computed here.
Silence one with ``SILENCED_SYSTEM_CHECKS = ["ratelimit_r4.W001"]``.

:func:`check_url_names` (tag ``urls``) walks the URLconf, importing the views, and reports every
instance name that routed views use (decorators, ``method_decorator`` on class-based views, DRF
throttles) and that is not configured, with the closest configured name; every permit demand above a limit
(E025); and every group of rate limiters one decorator or throttle decides all-or-nothing that holds a limit whose
third-party backend cannot take part in such a decision (E035, :func:`_group_messages`); and every rate limit keyed
by ``request.user`` or ``request.session`` while no middleware sets it (W007, W009).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import shlex
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.utils.module_loading import import_string

from . import conf
from .backends.base import redact_url
from .conf import Code, Problem
from .core.ratelimiter import most_grantable

__all__ = ["check_settings", "check_url_names", "detect_multiprocess", "problem_to_message"]

_SERVERS = ("gunicorn", "uvicorn", "hypercorn")


def problem_to_message(problem: Problem) -> CheckMessage:
    """Render a :class:`Problem` as a Django check message under its stable id."""
    cls = CheckWarning if problem.code.value.startswith("W") else Error
    return cls(f"{problem.path}: {problem.message}", hint=problem.hint, id=problem.check_id)


def _positive_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _workers_in_args(args: Sequence[str]) -> int | None:
    """The value of ``-w N`` / ``-wN`` / ``--workers N`` / ``--workers=N`` in a command line."""
    found = None
    for i, arg in enumerate(args):
        if arg in ("-w", "--workers") and i + 1 < len(args):
            found = _positive_int(args[i + 1])
        elif arg.startswith("--workers="):
            found = _positive_int(arg.split("=", 1)[1])
        elif arg.startswith("-w") and arg[2:].isdigit():
            found = _positive_int(arg[2:])
    return found


def _names_a_server(arg: str) -> bool:
    """``/venv/bin/gunicorn`` or, under ``python -m gunicorn``, ``.../site-packages/gunicorn/__main__.py``."""
    name = os.path.basename(arg)
    if name == "__main__.py":
        name = os.path.basename(os.path.dirname(arg))
    return name.startswith(_SERVERS)


def detect_multiprocess(environ: Mapping[str, str], argv: Sequence[str]) -> str | None:
    """Describe why the deployment looks multi-process (several workers), or return None.

    Explicit worker counts win (``WEB_CONCURRENCY`` is also gunicorn's and uvicorn's default);
    a gunicorn ``SERVER_SOFTWARE`` without a known count counts as multi-process.
    """
    counts: list[tuple[int, str]] = []
    web = _positive_int(environ.get("WEB_CONCURRENCY"))
    if web is not None:
        counts.append((web, f"WEB_CONCURRENCY={web}"))
    gunicorn_args = environ.get("GUNICORN_CMD_ARGS")
    if gunicorn_args:
        try:
            n = _workers_in_args(shlex.split(gunicorn_args))
        except ValueError:
            n = None
        if n is not None:
            counts.append((n, f"GUNICORN_CMD_ARGS workers={n}"))
    if any(_names_a_server(a) for a in argv[:3]):
        n = _workers_in_args(list(argv))
        if n is not None:
            counts.append((n, f"--workers {n} on the command line"))
    many = [why for n, why in counts if n > 1]
    if many:
        return ", ".join(many)
    software = environ.get("SERVER_SOFTWARE", "")
    if not counts and software.lower().startswith("gunicorn"):
        return f"SERVER_SOFTWARE={software} (worker count unknown)"
    return None


#: W006 for a trusted public network with a shorter prefix: wider than what IANA gives one regional registry (an
#: IPv4 /8, an IPv6 /12), so no proxy fleet spans it; private ranges (10.0.0.0/8, fc00::/7) are never W006.
_WIDEST_PROXY_PREFIX = {4: 8, 6: 12}
#: Where proxies of one's own fleet live: RFC 1918, shared address space (RFC 6598), loopback, link-local, unique
#: local and link-local IPv6. Listed here, not ``is_private``: Python 3.10 calls 0.0.0.0/0 private (both of its
#: ends are), later versions do not.
_PROXY_RANGES = tuple(
    ipaddress.ip_network(net)
    for net in (
        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
        "fc00::/7", "fe80::/10", "::1/128",
    )
)  # fmt: skip


#: W008 below this ``ipv6_prefix_length``: a /32 is the usual allocation to an ISP (RIR policies' minimum), so a
#: shorter prefix makes one bucket of several ISPs' clients.
_ISP_IPV6_PREFIX = 32


def _in_proxy_ranges(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    return any(net.version == space.version and net.subnet_of(space) for space in _PROXY_RANGES)  # type: ignore[arg-type]


def _environment_warnings(
    analysis: conf.Analysis, environ: Mapping[str, str], argv: Sequence[str]
) -> list[Problem]:
    problems: list[Problem] = []
    raw = analysis.raw if isinstance(analysis.raw, Mapping) else {}
    options = analysis.options
    per_process = conf.per_process_rate_limiters(analysis)
    if per_process:
        why = detect_multiprocess(environ, argv)
        if why is not None:
            names = ", ".join(repr(n) for n in per_process)
            problems.append(
                Problem(
                    Code.MEMORY_MULTIPROCESS,
                    conf.setting_path("backend"),
                    f"rate limiters {names} keep their state in memory but this deployment looks multi-process "
                    f"({why}): limits are per process: a limit of 10 becomes 10 x N workers",
                    'Use the redis backend for global quotas (RATELIMIT_R4["backend"] = "redis", or a '
                    'RATELIMIT_R4["backends"] entry named by each instance\'s "backend"), '
                    "or silence ratelimit_r4.W001 if per-process limits are intended.",
                )
            )
    if raw.get("metrics") is True and importlib.util.find_spec("prometheus_client") is None:
        problems.append(
            Problem(
                Code.METRICS_WITHOUT_PROMETHEUS,
                conf.setting_path("metrics"),
                "metrics is True but prometheus_client is not installed, so no metrics are exported",
                "pip install 'django-ratelimit-r4[prometheus]', or remove the metrics option.",
            )
        )
    wide = [
        str(net)
        for net in (options.trusted_proxies if options is not None and isinstance(options.trusted_proxies, tuple) else ())
        if not isinstance(net, str) and not _in_proxy_ranges(net) and net.prefixlen < _WIDEST_PROXY_PREFIX[net.version]
    ]
    if wide:
        problems.append(
            Problem(
                Code.WIDE_TRUSTED_PROXIES,
                conf.setting_path("trusted_proxies"),
                f"{', '.join(wide)} trusts public addresses no proxy fleet spans: every such peer is a trusted proxy, "
                "so any client chooses its own address with X-Forwarded-For (or Forwarded), and a per-IP limit is a "
                "fresh budget per forged header",
                "Name only your proxies' networks (private ranges, your CDN's published CIDRs), or give their "
                "count (e.g. 1) when every request comes through them.",
            )
        )
    prefix = options.ipv6_prefix_length if options is not None else _ISP_IPV6_PREFIX
    if prefix < _ISP_IPV6_PREFIX:
        problems.append(
            Problem(
                Code.WIDE_IPV6_PREFIX,
                conf.setting_path("ipv6_prefix_length"),
                f"{prefix} groups IPv6 clients by their /{prefix}, but a /{_ISP_IPV6_PREFIX} is what a whole ISP is "
                "typically given: one per-IP budget would be shared by an ISP's or a region's IPv6 clients",
                "48-64 is usual; 64 is one customer's subnet (the default), 128 keys each address on its own.",
            )
        )
    token = options.state_endpoint_token if options is not None else None
    if token is not None and len(token) < 32:
        problems.append(
            Problem(
                Code.SHORT_TOKEN,
                conf.setting_path("state_endpoint_token"),
                f"the token is {len(token)} characters long; short tokens can be guessed",
                "Use at least 32 random characters: python -c 'import secrets; print(secrets.token_urlsafe(32))'.",
            )
        )
    return problems


#: W005 above this: a keyed in-memory sliding window could hold that much if its clients used their limits. A client's
#: log grows with use (8 bytes a permit while the permit is in the window, up to ``8 x limit_for_period``), so this
#: is a ceiling reached by permits granted within one period, not by keys made up (a client of one request costs
#: about ``_SLIDING_KEY_BYTES + 32`` bytes whatever the limit).
SLIDING_WINDOW_MEMORY_WARNING = 256 * 1024 * 1024
# The key, its entry and the log object besides the ring's 8 bytes a slot: 390-399 B/key with rings of 4 slots
# (python benchmarks/bench_keyed_memory.py --algorithm sliding_window --limit 100000 100000).
_SLIDING_KEY_BYTES = 360


def _memory_warnings(analysis: conf.Analysis) -> list[Problem]:
    problems: list[Problem] = []
    per_process = set(conf.per_process_rate_limiters(analysis))
    for name, spec in analysis.specs["ratelimiters"].items():
        if name not in per_process or spec.options.get("key") is None or spec.config.algorithm != "sliding_window":
            continue
        limit, max_keys = int(spec.config.limit_for_period), int(spec.options["max_keys"])
        total = max_keys * (8 * limit + _SLIDING_KEY_BYTES)
        if total <= SLIDING_WINDOW_MEMORY_WARNING:
            continue
        problems.append(
            Problem(
                Code.SLIDING_WINDOW_MEMORY,
                spec.path,
                f"a keyed sliding window's log grows with use, 8 bytes a slot, at most twice the permits a client "
                f"held in one window and at most limit_for_period: if up to {max_keys} clients (max_keys) used their "
                f"{limit} permits within one period, that is {max_keys} x (8 bytes x limit_for_period {limit} + "
                f"{_SLIDING_KEY_BYTES}) = {total / 1e9:.1f} GB per process (a client of one request costs about "
                f"{_SLIDING_KEY_BYTES + 32} bytes)",
                f"If clients can use that many permits in one period: use algorithm 'gcra' (one integer per "
                f"client, the same smoothness), lower max_keys to at most "
                f"{max(1, SLIDING_WINDOW_MEMORY_WARNING // (8 * limit + _SLIDING_KEY_BYTES))}, or keep the state "
                "in Redis (backend 'redis'); if they cannot, silence ratelimit_r4.W005.",
            )
        )
    return problems


@register("ratelimit_r4")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report every problem in ``settings.RATELIMIT_R4`` (registered with Django's check framework)."""
    analysis = conf.analyse(conf.raw_setting(), conf.drf_throttle_rates())  # fresh: checks must see the settings as they are now
    problems = analysis.problems + _environment_warnings(analysis, os.environ, sys.argv) + _memory_warnings(analysis)
    return [problem_to_message(p) for p in problems]


# ------------------------------------------------------------------------------------- names in the URLconf

_MAX_DEPTH = 64  # include() nesting; deeper is a loop or a pathological URLconf
_SHOWN_PLACES = 5


def _qualname(obj: object) -> str:
    module = getattr(obj, "__module__", None) or "?"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
    return f"{module}.{name}"


def _route(pattern: object) -> str:
    try:
        return str(getattr(pattern, "pattern", ""))
    except Exception:  # a custom pattern class whose __str__ fails
        return ""


def _routed_views(patterns: object, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """``(route, callback)`` of every URLPattern under ``patterns``; what cannot be imported is skipped.

    Django's own URL checks (``urls.E004``, ...) report broken includes: this check only must not crash.
    """
    if depth > _MAX_DEPTH:
        return
    try:
        entries = list(patterns)  # type: ignore[call-overload]
    except Exception:
        return
    for entry in entries:
        route = prefix + _route(entry)
        if hasattr(type(entry), "url_patterns") or hasattr(entry, "urlconf_name"):  # a URLResolver (include)
            try:
                nested = entry.url_patterns
            except Exception:  # an include() of a module that does not import or has no urlpatterns
                continue
            yield from _routed_views(nested, route, depth + 1)
            continue
        callback = getattr(entry, "callback", None)
        if callable(callback):
            yield route, callback


class _ViewAttrs:
    """A DRF view's attributes as an instance would see them: ``as_view()``'s initkwargs over the class."""

    def __init__(self, cls: type, initkwargs: Mapping[str, Any]) -> None:
        self._cls = cls
        self._initkwargs = initkwargs

    def __getattr__(self, name: str) -> Any:
        if name in self._initkwargs:
            return self._initkwargs[name]
        return getattr(self._cls, name)


def _class_functions(cls: type) -> Iterator[Any]:
    """Functions defined on ``cls`` and its bases (``method_decorator`` puts its wrapper there)."""
    for klass in cls.__mro__:
        for value in list(vars(klass).values()):
            value = getattr(value, "__func__", value)  # staticmethod / classmethod
            if callable(value) and not isinstance(value, type):
                yield value


def _rate_limiter_throttles(cls: type, initkwargs: Mapping[str, Any]) -> Iterator[tuple[Any, Any]]:
    """``(the view's attributes, throttle class)`` of every RateLimiterThrottle class on the view."""
    try:
        from .rest_framework import RateLimiterThrottle
    except ImportError:  # DRF not installed: no DRF views either
        return
    view = _ViewAttrs(cls, initkwargs)
    throttles = getattr(view, "throttle_classes", None) or ()
    if isinstance(throttles, str | bytes) or not isinstance(throttles, Iterable):
        return
    for throttle in throttles:
        if isinstance(throttle, type) and issubclass(throttle, RateLimiterThrottle):
            yield view, throttle


def _drf_throttle_names(cls: type, initkwargs: Mapping[str, Any]) -> Iterator[tuple[str, bool]]:
    """``(rate limiter name, named explicitly)`` of the view's RateLimiterThrottle classes."""
    for view, throttle in _rate_limiter_throttles(cls, initkwargs):
        yield from throttle.referenced_names(view)


def _view_names(callback: Any) -> Iterator[tuple[str, str, bool, str]]:
    """``(section, name, named explicitly, view)`` of every instance name a routed callback uses."""
    from .decorators import referenced_names

    cls = getattr(callback, "view_class", None) or getattr(callback, "cls", None)  # Django / DRF as_view()
    if not isinstance(cls, type):
        cls = None
    # as_view() copies dispatch's attributes onto its function: name the class, not that function.
    where = _qualname(cls if cls is not None else callback)
    for section, name in referenced_names(callback):
        yield section, name, True, where
    if cls is None:
        return
    for fn in _class_functions(cls):
        for section, name in referenced_names(fn):
            yield section, name, True, where
    initkwargs = getattr(callback, "initkwargs", None)
    for name, explicit in _drf_throttle_names(cls, initkwargs if isinstance(initkwargs, Mapping) else {}):
        yield "ratelimiters", name, explicit, where


def _drf_groups(cls: type, initkwargs: Mapping[str, Any]) -> Iterator[tuple[tuple[str, ...], bool]]:
    """``(names, key_override)`` of every RateLimiterThrottle on the view deciding several names at once (its
    ``rate_limiter`` list; the drop-ins decide one scope each)."""
    for view, throttle in _rate_limiter_throttles(cls, initkwargs):
        from .rest_framework import _ScopeThrottle  # importable: _rate_limiter_throttles found DRF

        if not issubclass(throttle, _ScopeThrottle):
            names = tuple(name for name, explicit in throttle.referenced_names(view) if explicit)
            if len(names) > 1:
                yield names, False  # the throttle's gate has no key=: each instance's own key option


def _view_groups(callback: Any) -> Iterator[tuple[tuple[str, ...], bool, str]]:
    """``(names, key_override, view)`` of every group of rate limiters a routed view decides all-or-nothing."""
    from .decorators import decision_groups

    cls = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if not isinstance(cls, type):
        cls = None
    where = _qualname(cls if cls is not None else callback)
    for group in decision_groups(callback):
        yield group.names, group.key_override, where
    if cls is None:
        return
    for fn in _class_functions(cls):
        for group in decision_groups(fn):
            yield group.names, group.key_override, where
    initkwargs = getattr(callback, "initkwargs", None)
    for names, key_override in _drf_groups(cls, initkwargs if isinstance(initkwargs, Mapping) else {}):
        yield names, key_override, where


def _drf_permits(cls: type, initkwargs: Mapping[str, Any]) -> Iterator[tuple[str, int]]:
    """``(rate limiter name, rate_limiter_permits)`` of the view's RateLimiterThrottle classes, when above 1."""
    try:
        from .rest_framework import RateLimiterThrottle, _ScopeThrottle
    except ImportError:
        return
    view = _ViewAttrs(cls, initkwargs)
    permits = getattr(view, "rate_limiter_permits", 1)
    throttles = getattr(view, "throttle_classes", None) or ()
    if not isinstance(permits, int) or permits <= 1 or isinstance(throttles, str | bytes):
        return
    if not isinstance(throttles, Iterable):
        return
    for throttle in throttles:
        # The drop-ins (AnonRateThrottle, ...) always take 1 permit; only RateLimiterThrottle reads the view's.
        if (
            isinstance(throttle, type)
            and issubclass(throttle, RateLimiterThrottle)
            and not issubclass(throttle, _ScopeThrottle)
        ):
            for name, _ in throttle.referenced_names(view):
                yield name, permits


def _drf_argument_errors(cls: type, initkwargs: Mapping[str, Any]) -> Iterator[str]:
    """What each RateLimiterThrottle on the view would raise at every request, built from the same arguments as
    ``rest_framework._bound_gate``: the view's ``rate_limiter`` (or ``throttle_scope``), ``rate_limiter_permits``
    and ``rate_limiter_methods``, or a drop-in class's ``scope``, ``key`` and ``methods``."""
    from .gate import RateLimitGate
    from .keyspec import validate_key_spec

    for view, throttle in _rate_limiter_throttles(cls, initkwargs):
        from .rest_framework import _ScopeThrottle  # importable: _rate_limiter_throttles found DRF

        key: Any = None
        if issubclass(throttle, _ScopeThrottle):
            names: Any = throttle.scope
            permits: Any = 1
            key, methods = throttle.key, throttle.methods
            origin = f"throttle class {_qualname(throttle)}"
        else:
            names = getattr(view, "rate_limiter", None) or getattr(view, "throttle_scope", None)
            if not names:
                continue  # not throttled
            permits = getattr(view, "rate_limiter_permits", 1)
            methods = getattr(view, "rate_limiter_methods", None)
            origin = "rate_limiter / rate_limiter_permits / rate_limiter_methods"
        try:
            RateLimitGate(names, key=key, permits=permits, methods=methods)
            error = validate_key_spec(key)  # the gate imports a dotted path at first use only; the check may
        except (TypeError, ValueError) as exc:
            error = str(exc)
        if error is not None:
            yield f"{origin}: {error}"


def _view_permits(callback: Any) -> Iterator[tuple[str, int, str]]:
    """``(rate limiter name, permits per request, view)`` of every demand above 1 permit a routed view makes."""
    from .decorators import permit_demands

    cls = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if not isinstance(cls, type):
        cls = None
    where = _qualname(cls if cls is not None else callback)
    for name, permits in permit_demands(callback):
        yield name, permits, where
    if cls is None:
        return
    for fn in _class_functions(cls):
        for name, permits in permit_demands(fn):
            yield name, permits, where
    initkwargs = getattr(callback, "initkwargs", None)
    for name, permits in _drf_permits(cls, initkwargs if isinstance(initkwargs, Mapping) else {}):
        yield name, permits, where


def _view_argument_errors(callback: Any) -> Iterator[tuple[str, str]]:
    """``(error, view)`` of every decorator key path that cannot be imported and every DRF throttle whose arguments
    fail every request on a routed view (E036)."""
    from .decorators import key_paths
    from .keyspec import validate_key_spec

    cls = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if not isinstance(cls, type):
        cls = None
    where = _qualname(cls if cls is not None else callback)
    for fn in (callback, *(_class_functions(cls) if cls is not None else ())):
        for key in sorted(key_paths(fn)):
            error = validate_key_spec(key)
            if error is not None:
                yield f"key={key!r}: {error}", where
    if cls is None:
        return
    initkwargs = getattr(callback, "initkwargs", None)
    for error in _drf_argument_errors(cls, initkwargs if isinstance(initkwargs, Mapping) else {}):
        yield error, where


def _drf_view_class(cls: type) -> bool:
    """Whether ``cls`` is a DRF ``APIView``: its handlers get DRF's ``Request``, not Django's ``HttpRequest``."""
    try:
        from rest_framework.views import APIView
    except ImportError:  # DRF not installed: no DRF views either
        return False
    return issubclass(cls, APIView)


#: Who gave a limit its ``key=`` in a W007 / W009 message when it is not the instance's ``key`` option.
_BY_DECORATOR = "the decorator"


def _view_key_uses(callback: Any) -> Iterator[tuple[str, str | None, str, bool, str]]:
    """``(rate limiter name, key= or None, declared by, on Django's HttpRequest, view)`` of every rate limit of a
    routed view: its decorators' (``key=`` None when the instance's ``key`` option decides) and its DRF throttles'
    (a drop-in's ``key``; None for ``RateLimiterThrottle``). On a DRF ``APIView`` only ``dispatch`` gets Django's
    ``HttpRequest`` (``method_decorator`` puts its wrapper there); its handlers and throttles get DRF's ``Request``,
    whose ``user`` DRF's authentication classes set (not W007's business) but whose ``session`` is still the
    ``HttpRequest``'s (W009's)."""
    from .decorators import key_uses

    cls = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if not isinstance(cls, type):
        cls = None
    where = _qualname(cls if cls is not None else callback)
    drf = cls is not None and _drf_view_class(cls)
    dispatch = {id(vars(klass).get("dispatch")) for klass in cls.__mro__} if drf and cls is not None else set()
    for fn in (callback, *(_class_functions(cls) if cls is not None else ())):
        on_http_request = fn is callback or not drf or id(fn) in dispatch
        for use in key_uses(fn):
            for name in use.names:
                yield name, use.key, _BY_DECORATOR, on_http_request, where
    if not drf or cls is None:
        return
    from .rest_framework import _ScopeThrottle  # importable: the view is DRF's

    initkwargs = getattr(callback, "initkwargs", None)
    for view, throttle in _rate_limiter_throttles(cls, initkwargs if isinstance(initkwargs, Mapping) else {}):
        key = throttle.key if issubclass(throttle, _ScopeThrottle) else None  # None: the instance's key option
        if key is not None and not isinstance(key, str):
            key = "<not a key string>"  # a callable, or what E036 reports: none of the built-in specs (hashable)
        for name, _ in throttle.referenced_names(view):
            yield name, key, f"throttle class {_qualname(throttle)}", False, where


#: The key specs that read ``request.user``, and what a request without it gets (W007).
_USER_KEYS = {
    "user": ("keyed by the user", "every request is exempt from this limit (not limited)"),
    "user_or_ip": (
        "keyed by the user, else the client IP",
        "every request is keyed by its client IP, never per user: users behind one address share a budget",
    ),
}
_AUTHENTICATION_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"
#: The key specs that read ``request.session``, and what a request without it gets (W009).
_SESSION_KEYS = {
    "session": (
        "keyed by the session, else the client IP",
        "every request is keyed by its client IP, never per session: clients behind one address share a budget",
    ),
}
_SESSION_MIDDLEWARE = "django.contrib.sessions.middleware.SessionMiddleware"


def _has_middleware(middleware: Iterable[Any], wanted: str) -> bool:
    """Whether ``MIDDLEWARE`` holds the middleware at dotted path ``wanted`` or a subclass of it."""
    middleware = [m for m in middleware if isinstance(m, str)]
    if wanted in middleware:
        return True  # the usual case: nothing imported
    try:
        base = import_string(wanted)
    except Exception:  # its contrib app unusable: nothing can subclass its middleware
        return False
    for path in middleware:
        try:
            cls = import_string(path)
        except Exception:  # Django reports a middleware that does not import when it loads them
            continue
        if isinstance(cls, type) and issubclass(cls, base):
            return True
    return False


def _limits_keyed_by(
    analysis: conf.Analysis, uses: Mapping[tuple[str, str | None, str], list[str]], specs: Mapping[str, Any]
) -> dict[tuple[str, str, str], list[str]]:
    """``(rate limiter name, key spec, where the key is set) -> views`` of the ``uses`` whose key is in ``specs``:
    the ``key=`` given (by a decorator or a drop-in throttle class), else the instance's ``key`` option."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for (name, key, declared_by), places in uses.items():
        if key is None:  # the instance's key option decides
            spec = analysis.specs["ratelimiters"].get(name)
            option = spec.options.get("key") if spec is not None else None
            if not isinstance(option, str) or option not in specs:
                continue
            assert spec is not None
            spec_key: str = option
            where = spec.origins.get("key", f'{spec.path}["key"]')
            origin = f"{where} = {option!r}"
        elif key in specs:
            spec_key, origin = key, f"key={key!r} of {declared_by}"
        else:
            continue
        merged = found.setdefault((name, spec_key, origin), [])
        merged.extend(place for place in places if place not in merged)
    return found


def _key_without_middleware_messages(
    analysis: conf.Analysis,
    uses: Mapping[tuple[str, str | None, str], list[str]],
    keys: Mapping[str, tuple[str, str]],
    middleware: str,
    attribute: str,
    code: Code,
    fix: str,
) -> list[CheckMessage]:
    """``code`` for every rate limit of a routed view keyed by ``request.<attribute>`` (one of ``keys``: a
    decorator's or drop-in throttle's ``key=``, or the instance's ``key`` option) while ``middleware``, which
    sets it, is not in MIDDLEWARE (nor a subclass): the key then silently does what ``keys`` says."""
    found = _limits_keyed_by(analysis, uses, keys)
    if not found:
        return []
    from django.conf import settings

    if _has_middleware(getattr(settings, "MIDDLEWARE", None) or (), middleware):
        return []
    messages: list[CheckMessage] = []
    for (name, spec_key, origin), places in found.items():
        keyed, outcome = keys[spec_key]
        messages.append(
            CheckWarning(
                f"{_places(places)}: rate limiter {name!r} is {keyed} ({origin}), but {middleware} "
                f"is not in MIDDLEWARE, so requests have no request.{attribute}: {outcome}",
                hint=f"Add {middleware!r} to MIDDLEWARE {fix}; if a middleware of your own sets "
                f"request.{attribute}, silence {code.check_id}.",
                id=code.check_id,
            )
        )
    return messages


def _permits_messages(analysis: conf.Analysis, demands: dict[tuple[str, int], list[str]]) -> list[CheckMessage]:
    """E025 for every view asking for more permits per request than its limiter's cycle holds."""
    messages: list[CheckMessage] = []
    for (name, permits), places in demands.items():
        spec = analysis.specs["ratelimiters"].get(name)
        if spec is None:
            continue  # an unknown or broken limiter is reported as such
        limit = most_grantable(spec.config, 0)  # limit_for_period, or burst for gcra
        if permits <= limit:
            continue
        field = "burst" if spec.config.algorithm == "gcra" and spec.config.burst is not None else "limit_for_period"
        where = spec.origins.get(field, f'{spec.path}["{field}"]')
        messages.append(
            Error(
                f"{_places(places)}: asks for {permits} permits per request, but rate limiter {name!r} allows only "
                f"{limit} {'at once' if field == 'burst' else 'per period'} ({where}): no request could ever be admitted, and every 429 would promise "
                "a Retry-After that never comes true",
                hint=f"Lower permits= (or rate_limiter_permits) to at most {limit}, or raise {where}.",
                id=Code.PERMITS_ABOVE_LIMIT.check_id,
            )
        )
    return messages


# What holds a limit's state, as far as the setting and the factory's class tell without building anything.
_MEMORY = "memory"  # our in-process stores (keyed.py decides them all-or-nothing under their locks)
_REDIS = "redis"  # our Redis stores (one script per connection; memory + Redis: the mixed path)
_LOCAL_THIRD_PARTY = "third party, in process"  # only the protocols: no step in a decision over several limits
_UNKNOWN = "unknown"  # known only once built: the check says nothing (the first request still raises)


def _holder_kind(backend: conf.BackendSpec, keyed: bool) -> str:
    """What a keyed (``keyed_store``) or unkeyed (``backend_factory``) limit on ``backend`` is decided by.

    A ``BACKEND`` dotted path is imported (``conf.analyse`` already imported it to validate it) but never called,
    so nothing is built or connected at check time. A factory class declaring ``per_process = True`` (the
    ``Store`` attribute: its state lives in this process) whose method is not the memory store's own holds that
    limit in a third party's holder, which has only the protocols; a memory store subclass keeping the method
    holds it in ours. Anything else (a function factory, a store whose state is shared, whose holders may be
    remote and decided alone or through ``AllOrNothingPlace``) is unknown until built.
    """
    if backend.backend in conf.BUILTIN_BACKENDS:
        return backend.backend
    try:
        factory = import_string(backend.factory_path)
    except Exception:  # reported by check_settings (E009)
        return _UNKNOWN
    if not isinstance(factory, type) or getattr(factory, "per_process", None) is not True:  # a property: unknown
        return _UNKNOWN
    from .backends.memory import MemoryStore

    method = "keyed_store" if keyed else "backend_factory"
    if issubclass(factory, MemoryStore) and getattr(factory, method, None) is getattr(MemoryStore, method):
        return _MEMORY
    return _LOCAL_THIRD_PARTY


#: ``(name, alias, keyed, kind)`` of one limit of a decision group.
_Member = tuple[str, str, bool, str]


def _group_members(analysis: conf.Analysis, names: tuple[str, ...], key_override: bool) -> list[_Member] | None:
    """Each limit of a group as the gate would build it (a DRF scope with a None rate is left out, as the throttle
    does); None when a name is not a valid rate limiter (E024 or the settings check reports that first)."""
    members: list[_Member] = []
    for name in names:
        if name in analysis.unthrottled_scopes:
            continue
        spec = analysis.specs["ratelimiters"].get(name)
        backend = analysis.backends.get(spec.options.get("backend", "default")) if spec is not None else None
        if spec is None or backend is None:
            return None
        keyed = key_override or spec.options.get("key") is not None
        members.append((name, backend.alias, keyed, _holder_kind(backend, keyed)))
    return members


def _not_combinable(members: list[_Member]) -> Iterator[tuple[_Member, str]]:
    """``(limit, why)`` for each limit of a group of two or more that the first request cannot decide with the
    others, as keyed.py finds it:

    * a keyed limit in a third party's in-process store: ``_acquire_memory`` raises ``TypeError``
      (``_not_combinable``): the ``KeyedBackend`` protocol has no all-or-nothing step;
    * an unkeyed one with an unkeyed in-process limit of another store: one ``acquire_many`` over both, which
      decides only backends of its own kind (``backends.memory.acquire_many`` raises ``TypeError``, and the
      protocol asks the same of a third party's);
    * an unkeyed one with a Redis limit: the mixed path takes it first and, when Redis refuses, gives it back
      with ``give_back``, which the protocol does not have (``keyed._refuse_without_give_back`` raises ``TypeError``
      before anything is taken).
    """
    if len(members) < 2:
        return
    for member in members:
        _, alias, keyed, kind = member
        if kind != _LOCAL_THIRD_PARTY:
            continue
        if keyed:
            yield member, "whose keyed store has only the KeyedBackend protocol: it decides its limits one at a time"
            continue
        other = next(
            (m for m in members if not m[2] and m[3] in (_MEMORY, _LOCAL_THIRD_PARTY) and m[1] != alias), None
        )
        if other is not None:
            yield member, (
                "whose backend decides several limits at once only with backends of its own store "
                f"(acquire_many), not with {other[0]!r}'s (backend {other[1]!r})"
            )
            continue
        remote = next((m for m in members if m[3] == _REDIS), None)
        if remote is not None:
            yield member, (
                f"whose backend cannot give a permit back (the protocol has no give_back), which a decision with "
                f"{remote[0]!r} (backend {remote[1]!r}, Redis) needs when Redis refuses"
            )


_UNSET = object()  # an option a connection does not have (None may be a value)


def _redis_connections(analysis: conf.Analysis, members: list[_Member]) -> list[list[_Member]] | None:
    """The group's Redis limits by the connection each is decided on, in the group's order, when there are two or
    more connections (``keyed._remote_decider`` raises ``TypeError``: one all-or-nothing script per connection);
    None otherwise.

    Mirrors the runtime from the setting alone: a :class:`~.backends.redis.RedisStore` builds every limit (keyed
    or not, any algorithm, leased or not) on ``connection(LOCATION, OPTIONS but key_prefix)``, one per
    :func:`~.backends.redis.connection_ident` (the URL as written, the options as validated): two aliases with
    those equal share one; a different ``key_prefix`` alone does not make another. Nothing is connected.
    """
    remote = [m for m in members if m[3] == _REDIS]
    if len(remote) < 2:
        return None
    try:
        from .backends.redis import connection_ident, store_options
    except ImportError:  # no redis package: E010 already, and the backend was not parsed
        return None
    by_ident: dict[Any, list[_Member]] = {}
    for member in remote:
        backend = analysis.backends[member[1]]
        by_ident.setdefault(connection_ident(backend.location or "", store_options(backend.options)[1]), []).append(
            member
        )
    return list(by_ident.values()) if len(by_ident) > 1 else None


def _connections_message(
    analysis: conf.Analysis, names: tuple[str, ...], places: list[str], split: list[list[_Member]]
) -> CheckMessage:
    """E035 for a group whose Redis limits are on several connections: each connection's limits, backends, URL
    (its password redacted) and the options that tell it from the others."""
    from .backends.redis import store_options

    options = [store_options(analysis.backends[on[0][1]].options)[1] for on in split]
    differ = sorted({k for opts in options for k in opts if any(o.get(k, _UNSET) != opts[k] for o in options)})
    described = []
    for on, opts in zip(split, options, strict=True):
        backend = analysis.backends[on[0][1]]
        limits = ", ".join(f"{m[0]!r} (backend {m[1]!r})" for m in on)
        shown = ", ".join(f"{k}={opts[k]!r}" if k in opts else f"no {k}" for k in differ)
        described.append(f"{limits} at {redact_url(backend.location or '')}" + (f" ({shown})" if shown else ""))
    moved = [
        analysis.specs["ratelimiters"][m[0]].origins.get(
            "backend", conf.setting_path("ratelimiters", "instances", m[0], "backend")
        )
        for on in split[1:]
        for m in on
    ]
    return Error(
        f"{_places(places)}: decides rate limiters {list(names)!r} all-or-nothing, but they are on {len(split)} "
        f"different Redis connections, which one script cannot reach together: {'; '.join(described)}; the first "
        "request would fail with TypeError",
        hint="Put them on one redis backend, or on backends with the same LOCATION and the same OPTIONS but "
        f"key_prefix (one connection): {', '.join(dict.fromkeys(moved))}; or decide the limits of each connection "
        "in a @ratelimit of its own (stacked: each decorator decides on its own).",
        id=Code.NOT_ALL_OR_NOTHING.check_id,
    )


def _group_messages(
    analysis: conf.Analysis, groups: dict[tuple[tuple[str, ...], bool], list[str]]
) -> list[CheckMessage]:
    """E035 for every limit of a decision group that the first request could not decide with the others, and for
    a group whose Redis limits are on several connections."""
    messages: list[CheckMessage] = []
    for (names, key_override), places in groups.items():
        members = _group_members(analysis, names, key_override)
        split = _redis_connections(analysis, members or [])
        if split is not None:
            messages.append(_connections_message(analysis, names, places, split))
        for (name, alias, keyed, _), why in _not_combinable(members or []):
            spec = analysis.specs["ratelimiters"][name]
            factory = analysis.backends[alias].factory_path
            where = spec.origins.get("backend", conf.setting_path("ratelimiters", "instances", name, "backend"))
            messages.append(
                Error(
                    f"{_places(places)}: decides rate limiters {list(names)!r} all-or-nothing, but {name!r} is "
                    f"{'keyed' if keyed else 'unkeyed'} on backend {alias!r} ({factory}, a third-party store kept "
                    f"in each process), {why}; the first request would fail with TypeError",
                    hint=f"Decide {name!r} in its own @ratelimit (stacked with one for the others), or give it a "
                    f"memory or redis backend ({where}).",
                    id=Code.NOT_ALL_OR_NOTHING.check_id,
                )
            )
    return messages


def _places(places: list[str]) -> str:
    shown = ", ".join(places[:_SHOWN_PLACES])
    more = len(places) - _SHOWN_PLACES
    return shown + (f" (and {more} more)" if more > 0 else "")


def _unknown_name_message(
    analysis: conf.Analysis, section: str, name: str, explicit: bool, places: list[str], known: Sequence[str]
) -> CheckMessage:
    section_info = conf.SECTIONS[section]
    where = conf.setting_path(section, "instances")
    close = conf._did_you_mean(name, known)
    listing = ", ".join(repr(n) for n in known) if known else "none"
    if not explicit:
        drf = conf.drf_scope_path(None)
        return CheckWarning(
            f"{_places(places)}: throttle_scope {name!r} names no rate limiter in {where} and no scope in {drf}: "
            "RateLimiterThrottle does not limit this view",
            hint=(close + " " if close else "") + f"Declare it in {where} or {drf}, or fix the scope.",
            id=Code.UNKNOWN_THROTTLE_SCOPE.check_id,
        )
    hint = f"Declare it in {where}"
    if section == "ratelimiters":
        hint += f" or give it a rate in {conf.drf_scope_path(None)}"
    hint += f", or fix the name (configured: {listing})."
    if section == "ratelimiters" and conf._is_rate(name):
        hint = (
            f"{name!r} is a rate, not a name: declare an instance with it, e.g. "
            f'{conf.setting_path(section, "instances", "api")} = {{"rate": "{name}"}}, and use that name.'
        )
    return Error(
        f"{_places(places)}: uses {section_info.type_name} {name!r}, which is not configured in {where}; "
        "the first request would fail with ImproperlyConfigured",
        hint=(close + " " if close else "") + hint,
        id=Code.UNKNOWN_NAME.check_id,
    )


@register(Tags.urls)
def check_url_names(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report instance names used by routed views (decorators, DRF throttles) that are not configured, permit
    demands above a limit (E025) and decision groups the first request could not decide (E035).

    Walks the URLconf, which imports the views; a view that cannot be imported is skipped (Django's own
    URL checks report it). Registered with the ``urls`` tag, so ``manage.py check`` runs it.
    """
    from django.conf import settings

    if not getattr(settings, "ROOT_URLCONF", None):
        return []
    try:
        from django.urls import get_resolver

        patterns = get_resolver().url_patterns
    except Exception:  # an unimportable ROOT_URLCONF: Django's urls checks report it
        return []
    analysis = conf.analyse(conf.raw_setting(), conf.drf_throttle_rates())
    uses: dict[tuple[str, str, bool], list[str]] = {}
    demands: dict[tuple[str, int], list[str]] = {}
    groups: dict[tuple[tuple[str, ...], bool], list[str]] = {}
    bad_arguments: dict[str, list[str]] = {}
    # (name, key=, declared by) -> views: on Django's HttpRequest (W007), on any request (W009).
    http_key_uses: dict[tuple[str, str | None, str], list[str]] = {}
    key_uses: dict[tuple[str, str | None, str], list[str]] = {}
    for route, callback in _routed_views(patterns):
        try:
            names = list(_view_names(callback))
            permits = list(_view_permits(callback))
            decided = list(_view_groups(callback))
            argument_errors = list(_view_argument_errors(callback))
            keyed = list(_view_key_uses(callback))
        except Exception:  # an exotic callable: never crash the check
            continue
        for name, key, declared_by, on_http_request, view in keyed:
            for found in (key_uses, http_key_uses) if on_http_request else (key_uses,):
                places = found.setdefault((name, key, declared_by), [])
                if f"{view} (URL '{route}')" not in places:
                    places.append(f"{view} (URL '{route}')")
        for error, view in argument_errors:
            places = bad_arguments.setdefault(error, [])
            if f"{view} (URL '{route}')" not in places:
                places.append(f"{view} (URL '{route}')")
        for group, key_override, view in decided:
            places = groups.setdefault((group, key_override), [])
            if f"{view} (URL '{route}')" not in places:
                places.append(f"{view} (URL '{route}')")
        for name, count, view in permits:
            places = demands.setdefault((name, count), [])
            if f"{view} (URL '{route}')" not in places:
                places.append(f"{view} (URL '{route}')")
        for section, name, explicit, view in names:
            places = uses.setdefault((section, name, explicit), [])
            place = f"{view} (URL '{route}')"
            if place not in places:
                places.append(place)
    messages: list[CheckMessage] = []
    for (section, name, explicit), places in uses.items():
        if analysis.section_problems[section]:
            continue  # the whole section is unusable: check_settings reports that once
        known = analysis.names(section)
        if name in known or (section == "ratelimiters" and name in analysis.unthrottled_scopes):
            continue
        messages.append(_unknown_name_message(analysis, section, name, explicit, places, known))
    for error, places in bad_arguments.items():
        messages.append(
            Error(
                f"{_places(places)}: {error}; every request to the view would fail with it (a 500)",
                hint=(
                    "Give rate_limiter one name or a list of distinct names, rate_limiter_permits an int >= 1, "
                    "rate_limiter_methods HTTP method names (e.g. ['POST']) or None, and a drop-in throttle "
                    "class (AnonRateThrottle, UserRateThrottle subclasses) a valid key spec; a decorator's dotted "
                    "key= path must name an importable callable(request) -> str | None."
                ),
                id=Code.INVALID_THROTTLE_ARGUMENTS.check_id,
            )
        )
    if not analysis.section_problems["ratelimiters"]:
        messages.extend(_permits_messages(analysis, demands))
        messages.extend(_group_messages(analysis, groups))
    # W007: on Django's HttpRequest only (DRF authenticates its own Request). W009: DRF's Request reads the
    # HttpRequest's session, so DRF views too.
    messages.extend(
        _key_without_middleware_messages(
            analysis, http_key_uses, _USER_KEYS, _AUTHENTICATION_MIDDLEWARE, "user",
            Code.USER_KEY_WITHOUT_AUTHENTICATION,
            "(after SessionMiddleware), or key the limit by something the request has ('ip')",
        )
    )
    messages.extend(
        _key_without_middleware_messages(
            analysis, key_uses, _SESSION_KEYS, _SESSION_MIDDLEWARE, "session", Code.SESSION_KEY_WITHOUT_SESSIONS,
            "(before AuthenticationMiddleware), or key the limit by 'ip' if a per-address budget is what you want",
        )
    )
    return messages
