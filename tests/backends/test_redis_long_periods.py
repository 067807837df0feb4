"""Long periods on Redis: monthly and yearly quotas are exact, and one instance never breaks the others' status.

Periods up to ``MAX_NS_PERIOD`` (~10.4 days) are counted in nanoseconds by the script; longer ones, up to
``MAX_PERIOD_NS`` (~28.5 years), in whole microseconds. With Redis server time every instant is a whole
microsecond, so decisions and waits stay exact; a client clock with sub-microsecond times gets waits rounded
UP to the microsecond (never a permit early). A long period that is not whole microseconds is
``ratelimit_r4.E004`` in ``manage.py check`` (and configs stop at 366 days).
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_ratelimit_r4 import registry, state
from django_ratelimit_r4.backends.memory import MemoryBackend
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig
from django_ratelimit_r4.decorators import ratelimit
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(databases=[])]

S = 1_000_000_000
DAY = 86_400 * S
A = {"REMOTE_ADDR": "203.0.113.7"}


@ratelimit("monthly")
def monthly(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("monthly_ip")
def monthly_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("monthly/", monthly), path("monthly-ip/", monthly_ip)]


@pytest.fixture
def raw_redis(redis_url: str) -> Iterator[Any]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def quota_settings(url: str, prefix: str, **extra: Any) -> dict[str, Any]:
    return {
        "backend": "redis",
        "redis_url": url,
        "redis_key_prefix": prefix,
        "ratelimiters": {
            "instances": {
                "monthly": {"rate": "3/30d"},
                "monthly_ip": {"rate": "2/30d", "key": "ip"},
                "yearly": {"limit_for_period": 10_000, "limit_refresh_period": "366d"},
                **extra,
            }
        },
    }


# ---------------------------------------------------------------------------------------- end to end


def test_a_30_day_quota_end_to_end_with_the_client_clock(redis_url: str, prefix: str, settings, r4_clock) -> None:
    settings.RATELIMIT_R4 = quota_settings(redis_url, prefix)
    client = Client()
    assert [client.get("/monthly/").status_code for _ in range(4)] == [200, 200, 200, 429]
    assert [client.get("/monthly-ip/", **A).status_code for _ in range(3)] == [200, 200, 429]
    r4_clock.advance(12 * 86_400 + 0.5)  # 12 days and half a second later
    response = client.get("/monthly/")
    assert response.status_code == 429
    assert int(response["Retry-After"]) == 18 * 86_400  # 17 d 23:59:59.5 left, rounded up to whole seconds
    limiter = registry.get_rate_limiter("monthly")
    with pytest.raises(RequestNotPermitted) as info:
        limiter.acquire_or_raise()  # type: ignore[union-attr]
    assert info.value.wait_ns == 30 * DAY - 12 * DAY - S // 2  # exact: the fake times are whole microseconds
    assert client.get("/monthly-ip/", **A).status_code == 429
    r4_clock.advance(18 * 86_400 - 0.5)  # the 30 days are over
    assert [client.get("/monthly/").status_code for _ in range(4)] == [200, 200, 200, 429]
    assert [client.get("/monthly-ip/", **A).status_code for _ in range(3)] == [200, 200, 429]


def test_a_30_day_quota_end_to_end_with_server_time(redis_url: str, prefix: str, settings) -> None:
    """No r4_clock: the limiters use Redis server time, as in production."""
    settings.RATELIMIT_R4 = quota_settings(redis_url, prefix)
    client = Client()
    responses = [client.get("/monthly/") for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert 30 * 86_400 - 60 <= int(responses[-1]["Retry-After"]) <= 30 * 86_400
    assert [client.get("/monthly-ip/", **A).status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/monthly-ip/", REMOTE_ADDR="198.51.100.2").status_code == 200  # another client's budget
    [item] = state.snapshot(["monthly"])
    assert item["state"]["available_permissions"] == 0
    assert 30 * DAY - 60 * S <= item["state"]["nanos_to_wait"] <= 30 * DAY


def test_a_30_day_quota_with_server_time(redis_url: str, prefix: str, raw_redis) -> None:
    config = RateLimiterConfig(limit_for_period=3, limit_refresh_period="30d")
    rl = RateLimiter(
        uuid.uuid4().hex, config, clock=SYSTEM_CLOCK, backend=rb.redis_backend(redis_url, prefix=prefix)
    )
    keyed = rb.RedisKeyedRateLimiter(uuid.uuid4().hex, config, url=redis_url, prefix=prefix)
    assert [rl.acquire_permission() for _ in range(4)] == [True, True, True, False]
    assert [keyed.acquire_permission("c") for _ in range(4)] == [True, True, True, False]
    for wait in (rl.metrics.nanos_to_wait, keyed.state("c")[2]):
        assert 30 * DAY - 60 * S < wait <= 30 * DAY and wait % 1000 == 0  # server time: whole microseconds
    assert rl.metrics.available_permissions == 0 and rl.metrics.cycle == 0
    ttl = raw_redis.pttl(rl.backend.state_key)  # type: ignore[attr-defined]
    assert 30 * 86_400_000 - 60_000 < ttl <= 30 * 86_400_000 + 1  # expires when full again: in 30 days
    assert rl.backend._unit == 1000  # type: ignore[attr-defined]


def test_a_yearly_quota_and_a_leap_year(redis_url: str, prefix: str) -> None:
    clock = FakeClock(1_700_000_000_123_456_000)
    for period in (365 * DAY, 366 * DAY):
        rl = RateLimiter(
            uuid.uuid4().hex,
            RateLimiterConfig(limit_for_period=2, limit_refresh_period=f"{period}ns"),
            clock=clock,
            backend=rb.redis_backend(redis_url, prefix=prefix),
        )
        assert rl.acquire_permission(2) and not rl.acquire_permission()
        clock.advance_ns(period - 1000)
        assert rl.metrics.nanos_to_wait == 1000 and not rl.acquire_permission()
        clock.advance_ns(1000)
        assert rl.acquire_permission(2) and rl.metrics.cycle == 1


def test_sub_microsecond_client_times_round_long_waits_up(redis_url: str, prefix: str) -> None:
    """A fake clock at odd nanoseconds: the wait is the exact one rounded up to the microsecond, never less."""
    clock = FakeClock(10**15 + 1)
    rl = RateLimiter(
        "odd",
        RateLimiterConfig(limit_for_period=1, limit_refresh_period="30d"),
        clock=clock,
        backend=rb.redis_backend(redis_url, prefix=prefix),
    )
    memory = MemoryBackend("odd", 1, 30 * DAY, clock)
    assert rl.acquire_permission() and memory.acquire(1, 0) == 0
    for step in (1, 333, 999, 1000, 123_456_789, 29 * DAY):
        clock.advance_ns(step)
        exact = memory.state()[2]
        assert exact <= rl.metrics.nanos_to_wait < exact + 1000
        assert rl.metrics.available_permissions == memory.state()[1]


# ------------------------------------------------------------------------------- the property, in µs


LONG_PERIODS = [rb.MAX_NS_PERIOD - rb.MAX_NS_PERIOD % 1000 + 1000, 30 * DAY, 366 * DAY, rb.MAX_PERIOD_NS]
MICRO_STARTS = [0, 1_700_000_000_123_456_000, 2**62 - 2**62 % 1000, -(10**15)]


@st.composite
def long_scenarios(draw: st.DrawFn) -> tuple[int, int, int, list[tuple[str, int, int]]]:
    period = draw(st.sampled_from(LONG_PERIODS))
    limit = draw(st.sampled_from([1, 3, 10_000]))
    start = draw(st.sampled_from(MICRO_STARTS))
    micros = st.integers(0, 4 * period // 1000).map(lambda us: us * 1000)
    ops = draw(
        st.lists(
            st.one_of(
                st.tuples(
                    st.just("acquire"), st.integers(1, 7), st.sampled_from([0, period // 2, 3 * period])
                ),
                st.tuples(st.just("advance"), micros, st.just(0)),
                st.tuples(st.just("drain"), st.just(0), st.just(0)),
            ),
            min_size=1,
            max_size=20,
        )
    )
    return period, limit, start, ops


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=long_scenarios())
def test_long_periods_match_the_memory_backend_exactly_at_microsecond_times(
    redis_url: str, prefix: str, scenario
) -> None:
    """Server time is whole microseconds: at such instants every answer equals MemoryBackend's exactly."""
    period, limit, start, ops = scenario
    clock = FakeClock(start)
    name = uuid.uuid4().hex
    memory = MemoryBackend(name, limit, period, clock)
    red = rb.RedisBackend(name, limit, period, clock, url=redis_url, prefix=prefix)
    for op, a, b in ops:
        if op == "acquire":
            assert red.acquire(a, b) == memory.acquire(a, b), (op, a, b)
        elif op == "advance":
            clock.advance_ns(a)
        else:
            assert red.drain() == memory.drain()
        assert red.state() == memory.state()


