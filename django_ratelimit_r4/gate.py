"""The rate-limit gate behind :func:`~django_ratelimit_r4.decorators.ratelimit` and the DRF throttle.

:class:`RateLimitGate` takes the permits of one or more named rate limiters for a request (or a plain
call), all-or-nothing, and puts the RateLimit header fields on the response. Per registry generation it
resolves a *plan* (:class:`_RatePlan`): each limit (:class:`_Limit`) with its compiled key function and its
draft-10 constants, and which path a request takes:

* a single unkeyed in-memory limit: one backend call, the two header fields from its ``quota()``;
* a single in-memory keyed limit (draft-10): one locked decision that also gives the header figures
  (``KeyedRateLimiter.acquire_quota``), each client's constants cached by REMOTE_ADDR or key;
* limits all in one Redis with header fields on: one script call decides and reads the figures;
* anything else: the all-or-nothing ``acquire_all`` of :mod:`~django_ratelimit_r4.keyed`, then the
  quotas read after the view.

The fields are formatted and written by :mod:`~django_ratelimit_r4.headers` only; the 429 is built by
:mod:`~django_ratelimit_r4.responses`.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import typing
from collections.abc import Callable, Collection, Iterable, Sequence
from functools import lru_cache
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponseBase
from django.utils.functional import SimpleLazyObject, empty

from . import conf, registry
from .backends.memory import GcraBackend, MemoryBackend, SlidingWindowBackend
from .core.backend import GCRA
from .core.exceptions import RequestNotPermitted
from .core.ratelimiter import RateLimiter, most_grantable
from .headers import (
    DRAFT_10,
    QuotaStatus,
    delay_seconds,
    draft10_headers,
    draft10_state,
    partition_key,
    ratelimit_headers,
    sf_string,
    window_seconds,
    write_draft10,
    write_fields,
)
from .ip import ClientIPResolver
from .keyed import AllOrNothingPlan, KeyedRateLimiter
from .keys import KeyFunc, compile_key
from .keyspec import validate_key_spec
from .responses import rejection_response

__all__ = ["UNSAFE_METHODS", "KeySpec", "RateLimitGate", "method_filter", "request_of"]

KeySpec = str | Callable[[Any], Any] | None

#: The methods that change state (django-ratelimit's ``UNSAFE``), for ``methods=UNSAFE_METHODS``.
UNSAFE_METHODS: frozenset[str] = frozenset({"DELETE", "PATCH", "POST", "PUT"})
_METHOD_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")  # RFC 9110 token

#: Backends whose quota is read without I/O: the unkeyed allowed-request fast path takes them.
_IN_MEMORY_BACKENDS = (MemoryBackend, GcraBackend, SlidingWindowBackend)


_SKIP = object()  # a key function said None: that limit does not apply to this request
_PK_SALT_PREFIX = b"django-ratelimit-r4:pk:"
_KEYED_ENTRIES_MAX = 1024  # per plan: the keyed fast path's cached clients, cleared when full
_SLOT_MAX_LEN = 256  # longer cache slots (REMOTE_ADDR text or key) are computed, never cached


def request_of(args: tuple[Any, ...]) -> Any | None:
    """The request when ``args[0]`` is a Django ``HttpRequest`` or a DRF ``Request``; else None."""
    if args:
        first = args[0]
        if isinstance(first, HttpRequest):
            return first
        if isinstance(getattr(first, "_request", None), HttpRequest):  # DRF wraps the HttpRequest
            return first
    return None


def method_filter(methods: str | Collection[str] | None) -> tuple[frozenset[str], bool]:
    """``(methods, skip_if_listed)`` for the ``methods=`` argument, validated once at decoration.

    ``None``: every method is counted, ``OPTIONS`` included (``(frozenset(), True)``: nothing is listed to
    skip). A method name or a collection of them: only those are counted (``(names, False)``), upper-cased as
    Django's ``request.method`` is, ``GET`` with ``HEAD`` (Django answers a HEAD with the GET view, body
    dropped: left out, a HEAD would do the limited work unlimited). A request is then skipped when
    ``(request.method in methods) is skip_if_listed``.

    :raises TypeError: for anything but None, a string or a collection of strings.
    :raises ValueError: for an empty collection or a name that is not an HTTP token.
    """
    if methods is None:
        return frozenset(), True
    if isinstance(methods, str):
        names: tuple[Any, ...] = (methods,)
    elif isinstance(methods, Iterable) and not isinstance(methods, (bytes, bytearray)):
        names = tuple(methods)
    else:
        raise TypeError(
            "methods must be None (every method) or HTTP method names such as "
            f"['POST'] or UNSAFE_METHODS, got {methods!r}"
        )
    if not names:
        raise ValueError(
            f"methods={methods!r} would limit no request: leave methods=None (every method) "
            "or name the methods to count, e.g. methods=['POST']"
        )
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"methods must be HTTP method names (strings), got {name!r} in {methods!r}")
        if not _METHOD_RE.match(name):
            raise ValueError(f"{name!r} is not an HTTP method (a token such as 'POST')")
    counted = frozenset(name.upper() for name in names)
    return (counted | {"HEAD"} if "GET" in counted else counted), False


#: The keyed fast path's per-client constants: (key, RateLimit-Policy value, RateLimit prefix up to
#: ``r=``, ``;pk=`` suffix).
_KeyedEntry = tuple[str, str, str, str]


@lru_cache(maxsize=4096)
def _pk(salt: bytes, key: str) -> str:
    # Keys repeat (the same clients come back): hash each once, not per response.
    return partition_key(key, salt)


def _untraced(exc: RequestNotPermitted) -> RequestNotPermitted:
    """A rejection to return (not raise): without the traceback of its raise, whose frames link back
    (``f_back``) to every caller. A caller holding the returned rejection in a local would otherwise close a
    reference cycle through them, and every denied request (its request, view and frames) would wait for the
    cyclic GC instead of being freed at once."""
    return exc.with_traceback(None)


def _secret_salt() -> bytes:
    """A server-secret salt for ``pk`` so a hashed IPv4 key cannot be reversed by brute force."""
    from django.conf import settings

    secret = getattr(settings, "SECRET_KEY", "") or ""
    return hashlib.sha256(_PK_SALT_PREFIX + str(secret).encode("utf-8", "surrogatepass")).digest()


class _Limit:
    """One named limit of a gate, resolved for one registry generation."""

    __slots__ = (
        "by_remote_addr",
        "item",
        "key_func",
        "keyed",
        "limit",
        "limiter",
        "name",
        "policy",
        "state_prefix",
        "window",
    )

    def __init__(
        self,
        name: str,
        limiter: RateLimiter | None,
        keyed: KeyedRateLimiter | None,
        key_func: KeyFunc | None,
        *,
        by_remote_addr: bool = False,
    ) -> None:
        config = limiter.config if limiter is not None else keyed.config  # type: ignore[union-attr]
        self.name = name
        self.limiter = limiter
        self.keyed = keyed
        self.key_func = key_func
        self.limit = int(config.limit_for_period)
        self.window = window_seconds(int(config.limit_refresh_period))
        self.item = sf_string(name)
        self.state_prefix = self.item + ";r="
        #: The key is a pure function of REMOTE_ADDR ("ip" without trusted proxies).
        self.by_remote_addr = by_remote_addr
        # Built by the reference formatter once, so the fast path's strings match it exactly.
        self.policy = draft10_headers([QuotaStatus(name, self.limit, self.window, 0, 0)])["RateLimit-Policy"]

    def quota(self, key: Any) -> tuple[int, int]:
        if self.keyed is not None:
            return self.keyed.quota(key)
        return self.limiter.backend.quota()  # type: ignore[union-attr]

    async def aquota(self, key: Any) -> tuple[int, int]:
        """:meth:`quota` without blocking the loop: a keyed limiter's ``aquota()`` (every ``KeyedBackend`` store
        declares it: Redis awaits redis.asyncio, memory answers inline), a remote backend's ``aquota()``, else
        ``quota()`` on a worker thread (a third-party backend with only the sync protocol)."""
        if self.keyed is not None:
            return await self.keyed.aquota(key)
        remote = self.limiter.remote_backend  # type: ignore[union-attr]
        if remote is not None:
            return await remote.aquota()
        return await asyncio.get_running_loop().run_in_executor(None, self.quota, key)


class _RatePlan:
    """A gate's limits for one registry generation, with everything per-request work needs."""

    __slots__ = (
        "aacquire_all",
        "aacquire_all_quotas",
        "acquire_all",
        "acquire_all_quotas",
        "draft10",
        "fast_keyed",
        "fast_quota",
        "generation",
        "keyed_acquire_quota",
        "keyed_by_remote_addr",
        "keyed_entries",
        "keyed_key_func",
        "limits",
        "loads_session",
        "loads_user",
        "remote",
        "remote_aacquire_quota",
        "remote_acquire_quota",
        "remote_quotas",
        "salt",
        "single",
        "single_keyed",
        "single_remote",
        "style",
    )

    def __init__(
        self,
        generation: int,
        limits: tuple[_Limit, ...],
        style: str | None,
        salt: bytes,
        all_or_nothing: AllOrNothingPlan | None = None,
    ) -> None:
        self.generation = generation
        # Where the limits live, asked of the limiters once per plan (never per request): limits all in this
        # process are decided inline; all in one remote place by that place's decider; limits in memory and
        # in Redis (backends chosen per instance) through keyed's mixed path.
        aon = all_or_nothing or AllOrNothingPlan([limit.keyed or limit.limiter for limit in limits])
        #: True when some limit lives outside this process: decisions and quotas are round trips, so async
        #: paths await them and read quotas off the event loop.
        self.remote = aon.remote
        self.acquire_all: Callable[..., tuple[int, int] | None] = aon.acquire_all
        self.aacquire_all: Callable[..., Any] | None = aon.aacquire_all
        self.limits = limits
        self.style = style
        self.draft10 = style == DRAFT_10
        self.salt = salt
        #: Limits all in one Redis with header fields on: one script call decides and reads the figures
        #: (``acquire_quota`` / ``acquire_all_quotas``), so a request costs one round trip, headers included.
        # Limits in memory and in Redis too: the in-memory figures are snapshots read after the decision, the
        # Redis ones come with it (keyed.acquire_all_quotas). A single remote limit reads them with its own
        # acquire_quota.
        self.remote_quotas = self.remote and style is not None
        self.acquire_all_quotas: Callable[..., Any] | None = aon.acquire_all_quotas if self.remote_quotas else None
        self.aacquire_all_quotas: Callable[..., Any] | None = (
            aon.aacquire_all_quotas if self.remote_quotas else None
        )
        only = limits[0] if len(limits) == 1 else None
        # (None for remote_quotas: _call's in-memory single-limit path is not taken.)
        self.single = only.limiter if only is not None and not self.remote_quotas else None
        self.single_keyed = only if only is not None and only.keyed is not None else None
        # The allowed-request fast path: a single unkeyed in-memory limit with draft-10 headers reads its
        # backend's quota() (no I/O; MemoryBackend's is a lock-free snapshot) and writes the two fields inline.
        backend = self.single.backend if self.single is not None else None
        self.fast_quota: Callable[[], tuple[int, int]] | None = (
            backend.quota if self.draft10 and backend is not None and type(backend) in _IN_MEMORY_BACKENDS else None
        )
        # The same for a single keyed limit: KeyedRateLimiter.acquire_quota() decides and returns the header
        # figures in one step (in memory one locked step; on Redis one round trip, a rejection carrying them),
        # and each client's constants (key, pk hash, policy string) are built once. With key "ip" and no
        # trusted proxies they are found by the REMOTE_ADDR text itself, so a returning client costs one dict
        # read, no key function call. (The async paths of a remote limit take remote_quotas first.)
        keyed = self.single_keyed
        fast = keyed if self.draft10 and keyed is not None else None
        self.fast_keyed: _Limit | None = fast
        self.keyed_entries: dict[str, _KeyedEntry] = {}
        self.keyed_by_remote_addr = fast is not None and fast.by_remote_addr
        self.keyed_acquire_quota: Callable[[str, int], tuple[int, int]] | None = (
            fast.keyed.acquire_quota if fast is not None else None  # type: ignore[union-attr]
        )
        self.keyed_key_func: KeyFunc | None = fast.key_func if fast is not None else None
        #: A single unkeyed remote limit with draft-10 fields: its limiter's ``acquire_quota`` decides and reads
        #: the two fields' figures in one round trip (a rejection carries them), written as the in-memory
        #: single limit's are (no keys list, no caught and re-raised rejection, no field dict).
        unkeyed_remote = only is not None and only.keyed is None and self.remote_quotas and self.draft10
        self.remote_acquire_quota: Callable[[int], tuple[int, int]] | None = (
            only.limiter.acquire_quota if unkeyed_remote else None  # type: ignore[union-attr]
        )
        self.remote_aacquire_quota: Callable[[int], Any] | None = (
            only.limiter.aacquire_quota if unkeyed_remote else None  # type: ignore[union-attr]
        )
        #: One remote limit with draft-10 fields: a 429 writes them from the figures its rejection carries.
        self.single_remote = only is not None and self.remote_quotas and self.draft10
        #: A key function reads the session store ("session"): async calls load it off the loop first.
        self.loads_session = any(getattr(limit.key_func, "reads_session", False) for limit in limits)
        #: A key function reads request.user ("user", "user_or_ip"): async calls resolve it off the loop first.
        self.loads_user = any(getattr(limit.key_func, "reads_user", False) for limit in limits)

    def keyed_entry(self, request: Any) -> _KeyedEntry | None:
        """``fast_keyed``'s cached constants for ``request``'s client; None when its key function exempts it.

        The sync fast path in :meth:`RateLimitGate._call` inlines this.
        """
        if self.keyed_by_remote_addr:
            return self.keyed_entries.get(request.META.get("REMOTE_ADDR")) or self.add_keyed_entry(request)
        key = self.keyed_key_func(request)  # type: ignore[misc]
        if key is None:
            return None
        return self.keyed_entries.get(key) or self.add_keyed_entry(request, key)

    def add_keyed_entry(self, request: Any, key: str | None = None) -> _KeyedEntry:
        """Build (and cache) the entry of ``request``'s client: ``key`` given, or from REMOTE_ADDR.

        Cached by the REMOTE_ADDR text (``keyed_by_remote_addr``) or by the key; the cache holds at most
        ``_KEYED_ENTRIES_MAX`` clients (cleared when full: the same clients come back and refill it).
        """
        limit = self.fast_keyed
        assert limit is not None and limit.key_func is not None
        if key is None:  # keyed_by_remote_addr: the "ip" key function never answers None
            slot = request.META.get("REMOTE_ADDR")
            key = typing.cast(str, limit.key_func(request))
        else:
            slot = key
        pk = ";pk=" + _pk(self.salt, key)
        entry = (key, limit.policy + pk, limit.state_prefix, pk)
        if isinstance(slot, str) and len(slot) <= _SLOT_MAX_LEN:
            cache = self.keyed_entries
            if len(cache) >= _KEYED_ENTRIES_MAX:
                cache.clear()
            cache[slot] = entry
        return entry


