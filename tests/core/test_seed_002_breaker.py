"""Seed 002: the article's 60-call circuit-breaker run, replayed on a FakeClock.

The article (Portuguese, Resilience4j 2.4) calls a partner that fails until call 40, through a
COUNT_BASED breaker (window 20, minimum 10, threshold 50 %, 3 s open, 3 half-open calls), sleeping
150 ms between calls, and prints each transition. We must reproduce its transitions at the same calls.
"""

from __future__ import annotations

import pytest

from django_ratelimit_r4.core.circuitbreaker import CircuitBreaker, CircuitBreakerConfig, State
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import CallNotPermitted

MS = 1_000_000

CONFIG = CircuitBreakerConfig(
    sliding_window_type="COUNT_BASED",
    sliding_window_size=20,
    minimum_number_of_calls=10,
    failure_rate_threshold=50,
    wait_duration_in_open_state="3s",
    permitted_number_of_calls_in_half_open_state=3,
)


class PartnerDown(RuntimeError):
    """The acquirer is unavailable ("adquirente indisponível")."""


def run_article(*, rejection_costs_ms: int) -> tuple[list[str], list[tuple[int, str, str]], CircuitBreaker]:
    """Run the 60 iterations; return per-call outcomes and (call, from, to) transitions.

    Each iteration: the partner call takes 1 ms (the fake clock advances inside the call), then the
    loop sleeps 150 ms. ``rejection_costs_ms`` is the time an iteration spends when the breaker
    rejects (the article's println and exception handling are not free in a real run).
    """
    clock = FakeClock()
    breaker = CircuitBreaker("adquirente", CONFIG, clock=clock)
    current_call = 0
    transitions: list[tuple[int, str, str]] = []
    breaker.events.on_state_transition(
        lambda e: transitions.append((current_call, e.from_state.name, e.to_state.name))
    )
    partner_down = True

    def capture() -> str:
        clock.advance_ns(1 * MS)
        if partner_down:
            raise PartnerDown("adquirente indisponível")
        return "CAPTURADO"

    outcomes: list[str] = []
    for i in range(1, 61):
        current_call = i
        if i == 40:
            partner_down = False  # the partner recovers
        try:
            outcomes.append(breaker.call(capture))
        except CallNotPermitted:
            outcomes.append("barrado")
            clock.advance_ns(rejection_costs_ms * MS)
        except PartnerDown:
            outcomes.append("falhou")
        clock.sleep(0.150)
    return outcomes, transitions, breaker


def expected_outcomes() -> list[str]:
    return (
        ["falhou"] * 10  # 1..10 really fail; the 10th opens the breaker
        + ["barrado"] * 19  # 11..29 rejected without leaving the application
        + ["falhou"] * 3  # 30..31..32: half-open trials, partner still down
        + ["barrado"] * 19  # 33..51 rejected (the partner is back at 40, nobody knows yet)
        + ["CAPTURADO"] * 9  # 52..54 trials succeed -> CLOSED; 55..60 succeed
    )


def test_article_run_reproduces_every_call_and_transition() -> None:
    outcomes, transitions, breaker = run_article(rejection_costs_ms=1)

    assert outcomes == expected_outcomes()
    assert transitions == [
        (10, "CLOSED", "OPEN"),  # published when call 10's failure is recorded (before its catch)
        (30, "OPEN", "HALF_OPEN"),
        (32, "HALF_OPEN", "OPEN"),  # after call 32's result
        (52, "OPEN", "HALF_OPEN"),
        (54, "HALF_OPEN", "CLOSED"),  # after call 54's result
    ]
    assert breaker.state is State.CLOSED
    m = breaker.metrics
    # CLOSED since call 54: a fresh window holding calls 55..60.
    assert m.number_of_buffered_calls == 6
    assert m.number_of_failed_calls == 0
    assert m.failure_rate == -1.0  # 6 < minimum 10
    assert m.total_failed_calls == 13
    assert m.total_successful_calls == 9
    assert m.total_not_permitted_calls == 38


def test_transition_is_printed_before_the_failing_call_returns() -> None:
    """The article: the '>>' line comes before '10: falhou' because the event fires on recording."""
    clock = FakeClock()
    breaker = CircuitBreaker("adquirente", CONFIG, clock=clock)
    log: list[str] = []
    breaker.events.on_state_transition(lambda e: log.append(e.state_transition))

    def fail() -> None:
        raise PartnerDown

    for i in range(1, 11):
        try:
            breaker.call(fail)
        except PartnerDown:
            log.append(f"{i}: falhou no parceiro")
    assert log[-2:] == ["State transition from CLOSED to OPEN", "10: falhou no parceiro"]


def test_literal_150ms_model_puts_call_30_exactly_on_the_deadline() -> None:
    """If rejections took zero time, call 30 would start exactly 3 s after call 10's failure was
    recorded; Resilience4j's strict isAfter keeps the breaker OPEN there, so the probe moves to 31."""
    outcomes, transitions, _ = run_article(rejection_costs_ms=0)
    assert transitions[0] == (10, "CLOSED", "OPEN")
    assert outcomes[29] == "barrado"  # call 30: at the deadline, still OPEN
    assert transitions[1] == (31, "OPEN", "HALF_OPEN")
    assert outcomes[30:33] == ["falhou"] * 3


@pytest.mark.parametrize("rejection_costs_ms", [2, 5])
def test_article_run_is_robust_to_small_loop_overheads(rejection_costs_ms: int) -> None:
    """Any small positive overhead per rejected iteration reproduces the article's calls."""
    outcomes, transitions, _ = run_article(rejection_costs_ms=rejection_costs_ms)
    assert outcomes == expected_outcomes()
    assert [t[0] for t in transitions] == [10, 30, 32, 52, 54]
