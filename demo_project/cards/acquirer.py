"""The simulated acquirer (the partner that authorizes card payments), protected by a breaker and a bulkhead.

Resilience4j's order: the breaker sits outside the bulkhead, so an open breaker rejects without taking a slot.
Denying is not failing: when the partner is down or saturated, the fallback answers "temporarily
unavailable" instead of an error, so the terminal knows the problem is transient.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from django_ratelimit_r4.decorators import resilient


class AcquirerError(Exception):
    """The partner refused or failed the call."""


@dataclass
class PartnerState:
    """What the dashboard's buttons change: whether the partner is down and how slow it is."""

    down: bool = False
    latency_s: float = 0.050


PARTNER = PartnerState()


def unavailable(card: str, amount: int, exc: BaseException) -> dict[str, object]:
    """Fallback with the protected function's parameters plus the exception (Resilience4j style)."""
    return {"status": "DECLINED", "reason": "TEMPORARILY_UNAVAILABLE", "card": card[-4:], "amount": amount,
            "cause": type(exc).__name__}


@resilient(circuitbreaker="acquirer", bulkhead="acquirer", fallback=unavailable)
def capture(card: str, amount: int) -> dict[str, object]:
    """Call the partner (sync). Blocks this request's thread for the partner's latency."""
    time.sleep(PARTNER.latency_s)
    if PARTNER.down:
        raise AcquirerError("acquirer unavailable")
    return {"status": "APPROVED", "card": card[-4:], "amount": amount}


@resilient(circuitbreaker="acquirer", bulkhead="acquirer", fallback=unavailable)
async def acapture(card: str, amount: int) -> dict[str, object]:
    """Call the partner (async). Waits with asyncio, so the event loop keeps serving others."""
    await asyncio.sleep(PARTNER.latency_s)
    if PARTNER.down:
        raise AcquirerError("acquirer unavailable")
    return {"status": "APPROVED", "card": card[-4:], "amount": amount}
