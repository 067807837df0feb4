"""The sync and async wrappers of every decorator answer alike (issue 10, item 5 for the decorators).

``_Resilience`` builds a sync and an async wrapper that differ only in how they wait (``await``, and the
async-only time limiter). Each scenario below runs through both with the same fresh instances and the same
fake clock, and the outcomes (return values, statuses, the RateLimit and Retry-After fields, exception
types) must be identical, call by call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from django_ratelimit_r4 import get_circuit_breaker
from django_ratelimit_r4.core.exceptions import CallNotPermitted
from django_ratelimit_r4.decorators import circuitbreaker, ratelimit, resilient
from django_ratelimit_r4.testing import reset_all

pytestmark = pytest.mark.django_db(databases=[])

FIELDS = ("RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining", "Retry-After")


def _outcome(value: Any) -> tuple[Any, ...]:
    if isinstance(value, HttpResponse):
        return ("response", value.status_code, tuple((f, value.get(f)) for f in FIELDS))
    return ("value", value)


def _run(decorate: Callable[[Callable[..., Any]], Callable[..., Any]], is_view: bool, calls: int, mode: str):
    if is_view:

        def body(request: Any) -> Any:
            return HttpResponse("ok")

        async def abody(request: Any) -> Any:
            return HttpResponse("ok")

    else:

        def body(amount: int) -> Any:
            return amount

        async def abody(amount: int) -> Any:
            return amount

    fn = decorate(body if mode == "sync" else abody)
    argument = (lambda: RequestFactory().get("/", REMOTE_ADDR="203.0.113.7")) if is_view else (lambda: 7)
    outcomes = []
    for _ in range(calls):
        try:
            result = fn(argument()) if mode == "sync" else asyncio.run(fn(argument()))
            outcomes.append(_outcome(result))
        except Exception as exc:  # the type is the outcome
            outcomes.append(("raised", type(exc).__name__))
    return outcomes


def _open(name: str = "acquirer") -> None:
    get_circuit_breaker(name).transition_to_open_state()


def _cached(amount: Any, exc: CallNotPermitted) -> str:
    return "cached"


def _only_value_errors(amount: Any, exc: ValueError) -> str:
    return "fallback"


SCENARIOS: dict[str, tuple[Callable[..., Any], bool, int, Callable[[], None] | None]] = {
    "ratelimit plain": (ratelimit("burst"), False, 3, None),
    "ratelimit view": (ratelimit("burst"), True, 3, None),
    "ratelimit keyed view": (ratelimit("per_ip"), True, 3, None),
    "ratelimit all-or-nothing view": (ratelimit(["burst", "sustained"]), True, 4, None),
    "breaker open plain": (circuitbreaker("acquirer"), False, 2, _open),
    "breaker open view": (circuitbreaker("acquirer"), True, 2, _open),
    "breaker open, typed fallback": (circuitbreaker("acquirer", fallback=_cached), False, 2, _open),
    "breaker open, other fallback type": (circuitbreaker("acquirer", fallback=_only_value_errors), False, 1, _open),
    "stack view": (resilient(ratelimiter="burst", circuitbreaker="acquirer"), True, 3, None),
    "unknown name": (ratelimit("nope", fallback=lambda *a: "fallback"), False, 1, None),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_sync_and_async_wrappers_answer_alike(scenario: str, r4_clock) -> None:
    decorate, is_view, calls, prepare = SCENARIOS[scenario]
    results = {}
    for mode in ("sync", "async"):
        reset_all()
        if prepare is not None:
            prepare()
        results[mode] = _run(decorate, is_view, calls, mode)
    assert results["sync"] == results["async"]
    assert len({o[0] for o in results["sync"]}) >= 1


def test_the_scenarios_cover_each_answer(r4_clock) -> None:
    """The table reaches allowed calls, 429s, 503s, raised rejections and fallbacks."""
    seen = set()
    for decorate, is_view, calls, prepare in SCENARIOS.values():
        reset_all()
        if prepare is not None:
            prepare()
        for outcome in _run(decorate, is_view, calls, "sync"):
            seen.add(outcome[1] if outcome[0] in ("response", "raised") else outcome[0])
    assert {200, 429, 503, "RequestNotPermitted", "CallNotPermitted", "value"} <= seen