async def _aload_user(request: Any) -> None:
    """Resolve ``request.user`` with Django's async API when it is still AuthenticationMiddleware's unread lazy
    object, so the "user" / "user_or_ip" key functions read it without a query from the event loop (Django
    raised SynchronousOnlyOperation there: a 500 for every signed-in request to an async view keyed by user).

    ``request.auser()`` (Django's, set by the middleware) resolves it; the user replaces the lazy object, as
    ``django.contrib.auth.login`` does, so the view reads it for free. Without ``auser`` (a middleware of
    one's own), the lazy object is read in a thread. Anything else (already read, or a plain object) is left.
    """
    user = getattr(request, "user", None)
    if not isinstance(user, SimpleLazyObject) or user._wrapped is not empty:
        return
    auser = getattr(request, "auser", None)
    if auser is not None:
        request.user = await auser()
    else:
        await sync_to_async(getattr)(user, "is_authenticated")


async def _aload_session(request: Any) -> None:
    """Load ``request.session`` with the engine's async API, so the "session" key function reads it from
    its cache instead of querying the store from the event loop (Django refuses sync ORM calls there)."""
    session = getattr(request, "session", None)
    if session is not None and session.session_key:
        await session.akeys()


def _write_single(plan: _RatePlan, response: HttpResponseBase, request: Any, exc: RequestNotPermitted) -> bool:
    """``plan.single_remote``: write the two fields of the 429 from the figures the rejection carries, as the
    allowed request's are written (the keyed client's cached constants when it has them); False when ``exc`` is
    not this limit's own (the view raised another limiter's rejection)."""
    limit = plan.limits[0]
    refused: object = exc.rate_limiter
    quota = exc.quotas[0]  # type: ignore[index]
    if refused is limit.limiter:
        write_draft10(response, limit.policy, limit.state_prefix, quota[0], quota[1])
        return True
    key = exc.key
    if refused is not limit.keyed or key is None:
        return False
    entry = plan.keyed_entries.get(request.META.get("REMOTE_ADDR") if plan.keyed_by_remote_addr else key)
    if entry is None or entry[0] != key:
        pk = ";pk=" + _pk(plan.salt, key)
        entry = (key, limit.policy + pk, limit.state_prefix, pk)
    write_draft10(response, entry[1], entry[2], quota[0], quota[1], entry[3])
    return True


