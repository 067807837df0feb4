"""The state endpoint: the JSON of ``manage.py r4 status --json`` and POST actions, for operators only.

Mount it with ``path("ops/r4/", include("django_ratelimit_r4.urls"))`` (see :mod:`.urls`).

Access (checked before anything else, for every method):

- ``Authorization: Bearer <token>`` equal to ``RATELIMIT_R4["state_endpoint_token"]`` (compared with
  :func:`hmac.compare_digest`). A bearer token that does not match is refused even for a staff session.
- otherwise an active, authenticated **staff** user (Django session).
- everyone else gets a plain **404**, exactly like a URL that does not exist, so the endpoint's
  existence is not revealed: the project's ``handler404`` (Django's "Not Found" page by default), built
  without this endpoint's headers, and never Django's DEBUG page (which would name the view).

POST is exempt from CSRF only for bearer-token requests (no cookies are involved); staff sessions must
send the CSRF token as for any other Django form.

Client keys of keyed rate limiters are listed only with ``?keys=1`` **and** either the bearer token or
the ``ratelimit_r4.view_keys`` permission (superusers have every permission; for other staff grant it
through an authentication backend's ``has_perm``). Without that permission ``?keys=1`` is a 403.

Each response carries ``X-R4-Worker-Pid`` and ``X-R4-Worker-Host``: with the in-memory backend every worker
has its own state, and these say which one answered.

Without ``RATELIMIT_R4["control"]`` an action changes the worker that answers, and its JSON says so
(``"scope": "worker"`` and ``"worker": {"host", "pid", "started"}``). With it, an action is broadcast to every
live worker (:func:`django_ratelimit_r4.control.broadcast`; an optional ``timeout`` field in seconds, at most
:data:`MAX_TIMEOUT_S`) and the JSON lists who acknowledged and who did not (``"scope": "cluster"``).
``GET ?cluster=1`` answers ``{"scope": "cluster", "workers": [...], "totals": [...]}`` with the control plane, and
``{"scope": "worker", "worker": {...}, "instances": [...]}`` without it; a plain GET keeps answering the list.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.urls import get_resolver, get_urlconf
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

from . import conf, control, state

__all__ = ["KEYS_PERMISSION", "MAX_TIMEOUT_S", "drain_view", "reset_view", "state_view", "transition_view"]

#: The permission (besides the bearer token) that lets ``?keys=1`` list client keys.
KEYS_PERMISSION = "ratelimit_r4.view_keys"

#: The longest ``timeout`` (seconds) a broadcast action may wait for acknowledgements.
MAX_TIMEOUT_S = control.MAX_TIMEOUT_S


class _Access:
    """Who is asking: by bearer token, or a staff session (which keeps CSRF)."""

    __slots__ = ("by_token", "user")

    def __init__(self, by_token: bool, user: Any = None) -> None:
        self.by_token = by_token
        self.user = user

    def may_see_keys(self) -> bool:
        return self.by_token or bool(self.user is not None and self.user.has_perm(KEYS_PERMISSION))


def _expected_token() -> str | None:
    try:
        return conf.get_options().state_endpoint_token
    except ImproperlyConfigured:  # broken options: token access is off, staff access still works
        return None


def _authorize(request: HttpRequest) -> _Access | None:
    """The caller's access, or None for anyone not allowed (they get a 404, never 401/403: do not reveal)."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer":
        expected = _expected_token()
        given = credentials.strip().encode()
        if expected and hmac.compare_digest(given, expected.encode()):
            return _Access(by_token=True)
        return None
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_active and user.is_staff:
        return _Access(by_token=False, user=user)
    return None


def _not_found(request: HttpRequest) -> HttpResponse:
    """The 404 of a URL that does not exist, as production renders it: the project's ``handler404``.

    Returned, not raised: with ``DEBUG = True`` Django renders a raised ``Http404`` as its technical
    page, which names this view ("Raised by: ...state_view") and lists the URLconf.
    """
    handler: Any = get_resolver(get_urlconf()).resolve_error_handler(404)  # (request, exception)
    response: HttpResponse = handler(request, Http404())
    return response


