"""Retry budgets (Finagle's RetryBudget): retries capped at a share of recent calls plus a floor, fake clock."""

from __future__ import annotations

import asyncio
import threading

import pytest

from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import ConfigurationError, MaxRetriesExceeded
from django_ratelimit_r4.core.retry import Retry, RetryConfig, RetryEvent
from django_ratelimit_r4.core.retrybudget import RetryBudget, RetryBudgetConfig

S = 1_000_000_000


class Down:
    """A dependency in an outage: every attempt fails; counts what it receives."""

    def __init__(self) -> None:
        self.received = 0

    def __call__(self) -> None:
        self.received += 1
        raise ConnectionError("down")


def outage(retry: Retry, clock: FakeClock, *, calls_per_second: int, seconds: int) -> tuple[int, int]:
    """Drive ``calls_per_second`` logical calls for ``seconds`` of fake time; (calls, attempts received)."""
    dependency = Down()
    calls = calls_per_second * seconds
    for _ in range(calls):
        with pytest.raises(ConnectionError):
            retry.call(dependency)
        clock.advance(1 / calls_per_second)
    return calls, dependency.received


def test_defaults_are_finagles() -> None:
    cfg = RetryBudgetConfig()
    assert (cfg.ttl, cfg.min_retries_per_second, cfg.percent_can_retry) == (10 * S, 10, 0.2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ttl": "500ms"}, "ttl"),
        ({"ttl": "61s"}, "ttl"),
        ({"ttl": 10}, "ttl"),
        ({"min_retries_per_second": -1}, "min_retries_per_second"),
        ({"min_retries_per_second": 1.5}, "min_retries_per_second"),
        ({"percent_can_retry": -0.1}, "percent_can_retry"),
        ({"percent_can_retry": "20%"}, "percent_can_retry"),
    ],
)
def test_invalid_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RetryBudgetConfig(**kwargs)
    assert [e.field for e in info.value.errors] == [field]


def test_load_amplification_during_an_outage_with_and_without_a_budget() -> None:
    """The issue's proof: 3 attempts per call triple the load; a 10 % budget keeps it at most 1.1x."""
    clock = FakeClock()
    cfg = RetryConfig(max_attempts=3, wait_duration="0s")
    plain = Retry("plain", cfg, clock=clock)
    calls, received = outage(plain, clock, calls_per_second=100, seconds=60)
    assert received / calls == 3.0

    budget = RetryBudget("dep", RetryBudgetConfig(percent_can_retry=0.1, min_retries_per_second=0), clock=clock)
    budgeted = Retry("budgeted", cfg, clock=clock, budget=budget)
    calls, received = outage(budgeted, clock, calls_per_second=100, seconds=60)
    amplification = received / calls
    assert 1.05 <= amplification <= 1.1, amplification
    m = budgeted.metrics
    assert m.number_of_budget_exhausted_calls == budget.metrics.number_of_refused_retries > 0
    assert m.number_of_failed_calls_with_retry_attempt + m.number_of_failed_calls_without_retry_attempt == calls
    assert budget.metrics.number_of_deposits == calls


def test_the_floor_allows_retries_at_low_traffic_and_bounds_the_amplification() -> None:
    """1 call per second with a floor of 1 retry/s: every call may retry once (2 attempts), never 3."""
    clock = FakeClock()
    budget = RetryBudget("dep", RetryBudgetConfig(percent_can_retry=0, min_retries_per_second=1), clock=clock)
    retry = Retry("r", RetryConfig(max_attempts=3, wait_duration="0s"), clock=clock, budget=budget)
    calls, received = outage(retry, clock, calls_per_second=1, seconds=60)
    # The reserve (ttl * 1 retry) is shared by the last ttl: at most 10 retries in any 10 s, over 60 s.
    assert received - calls <= 60 + 10
    assert received / calls < 3


def test_the_window_slides_so_a_recovered_budget_allows_retries_again() -> None:
    clock = FakeClock()
    budget = RetryBudget("dep", RetryBudgetConfig(ttl="10s", percent_can_retry=0.5, min_retries_per_second=0), clock=clock)
    assert budget.balance == 0
    for _ in range(4):
        budget.deposit()
    assert budget.balance == 2
    assert budget.try_withdraw() and budget.try_withdraw()
    assert not budget.try_withdraw()
    clock.advance(10)  # every deposit and withdrawal of the old window has expired
    assert budget.balance == 0
    budget.deposit()
    budget.deposit()
    assert budget.try_withdraw()
    assert budget.metrics.number_of_retries == 3 and budget.metrics.number_of_refused_retries == 1


