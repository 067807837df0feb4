"""The demo's own views, in the demo's settings (a subprocess, like test_demo.py): the strict path without
the fallback, the bulkhead's BulkheadFull decline, the trusted proxy, /block, /partner and state.json."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "demo_project"

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
        for _ in range(40):
            assert bulkhead.try_acquire_permission()
        declined = client.post("/authorize").json()
        assert declined["reason"] == "TEMPORARILY_UNAVAILABLE" and declined["cause"] == "BulkheadFull", declined
        strict = client.post("/authorize?fallback=0")
        assert strict.status_code == 503 and strict["Retry-After"] == "1", (strict.status_code, strict.headers)
        assert breaker.metrics.number_of_buffered_calls == buffered
        for _ in range(40):
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


def test_demo_views() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "demo.settings", "DEMO_DB": ":memory:"}
    for name in ("PROMETHEUS_MULTIPROC_DIR", "DEMO_STATE_DIR", "DEMO_BACKEND"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(DEMO), str(DEMO.parent), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=DEMO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "views ok" in result.stdout


def test_demo_backend_setting_is_validated() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "demo.settings", "DEMO_DB": ":memory:", "DEMO_BACKEND": "mongo"}
    env["PYTHONPATH"] = os.pathsep.join([str(DEMO), str(DEMO.parent), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=DEMO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DEMO_BACKEND must be 'memory' or 'redis'" in result.stderr
