"""The demo project (README's first command) works end to end: limits, breaker fallback, probes, metrics."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.demo_harness import DEMO, demo_env, run_in_demo

SCRIPT = textwrap.dedent(
    """
    import json, django
    django.setup()
    from django.test import Client
    from django_ratelimit_r4 import get_circuit_breaker
    from django_ratelimit_r4.testing import fake_clock
    from cards.acquirer import PARTNER

    PARTNER.latency_s = 0
    client = Client()
    with fake_clock() as clock:
        codes = [client.post("/authorize").status_code for _ in range(11)]
        assert codes == [200] * 10 + [429], codes
        rejected = client.post("/authorize")
        assert rejected["Retry-After"] == "1", rejected.headers
        assert rejected["Content-Type"] == "application/problem+json"
        assert '"per-client";r=0;t=1' in rejected["RateLimit"], rejected["RateLimit"]
        # All-or-nothing: the 2 rejected requests consumed nothing from the global limiter.
        assert '"authorize-global";r=190;t=1' in rejected["RateLimit"], rejected["RateLimit"]
        # Saturation is the system working: probes stay green.
        assert client.get("/healthz/live").status_code == 200
        assert client.get("/healthz/ready").status_code == 200
        assert client.get("/healthz/resilience?format=json").status_code == 200
        clock.advance(1)
        assert client.post("/authorize").json()["status"] == "APPROVED"

        # Partner down: 10 real failures open the breaker (seed 002), then calls are refused without
        # leaving the process; the fallback answers "temporarily unavailable" instead of an error.
        PARTNER.down = True
        causes = []
        for i in range(12):
            clock.advance(1)
            causes.append(client.post("/authorize", {"amount": i}).json()["cause"])
        assert causes == ["AcquirerError"] * 10 + ["CallNotPermitted"] * 2, causes
        assert get_circuit_breaker("acquirer").state.name == "OPEN"
        assert client.get("/healthz/live").status_code == 200
        assert client.get("/healthz/ready").status_code == 200
        assert client.get("/healthz/resilience?format=json").status_code == 200

        metrics = client.get("/metrics").content.decode()
        assert 'resilience4j_circuitbreaker_state{name="acquirer",state="open"} 1.0' in metrics, metrics
        assert 'resilience4j_ratelimiter_calls_total{kind="failed",name="per-client"}' in metrics
        state = client.get("/dashboard/state.json").json()
        assert state["breaker"]["state"] == "OPEN" and state["traffic"]["totals"]["429"] == 2, state
        assert client.get("/").status_code == 200
    print("demo ok")
    """
)


def test_demo_project_end_to_end() -> None:
    result = run_in_demo(SCRIPT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo ok" in result.stdout


def test_demo_project_passes_system_checks() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--fail-level", "WARNING"],
        cwd=DEMO, env=demo_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
