"""The shared waiting counter: counted while sleeping, uncounted after, even when the sleep raises."""

from __future__ import annotations

import asyncio

import pytest

from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.waiting import Waiters


class _ObservingClock(FakeClock):
    """A FakeClock that records the waiter count seen from inside each sleep, and can fail a sleep."""

    def __init__(self, waiters: Waiters, fail: BaseException | None = None) -> None:
        super().__init__()
        self.waiters = waiters
        self.fail = fail
        self.seen: list[tuple[int, float]] = []

    def sleep(self, seconds: float) -> None:
        self.seen.append((self.waiters.count, seconds))
        if self.fail is not None:
            raise self.fail
        super().sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        self.seen.append((self.waiters.count, seconds))
        if self.fail is not None:
            raise self.fail
        await super().asleep(seconds)


def test_sleep_counts_the_waiter_and_converts_ns_to_seconds() -> None:
    waiters = Waiters()
    clock = _ObservingClock(waiters)
    start = clock.now_ns()
    waiters.sleep(clock, 250_000_000)
    assert clock.seen == [(1, 0.25)]
    assert clock.now_ns() - start == 250_000_000
    assert waiters.count == 0


async def test_asleep_counts_the_waiter() -> None:
    waiters = Waiters()
    clock = _ObservingClock(waiters)
    await waiters.asleep(clock, 1_500_000_000)
    assert clock.seen == [(1, 1.5)]
    assert waiters.count == 0


def test_a_failing_sleep_is_uncounted() -> None:
    waiters = Waiters()
    clock = _ObservingClock(waiters, fail=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        waiters.sleep(clock, 1)
    assert waiters.count == 0


async def test_a_cancelled_wait_is_uncounted() -> None:
    waiters = Waiters()
    clock = _ObservingClock(waiters, fail=asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await waiters.asleep(clock, 1)
    assert waiters.count == 0
