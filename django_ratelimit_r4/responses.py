"""HTTP responses for rejections: 429 for rate limiters, 503 for circuit breakers and bulkheads.

=============================  ======  ==============================================================
Exception                      Status  ``Retry-After`` (delay-seconds, rounded up, at least 1)
=============================  ======  ==============================================================
``RequestNotPermitted``        429     ``exc.wait_ns``: time to the next permit for that limiter/key
``CallNotPermitted``           503     ``exc.wait_ns``: remaining time in the OPEN state
``BulkheadFull``               503     the configured per-instance duration (default 1 s)
=============================  ======  ==============================================================

An exception raised by user code without a wait reads ``wait_ns`` from its instance here, when the
response is built (see :mod:`django_ratelimit_r4.core.exceptions`).

The body is negotiated on ``Accept`` among ``application/problem+json`` (RFC 9457), a small
``text/html`` page and one line of ``text/plain``, with Django's ranking
(:meth:`~django.http.HttpRequest.get_preferred_type`: higher q, then the more specific range, then the
client's order; an absent ``Accept`` or ``*/*`` gets problem+json, which ``application/json`` also
selects). So API clients and curl get problem+json and a browser, whose ``Accept`` names ``text/html``
and reaches JSON only through ``*/*;q=0.8``, gets the page. A type the client refuses with ``q=0``
is never chosen (RFC 9110; Django drops such ranges instead). A malformed, over-long or unsatisfiable
``Accept`` gets text; none is ever an error. Problem members: ``type``, ``title``, ``status``, ``detail``, ``name``
(the instance that rejected) and ``retry_after``; rate-limit and bulkhead rejections use the
RateLimit draft's ``quota-exceeded`` / ``temporary-reduced-capacity`` types with
``violated-policies``. RFC 9457's ``instance`` member is a URI reference for the occurrence, so the
instance *name* goes in ``name`` instead. The client key is never included.

Every such response carries ``Cache-Control: no-store`` (RFC 6585: a 429 MUST NOT be stored; a cached
503 would outlive the outage) and ``Vary: Accept``.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from functools import lru_cache
from http import HTTPStatus
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.cache import patch_cache_control
from django.utils.module_loading import import_string

from . import conf, registry
from .conf import DEFAULT_BULKHEAD_RETRY_AFTER
from .core.exceptions import (
    BulkheadFull,
    CallNotPermitted,
    RequestNotPermitted,
    ResilienceError,
    retry_after_seconds,
)
from .headers import write_fields

__all__ = [
    "HANDLED_EXCEPTIONS",
    "PROBLEM_QUOTA_EXCEEDED",
    "PROBLEM_TEMPORARY_REDUCED_CAPACITY",
    "ResponseBuilder",
    "accepts_json",
    "bulkhead_retry_after_ns",
    "default_response",
    "rejection_response",
    "resolve_response_builder",
    "response_for_exception",
    "retry_after_for",
    "status_for",
]

#: The rejections :func:`response_for_exception` answers (for ``except`` clauses in middleware).
HANDLED_EXCEPTIONS: tuple[type[ResilienceError], ...] = (RequestNotPermitted, CallNotPermitted, BulkheadFull)

_PROBLEM_BASE = "https://iana.org/assignments/http-problem-types#"
#: draft-ietf-httpapi-ratelimit-headers problem types (titles as registered there).
PROBLEM_QUOTA_EXCEEDED = _PROBLEM_BASE + "quota-exceeded"
PROBLEM_TEMPORARY_REDUCED_CAPACITY = _PROBLEM_BASE + "temporary-reduced-capacity"

#: A user-supplied builder: ``builder(request, exc, *, status, retry_after) -> HttpResponse``.
ResponseBuilder = Callable[..., HttpResponse]

_DEFAULT_BULKHEAD_RETRY_AFTER_NS = int(DEFAULT_BULKHEAD_RETRY_AFTER)  # the settings' default, one source
_JSON_CONTENT_TYPE = "application/problem+json"
_TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
_HTML_CONTENT_TYPE = "text/html; charset=utf-8"
_JSON, _HTML, _TEXT = "json", "html", "text"
#: What a rejection can be sent as, in the order that breaks a tie (``*/*`` gets problem+json).
_OFFERS = ("application/problem+json", "application/json", "text/html", "text/plain")
_BODY_TYPES = {"application/problem+json": _JSON, "application/json": _JSON, "text/html": _HTML, "text/plain": _TEXT}
_MAX_ACCEPT_LEN = 2048

# RFC 9110 token and qvalue grammar.
_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_QVALUE_RE = re.compile(r"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)\Z")


def _parse_accept(accept: str) -> list[tuple[str, str, float]] | None:
    """``[(type, subtype, q)]`` for an Accept value, or None when any element is malformed."""
    ranges = []
    for element in accept.split(","):
        if not element.strip():
            continue  # RFC 9110 lists tolerate empty elements
        media, *params = element.split(";")
        maintype, slash, subtype = media.strip().lower().partition("/")
        if not slash or not _TOKEN_RE.match(maintype) or not _TOKEN_RE.match(subtype):
            return None
        if maintype == "*" and subtype != "*":
            return None
        q = 1.0
        for param in params:
            key, eq, value = param.strip().partition("=")
            if not eq or not _TOKEN_RE.match(key.strip()):
                return None
            if key.strip().lower() == "q":
                if not _QVALUE_RE.match(value.strip()):
                    return None
                q = float(value)
        ranges.append((maintype, subtype, q))
    return ranges or None


def _quality(ranges: list[tuple[str, str, float]], maintype: str, subtype: str) -> float:
    """q of the most specific range matching ``maintype/subtype`` (0 when none matches)."""
    best_rank, best_q = -1, 0.0
    for rtype, rsub, q in ranges:
        if rtype == maintype and rsub == subtype:
            rank = 2
        elif rtype == maintype and rsub == "*":
            rank = 1
        elif rtype == "*":
            rank = 0
        else:
            continue
        if rank > best_rank or (rank == best_rank and q > best_q):
            best_rank, best_q = rank, q
    return best_q


@lru_cache(maxsize=256)
def _negotiated_cached(accept: str) -> str:
    ranges = _parse_accept(accept)
    if ranges is None:
        return _TEXT
    # RFC 9110: q=0 means "not acceptable". Django's matching drops q=0 ranges rather than honouring them
    # (``application/*;q=0, */*`` would still select JSON), so the offers a range refuses go first.
    offers = [offer for offer in _OFFERS if _quality(ranges, *offer.split("/")) > 0]
    if not offers:
        return _TEXT
    # Django ranks what is left, on the header as parsed above (lower-cased, parameters other than q
    # dropped): nothing malformed or odd reaches it.
    request = HttpRequest()
    request.META["HTTP_ACCEPT"] = ", ".join(f"{t}/{sub};q={q}" for t, sub, q in ranges if q > 0)
    choice = request.get_preferred_type(offers)
    return _TEXT if choice is None else _BODY_TYPES[choice]


def _negotiated(accept: str | None) -> str:
    """``"json"``, ``"html"`` or ``"text"``: the body for this ``Accept`` value (``None``: header absent)."""
    if accept is None:
        return _JSON
    if len(accept) > _MAX_ACCEPT_LEN:
        return _TEXT
    return _negotiated_cached(accept)


def accepts_json(accept: str | None) -> bool:
    """Whether this ``Accept`` value gets the problem+json body (``None`` = header absent = yes).

    See the module docstring for the negotiation; malformed or over-long -> False.
    """
    return _negotiated(accept) == _JSON


def status_for(exc: ResilienceError) -> int:
    """429 for ``RequestNotPermitted``, 503 for ``CallNotPermitted`` and ``BulkheadFull``.

    :raises TypeError: for any other exception (not a rejection this module answers).
    """
    if isinstance(exc, RequestNotPermitted):
        return 429
    if isinstance(exc, (CallNotPermitted, BulkheadFull)):
        return 503
    raise TypeError(
        f"no HTTP response is defined for {type(exc).__name__}; expected one of HANDLED_EXCEPTIONS"
    )


def retry_after_for(
    exc: ResilienceError, bulkhead_retry_after_ns: int = _DEFAULT_BULKHEAD_RETRY_AFTER_NS
) -> int:
    """``Retry-After`` seconds for a rejection: the exception's wait, or the bulkhead's configured one."""
    if isinstance(exc, BulkheadFull):
        return retry_after_seconds(int(bulkhead_retry_after_ns))
    return exc.retry_after


def _violated(exc: ResilienceError) -> tuple[str, ...]:
    # A breaker is no policy the client violated; a limiter or bulkhead is the one policy named.
    if isinstance(exc, CallNotPermitted):
        return ()
    return (exc.name,)


_PROBLEM_TITLES = {
    PROBLEM_QUOTA_EXCEEDED: "Quota Exceeded",
    PROBLEM_TEMPORARY_REDUCED_CAPACITY: "Temporary Reduced Capacity",
    "about:blank": "Service Unavailable",
}


def _problem_type(exc: ResilienceError) -> str:
    if isinstance(exc, RequestNotPermitted):
        return PROBLEM_QUOTA_EXCEEDED
    if isinstance(exc, BulkheadFull):
        return PROBLEM_TEMPORARY_REDUCED_CAPACITY
    return "about:blank"


def _problem_for(
    problem_type: str, message: str, name: str, violated: tuple[str, ...], status: int, retry_after: int
) -> tuple[dict[str, Any], str]:
    detail = f"{message}; retry after {retry_after} second{'s' if retry_after != 1 else ''}."
    body: dict[str, Any] = {"type": problem_type, "title": _PROBLEM_TITLES[problem_type]}
    body.update(status=status, detail=detail, name=name, retry_after=retry_after)
    if violated:
        body["violated-policies"] = list(violated)
    return body, detail


# Rejections repeat: the same instance, the same few Retry-After values. Rendering the body once per
# distinct combination keeps the 429 path cheap (it is what an attacker makes us serve, fast).
@lru_cache(maxsize=1024)
def _rendered(
    problem_type: str,
    message: str,
    name: str,
    violated: tuple[str, ...],
    status: int,
    retry_after: int,
    body_type: str,
) -> tuple[bytes, str]:
    body, detail = _problem_for(problem_type, message, name, violated, status, retry_after)
    if body_type == _JSON:
        return json.dumps(body).encode(), _JSON_CONTENT_TYPE
    if body_type == _HTML:
        return _page(status, detail).encode(), _HTML_CONTENT_TYPE
    return (detail + "\n").encode(), _TEXT_CONTENT_TYPE


def _page(status: int, detail: str) -> str:
    """A small HTML page for a browser: the status and the detail line (escaped: it holds the name)."""
    reason = HTTPStatus(status).phrase
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{status} {reason}</title></head>\n"
        f"<body><h1>{reason}</h1><p>{html.escape(detail)}</p></body></html>\n"
    )


def default_response(
    request: HttpRequest, exc: ResilienceError, *, status: int, retry_after: int
) -> HttpResponse:
    """The built-in body (problem+json, HTML or text, negotiated) with ``status``. Headers are added by the caller.

    Exposed so a custom builder can wrap it.
    """
    content, content_type = _default_body(request, exc, status, retry_after)
    return HttpResponse(content, status=status, content_type=content_type)


def _default_body(request: HttpRequest, exc: ResilienceError, status: int, retry_after: int) -> tuple[bytes, str]:
    """(content, content type) of the built-in body, negotiated on the request's ``Accept``."""
    return _rendered(
        _problem_type(exc),
        str(exc),
        exc.name,
        _violated(exc),
        status,
        retry_after,
        _negotiated(request.META.get("HTTP_ACCEPT")),
    )


