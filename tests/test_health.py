"""The django-health-check check: healthy whatever the resilience state, unhealthy only for a broken setting."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import RequestFactory
from health_check.exceptions import HealthCheckException
from health_check.views import HealthCheckView

from django_ratelimit_r4 import get_bulkhead, get_circuit_breaker, get_rate_limiter
from django_ratelimit_r4.health import ResilienceState, summarize

DOTTED = "django_ratelimit_r4.health.ResilienceState"


@pytest.fixture
def fresh(settings: Any, r4_clock: Any) -> Any:
    settings.RATELIMIT_R4 = copy.deepcopy(django_settings.RATELIMIT_R4)
    return r4_clock


async def _get(accept: str = "application/json", query: str = "") -> Any:
    view = HealthCheckView.as_view(checks=[DOTTED])
    return await view(RequestFactory().get("/healthz/resilience" + query, HTTP_ACCEPT=accept))


def _saturate_everything() -> Any:
    limiter = get_rate_limiter("api")
    while limiter.acquire_permission():
        pass
    bulkhead = get_bulkhead("acquirer")
    assert bulkhead.try_acquire_permission() and bulkhead.try_acquire_permission()
    assert not bulkhead.try_acquire_permission()  # full
    get_circuit_breaker("acquirer").transition_to_forced_open_state()
    return bulkhead


async def test_healthy_with_saturated_limiter_full_bulkhead_and_forced_open_breaker(fresh: Any) -> None:
    bulkhead = _saturate_everything()
    try:
        response = await _get()
        assert response.status_code == 200
        assert json.loads(response.content) == {"ResilienceState": "OK"}  # one stable key a monitor can read
        text = await _get("text/plain")
        assert text.status_code == 200 and text.content.decode() == "ResilienceState: OK\n"
        html = await _get("text/html")
        assert html.status_code == 200
        metrics = await _get(query="?format=openmetrics")
        assert 'django_health_check_status{check="ResilienceState"} 1' in metrics.content.decode()
    finally:
        bulkhead.release_permission()
        bulkhead.release_permission()


async def test_an_open_breaker_is_not_a_failure_either(fresh: Any) -> None:
    breaker = get_circuit_breaker("acquirer")
    breaker.transition_to_open_state()
    fresh.advance(0.5)
    response = await _get()
    assert response.status_code == 200 and json.loads(response.content) == {"ResilienceState": "OK"}
    check = ResilienceState()
    check.run()
    assert "circuitbreaker acquirer: OPEN 2.5s" in check.pretty_status()


def test_run_never_raises_for_saturation(fresh: Any) -> None:
    bulkhead = _saturate_everything()
    try:
        check = ResilienceState()
        check.run()  # a HealthCheckException (ServiceWarning included) would fail the test
        assert "FORCED_OPEN" in check.pretty_status()
        assert repr(check) == "ResilienceState"  # constant: the summary is not the name
        assert check.labels == {"check": "ResilienceState"}  # constant: the summary is not a label
    finally:
        bulkhead.release_permission()
        bulkhead.release_permission()


async def test_broken_setting_is_unhealthy_without_echoing_values(settings: Any) -> None:
    settings.RATELIMIT_R4 = {"ratelimiters": {"instances": {"api": {"limit_for_period": "s3cr3t"}}}}
    response = await _get()
    assert response.status_code == 500
    (message,) = json.loads(response.content).values()
    assert "ratelimit_r4.E004" in message and "manage.py check" in message
    assert "s3cr3t" not in message
    with pytest.raises(HealthCheckException):
        ResilienceState().run()


def test_warnings_in_the_setting_do_not_fail_the_check(settings: Any) -> None:
    settings.RATELIMIT_R4 = {"state_endpoint_token": "short", "ratelimiters": {"instances": {"api": {}}}}
    check = ResilienceState()
    check.run()
    assert "ratelimiter api: 50/50 available" in check.pretty_status()


def test_a_reading_bug_is_reported_not_raised(fresh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from django_ratelimit_r4 import state

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(state, "snapshot", broken)
    check = ResilienceState()
    check.run()
    assert check.pretty_status() == "state unavailable: RuntimeError"


def test_summary_of_every_type(fresh: Any) -> None:
    from django_ratelimit_r4 import state

    text = summarize(state.snapshot())
    assert text.split("; ") == [
        "ratelimiter api: 10/10 available",
        "ratelimiter slow: 10/10 available",
        "ratelimiter per_ip: per client, 2/1s, 0 keys",
        "ratelimiter burst: 2/2 available",
        "ratelimiter burst3: 3/3 available",
        "ratelimiter sustained: 3/3 available",
        "bulkhead acquirer: 0/2 in use",
        "circuitbreaker acquirer: CLOSED",
        "retry acquirer: 0 failed after retries",
        "timelimiter acquirer: 0 timeouts",
    ]
    assert summarize([]) == "no instances configured"
