"""The demo's own views, in the demo's settings (a subprocess, like test_demo.py): the strict path without
the fallback, the bulkhead's BulkheadFull decline, the trusted proxy, /block, /partner and state.json."""

from __future__ import annotations

import textwrap

from tests.demo_harness import run_in_demo

SCRIPT = textwrap.dedent(
    """
    import os, django
    django.setup()
    from django.test import Client
    from django_ratelimit_r4 import get_bulkhead, get_circuit_breaker
    from django_ratelimit_r4.testing import fake_clock
    from cards.acquirer import METER, PARTNER

    PARTNER.latency_s = 0
    client = Client()
    with fake_clock() as clock:
        # Every response says which process answered.
        first = client.post("/authorize")
        assert first["X-Worker-Pid"] == str(os.getpid()), first.headers

        # The demo trusts one proxy: X-Forwarded-For names the client, so another address has its own budget.
        for _ in range(9):
            assert client.post("/authorize").status_code == 200
        assert client.post("/authorize").status_code == 429
        other = client.post("/authorize", HTTP_X_FORWARDED_FOR="198.18.0.9")
        assert other.status_code == 200, other.content
        assert '"per-client";r=9;t=1' in other["RateLimit"], other["RateLimit"]

        # A full bulkhead: the fallback declines with cause BulkheadFull; the strict path is a 503 with the
        # bulkhead's Retry-After; and the breaker counts neither (ignore_exceptions).
        clock.advance(1)
        bulkhead, breaker = get_bulkhead("acquirer"), get_circuit_breaker("acquirer")
        buffered = breaker.metrics.number_of_buffered_calls
        size = bulkhead.metrics.max_allowed_concurrent_calls  # adaptive: 40 to start with
        for _ in range(size):
            assert bulkhead.try_acquire_permission()
        declined = client.post("/authorize").json()
        assert declined["reason"] == "TEMPORARILY_UNAVAILABLE" and declined["cause"] == "BulkheadFull", declined
        strict = client.post("/authorize?fallback=0")
        assert strict.status_code == 503 and strict["Retry-After"] == "1", (strict.status_code, strict.headers)
        assert breaker.metrics.number_of_buffered_calls == buffered
        for _ in range(size):
            bulkhead.on_complete()

        # Partner down, no fallback: partner errors are 502s (failing), then the breaker opens and refuses
        # with a 503 whose Retry-After is its remaining open time (3 s).
        PARTNER.down = True
        statuses = []
        for i in range(10):
            clock.advance(1)
            statuses.append(client.post("/authorize?fallback=0", HTTP_X_FORWARDED_FOR="198.18.0.10").status_code)
        assert statuses == [502] * 10, statuses
        refused = client.post("/authorize?fallback=0", HTTP_X_FORWARDED_FOR="198.18.0.11")
        assert refused.status_code == 503 and refused["Retry-After"] == "3", refused.headers
        clock.advance(1.5)
        assert client.post("/authorize?fallback=0", HTTP_X_FORWARDED_FOR="198.18.0.11")["Retry-After"] == "2"
        assert refused["Content-Type"] == "application/problem+json"
        assert client.get("/healthz/live").status_code == 200 and client.get("/healthz/ready").status_code == 200

        # The partner switch validates its body and clamps the latency.
        assert client.post("/partner", "not json", content_type="application/json").status_code == 400
        assert client.post("/partner", "[1]", content_type="application/json").status_code == 200
        assert client.post("/partner", '{"latency_ms": "x"}', content_type="application/json").status_code == 400
        answer = client.post("/partner", '{"down": false, "latency_ms": 99999}', content_type="application/json")
        assert answer.json() == {"down": False, "latency_ms": 5000.0}, answer.json()
        assert client.get("/partner").status_code == 405
        PARTNER.latency_s = 0

    # /block under WSGI: no event loop to stall, it just sleeps (bounded, validated).
    blocked = client.get("/block?ms=30")
    assert blocked.status_code == 200 and blocked.json()["blocked_ms"] >= 29, blocked.content
    assert client.get("/block?ms=abc").status_code == 400

    state = client.get("/dashboard/state.json").json()
    assert state["pid"] == os.getpid() and state["server"] == "wsgi" and state["backend"] == "memory"
    assert set(state["breaker"]) == {"state", "failure_rate", "remaining_open_seconds", "not_permitted", "shared"}
    assert state["breaker"]["shared"] is False  # per process here; make demo-cluster shares it
    assert state["bulkhead"] == {  # leaving fake_clock reset the instances: the adaptive limit starts over at 40
        "max": 40,
        "in_use": 0,
        "rejected": 0,
        "adaptive": {"algorithm": "littles_law", "headroom": 0.1, "no_load_latency_ms": None},
    }
    assert state["partner"] == {"down": False, "latency_ms": 0.0}
    assert set(state["partner_calls"]) == {"calls_per_s", "peak_in_flight", "in_flight", "window_s"}
    assert state["partner_calls"]["in_flight"] == 0
    assert state["stalls"] == {"detectors": 0, "stalls_total": 0, "max_stall_ms": 0.0}

    page = client.get("/").content.decode()
    for needle in ('id="chart"', 'id="timeline"', 'id="little"', 'id="banner"', "X-Worker-Pid", "/block?ms="):
        assert needle in page, needle
    print("views ok")
    """
)