def response_for_exception(
    request: HttpRequest,
    exc: ResilienceError,
    *,
    bulkhead_retry_after_ns: int = _DEFAULT_BULKHEAD_RETRY_AFTER_NS,
    builder: ResponseBuilder | None = None,
) -> HttpResponse:
    """The 429/503 response for a rejection raised by a rate limiter, circuit breaker or bulkhead.

    ``builder`` (from the ``response_builder`` setting, see :func:`resolve_response_builder`) replaces
    the default body: it is called as ``builder(request, exc, status=..., retry_after=...)``. Whatever
    it returns still gets ``Retry-After`` (unless it set one) and, on 429/503, ``Cache-Control: no-store``.

    :raises TypeError: when ``exc`` is not one of :data:`HANDLED_EXCEPTIONS`.
    """
    status = status_for(exc)
    retry_after = retry_after_for(exc, bulkhead_retry_after_ns)
    if builder is None:
        # The default response is fully known: its fields (ASCII, no CR/LF) are written straight into Django's
        # header store (headers.write_fields) instead of one checked response[name] = value each (~1 µs).
        content, content_type = _default_body(request, exc, status, retry_after)
        response = HttpResponse(content, status=status, content_type=content_type)
        write_fields(response, {"Retry-After": str(retry_after), "Cache-Control": "no-store", "Vary": "Accept"})
        return response
    response = builder(request, exc, status=status, retry_after=retry_after)
    if not isinstance(response, HttpResponseBase):  # a builder that forgot its return: name it, not a TypeError
        raise ImproperlyConfigured(
            f'{conf.setting_path("response_builder")} {getattr(builder, "__qualname__", builder)!s} returned '
            f"{response!r:.80}, not an HttpResponse: return the response it builds"
        )
    if "Retry-After" not in response:
        response["Retry-After"] = str(retry_after)
    if response.status_code in (429, 503):
        patch_cache_control(response, no_store=True)
    return response