#: A gate's plan before its first use: a complete plan of no limits whose generation (-1) never matches
#: ``registry.generation`` (0 and up), so the first call resolves the real one.
_UNRESOLVED_PLAN = _RatePlan(-1, (), None, b"")


class RateLimitGate:
    """The rate-limit check behind :func:`ratelimit` and the DRF throttle.

    ``names`` are rate limiter instances decided all-or-nothing; ``key`` overrides the instances'
    ``key`` spec (``"ip"``, ``"user"``, ``"header:X-Api-Key"``, a dotted path or a callable). The
    resolved limiters and compiled key functions are cached and rebuilt when the registry generation
    changes. ``methods`` chooses which requests count (see :func:`method_filter`; plain calls without
    a request always count).
    """

    def __init__(
        self,
        names: str | Sequence[str],
        *,
        key: KeySpec = None,
        permits: int = 1,
        methods: str | Collection[str] | None = None,
    ) -> None:
        """Validate the arguments; nothing is resolved until the first call."""
        names = (names,) if isinstance(names, str) else tuple(names)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise TypeError(f"rate limiter names must be non-empty strings, got {names!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"a rate limiter is named twice in {names!r}")
        if isinstance(permits, bool) or not isinstance(permits, int) or permits < 1:
            raise ValueError(f"permits must be an int >= 1, got {permits!r}")
        # A bad key= would otherwise surface at every request (compiled at first use) as a 500. Dotted paths
        # are imported at first use only: the key function may live in the module being decorated.
        key_error = validate_key_spec(key, imports=False)
        if key_error is not None:
            raise (ValueError if isinstance(key, str) else TypeError)(key_error)
        self.names: tuple[str, ...] = names
        self.key = key
        self.permits = permits
        #: The methods counted (``None``: every method). Precomputed for the hot path: ``None`` skips the
        #: method test altogether, a set costs one lookup per request.
        self.methods: frozenset[str] | None = None if methods is None else method_filter(methods)[0]
        self._plan: _RatePlan = _UNRESOLVED_PLAN
        self._lock = threading.Lock()

    # -- plan ----------------------------------------------------------------------------------------

    def plan(self) -> _RatePlan:
        """The current plan (rebuilt if ``RATELIMIT_R4`` changed)."""
        plan = self._plan
        if plan.generation != registry.generation:
            plan = self._refresh()
        return plan

    def _refresh(self) -> _RatePlan:
        with self._lock:
            generation = registry.generation  # read first: a rebuild racing with us makes this plan stale
            options = conf.get_options()
            if not options.enabled:
                # RATELIMIT_R4["enabled"] = False: a plan with no limits and no header style takes no
                # permit and writes no field; read once per registry generation, never per request.
                plan = _RatePlan(generation, (), None, b"")
                self._plan = plan
                return plan
            resolver: ClientIPResolver | None = None
            limits = []
            for name in self.names:
                spec = (
                    self.key
                    if self.key is not None
                    else registry.instance_options("ratelimiters", name)["key"]
                )
                if spec is None:
                    limits.append(_Limit(name, registry.get_rate_limiter(name), None, None))  # type: ignore[arg-type]
                    continue
                if resolver is None:
                    resolver = ClientIPResolver(
                        options.trusted_proxies or None,  # type: ignore[arg-type]
                        options.ipv6_prefix_length,
                        forwarded_header=options.forwarded_header,  # type: ignore[arg-type]
                    )
                key_func = compile_key(spec, ip_resolver=resolver)
                limits.append(
                    _Limit(
                        name,
                        None,
                        registry.get_keyed_rate_limiter(name),
                        key_func,
                        by_remote_addr=spec == "ip" and resolver.remote_addr_only,
                    )
                )
            for limit in limits:
                self._refuse_permits_above_limit(limit)
            try:
                all_or_nothing = AllOrNothingPlan(
                    [limit.keyed if limit.keyed is not None else limit.limiter for limit in limits]
                )
            except TypeError as exc:
                raise TypeError(f"rate limit gate {list(self.names)}: {exc}") from None
            plan = _RatePlan(generation, tuple(limits), options.headers, _secret_salt(), all_or_nothing)
            self._plan = plan
            return plan

    def _refuse_permits_above_limit(self, limit: _Limit) -> None:
        # A request for more permits than a cycle holds is never admitted without waiting, yet every 429
        # would promise a Retry-After: refuse the decorator at first use instead.
        holder = limit.keyed if limit.keyed is not None else limit.limiter
        config = holder.config  # type: ignore[union-attr]
        allowed = most_grantable(config, 0)  # GCRA's bound is its burst, as manage.py check's (E025)
        if self.permits > allowed:
            burst = config.algorithm == GCRA and config.burst is not None
            field = "burst" if burst else "limit_for_period"
            raise ImproperlyConfigured(
                f"rate limit on {list(self.names)} asks for permits={self.permits}, but rate limiter "
                f"{limit.name!r} allows only {allowed} {'at once' if burst else 'per period'} "
                f'({conf.setting_path("ratelimiters", "instances", limit.name, field)}): '
                f"no request could ever be admitted. Lower permits or raise {field}."
            )

    # -- deciding ------------------------------------------------------------------------------------

    def _keys(self, plan: _RatePlan, request: Any) -> list[Any]:
        keys: list[Any] = []
        for limit in plan.limits:
            if limit.key_func is None:
                keys.append(None)
                continue
            if request is None:
                raise TypeError(
                    f"rate limiter {limit.name!r} is keyed per request, but the decorated function did not get "
                    "a request as its first argument; use get_rate_limiter(name, key=...) in code instead"
                )
            key = limit.key_func(request)
            keys.append(_SKIP if key is None else key)
        return keys

    @staticmethod
    def _entries(plan: _RatePlan, keys: list[Any]) -> list[tuple[Any, Any]]:
        return [
            (limit.keyed if limit.keyed is not None else limit.limiter, key)
            for limit, key in zip(plan.limits, keys, strict=True)
            if key is not _SKIP
        ]

    @staticmethod
    def _raise(entries: list[tuple[Any, Any]], outcome: tuple[int, int] | None) -> None:
        if outcome is not None:
            index, wait = outcome
            limiter, key = entries[index]
            raise RequestNotPermitted(limiter, wait, key=key)

    def _acquire(self, plan: _RatePlan, keys: list[Any]) -> None:
        """Take the permits (no waiting) or raise RequestNotPermitted with the largest wait."""
        entries = self._entries(plan, keys)
        if entries:
            self._raise(entries, plan.acquire_all(entries, self.permits))

    async def _aacquire(self, plan: _RatePlan, keys: list[Any]) -> None:
        """Async twin of :meth:`_acquire`: one awaited script for Redis, integer work under locks for memory."""
        entries = self._entries(plan, keys)
        if not entries:
            return
        if plan.aacquire_all is not None:
            self._raise(entries, await plan.aacquire_all(entries, self.permits))
        else:
            self._raise(entries, plan.acquire_all(entries, self.permits))

    def _remote(
        self, plan: _RatePlan, request: Any
    ) -> tuple[RequestNotPermitted | None, list[Any], list[tuple[int, int]]]:
        """``plan.remote_quotas``: decide and read the RateLimit figures in one round trip.

        Returns ``(rejection or None, keys, (remaining, reset_ns) of each limit that applied)``.
        """
        keys = self._keys(plan, request)
        try:
            if len(plan.limits) == 1:
                limit = plan.limits[0]
                if limit.keyed is None:
                    return None, keys, [limit.limiter.acquire_quota(self.permits)]  # type: ignore[union-attr]
                if keys[0] is _SKIP:
                    return None, keys, []
                return None, keys, [limit.keyed.acquire_quota(keys[0], self.permits)]
            entries = self._entries(plan, keys)
            if not entries:
                return None, keys, []
            outcome, quotas = plan.acquire_all_quotas(entries, self.permits)  # type: ignore[misc]
        except RequestNotPermitted as exc:
            return _untraced(exc), keys, list(exc.quotas or ())
        return self._outcome(entries, outcome, quotas), keys, quotas

    async def _aremote(
        self, plan: _RatePlan, request: Any
    ) -> tuple[RequestNotPermitted | None, list[Any], list[tuple[int, int]]]:
        """Async twin of :meth:`_remote` (``redis.asyncio``, never blocks the loop)."""
        keys = self._keys(plan, request)
        try:
            if len(plan.limits) == 1:
                limit = plan.limits[0]
                if limit.keyed is None:
                    return None, keys, [await limit.limiter.aacquire_quota(self.permits)]  # type: ignore[union-attr]
                if keys[0] is _SKIP:
                    return None, keys, []
                return None, keys, [await limit.keyed.aacquire_quota(keys[0], self.permits)]
            entries = self._entries(plan, keys)
            if not entries:
                return None, keys, []
            outcome, quotas = await plan.aacquire_all_quotas(entries, self.permits)  # type: ignore[misc]
        except RequestNotPermitted as exc:
            return _untraced(exc), keys, list(exc.quotas or ())
        return self._outcome(entries, outcome, quotas), keys, quotas

    @staticmethod
    def _outcome(
        entries: list[tuple[Any, Any]], outcome: tuple[int, int] | None, quotas: list[tuple[int, int]]
    ) -> RequestNotPermitted | None:
        if outcome is None:
            return None
        index, wait = outcome
        limiter, key = entries[index]
        return RequestNotPermitted(limiter, wait, key=key, quotas=tuple(quotas))

    @staticmethod
    def _pairs(plan: _RatePlan, keys: list[Any]) -> list[tuple[_Limit, Any]]:
        return [(limit, key) for limit, key in zip(plan.limits, keys, strict=True) if key is not _SKIP]

    def counts(self, request: Any) -> bool:
        """Whether ``request``'s method is counted by this gate (``methods``)."""
        return self.methods is None or request.method in self.methods

    def acquire(self, request: Any = None) -> list[Any]:
        """Take the permits for ``request`` (or for a plain call) or raise ``RequestNotPermitted``.

        A single limit waits up to its ``timeout_duration`` (blocking this thread); several limits
        decide all-or-nothing with timeout 0. Returns the per-limit keys for :meth:`headers` (none
        applies to a request whose method is not counted).
        """
        if request is not None and self.methods is not None and request.method not in self.methods:
            return [_SKIP] * len(self.names)
        plan = self.plan()
        keys = self._keys(plan, request)
        self._take(plan, keys)
        return keys

    def _take(self, plan: _RatePlan, keys: list[Any]) -> None:
        """Take the permits of ``keys`` (from :meth:`_keys`) or raise ``RequestNotPermitted``."""
        single = plan.limits[0] if len(plan.limits) == 1 else None
        if single is None:
            self._acquire(plan, keys)
        elif single.keyed is not None:
            if keys[0] is not _SKIP:
                single.keyed.acquire_or_raise(keys[0], self.permits)
        else:
            single.limiter.acquire_or_raise(self.permits)  # type: ignore[union-attr]

    def check(self, request: Any) -> tuple[RequestNotPermitted | None, dict[str, str]]:
        """Sync decision for ``request``: ``(None or the rejection, RateLimit header fields)``."""
        plan = self.plan()
        # A DRF Request proxies method and META to its HttpRequest through __getattr__, which DRF reaches only
        # after the normal lookup failed (an AttributeError built and dropped each time): read them there.
        http = getattr(request, "_request", None)
        if not isinstance(http, HttpRequest):
            http = request
        methods = self.methods
        counted = methods is None or http.method in methods
        acquire_quota = plan.keyed_acquire_quota
        if acquire_quota is not None and counted:
            # The DRF throttle's keyed fast path, as _call's: the client's cached constants, then one locked
            # decision that also gives the header figures (a rejection reads them once more).
            entry: _KeyedEntry | None
            if plan.keyed_by_remote_addr:
                slot: Any = http.META.get("REMOTE_ADDR")
                entry = plan.keyed_entries.get(slot) or plan.add_keyed_entry(request)
            else:
                entry = plan.keyed_entry(request)
            if entry is None:
                return None, {}  # the key function exempts this request: no limit applied
            key, policy, prefix, pk = entry
            try:
                remaining, reset_ns = acquire_quota(key, self.permits)
            except RequestNotPermitted as exc:
                figures = exc.quotas
                remaining, reset_ns = figures[0] if figures else plan.limits[0].keyed.quota(key)  # type: ignore[union-attr]
                return _untraced(exc), {
                    "RateLimit-Policy": policy,
                    "RateLimit": draft10_state(prefix, remaining, delay_seconds(reset_ns), pk),
                }
            return None, {
                "RateLimit-Policy": policy,
                "RateLimit": draft10_state(prefix, remaining, delay_seconds(reset_ns), pk),
            }
        if plan.remote_quotas and counted:
            remote_quota = plan.remote_acquire_quota
            if remote_quota is None:
                rejection, keys, quotas = self._remote(plan, request)
                return rejection, self._fields(plan, self._pairs(plan, keys), quotas)
            # A single unkeyed Redis limit (as _call's): one round trip, the two fields from its figures.
            limit = plan.limits[0]
            try:
                remaining, reset_ns = remote_quota(self.permits)
            except RequestNotPermitted as exc:
                figures = exc.quotas
                remaining, reset_ns = figures[0] if figures else limit.quota(None)
                return _untraced(exc), {
                    "RateLimit-Policy": limit.policy,
                    "RateLimit": draft10_state(limit.state_prefix, remaining, delay_seconds(reset_ns), ""),
                }
            return None, {
                "RateLimit-Policy": limit.policy,
                "RateLimit": draft10_state(limit.state_prefix, remaining, delay_seconds(reset_ns), ""),
            }
        if not counted:
            return None, {}  # a method not counted: no limit applied
        keys = self._keys(plan, request)
        try:
            self._take(plan, keys)
        except RequestNotPermitted as exc:
            return _untraced(exc), self._headers(plan, keys)  # the keys of the decision: computed once
        return None, self._headers(plan, keys)

    def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Take the permits, then return ``fn(*args, **kwargs)`` with RateLimit fields on a response."""
        return self._call(fn, args, kwargs)

    def _call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # The hot path of an allowed request: one int compare, one backend call, two header strings.
        request = request_of(args)
        methods = self.methods
        if methods is not None and request is not None and request.method not in methods:
            return fn(*args, **kwargs)  # a method not counted (methods= lists others)
        plan = self._plan
        if plan.generation != registry.generation:
            plan = self._refresh()
        single = plan.single
        if single is not None:
            single.acquire_or_raise(self.permits)
            response = fn(*args, **kwargs)
            if plan.style is None or not isinstance(response, HttpResponseBase) or request is None:
                return response
            fast_quota = plan.fast_quota
            if fast_quota is not None:  # in memory, draft-10: the quota is a snapshot, no I/O
                limit = plan.limits[0]
                write_draft10(response, limit.policy, limit.state_prefix, *fast_quota())
                return response
            self._annotate_single(plan, single, response)
            return response
        acquire_quota = plan.keyed_acquire_quota
        if acquire_quota is not None and request is not None:
            # The keyed fast path: the client's cached constants (plan.keyed_entry inlined), then one
            # locked decision that also gives the header figures.
            if plan.keyed_by_remote_addr:
                entry = plan.keyed_entries.get(request.META.get("REMOTE_ADDR")) or plan.add_keyed_entry(
                    request
                )
            else:
                key = plan.keyed_key_func(request)  # type: ignore[misc]
                if key is None:
                    return fn(*args, **kwargs)
                entry = plan.keyed_entries.get(key) or plan.add_keyed_entry(request, key)
            key, policy, prefix, pk = entry
            remaining, reset_ns = acquire_quota(key, self.permits)
            response = fn(*args, **kwargs)
            if isinstance(response, HttpResponseBase):
                write_draft10(response, policy, prefix, remaining, reset_ns, pk)
            return response
        remote_quota = plan.remote_acquire_quota
        if remote_quota is not None:
            # A single unkeyed Redis limit: one round trip decides and reads the two fields' figures; a
            # rejection (carrying them) propagates as raised, never held in this frame.
            remaining, reset_ns = remote_quota(self.permits)
            response = fn(*args, **kwargs)
            if request is not None and isinstance(response, HttpResponseBase):
                limit = plan.limits[0]
                write_draft10(response, limit.policy, limit.state_prefix, remaining, reset_ns)
            return response
        if plan.remote_quotas:
            # Redis with header fields: one round trip decides and reads them.
            rejection, keys, quotas = self._remote(plan, request)
            if rejection is not None:
                try:
                    raise rejection
                finally:
                    # Not kept in this frame, which the traceback holds: that cycle would leave the request,
                    # the response and every frame of the rejection to the cyclic GC.
                    del rejection
            response = fn(*args, **kwargs)
            if request is not None and isinstance(response, HttpResponseBase):
                write_fields(response, self._fields(plan, self._pairs(plan, keys), quotas))
            return response
        keyed = plan.single_keyed
        if keyed is not None and request is not None:
            key = keyed.key_func(request)  # type: ignore[misc]
            if key is None:
                return fn(*args, **kwargs)
            keyed.keyed.acquire_or_raise(key, self.permits)  # type: ignore[union-attr]
            response = fn(*args, **kwargs)
            if plan.style is not None and isinstance(response, HttpResponseBase):
                self._annotate_keyed(plan, keyed, key, response)
            return response
        keys = self._keys(plan, request)
        self._acquire(plan, keys)
        response = fn(*args, **kwargs)
        if plan.style is not None and request is not None and isinstance(response, HttpResponseBase):
            self._annotate(plan, response, keys)
        return response

    async def acall(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Async twin of :meth:`call`: a single limit waits with ``await``, never blocking the loop."""
        request = request_of(args)
        methods = self.methods
        if methods is not None and request is not None and request.method not in methods:
            return await fn(*args, **kwargs)  # a method not counted (methods= lists others)
        plan = self._plan
        if plan.generation != registry.generation:
            plan = self._refresh()
        if plan.loads_session and request is not None:
            await _aload_session(request)
        if plan.loads_user and request is not None:
            await _aload_user(request)
        remote_aquota = plan.remote_aacquire_quota
        if remote_aquota is not None:
            # A single unkeyed Redis limit (as _call's): one awaited round trip, the two fields from its figures.
            remaining, reset_ns = await remote_aquota(self.permits)
            response = await fn(*args, **kwargs)
            if request is not None and isinstance(response, HttpResponseBase):
                limit = plan.limits[0]
                write_draft10(response, limit.policy, limit.state_prefix, remaining, reset_ns)
            return response
        if plan.remote_quotas:
            # Redis with header fields: one awaited round trip decides and reads them.
            rejection, applied, quotas = await self._aremote(plan, request)
            if rejection is not None:
                try:
                    raise rejection
                finally:
                    del rejection  # no reference cycle through the traceback (see _call)
            response = await fn(*args, **kwargs)
            if request is not None and isinstance(response, HttpResponseBase):
                write_fields(response, self._fields(plan, self._pairs(plan, applied), quotas))
            return response
        single = plan.single
        keyed = plan.single_keyed
        key: Any = None
        entry: _KeyedEntry | None = None
        quota: tuple[int, int] | None = None
        if single is not None:
            await single.aacquire_or_raise(self.permits)
            keys: list[Any] = [None]
        elif keyed is not None and request is not None:
            if plan.fast_keyed is not None:  # in memory, draft-10: the decision gives the header figures
                entry = plan.keyed_entry(request)
                key = None if entry is None else entry[0]
            else:
                key = keyed.key_func(request)  # type: ignore[misc]
            if key is None:
                return await fn(*args, **kwargs)
            if entry is not None:
                quota = await keyed.keyed.aacquire_quota(key, self.permits)  # type: ignore[union-attr]
            else:
                await keyed.keyed.aacquire_or_raise(key, self.permits)  # type: ignore[union-attr]
            keys = [key]
        else:
            keys = self._keys(plan, request)
            await self._aacquire(plan, keys)
        response = await fn(*args, **kwargs)
        if plan.style is not None and request is not None and isinstance(response, HttpResponseBase):
            if plan.remote:
                write_fields(response, await self._aheaders(keys))
            elif entry is not None and quota is not None:
                write_draft10(response, entry[1], entry[2], quota[0], quota[1], entry[3])
            elif keyed is not None and key is not None:
                self._annotate_keyed(plan, keyed, key, response)
            else:
                self._annotate(plan, response, keys)
        return response

    # -- headers -------------------------------------------------------------------------------------

    def headers(self, keys: list[Any]) -> dict[str, str]:
        """The RateLimit header fields (configured style) for the limits that applied; ``{}`` if off."""
        return self._headers(self.plan(), keys)

    def _headers(self, plan: _RatePlan, keys: list[Any]) -> dict[str, str]:
        if plan.style is None:
            return {}
        pairs = self._pairs(plan, keys)
        return self._fields(plan, pairs, [limit.quota(key) for limit, key in pairs])

    @staticmethod
    def _fields(
        plan: _RatePlan, pairs: list[tuple[_Limit, Any]], quotas: list[tuple[int, int]]
    ) -> dict[str, str]:
        """Format the header fields of ``pairs`` (the limits that applied) from their ``quotas``."""
        if not pairs:
            return {}
        if plan.draft10:
            policies = []
            states = []
            for (limit, key), (remaining, reset_ns) in zip(pairs, quotas, strict=True):
                pk = "" if key is None else ";pk=" + _pk(plan.salt, key)
                policies.append(limit.policy + pk)
                states.append(draft10_state(limit.state_prefix, remaining, delay_seconds(reset_ns), pk))
            return {"RateLimit-Policy": ", ".join(policies), "RateLimit": ", ".join(states)}
        statuses = []
        for (limit, key), (remaining, reset_ns) in zip(pairs, quotas, strict=True):
            statuses.append(
                QuotaStatus(limit.name, limit.limit, limit.window, remaining, delay_seconds(reset_ns), key)
            )
        return ratelimit_headers(plan.style, statuses, salt=plan.salt)

    async def _aheaders(self, keys: list[Any]) -> dict[str, str]:
        """:meth:`headers` for async paths: Redis quotas are awaited (``aquota()``), never read on the loop."""
        plan = self.plan()
        if plan.style is None:
            return {}
        if not plan.remote:
            return self.headers(keys)
        pairs = [(limit, key) for limit, key in zip(plan.limits, keys, strict=True) if key is not _SKIP]
        if len(pairs) == 1:
            quotas = [await pairs[0][0].aquota(pairs[0][1])]
        else:  # one round trip each, concurrently
            quotas = list(await asyncio.gather(*(limit.aquota(key) for limit, key in pairs)))
        return self._fields(plan, pairs, quotas)

    def _annotate(self, plan: _RatePlan, response: HttpResponseBase, keys: list[Any]) -> None:
        write_fields(response, self._headers(plan, keys))

    def _annotate_single(self, plan: _RatePlan, limiter: RateLimiter, response: HttpResponseBase) -> None:
        if not plan.draft10:
            self._annotate(plan, response, [None])
            return
        limit = plan.limits[0]
        write_draft10(response, limit.policy, limit.state_prefix, *limiter.backend.quota())

    def _annotate_keyed(self, plan: _RatePlan, limit: _Limit, key: str, response: HttpResponseBase) -> None:
        if not plan.draft10:
            self._annotate(plan, response, [key])
            return
        remaining, reset_ns = limit.keyed.quota(key)  # type: ignore[union-attr]
        pk = ";pk=" + _pk(plan.salt, key)
        write_draft10(response, limit.policy + pk, limit.state_prefix, remaining, reset_ns, pk)

    def rejected_response(self, request: Any, exc: RequestNotPermitted) -> HttpResponseBase:
        """The 429 for ``exc`` with this gate's RateLimit fields."""
        response = rejection_response(request, exc)
        plan = self.plan()
        if plan.style is None:
            return response
        if exc.quotas is not None and plan.single_remote and _write_single(plan, response, request, exc):
            return response
        if self._own_quotas(plan, exc):
            self._annotate_from(plan, response, request, exc)
            return response
        if plan.single is not None:
            self._annotate_single(plan, plan.single, response)
        elif plan.single_keyed is not None:
            key = exc.key
            if key is not None:
                self._annotate_keyed(plan, plan.single_keyed, key, response)
        else:
            self._annotate(plan, response, self._keys(plan, request))
        return response

    @staticmethod
    def _own_quotas(plan: _RatePlan, exc: RequestNotPermitted) -> bool:
        """``exc`` carries the figures of this gate's own decision (``plan.remote_quotas``)."""
        if exc.quotas is None or not plan.remote_quotas:
            return False
        refused: object = exc.rate_limiter
        return any(refused is limit.keyed or refused is limit.limiter for limit in plan.limits)

    def _annotate_from(
        self, plan: _RatePlan, response: HttpResponseBase, request: Any, exc: RequestNotPermitted
    ) -> None:
        """The RateLimit fields of a 429 from the figures its decision read (no second round trip)."""
        if len(plan.limits) == 1:
            keys = [exc.key if plan.limits[0].keyed is not None else None]
        else:
            keys = self._keys(plan, request)
        pairs = self._pairs(plan, keys)
        quotas = list(exc.quotas or ())
        if len(pairs) == len(quotas):
            write_fields(response, self._fields(plan, pairs, quotas))

    async def arejected_response(self, request: Any, exc: RequestNotPermitted) -> HttpResponseBase:
        """Async twin of :meth:`rejected_response` (Redis quotas read off the event loop)."""
        await exc.await_wait_ns()  # raised by the view itself without a wait: read it without blocking
        plan = self.plan()
        if not plan.remote:
            return self.rejected_response(request, exc)
        response = rejection_response(request, exc)
        if plan.style is None:
            return response
        if exc.quotas is not None and plan.single_remote and _write_single(plan, response, request, exc):
            return response
        if self._own_quotas(plan, exc):
            self._annotate_from(plan, response, request, exc)
            return response
        if plan.single is not None:
            keys: list[Any] = [None]
        elif plan.single_keyed is not None:
            key = exc.key
            if key is None:
                return response
            keys = [key]
        else:
            keys = self._keys(plan, request)
        write_fields(response, await self._aheaders(keys))
        return response
