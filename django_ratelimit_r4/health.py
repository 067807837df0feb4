"""django-health-check (4.x) check that reports resilience state and never fails because of it.

Use it on an *informational* endpoint, never on a Kubernetes probe (docs/operations.md, section 5)::

    from health_check.views import HealthCheckView

    path("healthz/resilience", HealthCheckView.as_view(checks=["django_ratelimit_r4.health.ResilienceState"]))

A saturated rate limiter, a full bulkhead or an open breaker is the system shedding load as designed,
and it is the same on every pod: failing a probe for it takes the whole fleet out (Resilience4j #607).
So :meth:`ResilienceState.run` never raises for them, not even ``ServiceWarning`` (a 500 in 4.x). It
raises ``ServiceUnavailable`` only when ``RATELIMIT_R4`` itself is broken (``manage.py check``
errors), because then protected views fail on first use.

The state is reported as information: after ``run()`` the check's ``repr`` (which every output
format of django-health-check shows) and :meth:`pretty_status` summarise every instance, e.g.
``ResilienceState(ratelimiter api: 0/10 available; bulkhead db: 2/2 in use; circuitbreaker pay: OPEN 12.5s)``.
The ``labels`` used by the OpenMetrics output stay constant (``check`` only) to keep cardinality low.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable

from . import conf, state

__all__ = ["ResilienceState", "summarize"]

logger = logging.getLogger("django_ratelimit_r4.health")


def summarize(items: list[dict[str, Any]]) -> str:
    """One short phrase per instance of a :func:`state.snapshot`, joined with ``"; "``."""
    parts = []
    for item in items:
        s = item["state"]
        type_name = item["type"]
        if s is None:  # could not be read: information, like the rest (the others are still summarised)
            parts.append(f"{type_name} {item['name']}: unreadable ({item.get('error')})")
            continue
        if type_name == "ratelimiter":
            if item["config"].get("key") is not None:  # one budget per client: no single "available"
                text = f"per client, {item['config']['limit_for_period']}/{item['config']['limit_refresh_period']}"
            else:
                text = f"{s['available_permissions']}/{item['config']['limit_for_period']} available"
            if s["keyed"] is not None and s["keyed"]["live_keys"] is not None:
                text += f", {s['keyed']['live_keys']} keys"
            backend = s.get("backend")
            if backend is not None and backend["degraded"]:  # information: the fault policy is deciding
                text += f", {backend['kind']} degraded (fault policy {backend['fault_policy']})"
        elif type_name == "bulkhead":
            text = f"{s['concurrent_calls']}/{s['max_allowed_concurrent_calls']} in use"
        elif type_name == "circuitbreaker":
            text = s["state"]
            if s["remaining_open_ns"]:
                text += f" {s['remaining_open_seconds']:g}s"
        elif type_name == "retry":
            text = f"{s['number_of_failed_calls_with_retry_attempt']} failed after retries"
        elif type_name == "adaptivethrottler":
            text = f"rejecting {s['rejection_probability']:.0%} locally"
        else:
            text = f"{s['number_of_timeout_calls']} timeouts"
        parts.append(f"{type_name} {item['name']}: {text}")
    return "; ".join(parts) if parts else "no instances configured"


@dataclasses.dataclass
class ResilienceState(HealthCheck):  # type: ignore[misc]  # health_check ships no types
    """Reports every configured instance's state; healthy unless ``RATELIMIT_R4`` is misconfigured."""

    summary: str = dataclasses.field(default="", init=False, repr=False, compare=False)

    def run(self) -> None:
        """Read every instance's state into :attr:`summary`; raise only for a broken setting."""
        analysis = conf.get_analysis()
        errors = [p for p in analysis.problems if p.code.value.startswith("E")]
        if errors:
            # Check ids only: a health page must not echo setting values.
            ids = ", ".join(sorted({p.check_id for p in errors}))
            raise ServiceUnavailable(
                f"RATELIMIT_R4 has {len(errors)} error(s) ({ids}); run `manage.py check`"
            )
        try:
            self.summary = summarize(state.snapshot())
        except Exception as exc:  # a reading bug must not look like an outage: report, stay healthy
            logger.exception("reading the resilience state failed")
            self.summary = f"state unavailable: {type(exc).__name__}"

    def pretty_status(self) -> str:
        """The summary of the last run (``"OK"`` before any)."""
        return self.summary or "OK"

    def __repr__(self) -> str:
        # django-health-check keys its JSON and text output by repr: a constant name a monitor can match
        # (``{"ResilienceState": "OK"}``); the state itself is in pretty_status(), r4 status and the metrics.
        return "ResilienceState"