def _operators_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Authorize first; anyone else gets :func:`_not_found` (without the endpoint's cache headers)."""
    inner = never_cache(view)

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        access = _authorize(request)
        if access is None:
            return _not_found(request)
        return inner(request, access, *args, **kwargs)

    return csrf_exempt(guarded)


def _unused_view(request: HttpRequest) -> HttpResponse:
    """Stands in for the view in the CSRF check, which needs one but never calls it."""
    return HttpResponse()


# Like any middleware instance, it keeps no per-request state: one serves every request.
_CSRF = CsrfViewMiddleware(_unused_view)


def _csrf_failure(request: HttpRequest) -> HttpResponse | None:
    """Run Django's CSRF check for a session-authenticated POST (the views themselves are exempt)."""
    _CSRF.process_request(request)
    return _CSRF.process_view(request, _unused_view, (), {})


def _json(data: Any, status: int = 200) -> JsonResponse:
    response = JsonResponse(data, status=status, safe=False, json_dumps_params={"sort_keys": True})
    response["X-R4-Worker-Pid"] = str(os.getpid())  # read per response: a preloading server forks after import
    response["X-R4-Worker-Host"] = control.worker()["host"]
    return response


def _error(message: str, status: int) -> JsonResponse:
    return _json({"error": message}, status)


@_operators_only
def state_view(request: HttpRequest, access: _Access) -> HttpResponse:
    """GET: the list of ``r4 status --json``. ``?name=a&name=b`` filters, ``?keys=1`` adds client keys."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    include_keys = request.GET.get("keys") in ("1", "true", "yes")
    if include_keys and not access.may_see_keys():
        return _error(f"listing client keys needs the bearer token or the {KEYS_PERMISSION} permission", 403)
    names = request.GET.getlist("name") or None
    cluster = request.GET.get("cluster") in ("1", "true", "yes")
    try:
        if cluster and not include_keys and control.get_control_plane() is not None:
            return _json(control.cluster_status(names))
        items = state.snapshot(names, include_keys=include_keys)
    except state.UnknownName as exc:
        return _error(str(exc), 404)
    except control.ControlUnavailable as exc:
        return _error(str(exc), 503)
    if cluster:
        return _json({"scope": "worker", "worker": control.worker(), "instances": items})
    return _json(items)


_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class _DuplicateField(ValueError):
    """A JSON object names the same field twice (``json`` would silently keep the last one)."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` that refuses duplicated names instead of keeping the last one."""
    data: dict[str, Any] = {}
    for name, value in pairs:
        if name in data:
            raise _DuplicateField(name)
        data[name] = value
    return data


def _json_body(raw: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(raw or b"{}", object_pairs_hook=_unique_pairs)
    except _DuplicateField as exc:
        raise state.IllegalAction(f"the JSON body names {str(exc)!r} more than once; send it once") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise state.IllegalAction(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise state.IllegalAction("the JSON body must be an object")
    return parsed


def _form_body(request: HttpRequest) -> dict[str, Any]:
    raw = request.body  # read first: Django then parses a multipart body from memory, and we can count
    if request.FILES:
        name = next(iter(request.FILES))
        raise state.IllegalAction(f"{name!r} was sent as a file part; send every field as a plain form field")
    data: dict[str, Any] = {}
    for name, values in request.POST.lists():
        if len(values) != 1:
            raise state.IllegalAction(f"the form sends {name!r} {len(values)} times; send it once")
        data[name] = values[0]
    if request.content_type == "multipart/form-data":
        # Django drops some parts without a word (no name; a file part whose filename sanitises to "..").
        # Every delimiter but the closing one opens a part: all of them must have become fields.
        boundary = (request.content_params or {}).get("boundary", "").encode("latin-1", "replace")
        if raw.count(b"--" + boundary) - 1 != len(data):
            raise state.IllegalAction("a part of the multipart body is not a plain named form field")
    return data


def _body(request: HttpRequest, fields: frozenset[str]) -> dict[str, Any]:
    """The action's arguments from a JSON object or a form; anything unexpected is a 400.

    Unknown fields, duplicated fields, file parts, a query string and unreadable bodies are refused
    rather than ignored: a mistyped or doubled ``key`` must not turn a one-client reset into a reset
    of every client. A body without ``key`` acts on the whole instance.
    """
    if request.GET:
        name = next(iter(request.GET))
        raise state.IllegalAction(
            f"the query string is not read (it names {name!r}): send the fields in a JSON or form body"
        )
    data: dict[str, Any]
    if request.content_type == "application/json":
        data = _json_body(request.body)
    elif request.content_type in _FORM_TYPES:
        data = _form_body(request)
    elif request.body:
        raise state.IllegalAction(
            f"unsupported content type {request.content_type!r}: send application/json or a form"
        )
    else:
        data = {}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise state.IllegalAction(f"unknown field {unknown[0]!r}; expected {', '.join(sorted(fields))}")
    return data


def _action(
    action: str, run: Callable[..., dict[str, Any]], field: str, doc: str
) -> Callable[[HttpRequest, str], HttpResponse]:
    """The view of ``action``: ``run(name, **{field: value})`` here, or the same arguments broadcast to every
    worker through the control plane."""
    accepted = frozenset((field, "timeout"))

    def view(request: HttpRequest, access: _Access, name: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        # Buffer the raw body before anything parses the form (the CSRF check may): _body counts a
        # multipart body's parts in it, and Django refuses `request.body` once the stream is parsed.
        _ = request.body
        if not access.by_token:
            failure = _csrf_failure(request)
            if failure is not None:
                return failure
        try:
            data = _body(request, accepted)
            timeout = _timeout(data.pop("timeout", None))
            value = _optional(data, field)
            if field == "to" and value is None:
                raise state.IllegalAction(f"'to' is required: one of {', '.join(state.TRANSITION_TARGETS)}")
            if control.get_control_plane() is not None:
                return _json(control.broadcast(action, name, timeout=timeout, **{field: value}))
            result = run(name, **{field: value})
            return _json({**result, "scope": "worker", "worker": control.worker()})
        except state.UnknownName as exc:
            return _error(str(exc), 404)
        except control.ControlUnavailable as exc:
            return _error(str(exc), 503)
        except state.StateError as exc:
            return _error(str(exc), 400)
        except ImproperlyConfigured as exc:  # a misconfigured instance: say what `manage.py check` says
            return _error(str(exc), 500)

    view.__doc__ = doc
    return _operators_only(view)


def _timeout(value: Any) -> float:
    """The ``timeout`` field: seconds to wait for acknowledgements (a number from 0 to :data:`MAX_TIMEOUT_S`)."""
    if value is None:
        return control.DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a JSON integer too large for a float
        seconds = -1.0
    if isinstance(value, bool) or not 0 <= seconds <= MAX_TIMEOUT_S:
        raise state.IllegalAction(f"'timeout' must be a number of seconds from 0 to {MAX_TIMEOUT_S:g}, got {value!r}")
    return seconds


def _optional(data: dict[str, Any], field: str) -> str | None:
    """``data[field]`` as a non-empty string, or None when absent.

    A field that is present must be exactly one non-empty string: ``null``, ``""``, a number or a list
    is a 400, never read as "absent" (an absent ``key`` widens an action to every client).
    """
    if field not in data:
        return None
    value = data[field]
    if not isinstance(value, str):
        hint = " (leave it out to act on the whole instance)" if field == "key" else ""
        raise state.IllegalAction(f"{field!r} must be a non-empty string{hint}")
    if not value:
        raise state.IllegalAction(f"{field!r} is empty: omit the field rather than send an empty value")
    return value


#: POST ``<name>/reset`` with optional ``key``.
reset_view = _action("reset", state.reset, "key", "POST ``<name>/reset`` (optional ``key``): :func:`state.reset`.")
#: POST ``<name>/drain`` with optional ``key``.
drain_view = _action("drain", state.drain, "key", "POST ``<name>/drain`` (optional ``key``): :func:`state.drain`.")
#: POST ``<name>/transition`` with ``to`` (``CLOSED``, ``OPEN``, ``FORCED_OPEN``, ...).
transition_view = _action(
    "transition", state.transition, "to", "POST ``<name>/transition`` with ``to``: :func:`state.transition`."
)