def resolve_response_builder(spec: str | ResponseBuilder | None) -> ResponseBuilder | None:
    """Turn the ``response_builder`` option (dotted path, callable or None) into a callable, once.

    :raises ValueError: when the path cannot be imported or does not name a callable.
    """
    if spec is None or (callable(spec) and not isinstance(spec, str)):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"response_builder must be a dotted path or a callable, got {type(spec).__name__}")
    try:
        builder = import_string(spec)
    except ImportError as exc:
        raise ValueError(f"cannot import response_builder '{spec}': {exc}") from None
    if not callable(builder):
        raise ValueError(f"response_builder '{spec}' is not callable")
    return builder  # type: ignore[no-any-return]


def bulkhead_retry_after_ns(name: str) -> int:
    """The configured ``retry_after`` (ns) of bulkhead ``name``; the default for unknown instances."""
    try:
        return int(registry.instance_options("bulkheads", name)["retry_after"])
    except (KeyError, ImproperlyConfigured):  # not configured (built by hand) or misconfigured
        return _DEFAULT_BULKHEAD_RETRY_AFTER_NS


def rejection_response(
    request: Any, exc: ResilienceError, *, bulkhead_retry_after: int | None = None
) -> HttpResponse:
    """The 429/503 response for one of :data:`HANDLED_EXCEPTIONS`, as configured.

    Uses the ``response_builder`` option and, for a full bulkhead, its configured ``retry_after``
    (pass ``bulkhead_retry_after`` in ns to skip the lookup). A rejection path only: it reads the
    cached options, never the raw settings. What the decorators, the middleware and the DRF exception
    handler all answer.
    """
    if isinstance(exc, BulkheadFull) and bulkhead_retry_after is None:
        bulkhead_retry_after = bulkhead_retry_after_ns(exc.name)
    return response_for_exception(
        request,
        exc,
        bulkhead_retry_after_ns=int(bulkhead_retry_after or _DEFAULT_BULKHEAD_RETRY_AFTER_NS),
        builder=conf.get_options().response_builder,
    )
