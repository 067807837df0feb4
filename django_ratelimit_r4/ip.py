"""Client IP resolution for per-client rate limits.

The answer is ``REMOTE_ADDR`` unless trusted proxies are configured:

* ``trusted_proxies=N`` (an int): the app is reachable only through N proxies, each of which appends
  its peer to ``X-Forwarded-For`` (or ``Forwarded``). The client is the N-th entry from the right.
  With fewer than N entries the header cannot be the one the proxies built: ``REMOTE_ADDR`` is used.
* ``trusted_proxies=["10.0.0.0/8", ...]`` (CIDRs): the header is honoured only when ``REMOTE_ADDR``
  itself is trusted. It is then walked from the right, skipping trusted addresses; the first
  untrusted one is the client (if every hop is trusted, the left-most one is). A peer without an IP
  address (``REMOTE_ADDR`` empty, missing or not an IP: gunicorn on a Unix socket, uvicorn ``--uds``)
  is trusted only when the list names it: the entry :data:`UNIX_PEER` (``"unix"``).

Which header: by default (``forwarded_header="auto"``) whichever of ``X-Forwarded-For`` and RFC 7239
``Forwarded`` is present. When a request carries both, a client may have forged the one the proxies
do not write, so the resolver computes both answers and, if they disagree, falls back to
``REMOTE_ADDR``. Pin the header your proxies write (``"x-forwarded-for"`` or ``"forwarded"``) to avoid
that fallback.

Anything malformed (an entry that is not an IP, ``unknown``, an obfuscated ``_node`` identifier, an
over-long value) gives the safe answer ``REMOTE_ADDR``; the resolver never raises. The result is a
normalised string: IPv4-mapped IPv6 becomes IPv4, IPv6 scope ids are dropped, and with
``ipv6_prefix_length < 128`` IPv6 addresses are grouped into their network (``"2001:db8:1:2::/64"``),
because one IPv6 client usually owns a whole /64.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any, Literal

__all__ = ["UNIX_PEER", "UNKNOWN_CLIENT", "ClientIPResolver", "ForwardedHeader"]

#: Returned when even ``REMOTE_ADDR`` is missing or is not an IP (for example a Unix-socket peer).
#: All such requests share one budget; behind a proxy on a Unix socket, trust it with :data:`UNIX_PEER`.
UNKNOWN_CLIENT = "unknown"

#: The ``trusted_proxies`` entry that trusts a peer without an IP address (a Unix-socket peer: the
#: proxy in front of gunicorn ``--bind unix:...`` or uvicorn ``--uds``). Never implied by a CIDR.
UNIX_PEER = "unix"

ForwardedHeader = Literal["auto", "x-forwarded-for", "forwarded"]

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Longest textual address we parse: "[" + 45-char IPv6 + "%" + scope + "]:65535". Longer is garbage.
_MAX_ENTRY_LEN = 80
# Beyond this many hops a header is not something a proxy chain produced; refuse to walk it.
_MAX_HOPS = 64
_CACHE_SIZE = 4096


def _strip_port(text: str) -> str:
    """Remove ``[..]`` brackets and a ``:port`` from one header entry (IPv4 ``a.b.c.d:p``, ``[v6]:p``)."""
    if text.startswith("["):
        end = text.find("]")
        return text[1:end] if end > 0 else ""
    if text.count(":") == 1:  # IPv4 with a port; bare IPv6 has at least two colons
        return text.split(":", 1)[0]
    return text


def _parse_address(text: str) -> _IPAddress | None:
    """Parse one entry to an address, or None when it is not one."""
    if not text or len(text) > _MAX_ENTRY_LEN:
        return None
    try:
        addr = ipaddress.ip_address(_strip_port(text))
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        if addr.scope_id is not None:
            addr = ipaddress.IPv6Address(addr.packed)
    return addr


def _forwarded_for(value: str) -> list[str]:
    """The ``for=`` value of each element of an RFC 7239 ``Forwarded`` field, "" when absent.

    Quotes are removed; an element without ``for=`` gives "" so it counts as a malformed hop.
    """
    result: list[str] = []
    for element in value.split(","):
        found = ""
        for pair in element.split(";"):
            name, sep, raw = pair.partition("=")
            if sep and name.strip().lower() == "for":
                found = raw.strip().strip('"')
                break
        result.append(found)
    return result


def _x_forwarded_for(value: str) -> list[str]:
    return [part.strip() for part in value.split(",")]


class ClientIPResolver:
    """Callable that returns a request's client IP as a normalised string.

    Built once per configuration (networks parsed, caches created); ``__call__`` does the per-request
    work only. Thread-safe. See the module docstring for the trust model.
    """

    __slots__ = (
        "_cache",
        "_count",
        "_direct",
        "_header",
        "_networks",
        "_trust_unix",
        "ipv6_prefix_length",
        "trusted_proxies",
    )

    def __init__(
        self,
        trusted_proxies: int | Sequence[str] | None = None,
        ipv6_prefix_length: int = 64,
        *,
        forwarded_header: ForwardedHeader = "auto",
    ) -> None:
        """Compile the configuration.

        :param trusted_proxies: ``None``/``0`` (use ``REMOTE_ADDR``), a proxy count, or CIDR strings
            (and :data:`UNIX_PEER` to trust a peer without an IP address).
        :param ipv6_prefix_length: 1..128; IPv6 clients are grouped by this prefix (64, the default: one
            /64 is one client; 128 = no grouping).
        :param forwarded_header: ``"auto"``, ``"x-forwarded-for"`` or ``"forwarded"``.
        :raises ValueError: on an invalid configuration (never at request time).
        """
        if isinstance(trusted_proxies, bool):
            raise ValueError("trusted_proxies must be a proxy count or a list of CIDR strings, not a bool")
        if isinstance(ipv6_prefix_length, bool) or not isinstance(ipv6_prefix_length, int):
            raise ValueError(f"ipv6_prefix_length must be an int from 1 to 128, got {ipv6_prefix_length!r}")
        if not 1 <= ipv6_prefix_length <= 128:
            raise ValueError(f"ipv6_prefix_length must be from 1 to 128, got {ipv6_prefix_length}")
        if forwarded_header not in ("auto", "x-forwarded-for", "forwarded"):
            raise ValueError(
                f"forwarded_header must be 'auto', 'x-forwarded-for' or 'forwarded', got {forwarded_header!r}"
            )
        self.trusted_proxies = trusted_proxies
        self.ipv6_prefix_length = ipv6_prefix_length
        self._header = forwarded_header
        self._count = 0
        self._networks: tuple[_IPNetwork, ...] = ()
        self._trust_unix = False
        if trusted_proxies is None:
            pass
        elif isinstance(trusted_proxies, int):
            if trusted_proxies < 0:
                raise ValueError(f"trusted_proxies count must be >= 0, got {trusted_proxies}")
            self._count = trusted_proxies
        elif isinstance(trusted_proxies, str):
            raise ValueError("trusted_proxies must be a list of CIDR strings, not a single string")
        else:
            specs = list(trusted_proxies)
            self._trust_unix = any(isinstance(s, str) and s.strip().lower() == UNIX_PEER for s in specs)
            self._networks = tuple(
                self._compile_networks(
                    s for s in specs if not (isinstance(s, str) and s.strip().lower() == UNIX_PEER)
                )
            )
        # Normalisation and trust per textual address, memoised: the same clients and proxies repeat.
        self._cache = lru_cache(maxsize=_CACHE_SIZE)(self._classify)
        # No trusted proxies: the answer is REMOTE_ADDR's alone and no header is read (see as_function).
        self._direct = not self._count and not self._networks and not self._trust_unix

    def _lookup(self, text: str) -> tuple[str, bool] | None:
        # Length check before the cache so attacker-sized strings are never stored in it.
        return self._cache(text) if len(text) <= _MAX_ENTRY_LEN else None

    @staticmethod
    def _compile_networks(specs: Iterable[Any]) -> Iterable[_IPNetwork]:
        for spec in specs:
            try:
                net = ipaddress.ip_network(spec, strict=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"trusted_proxies entry {spec!r} is not an IP network (CIDR): {exc}"
                ) from None
            # Addresses are normalised from IPv4-mapped IPv6 to IPv4, so normalise such networks too.
            if (
                isinstance(net, ipaddress.IPv6Network)
                and net.prefixlen >= 96
                and net.network_address.ipv4_mapped
            ):
                net = ipaddress.IPv4Network((net.network_address.ipv4_mapped, net.prefixlen - 96))
            yield net

    def _classify(self, text: str) -> tuple[str, bool] | None:
        """(client string, is a trusted proxy) for one textual address; None when malformed."""
        addr = _parse_address(text)
        if addr is None:
            return None
        trusted = any(addr in net for net in self._networks)
        if addr.version == 6 and self.ipv6_prefix_length < 128:
            return str(ipaddress.IPv6Network((addr, self.ipv6_prefix_length), strict=False)), trusted
        return str(addr), trusted

    def __call__(self, request: Any) -> str:
        """Return the client IP of a Django request (``request.META``); never raises."""
        meta = request.META
        remote = self._lookup(meta.get("REMOTE_ADDR") or "")
        if self._direct:
            return UNKNOWN_CLIENT if remote is None else remote[0]
        if remote is None:
            fallback = UNKNOWN_CLIENT
            if not self._count and not self._trust_unix:
                return fallback  # a peer without an address is trusted only when "unix" names it
        else:
            fallback = remote[0]
            if not self._count and not remote[1]:
                return fallback  # untrusted peer: its headers are ignored
        xff = meta.get("HTTP_X_FORWARDED_FOR") if self._header != "forwarded" else None
        fwd = meta.get("HTTP_FORWARDED") if self._header != "x-forwarded-for" else None
        if xff is None and fwd is None:
            return fallback
        if xff is not None:
            answer = self._from_chain(_x_forwarded_for(xff), fallback)
            if fwd is not None and self._from_chain(_forwarded_for(fwd), fallback) != answer:
                return fallback  # two headers, two stories: one of them is forged
            return answer
        return self._from_chain(_forwarded_for(fwd), fallback)  # type: ignore[arg-type]

    @property
    def remote_addr_only(self) -> bool:
        """True without trusted proxies: the answer depends on ``REMOTE_ADDR`` alone (no header is read)."""
        return self._direct

    def as_function(self, prefix: str = "") -> Callable[[Any], str]:
        """This resolver as a plain function of the request, for per-request key functions.

        Same answers as calling the resolver, each after ``prefix`` (a key namespace such as ``"ip:"``).
        Without trusted proxies it is a closure that reads only ``REMOTE_ADDR`` (one dict read, one
        memoised normalisation that includes the prefix), cheaper to call than an instance's
        ``__call__``; otherwise it is the bound ``__call__`` (with the prefix added to its answer).
        """
        if not self._direct:
            if not prefix:
                return self.__call__
            resolve = self.__call__

            def prefixed(request: Any) -> str:
                return prefix + resolve(request)

            return prefixed
        classify = self._cache
        unknown = prefix + UNKNOWN_CLIENT

        @lru_cache(maxsize=_CACHE_SIZE)
        def cache(text: str) -> str:
            entry = classify(text)
            return unknown if entry is None else prefix + entry[0]

        def remote_addr(request: Any) -> str:
            text = request.META.get("REMOTE_ADDR") or ""
            # Length check before the cache, as in _lookup: attacker-sized strings are never stored.
            return cache(text) if len(text) <= _MAX_ENTRY_LEN else unknown

        return remote_addr

    def _from_chain(self, hops: list[str], fallback: str) -> str:
        """Pick the client from header entries (left = farthest), or ``fallback`` when unusable."""
        if len(hops) > _MAX_HOPS:
            return fallback
        if self._count:
            if len(hops) < self._count:
                return fallback
            entry = self._lookup(hops[-self._count])
            return fallback if entry is None else entry[0]
        client = fallback
        for text in reversed(hops):
            entry = self._lookup(text)
            if entry is None:
                return fallback
            client = entry[0]
            if not entry[1]:
                return client
        return client  # every hop trusted: the left-most is the origin

    def __repr__(self) -> str:
        return (
            f"ClientIPResolver(trusted_proxies={self.trusted_proxies!r}, "
            f"ipv6_prefix_length={self.ipv6_prefix_length}, forwarded_header={self._header!r})"
        )