def test_a_budget_without_percent_and_floor_refuses_every_retry() -> None:
    clock = FakeClock()
    budget = RetryBudget("none", RetryBudgetConfig(percent_can_retry=0, min_retries_per_second=0), clock=clock)
    retry = Retry("r", RetryConfig(max_attempts=5, wait_duration="0s"), clock=clock, budget=budget)
    dependency = Down()
    with pytest.raises(ConnectionError):
        retry.call(dependency)
    assert dependency.received == 1
    assert retry.metrics.number_of_failed_calls_without_retry_attempt == 1


def test_shared_budget_counts_calls_of_every_retry_that_uses_it() -> None:
    """Two retries calling the same dependency draw from one budget: calls through either fund both."""
    clock = FakeClock()
    budget = RetryBudget("dep", RetryBudgetConfig(percent_can_retry=1.0, min_retries_per_second=0), clock=clock)
    cfg = RetryConfig(max_attempts=2, wait_duration="0s")
    a = Retry("a", cfg, clock=clock, budget=budget)
    b = Retry("b", cfg, clock=clock, budget=budget)
    assert a.call(lambda: "ok") == "ok" and a.call(lambda: "ok") == "ok"  # two deposits, through a
    dependency = Down()
    for _ in range(2):  # b's own two deposits + a's two: four retries' worth, b uses two of them
        with pytest.raises(ConnectionError):
            b.call(dependency)
    assert dependency.received == 4
    assert budget.balance == 2


def test_a_refused_retry_publishes_error_with_the_last_exception() -> None:
    clock = FakeClock()
    budget = RetryBudget("dep", RetryBudgetConfig(percent_can_retry=0, min_retries_per_second=0), clock=clock)
    retry = Retry("r", RetryConfig(max_attempts=3, wait_duration="0s"), clock=clock, budget=budget)
    seen: list[RetryEvent] = []
    retry.events.on_error(seen.append)
    retry.events.on_retry(seen.append)
    with pytest.raises(ConnectionError):
        retry.call(Down())
    assert [(e.event_type, e.number_of_attempts, type(e.last_exception)) for e in seen] == [
        ("ERROR", 1, ConnectionError)
    ]


def test_refused_retry_on_result_returns_the_result_or_raises_max_retries_exceeded() -> None:
    clock = FakeClock()
    none = RetryBudgetConfig(percent_can_retry=0, min_retries_per_second=0)
    retry = Retry(
        "r",
        RetryConfig(max_attempts=3, wait_duration="0s", retry_on_result=lambda r: r == "busy"),
        clock=clock,
        budget=RetryBudget("dep", none, clock=clock),
    )
    assert retry.call(lambda: "busy") == "busy"
    strict = Retry(
        "s",
        RetryConfig(max_attempts=3, wait_duration="0s", retry_on_result=lambda r: r == "busy", fail_after_max_attempts=True),
        clock=clock,
        budget=RetryBudget("dep", none, clock=clock),
    )
    with pytest.raises(MaxRetriesExceeded):
        strict.call(lambda: "busy")
    assert retry.metrics.number_of_budget_exhausted_calls == strict.metrics.number_of_budget_exhausted_calls == 1


def test_async_calls_use_the_same_budget() -> None:
    clock = FakeClock()
    budget = RetryBudget("dep", RetryBudgetConfig(percent_can_retry=0.1, min_retries_per_second=0), clock=clock)
    retry = Retry("r", RetryConfig(max_attempts=3, wait_duration="0s"), clock=clock, budget=budget)
    received = 0

    async def down() -> None:
        nonlocal received
        received += 1
        raise ConnectionError("down")

    async def main() -> None:
        for _ in range(1000):
            with pytest.raises(ConnectionError):
                await retry.acall(down)
            clock.advance(0.01)

    asyncio.run(main())
    assert 1.05 <= received / 1000 <= 1.1


def test_concurrent_threads_never_overspend_the_budget() -> None:
    """Many threads racing on one budget: exactly the affordable retries are granted."""
    for _ in range(20):
        clock = FakeClock()
        budget = RetryBudget("dep", RetryBudgetConfig(percent_can_retry=0.5, min_retries_per_second=0), clock=clock)
        for _ in range(100):
            budget.deposit()
        barrier = threading.Barrier(8)
        granted: list[int] = []

        def spend(budget: RetryBudget, barrier: threading.Barrier, granted: list[int]) -> None:
            barrier.wait()
            granted.append(sum(budget.try_withdraw() for _ in range(50)))

        threads = [threading.Thread(target=spend, args=(budget, barrier, granted)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(granted) == 50
        assert budget.metrics.number_of_refused_retries == 8 * 50 - 50


def test_reset_and_set_clock_restart_the_window() -> None:
    clock = FakeClock()
    budget = RetryBudget("dep", RetryBudgetConfig(percent_can_retry=1, min_retries_per_second=0), clock=clock)
    budget.deposit()
    budget.reset()
    assert budget.balance == 0 and budget.metrics.number_of_deposits == 0
    budget.deposit()
    other = FakeClock(start_ns=5 * S)
    budget.set_clock(other)
    assert budget.balance == 0
