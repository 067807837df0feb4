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
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, Literal

__all__ = [
    "FORWARDED_HEADERS",
    "UNIX_PEER",
    "UNKNOWN_CLIENT",
    "ClientIPResolver",
    "ForwardedHeader",
    "parse_forwarded_header",
    "parse_ipv6_prefix_length",
    "parse_trusted_proxies",
]

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
#: The values of ``forwarded_header``: which header a trusted proxy writes (``"auto"``: either).
FORWARDED_HEADERS: tuple[str, ...] = ("auto", "x-forwarded-for", "forwarded")


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


def _forwarded_for(value: str, last: int) -> list[str]:
    """The ``for=`` value of each of the ``last`` right-most elements of an RFC 7239 ``Forwarded`` field, "" when
    absent, after the rest of the field as one more (unparsed) entry when there is more (see :func:`_x_forwarded_for`).

    Quotes are removed; an element without ``for=`` gives "" so it counts as a malformed hop.
    """
    result: list[str] = []
    for element in value.rsplit(",", last):
        found = ""
        for pair in element.split(";"):
            name, sep, raw = pair.partition("=")
            if sep and name.strip().lower() == "for":
                found = raw.strip().strip('"')
                break
        result.append(found)
    return result


def _x_forwarded_for(value: str, last: int) -> list[str]:
    """The ``last`` right-most entries of an ``X-Forwarded-For`` value, after the rest of the value as one more entry
    when there is more: the client writes the left of the header, so its length never costs more than this."""
    return [part.strip() for part in value.rsplit(",", last)]


# ---------------------------------------------------------------------------------- the one set of rules
# The settings (conf) and ClientIPResolver both validate with these; each raises ValueError with a message
# that does not name the option (the caller does: conf as a check problem with a hint, the resolver as
# "trusted_proxies ...").


def parse_trusted_proxies(value: object) -> int | tuple[_IPNetwork | str, ...]:
    """``trusted_proxies`` checked: a proxy count ``>= 0``, or CIDR networks (strings or network objects, and
    :data:`UNIX_PEER`), every bad entry named at once. IPv4-mapped IPv6 networks become IPv4 networks.

    :raises ValueError: for anything else.
    """
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple, set, frozenset)):
        raise ValueError(f"must be an integer or a list of CIDR strings, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must be >= 0, got {value}")
        return value
    networks: list[_IPNetwork | str] = []
    bad: list[str] = []
    for item in value:
        if isinstance(item, str) and item.strip().lower() == UNIX_PEER:
            networks.append(UNIX_PEER)  # a peer without an IP address (a Unix socket): only when named
            continue
        if not isinstance(item, (str, ipaddress.IPv4Network, ipaddress.IPv6Network)):
            bad.append(f"{item!r} (expected a string, got {type(item).__name__})")
            continue
        try:
            networks.append(_ipv4_if_mapped(ipaddress.ip_network(item, strict=False)))
        except ValueError as exc:
            bad.append(f"{item!r} ({exc})")
    if bad:
        raise ValueError("not valid CIDR networks: " + "; ".join(bad))
    return tuple(networks)


def _ipv4_if_mapped(net: _IPNetwork) -> _IPNetwork:
    # Addresses are normalised from IPv4-mapped IPv6 to IPv4, so normalise such networks too.
    if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96 and net.network_address.ipv4_mapped:
        return ipaddress.IPv4Network((net.network_address.ipv4_mapped, net.prefixlen - 96))
    return net


def parse_ipv6_prefix_length(value: object) -> int:
    """``ipv6_prefix_length`` checked: an int from 1 to 128. :raises ValueError: otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 128:
        raise ValueError(f"must be an integer from 1 to 128, got {value!r}")
    return value


def parse_forwarded_header(value: object) -> ForwardedHeader:
    """``forwarded_header`` checked and lower-cased: one of :data:`FORWARDED_HEADERS`. :raises ValueError: otherwise."""
    if not isinstance(value, str) or value.lower() not in FORWARDED_HEADERS:
        raise ValueError(f"must be one of {', '.join(repr(h) for h in FORWARDED_HEADERS)}, got {value!r}")
    return value.lower()  # type: ignore[return-value]


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
        "_read",
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
        try:
            proxies = 0 if trusted_proxies is None else parse_trusted_proxies(trusted_proxies)
        except ValueError as exc:
            raise ValueError(f"trusted_proxies {exc}") from None
        try:
            ipv6_prefix_length = parse_ipv6_prefix_length(ipv6_prefix_length)
        except ValueError as exc:
            raise ValueError(f"ipv6_prefix_length {exc}") from None
        try:
            forwarded_header = parse_forwarded_header(forwarded_header)
        except ValueError as exc:
            raise ValueError(f"forwarded_header {exc}") from None
        self.trusted_proxies = trusted_proxies
        self.ipv6_prefix_length = ipv6_prefix_length
        self._header = forwarded_header
        self._count = 0
        self._networks: tuple[_IPNetwork, ...] = ()
        self._trust_unix = False
        if isinstance(proxies, int):
            self._count = proxies
        else:
            self._trust_unix = UNIX_PEER in proxies
            self._networks = tuple(net for net in proxies if not isinstance(net, str))
        # Normalisation and trust per textual address, memoised: the same clients and proxies repeat.
        self._cache = lru_cache(maxsize=_CACHE_SIZE)(self._classify)
        # Header entries read, from the right: the N-th with a count, at most _MAX_HOPS walking CIDRs.
        self._read = self._count or _MAX_HOPS
        # No trusted proxies: the answer is REMOTE_ADDR's alone and no header is read (see as_function).
        self._direct = not self._count and not self._networks and not self._trust_unix

    def _lookup(self, text: str) -> tuple[str, bool] | None:
        # Length check before the cache so attacker-sized strings are never stored in it.
        return self._cache(text) if len(text) <= _MAX_ENTRY_LEN else None

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
        read = self._read
        if xff is not None:
            answer = self._from_chain(_x_forwarded_for(xff, read), fallback)
            if fwd is not None and self._from_chain(_forwarded_for(fwd, read), fallback) != answer:
                return fallback  # two headers, two stories: one of them is forged
            return answer
        return self._from_chain(_forwarded_for(fwd, read), fallback)  # type: ignore[arg-type]

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
        """Pick the client from header entries (left = farthest; at most ``_read + 1``, the first then holding the
        unread rest), or ``fallback`` when unusable. Entries left of the answer are never looked at: the client
        wrote them, and how many or what they are must not change its budget."""
        if self._count:
            if len(hops) < self._count:
                return fallback
            entry = self._lookup(hops[-self._count])
            return fallback if entry is None else entry[0]
        walked = hops[1:] if len(hops) > _MAX_HOPS else hops
        client = fallback
        for text in reversed(walked):
            entry = self._lookup(text)
            if entry is None:
                return fallback
            client = entry[0]
            if not entry[1]:
                return client
        if len(hops) > _MAX_HOPS:
            return fallback  # more than _MAX_HOPS trusted hops: not something a proxy chain produced
        return client  # every hop trusted: the left-most is the origin

    def __repr__(self) -> str:
        return (
            f"ClientIPResolver(trusted_proxies={self.trusted_proxies!r}, "
            f"ipv6_prefix_length={self.ipv6_prefix_length}, forwarded_header={self._header!r})"
        )