# ------------------------------------------------------------------------ one broken instance, status


def test_a_period_redis_cannot_keep_breaks_only_its_own_instance(redis_url: str, prefix: str, settings) -> None:
    from django.core.checks import run_checks

    settings.RATELIMIT_R4 = quota_settings(
        redis_url, prefix, too_long={"limit_for_period": 1, "limit_refresh_period": "1000000000000001ns"}
    )
    errors = [m for m in run_checks() if m.id == "ratelimit_r4.E004"]
    assert len(errors) == 1 and '["too_long"]["limit_refresh_period"]' in errors[0].msg
    assert "whole number" in errors[0].msg
    assert not [m for m in run_checks() if m.id.startswith("ratelimit_r4.E")][1:]  # 30d and 366d are fine
    names = [item["name"] for item in state.snapshot()]
    assert "too_long" not in names and {"monthly", "monthly_ip", "yearly"} <= set(names)
    out = io.StringIO()
    call_command("r4", "status", "--json", stdout=out)
    assert {item["name"] for item in json.loads(out.getvalue())} >= {"monthly", "yearly"}
    with pytest.raises(Exception, match="E004"):
        registry.get_rate_limiter("too_long")
    assert registry.get_rate_limiter("monthly").acquire_permission()  # type: ignore[union-attr]


