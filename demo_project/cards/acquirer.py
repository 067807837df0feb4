"""The simulated acquirer (the partner that authorizes card payments), protected by a breaker and a bulkhead.

Resilience4j's order: the breaker sits outside the bulkhead, so an open breaker rejects without taking a slot.
Denying is not failing (seed 002): when the partner is down or saturated, the fallback answers "temporarily
unavailable" instead of an error, so the terminal knows the problem is transient. ``capture_strict`` is the
same call without the fallback, so the dashboard can show what the terminal would get otherwise.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from django_ratelimit_r4.decorators import resilient

from .cluster_meter import ClusterMeter
from .meter import CallMeter
from .partner import PartnerState

__all__ = [
    "CLUSTER_METER",
    "METER",
    "PARTNER",
    "AcquirerError",
    "acapture",
    "acapture_strict",
    "capture",
    "capture_strict",
    "unavailable",
]


class AcquirerError(Exception):
    """The partner refused or failed the call."""


_STATE_DIR = os.environ.get("DEMO_STATE_DIR")
#: The partner's knobs; shared by every worker through a file when ``DEMO_STATE_DIR`` is set.
PARTNER = PartnerState(Path(_STATE_DIR) / "partner.json" if _STATE_DIR else None)
#: Calls that reached the partner from this process (for the dashboard's Little's-law box).
METER = CallMeter()
#: With DEMO_CONTROL=1 (make demo-cluster): calls in flight at the partner from every worker of every host.
CLUSTER_METER = (
    ClusterMeter(os.environ.get("DEMO_REDIS_URL", "redis://127.0.0.1:6379/0"), "r4demo")
    if os.environ.get("DEMO_CONTROL") == "1"
    else None
)


def unavailable(card: str, amount: int, exc: BaseException) -> dict[str, object]:
    """Fallback with the protected function's parameters plus the exception (Resilience4j style)."""
    return {"status": "DECLINED", "reason": "TEMPORARILY_UNAVAILABLE", "card": card[-4:], "amount": amount,
            "cause": type(exc).__name__}


def _call_partner(card: str, amount: int) -> dict[str, object]:
    METER.enter()
    if CLUSTER_METER is not None:
        CLUSTER_METER.enter()
    try:
        time.sleep(PARTNER.latency_s)
        if PARTNER.down:
            raise AcquirerError("acquirer unavailable")
        return {"status": "APPROVED", "card": card[-4:], "amount": amount}
    finally:
        METER.leave()
        if CLUSTER_METER is not None:
            CLUSTER_METER.leave()


async def _acall_partner(card: str, amount: int) -> dict[str, object]:
    METER.enter()
    if CLUSTER_METER is not None:
        CLUSTER_METER.enter()
    try:
        await asyncio.sleep(PARTNER.latency_s)
        if PARTNER.down:
            raise AcquirerError("acquirer unavailable")
        return {"status": "APPROVED", "card": card[-4:], "amount": amount}
    finally:
        METER.leave()
        if CLUSTER_METER is not None:
            CLUSTER_METER.leave()


@resilient(circuitbreaker="acquirer", bulkhead="acquirer", fallback=unavailable)
def capture(card: str, amount: int) -> dict[str, object]:
    """Call the partner (sync). Blocks this request's thread for the partner's latency."""
    return _call_partner(card, amount)


@resilient(circuitbreaker="acquirer", bulkhead="acquirer", fallback=unavailable)
async def acapture(card: str, amount: int) -> dict[str, object]:
    """Call the partner (async). Waits with asyncio, so the event loop keeps serving others."""
    return await _acall_partner(card, amount)


@resilient(circuitbreaker="acquirer", bulkhead="acquirer")
def capture_strict(card: str, amount: int) -> dict[str, object]:
    """:func:`capture` without the fallback: rejections and partner errors reach the caller."""
    return _call_partner(card, amount)


@resilient(circuitbreaker="acquirer", bulkhead="acquirer")
async def acapture_strict(card: str, amount: int) -> dict[str, object]:
    """:func:`acapture` without the fallback."""
    return await _acall_partner(card, amount)
