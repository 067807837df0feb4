"""IETF "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers): formatting and writing.

This module is the one place that formats the fields and the one place that writes them on a response
(:func:`write_draft10`, :func:`write_fields`); it is also the only module of the package that touches a
Django internal (``ResponseHeaders._store``, see "Writing" below).

Two styles, chosen by the ``headers`` option:

``"draft-10"`` (the -08..-10 syntax; Structured-Field Lists, RFC 9651)::

    RateLimit-Policy: "api";q=10;w=1
    RateLimit: "api";r=0;t=1

Several policies are joined with ``", "`` in the order given. With a client key, both items carry
``pk=:<base64>:``: the first 12 bytes of ``sha256(salt + key)``, never the raw key.

``"draft-6"`` (the -04..-06 fields, still what Litestar and express-rate-limit's ``draft-6`` emit)::

    RateLimit-Limit: 10
    RateLimit-Remaining: 0
    RateLimit-Reset: 1
    RateLimit-Policy: 10;w=1

With several policies, Limit/Remaining/Reset describe the one closest to exhaustion (fewest remaining,
then longest reset) and RateLimit-Policy lists them all.

Rounding. ``w`` must be a positive integer number of seconds, so :func:`window_seconds` rounds the
refresh period **up** (at least 1): a limit of 10 per 100 ms is advertised as ``q=10;w=1``. A client
that follows the advertised policy therefore never sends faster than the real one allows; it may send
slower. ``t`` and ``RateLimit-Reset`` are delay-seconds rounded up (:func:`delay_seconds`), so a client
that waits ``t`` seconds never comes back too early. Negative remaining (reservation debt) is sent as 0.

Writing. ``response[name] = value`` checks the charset and newlines of every value and lower-cases the
name each time: a few hundred ns on every allowed request. The fields written here are ASCII without
CR/LF by construction (sf-strings, integers, base64), so :func:`write_draft10` and :func:`write_fields` put them straight into
Django's ``ResponseHeaders._store`` (``{lower name: (name, value)}``). That layout is Django's private
business: it is probed once at import (:func:`store_layout_ok`: write through the store, read back through
the public API and the other way round), and when the probe fails (a Django that changed it) or a response
has no such store (a response class of its own), the fields go through the public API instead.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from .conf import DRAFT_6, DRAFT_10  # the headers option's styles are named where the option is checked

__all__ = [
    "DRAFT_6",
    "DRAFT_10",
    "HEADER_STYLES",
    "HeaderStyle",
    "QuotaStatus",
    "delay_seconds",
    "draft6_headers",
    "draft10_headers",
    "partition_key",
    "ratelimit_headers",
    "sf_string",
    "store_layout_ok",
    "window_seconds",
    "write_draft10",
    "write_fields",
]

HeaderStyle = Literal["draft-10", "draft-6"]
#: Valid values of the ``headers`` option (``None`` turns the fields off).
HEADER_STYLES: tuple[str | None, ...] = (DRAFT_10, DRAFT_6, None)

_NS_PER_S = 1_000_000_000
_PK_BYTES = 12  # 96 bits: collision-free in practice, 16 base64 characters on the wire
_SF_INT_MAX = 999_999_999_999_999  # RFC 9651 Integers have at most 15 digits


def _sf_int(value: int) -> int:
    """Clamp to a valid non-negative sf-integer (negative remaining = debt is sent as 0)."""
    return 0 if value < 0 else min(value, _SF_INT_MAX)


def window_seconds(period_ns: int) -> int:
    """A refresh period in ns as the draft's ``w``: seconds rounded up, at least 1."""
    return max(1, -(-period_ns // _NS_PER_S))


def delay_seconds(wait_ns: int) -> int:
    """A wait in ns as delay-seconds (``t``, ``RateLimit-Reset``): rounded up, never negative."""
    return max(0, -(-wait_ns // _NS_PER_S))


@lru_cache(maxsize=256)
def sf_string(value: str) -> str:
    """Serialise ``value`` as a Structured-Field String (quoted, ``\\`` and ``"`` escaped).

    Characters outside printable ASCII cannot appear in an sf-string; they become ``_`` so a policy
    name can never produce an invalid header.
    """
    out = []
    for ch in value:
        if ch in '\\"':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append("_")
    return '"' + "".join(out) + '"'


def partition_key(key: str, salt: bytes = b"") -> str:
    """The draft's ``pk`` as an sf-binary ``:base64:`` of a truncated ``sha256(salt + key)``.

    Pass a server secret as ``salt`` when keys are guessable (IPv4 addresses are: an unsalted hash
    of one can be reversed by trying all 2**32).
    """
    digest = hashlib.sha256(salt + key.encode("utf-8", "surrogatepass")).digest()[:_PK_BYTES]
    return ":" + base64.b64encode(digest).decode("ascii") + ":"


@dataclass(frozen=True, slots=True)
class QuotaStatus:
    """One policy's state on one response: the input of the formatters.

    ``window`` and ``reset`` are whole seconds (see :func:`window_seconds`, :func:`delay_seconds`);
    ``key`` is the raw client key, only ever sent hashed as ``pk``.
    """

    policy: str
    limit: int
    window: int
    remaining: int
    reset: int
    key: str | None = None


def draft10_state(prefix: str, remaining: int, reset: int, pk: str = "") -> str:
    """One member of the ``RateLimit`` field: ``prefix`` is ``sf_string(policy) + ";r="``, ``reset`` in seconds.

    The only formatter of that member (the decorators' fast paths call it too); ``pk`` is ``""`` or
    ``";pk=" + partition_key(...)``. Values are clamped to sf-integers (negative remaining is sent as 0).
    """
    # Comparisons, not _sf_int()/min(): this runs on every allowed request.
    if remaining < 0:
        remaining = 0
    elif remaining > _SF_INT_MAX:
        remaining = _SF_INT_MAX
    if reset < 0:
        reset = 0
    elif reset > _SF_INT_MAX:
        reset = _SF_INT_MAX
    return f"{prefix}{remaining};t={reset}{pk}"


def draft10_headers(statuses: Sequence[QuotaStatus], *, salt: bytes = b"") -> dict[str, str]:
    """``RateLimit-Policy`` and ``RateLimit`` in the -10 syntax; ``{}`` for no statuses."""
    if not statuses:
        return {}
    policies = []
    states = []
    for s in statuses:
        name = sf_string(s.policy)
        pk = "" if s.key is None else ";pk=" + partition_key(s.key, salt)
        policies.append(f"{name};q={_sf_int(s.limit)};w={_sf_int(s.window)}{pk}")
        states.append(draft10_state(name + ";r=", s.remaining, s.reset, pk))
    return {"RateLimit-Policy": ", ".join(policies), "RateLimit": ", ".join(states)}


def draft6_headers(statuses: Sequence[QuotaStatus]) -> dict[str, str]:
    """``RateLimit-Limit/Remaining/Reset`` (closest-to-exhaustion policy) and ``RateLimit-Policy``."""
    if not statuses:
        return {}
    worst = min(statuses, key=lambda s: (max(0, s.remaining), -s.reset))
    return {
        "RateLimit-Limit": str(worst.limit),
        "RateLimit-Remaining": str(max(0, worst.remaining)),
        "RateLimit-Reset": str(max(0, worst.reset)),
        "RateLimit-Policy": ", ".join(f"{s.limit};w={s.window}" for s in statuses),
    }


def ratelimit_headers(
    style: str | None, statuses: Sequence[QuotaStatus], *, salt: bytes = b""
) -> dict[str, str]:
    """Dispatch on the ``headers`` option: ``"draft-10"``, ``"draft-6"`` or ``None`` (no fields).

    :raises ValueError: for any other style (settings checks should have caught it).
    """
    if style == DRAFT_10:
        return draft10_headers(statuses, salt=salt)
    if style == DRAFT_6:
        return draft6_headers(statuses)
    if style is None:
        return {}
    raise ValueError(f"headers must be 'draft-10', 'draft-6' or None, got {style!r}")


# ------------------------------------------------------------------------------------------------ writing


def store_layout_ok(headers_class: Any = None) -> bool:
    """Whether ``headers_class`` (Django's ``ResponseHeaders`` by default) keeps ``{lower: (name, value)}``
    in ``_store``, both ways: a value put in the store reads back through the public API, and a value set
    through the public API shows in the store. False on any surprise (the fields then take the public API).
    """
    try:
        if headers_class is None:
            from django.http.response import ResponseHeaders as headers_class
        headers = headers_class({})
        store = headers._store
        if type(store) is not dict:
            return False
        store["ratelimit-probe"] = ("RateLimit-Probe", "1")
        headers["X-R4-Probe"] = "2"
        return bool(
            headers.get("RATELIMIT-PROBE") == "1"
            and ("RateLimit-Probe", "1") in list(headers.items())
            and store.get("x-r4-probe") == ("X-R4-Probe", "2")
        )
    except Exception:  # any change of shape: not the layout this module writes into
        return False


#: The probe's answer for the installed Django, read once at import.
STORE_LAYOUT_OK: bool = store_layout_ok()


def write_draft10(
    response: Any, policy: str, prefix: str, remaining: int, reset_ns: int, pk: str = ""
) -> None:
    """Set ``RateLimit-Policy: policy`` and the ``RateLimit`` member of one decision on ``response``.

    ``policy`` is the complete ``RateLimit-Policy`` value (with ``pk`` if any), ``prefix`` is
    ``sf_string(name) + ";r="`` and ``reset_ns`` the time to the reset in ns (rounded up to seconds).
    The decorators' hot path: straight into Django's header store when :data:`STORE_LAYOUT_OK`.
    """
    # draft10_state() inlined (this runs on every allowed request); tests/test_headers.py checks they agree.
    if remaining < 0:
        remaining = 0
    elif remaining > _SF_INT_MAX:
        remaining = _SF_INT_MAX
    reset = (reset_ns + 999_999_999) // 1_000_000_000 if reset_ns > 0 else 0
    state = f"{prefix}{remaining};t={reset if reset <= _SF_INT_MAX else _SF_INT_MAX}{pk}"
    if STORE_LAYOUT_OK:
        try:
            store = response.headers._store
        except AttributeError:  # a response class without Django's ResponseHeaders
            store = None
        if type(store) is dict:
            store["ratelimit-policy"] = ("RateLimit-Policy", policy)
            store["ratelimit"] = ("RateLimit", state)
            return
    response["RateLimit-Policy"] = policy
    response["RateLimit"] = state


def write_fields(response: Any, fields: dict[str, str]) -> None:
    """Set every field of ``fields`` (as returned by :func:`ratelimit_headers`, or ``Cache-Control: no-store``:
    ASCII strings without CR/LF, as this module builds them) on ``response``; straight into Django's header
    store when :data:`STORE_LAYOUT_OK`, as :func:`write_draft10` (about 1.5 µs a field less than
    ``response[name] = value``)."""
    if STORE_LAYOUT_OK:
        try:
            store = response.headers._store
        except AttributeError:  # a response class without Django's ResponseHeaders
            store = None
        if type(store) is dict:
            for name, value in fields.items():
                store[name.lower()] = (name, value)
            return
    for name, value in fields.items():
        response[name] = value
