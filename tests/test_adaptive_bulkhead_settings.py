"""An adaptive bulkhead from settings: the limit moves with latency, in r4 status and the existing metric."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from prometheus_client import CollectorRegistry

from django_ratelimit_r4 import conf, registry
from django_ratelimit_r4.checks import check_settings
from django_ratelimit_r4.decorators import bulkhead

SETTING = {
    "bulkheads": {
        "instances": {
            "acquirer": {
                "max_concurrent_calls": 10,
                "adaptive": {"algorithm": "aimd", "min_limit": 2, "max_limit": 50, "timeout": "200ms"},
            }
        }
    }
}


def test_the_limit_moves_and_shows_everywhere(settings: Any, r4_clock: Any) -> None:
    from django_ratelimit_r4.contrib import prometheus

    settings.RATELIMIT_R4 = SETTING

    @bulkhead("acquirer")
    def slow_partner() -> str:
        r4_clock.advance(0.5)  # slower than the 200 ms timeout: each call is a drop
        return "ok"

    b = registry.get_bulkhead("acquirer")
    assert b.metrics.max_allowed_concurrent_calls == 10
    for _ in range(3):
        assert slow_partner() == "ok"
    assert b.metrics.max_allowed_concurrent_calls == 7  # 10 -> 9 -> 8 -> 7 (x 0.9, truncated)
    out = io.StringIO()
    call_command("r4", "status", "--json", "acquirer", stdout=out)
    item = json.loads(out.getvalue())[0]
    assert item["state"]["max_allowed_concurrent_calls"] == 7
    assert item["config"]["max_concurrent_calls"] == 10 and item["config"]["adaptive"]["algorithm"] == "aimd"
    out = io.StringIO()
    call_command("r4", "status", "acquirer", stdout=out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("acquirer"))
    assert row.split()[2] == "7"  # the MAX column
    target = CollectorRegistry()
    target.register(prometheus.R4Collector())
    assert target.get_sample_value("resilience4j_bulkhead_max_allowed_concurrent_calls", {"name": "acquirer"}) == 7


@pytest.mark.parametrize(
    ("adaptive", "text"),
    [
        ({"algorithm": "bbr"}, "[\"algorithm\"] must be one of 'gradient2', 'aimd', 'vegas', 'littles_law'"),
        ({"min_limit": 0}, "[\"min_limit\"] must be >= 1"),
        ({"max_limt": 9}, "unknown option(s) 'max_limt'"),
    ],
)
def test_checks_name_the_adaptive_option(adaptive: dict, text: str) -> None:
    setting = {"bulkheads": {"instances": {"db": {"max_concurrent_calls": 25, "adaptive": adaptive}}}}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conf, "raw_setting", lambda: setting)
        found = [(m.id, m.msg) for m in check_settings() if m.id.startswith("ratelimit_r4.")]
    assert len(found) == 1 and found[0][0] == "ratelimit_r4.E004", found
    assert found[0][1].startswith('RATELIMIT_R4["bulkheads"]["instances"]["db"]["adaptive"]: ') and text in found[0][1]


def test_a_cluster_wide_bulkhead_cannot_be_adaptive() -> None:
    setting = {
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://127.0.0.1:6379/15"}},
        "bulkheads": {
            "instances": {
                "db": {"max_concurrent_calls": 25, "backend": "shared", "adaptive": {"algorithm": "aimd"}},
                "local": {"max_concurrent_calls": 25, "adaptive": {"algorithm": "aimd"}},
            }
        },
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conf, "raw_setting", lambda: setting)
        found = [(m.id, m.msg, m.hint) for m in check_settings() if m.id.startswith("ratelimit_r4.")]
    assert len(found) == 1 and found[0][0] == "ratelimit_r4.E027", found
    assert found[0][1].startswith('RATELIMIT_R4["bulkheads"]["instances"]["db"]["adaptive"]: an adaptive limit')
    assert "remove its backend" in found[0][2]


def test_the_adaptive_limit_is_in_the_state_snapshot(settings: Any, r4_clock: Any) -> None:
    from django_ratelimit_r4 import registry, state

    settings.RATELIMIT_R4 = {
        "bulkheads": {
            "instances": {"db": {"max_concurrent_calls": 25, "adaptive": {"algorithm": "littles_law", "min_limit": 5}}}
        }
    }
    registry.get_bulkhead("db").call(lambda: None)
    (item,) = state.snapshot(["bulkhead:db"])
    assert item["state"]["adaptive"] == {
        "algorithm": "littles_law",
        "limit": 25,
        "no_load_latency_ns": 0,
        "probing": False,
    }
    assert item["state"]["max_allowed_concurrent_calls"] == 25
