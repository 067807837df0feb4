"""Adaptive throttlers from settings: @resilient (sync and async views), 503, checks, r4 status, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
from typing import Any

import pytest
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from prometheus_client import CollectorRegistry

from django_ratelimit_r4 import conf, registry
from django_ratelimit_r4.checks import check_settings
from django_ratelimit_r4.decorators import resilient
from django_ratelimit_r4.exceptions import CallThrottled

SETTING = {
    "adaptivethrottlers": {
        "configs": {"default": {"window": "10s"}},
        "instances": {
            "partner": {"k": 2, "reject_exceptions": ["tests.test_adaptive_throttlers.Overloaded"]},
        },
    },
    "circuitbreakers": {"instances": {"partner": {"minimum_number_of_calls": 1000}}},
}


class Overloaded(Exception):
    """The partner answered "too busy"."""


def overloaded_partner(calls: list[int]) -> Any:
    def partner() -> None:
        calls.append(1)
        raise Overloaded

    return partner


@pytest.fixture
def throttled(settings: Any, r4_clock: Any) -> Any:
    settings.RATELIMIT_R4 = SETTING
    throttler = registry.get_adaptive_throttler("partner")
    throttler._random = random.Random(42)  # deterministic draws (the core takes random=)
    return throttler


def test_built_from_settings_on_the_test_clock(throttled: Any, r4_clock: Any) -> None:
    assert throttled.config.k == 2.0 and throttled.config.window == 10 * 10**9
    assert throttled.config.reject_exceptions == (Overloaded,)
    assert throttled.clock is r4_clock


def test_a_view_answers_503_once_the_partner_keeps_rejecting(throttled: Any) -> None:
    calls: list[int] = []
    partner = overloaded_partner(calls)

    @resilient(adaptivethrottler="partner", circuitbreaker="partner")
    def view(request: HttpRequest) -> HttpResponse:
        partner()
        return HttpResponse("ok")

    responses = []
    for _ in range(200):
        try:
            responses.append(view(RequestFactory().get("/")))
        except Overloaded:  # the partner's own rejection is not the throttler's to answer
            responses.append(None)
    rejected = [r for r in responses if r is not None]
    assert len(rejected) > 150 and len(calls) == 200 - len(rejected)  # the partner saw under a quarter
    assert {r.status_code for r in rejected} == {503}
    assert rejected[0]["Retry-After"] == "1" and b"rejected the call locally" in rejected[0].content


def test_an_async_view_and_a_fallback_see_call_throttled(throttled: Any) -> None:
    seen: list[BaseException] = []

    async def fallback(request: HttpRequest, exc: BaseException) -> HttpResponse:
        seen.append(exc)
        return HttpResponse("cached", status=200)

    @resilient(adaptivethrottler="partner", fallback=fallback)
    async def view(request: HttpRequest) -> HttpResponse:
        raise Overloaded

    async def main() -> list[int]:
        return [(await view(RequestFactory().get("/"))).status_code for _ in range(100)]

    statuses = asyncio.run(main())
    assert statuses == [200] * 100  # every rejection, remote or local, went to the fallback
    assert sum(isinstance(e, CallThrottled) for e in seen) > 50
    assert sum(isinstance(e, Overloaded) for e in seen) >= 1
    m = throttled.metrics
    assert m.number_of_throttled_calls + m.number_of_rejected_calls == 100 and m.number_of_accepted_calls == 0


def test_recovery_on_the_fake_clock(throttled: Any, r4_clock: Any) -> None:
    for _ in range(100):
        if throttled.try_acquire():
            throttled.on_rejected()
        r4_clock.advance(0.1)
    assert throttled.metrics.rejection_probability > 0.9
    r4_clock.advance(10)  # a whole window without calls: forgotten
    assert throttled.metrics.rejection_probability == 0 and throttled.call(lambda: "ok") == "ok"


def ours(setting: dict) -> list[tuple[str, str]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conf, "raw_setting", lambda: setting)
        return [(m.id, m.msg) for m in check_settings() if m.id.startswith("ratelimit_r4.")]


@pytest.mark.parametrize(
    ("entry", "check_id", "text"),
    [
        ({"k": 0.5}, "ratelimit_r4.E004", '["adaptivethrottlers"]["instances"]["p"]["k"]: must be >= 1'),
        ({"window": 120}, "ratelimit_r4.E004", '["window"]: bare number'),
        ({"K": 2}, "ratelimit_r4.E002", "unknown option 'K' for adaptivethrottlers"),
        ({"reject_on_result": "tests.nowhere.predicate"}, "ratelimit_r4.E004", "cannot import"),
    ],
)
def test_checks_name_the_setting(entry: dict, check_id: str, text: str) -> None:
    found = ours({"adaptivethrottlers": {"instances": {"p": entry}}})
    assert len(found) == 1 and found[0][0] == check_id and text in found[0][1], found


def test_status_and_metrics(throttled: Any) -> None:
    from django_ratelimit_r4.contrib import prometheus

    for _ in range(50):
        with contextlib.suppress(Overloaded, CallThrottled):
            throttled.call(overloaded_partner([]))
    out = io.StringIO()
    call_command("r4", "status", "--json", stdout=out)
    item = next(i for i in json.loads(out.getvalue()) if i["type"] == "adaptivethrottler")
    m = throttled.metrics
    assert item["state"]["requests"] == 50 and item["state"]["number_of_throttled_calls"] == m.number_of_throttled_calls
    assert item["config"]["k"] == 2.0
    out = io.StringIO()
    call_command("r4", "status", stdout=out)
    assert "Adaptive throttlers" in out.getvalue() and "P(REJECT)" in out.getvalue()
    target = CollectorRegistry()
    target.register(prometheus.R4Collector())
    sample = target.get_sample_value
    assert sample("r4_adaptive_throttler_calls_total", {"name": "partner", "kind": "throttled"}) == m.number_of_throttled_calls
    assert sample("r4_adaptive_throttler_calls_total", {"name": "partner", "kind": "rejected"}) == m.number_of_rejected_calls
    assert sample("r4_adaptive_throttler_rejection_probability", {"name": "partner"}) == pytest.approx(
        m.rejection_probability
    )