# The dashboard's data: what the server saw from every client (not the page's own requests), as counts
# only; the operator snapshot stays behind the state endpoint, whose 404 names nothing even with DEBUG.
DASHBOARD_SCRIPT = textwrap.dedent(
    """
    import json, re, django
    from django.conf import settings
    django.setup()
    from django.test import Client
    from django_ratelimit_r4.testing import fake_clock
    from cards.acquirer import PARTNER

    assert settings.DEBUG  # the demo runs with DEBUG = True: the 404 below must not lean on DEBUG = False
    PARTNER.latency_s = 0
    curl = Client()  # a terminal, load.py or curl: never the dashboard page
    with fake_clock() as clock:
        codes = [curl.post("/authorize", HTTP_X_FORWARDED_FOR="198.18.7.1").status_code for _ in range(11)]
        assert codes == [200] * 10 + [429], codes
        for i in range(2, 5):
            assert curl.post("/authorize-async", HTTP_X_FORWARDED_FOR=f"198.18.7.{i}").status_code == 200
        PARTNER.down = True
        for i in range(10):  # ten partner failures: 5 declined by the fallback, 5 failing (502) without it
            clock.advance(1)
            fallback = "" if i % 2 else "?fallback=0"
            curl.post("/authorize" + fallback, HTTP_X_FORWARDED_FOR="198.18.7.20")
        refused = curl.post("/authorize?fallback=0", HTTP_X_FORWARDED_FOR="198.18.7.21")
        assert refused.status_code == 503 and refused["Retry-After"] == "3", refused.status_code
        PARTNER.down = False
        response = curl.get("/dashboard/state.json")  # inside: leaving fake_clock resets the instances

    text = response.content.decode()
    data = json.loads(text)
    traffic = data["traffic"]
    want = {"approved": 13, "declined": 5, "429": 1, "503": 1, "other": 5}
    assert traffic["totals"] == want, traffic
    summed = {k: sum(s[k] for s in traffic["per_second"].values()) for k in want}
    assert summed == want, traffic["per_second"]
    assert all(traffic["now"] - 60 < int(s) <= traffic["now"] for s in traffic["per_second"]), traffic
    assert traffic["retry_after"] == {"1": 1, "3": 1}, traffic["retry_after"]
    per_client = data["limiters"]["per-client"]
    assert (per_client["granted"], per_client["rejected"]) == (24, 1), per_client
    assert 1 <= per_client["clients"] <= 6, per_client  # live budgets: a refilled client is forgotten for free
    assert data["breaker"]["state"] == "OPEN" and data["breaker"]["not_permitted"] == 1, data["breaker"]
    # Aggregates only: no client address, and nothing of the operator snapshot (config, keys, instances).
    assert not re.search(r"198\\.18\\.|127\\.0\\.0\\.1", text), text
    for hidden in ("instances", "config", "keys", "nanos_to_wait", "limit_for_period"):
        assert hidden not in data and f'"{hidden}"' not in text, hidden

    # The state endpoint: the token still works; anyone else gets a 404 that names nothing, DEBUG or not.
    token = {"HTTP_AUTHORIZATION": "Bearer " + settings.RATELIMIT_R4["state_endpoint_token"]}
    assert curl.get("/r4/", **token).status_code == 200
    for path, meta in (("/r4/", {}), ("/r4/?keys=1", {"HTTP_AUTHORIZATION": "Bearer guess"}),
                       ("/r4/per-client/reset", {})):
        hidden = curl.get(path, **meta) if "reset" not in path else curl.post(path, **meta)
        body = hidden.content.decode()
        assert hidden.status_code == 404, (path, hidden.status_code)
        for leak in ("state_view", "reset_view", "django_ratelimit_r4", "Raised by", "URLconf", "r4/"):
            assert leak not in body, (path, leak, body[:500])

    page = curl.get("/").content.decode()
    assert "seed 0" not in page.lower() and "How this page works" in page, page[:2000]
    print("dashboard ok")
    """
)


def _run_demo(script: str) -> str:
    result = run_in_demo(script)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_demo_views() -> None:
    assert "views ok" in _run_demo(SCRIPT)


def test_dashboard_data_counts_every_client_and_hides_the_operator_snapshot() -> None:
    assert "dashboard ok" in _run_demo(DASHBOARD_SCRIPT)


def test_demo_backend_setting_is_validated() -> None:
    result = run_in_demo("import django; django.setup()", timeout=60, DEMO_BACKEND="mongo")
    assert result.returncode != 0 and "DEMO_BACKEND must be 'memory' or 'redis'" in result.stderr
