"""Retry budgets from settings: one named budget shared by the retries that call a dependency; checks; metrics."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from prometheus_client import CollectorRegistry

from django_ratelimit_r4 import conf, registry
from django_ratelimit_r4.checks import check_settings
from django_ratelimit_r4.registry import MisconfiguredInstance

SHARED = {
    "retry_budgets": {"payments": {"percent_can_retry": 0.1, "min_retries_per_second": 0, "ttl": "10s"}},
    "retries": {
        "configs": {"default": {"wait_duration": "0s", "max_attempts": 3}},
        "instances": {
            "charge": {"budget": "payments"},
            "refund": {"budget": "payments"},
            "free": {},
        },
    },
}


def down() -> None:
    raise ConnectionError("payments is down")


def test_retries_naming_one_budget_share_it(settings: Any, r4_clock: Any) -> None:
    settings.RATELIMIT_R4 = SHARED
    charge, refund, free = (registry.get_retry(n) for n in ("charge", "refund", "free"))
    assert charge.budget is refund.budget is registry.get_retry_budget("payments")
    assert free.budget is None
    assert charge.budget.clock is r4_clock


def test_load_amplification_through_settings(settings: Any, r4_clock: Any) -> None:
    """An outage seen by two retries of one dependency: 3x the calls without the budget, at most 1.1x with it."""
    settings.RATELIMIT_R4 = SHARED
    received = {"budgeted": 0, "free": 0}

    def dependency(which: str) -> None:
        received[which] += 1
        down()

    for i in range(6000):  # 100 calls per second for 60 s, alternating between the two retries
        retry = registry.get_retry("charge" if i % 2 else "refund")
        with pytest.raises(ConnectionError):
            retry.call(dependency, "budgeted")
        with pytest.raises(ConnectionError):
            registry.get_retry("free").call(dependency, "free")
        r4_clock.advance(0.01)
    assert received["free"] == 3 * 6000
    assert 1.05 * 6000 <= received["budgeted"] <= 1.1 * 6000
    exhausted = sum(registry.get_retry(n).metrics.number_of_budget_exhausted_calls for n in ("charge", "refund"))
    assert exhausted == registry.get_retry_budget("payments").metrics.number_of_refused_retries > 5000


def ids(setting: dict) -> list[tuple[str, str, str, str]]:
    """(id, path, message, hint) of our check messages for ``setting``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conf, "raw_setting", lambda: setting)
        messages = check_settings()
    return [(m.id, *m.msg.split(": ", 1), m.hint or "") for m in messages if m.id.startswith("ratelimit_r4.")]


@pytest.mark.parametrize(
    ("setting", "check_id", "path", "message", "hint"),
    [
        pytest.param(
            {"retries": {"instances": {"charge": {"budget": "paymnets"}}}, "retry_budgets": {"payments": {}}},
            "ratelimit_r4.E026",
            'RATELIMIT_R4["retries"]["instances"]["charge"]["budget"]',
            "names retry budget 'paymnets', which is not in RATELIMIT_R4[\"retry_budgets\"]",
            "Did you mean 'payments'?",
            id="E026-unknown",
        ),
        pytest.param(
            {"retries": {"instances": {"charge": {"budget": "payments"}}}},
            "ratelimit_r4.E026",
            'RATELIMIT_R4["retries"]["instances"]["charge"]["budget"]',
            "which is not in",
            'RATELIMIT_R4["retry_budgets"] = {"payments": {"percent_can_retry": 0.1}}',
            id="E026-none-declared",
        ),
        pytest.param(
            {"retries": {"instances": {"charge": {"budget": 3}}}},
            "ratelimit_r4.E026",
            'RATELIMIT_R4["retries"]["instances"]["charge"]["budget"]',
            "must be the name of an entry of",
            '"budget": "payments"',
            id="E026-not-a-name",
        ),
        pytest.param(
            {"retry_budgets": {"payments": {"percent_can_retry": -1}}},
            "ratelimit_r4.E004",
            'RATELIMIT_R4["retry_budgets"]["payments"]["percent_can_retry"]',
            "must be >= 0",
            "",
            id="E004-percent",
        ),
        pytest.param(
            {"retry_budgets": {"payments": {"ttl": 10}}},
            "ratelimit_r4.E004",
            'RATELIMIT_R4["retry_budgets"]["payments"]["ttl"]',
            "unit",
            "'500ms', '1s', '5m'",
            id="E004-unitless-ttl",
        ),
        pytest.param(
            {"retry_budgets": {"payments": {"min_retries_per_sec": 5}}},
            "ratelimit_r4.E002",
            'RATELIMIT_R4["retry_budgets"]["payments"]["min_retries_per_sec"]',
            "unknown option 'min_retries_per_sec' for a retry budget",
            "Did you mean 'min_retries_per_second'?",
            id="E002-field",
        ),
        pytest.param(
            {"retry_budgets": ["payments"]},
            "ratelimit_r4.E003",
            'RATELIMIT_R4["retry_budgets"]',
            "must be a dict of name -> budget options, got list",
            "percent_can_retry",
            id="E003-section",
        ),
        pytest.param(
            {"retry_budgets": {"payments": 0.1}},
            "ratelimit_r4.E003",
            'RATELIMIT_R4["retry_budgets"]["payments"]',
            "must be a dict of options, got float",
            "Finagle's defaults",
            id="E003-entry",
        ),
    ],
)
def test_checks(setting: dict, check_id: str, path: str, message: str, hint: str) -> None:
    found = ids(setting)
    assert len(found) == 1, found
    got_id, got_path, got_message, got_hint = found[0]
    assert (got_id, got_path) == (check_id, path)
    assert message in got_message and hint in got_hint, found[0]