def test_an_instance_that_fails_to_be_read_does_not_hide_the_others(
    redis_url: str, prefix: str, settings, monkeypatch
) -> None:
    settings.RATELIMIT_R4 = quota_settings(redis_url, prefix)
    broken = registry.get_rate_limiter("monthly")

    def fail() -> tuple[int, int, int]:
        raise RuntimeError("this backend cannot answer")

    monkeypatch.setattr(broken.backend, "state", fail)  # type: ignore[union-attr]
    items = {item["name"]: item for item in state.snapshot()}
    assert items["monthly"]["state"] is None and "cannot answer" in items["monthly"]["error"]
    assert items["yearly"]["state"]["available_permissions"] == 10_000
    out = io.StringIO()
    call_command("r4", "status", stdout=out)
    assert "yearly" in out.getvalue() and "monthly: cannot be read: RuntimeError" in out.getvalue()
    from django_ratelimit_r4.health import summarize

    summary = summarize(list(items.values()))
    assert "ratelimiter monthly: unreadable" in summary and "ratelimiter yearly: 10000/10000 available" in summary


def test_all_or_nothing_compares_waits_across_units(redis_url: str, prefix: str) -> None:
    """A monthly limit (microsecond units) and an hourly one (nanoseconds): the longer wait is named."""
    from django_ratelimit_r4.core.ratelimiter import acquire_all

    clock = FakeClock(10**15)

    def make(rate: str) -> RateLimiter:
        limit, period = rate.split("/")
        config = RateLimiterConfig(limit_for_period=int(limit), limit_refresh_period=period)
        return RateLimiter(uuid.uuid4().hex, config, clock=clock, backend=rb.redis_backend(redis_url, prefix=prefix))

    monthly, hourly = make("1/30d"), make("1/1h")
    assert acquire_all([hourly, monthly]) is None
    clock.advance(60)
    loser, wait = acquire_all([hourly, monthly])  # type: ignore[misc]
    assert loser is monthly and wait == 30 * DAY - 60 * S
    loser, wait = acquire_all([monthly, hourly])  # type: ignore[misc]
    assert loser is monthly and wait == 30 * DAY - 60 * S
    assert (monthly.metrics.available_permissions, hourly.metrics.available_permissions) == (0, 0)


# ------------------------------------------------------------------------------ GCRA's bound, at check time


def test_a_gcra_rate_redis_cannot_keep_exact_is_a_check_error_not_a_500_per_request(
    redis_url: str, prefix: str, settings
) -> None:
    """GCRA on Redis keeps its arrival times below 2**52 (doubles). A rate it cannot keep exact (86 399 per day:
    units of 1/86 399 ns; a burst of 10**9 over 30 days) passed ``check`` and then raised on every use (a 500 per
    request, the instance unreadable in ``r4 status``); now it is ``E004`` on its limit_refresh_period, and the
    rates it can keep stay valid: 10 000 per 10 days, and (counted in µs since 2cbc738) per 30 and 366 days."""
    from django.core.checks import run_checks

    settings.RATELIMIT_R4 = quota_settings(
        redis_url,
        prefix,
        gcra_day={"limit_for_period": 86_399, "limit_refresh_period": "1d", "algorithm": "gcra"},
        gcra_month_ip={"limit_for_period": 10_000, "limit_refresh_period": "30d", "algorithm": "gcra",
                       "burst": 10**9, "key": "ip"},
        gcra_month={"limit_for_period": 10_000, "limit_refresh_period": "30d", "algorithm": "gcra"},
        gcra_year_ip={"limit_for_period": 10_000, "limit_refresh_period": "366d", "algorithm": "gcra", "key": "ip"},
        gcra_10d={"limit_for_period": 10_000, "limit_refresh_period": "10d", "algorithm": "gcra"},
        gcra_month_burst={"limit_for_period": 10_000, "limit_refresh_period": "30d", "algorithm": "gcra", "burst": 100},
        sliding_month={"limit_for_period": 1_000, "limit_refresh_period": "30d", "algorithm": "sliding_window"},
    )
    errors = [m for m in run_checks() if m.id.startswith("ratelimit_r4.E")]
    assert sorted(m.msg.split('"]["')[2] for m in errors) == ["gcra_day", "gcra_month_ip"], [m.msg for m in errors]
    for message in errors:
        assert message.id == "ratelimit_r4.E004" and '["limit_refresh_period"]' in message.msg
        assert "gcra" in message.msg and "burst" in (message.hint or "") and "cycle" in (message.hint or "")
    for name in ("gcra_10d", "gcra_month", "gcra_month_burst", "sliding_month"):
        assert registry.get_rate_limiter(name).acquire_permission(), name
    assert registry.get_keyed_rate_limiter("gcra_year_ip").acquire_permission("a")
    with pytest.raises(Exception, match="E004"):
        registry.get_rate_limiter("gcra_day")
    names = [item["name"] for item in state.snapshot()]
    assert "gcra_day" not in names and {"gcra_10d", "gcra_month", "monthly", "yearly"} <= set(names)