def test_a_broken_budget_breaks_only_its_retries(settings: Any) -> None:
    settings.RATELIMIT_R4 = {
        "retry_budgets": {"payments": {"percent_can_retry": "lots"}},
        "retries": {"instances": {"charge": {"budget": "payments"}, "free": {}}},
    }
    assert {found[0] for found in ids(settings.RATELIMIT_R4)} == {"ratelimit_r4.E004", "ratelimit_r4.E026"}
    with pytest.raises(MisconfiguredInstance) as info:
        registry.get_retry("charge")
    assert "retry budget 'payments', which is misconfigured" in str(info.value)
    assert registry.get_retry("free").budget is None
    with pytest.raises(ImproperlyConfigured, match="percent_can_retry"):
        registry.get_retry_budget("payments")


def test_metrics_export_refusals_and_balance(settings: Any, r4_clock: Any) -> None:
    from django_ratelimit_r4.contrib import prometheus

    settings.RATELIMIT_R4 = SHARED
    charge = registry.get_retry("charge")
    for _ in range(30):  # 30 deposits of 10 %: 3 retries granted, and every call ends on a refusal
        with pytest.raises(ConnectionError):
            charge.call(down)
    target = CollectorRegistry()
    target.register(prometheus.R4Collector())
    assert target.get_sample_value("r4_retry_budget_exhausted_calls_total", {"name": "charge"}) == 30
    assert target.get_sample_value("r4_retry_budget_exhausted_calls_total", {"name": "free"}) is None
    assert target.get_sample_value("r4_retry_budget_balance", {"name": "payments"}) == 0


def test_budgets_are_in_the_state_snapshot_and_r4_status(settings: Any, r4_clock: Any) -> None:
    """Issue 12: a budget's balance and counters show in state.snapshot() (the state endpoint, r4 status --json)
    and as a table in r4 status; a bare name or retrybudget:<name> selects it."""
    import io
    import json

    from django.core.management import call_command

    from django_ratelimit_r4 import state

    settings.RATELIMIT_R4 = SHARED
    for _ in range(20):
        with pytest.raises(ConnectionError):
            registry.get_retry("charge").call(down)
    (item,) = [i for i in state.snapshot() if i["type"] == "retrybudget"]
    assert item["name"] == "payments"
    assert item["config"] == {"ttl": "10s", "min_retries_per_second": 0, "percent_can_retry": 0.1}
    assert item["state"] == {
        "balance": 0,
        "number_of_deposits": 20,
        "number_of_retries": 2,
        "number_of_refused_retries": 20,  # 18 first retries refused, and the 2 allowed ones their second
    }
    assert state.snapshot(["retrybudget:payments"]) == [item] == state.snapshot(["payments"])
    out = io.StringIO()
    call_command("r4", "status", stdout=out)
    table = out.getvalue()
    assert "Retry budgets" in table
    row = next(line for line in table.splitlines() if line.startswith("payments"))
    assert row.split() == ["payments", "10%", "+", "0/s", "10s", "0", "20", "2", "20"]
    out = io.StringIO()
    call_command("r4", "status", "--json", stdout=out)
    assert [i for i in json.loads(out.getvalue()) if i["type"] == "retrybudget"] == [item]
