"""CircuitBreaker: Resilience4j 2.4 semantics (reference section 3), driven by a FakeClock."""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest

from django_ratelimit_r4.core.circuitbreaker import (
    STATE_TRANSITIONS,
    CircuitBreaker,
    CircuitBreakerConfig,
    ResultRecordedAsFailure,
    State,
)
from django_ratelimit_r4.core.circuitbreaker import breaker as cbmod  # the state machine builds the events
from django_ratelimit_r4.core.circuitbreaker.config import MAX_SLIDING_WINDOW_SIZE
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.durations import Nanos
from django_ratelimit_r4.core.exceptions import CallNotPermitted, ConfigurationError, IllegalStateTransition

MS = 1_000_000
S = 1_000_000_000


class Boom(Exception):
    """A recorded failure."""


def make(clock: FakeClock | None = None, **fields: object) -> tuple[CircuitBreaker, FakeClock]:
    clock = clock or FakeClock()
    return CircuitBreaker("cb", CircuitBreakerConfig(**fields), clock=clock), clock  # type: ignore[arg-type]


def fail() -> None:
    raise Boom("down")


def ok() -> str:
    return "ok"


def run(cb: CircuitBreaker, fn: object) -> str:
    try:
        return str(cb.call(fn))  # type: ignore[arg-type]
    except CallNotPermitted:
        return "rejected"
    except Boom:
        return "failed"


def record_events(cb: CircuitBreaker) -> list[str]:
    log: list[str] = []

    def listener(e: object) -> None:
        kind = e.event_type  # type: ignore[attr-defined]
        if kind == "STATE_TRANSITION":
            kind += f":{e.from_state.name}->{e.to_state.name}"  # type: ignore[attr-defined]
        log.append(kind)

    cb.events.on_event(listener)
    return log


def open_breaker(cb: CircuitBreaker, n: int) -> None:
    for _ in range(n):
        run(cb, fail)


# ---------------------------------------------------------------- Resilience4j's verified examples


def test_one_error_then_one_success_opens_with_rate_event_before_transition() -> None:
    cb, _ = make(sliding_window_size=4, minimum_number_of_calls=2, failure_rate_threshold=50)
    log = record_events(cb)
    assert run(cb, fail) == "failed"
    assert cb.state is State.CLOSED and cb.metrics.failure_rate == -1.0
    assert run(cb, ok) == "ok"
    assert cb.state is State.OPEN
    assert log == ["ERROR", "SUCCESS", "FAILURE_RATE_EXCEEDED", "STATE_TRANSITION:CLOSED->OPEN"]


def test_slow_means_strictly_greater_than_the_threshold() -> None:
    cb, clock = make(slow_call_duration_threshold="100ms", sliding_window_size=10, minimum_number_of_calls=10)

    def takes(ms: int) -> object:
        def fn() -> str:
            clock.advance_ns(ms * MS)
            return "ok"

        return fn

    run(cb, takes(100))
    assert cb.metrics.number_of_slow_calls == 0
    run(cb, takes(101))
    assert cb.metrics.number_of_slow_calls == 1
    assert cb.metrics.number_of_slow_successful_calls == 1
    cb.on_error(101 * MS, Boom())
    assert cb.metrics.number_of_slow_failed_calls == 1
    assert cb.metrics.number_of_slow_calls == 2
    assert cb.metrics.total_successful_duration_ns == 201 * MS  # measured with the injected clock


def test_half_open_decides_after_min_of_minimum_calls_and_permitted() -> None:
    cb, clock = make(
        sliding_window_size=4,
        minimum_number_of_calls=2,
        permitted_number_of_calls_in_half_open_state=4,
        wait_duration_in_open_state="1s",
    )
    open_breaker(cb, 2)
    assert cb.state is State.OPEN
    clock.advance(1.001)
    assert run(cb, ok) == "ok"
    assert cb.state is State.HALF_OPEN
    assert run(cb, ok) == "ok"
    assert cb.state is State.CLOSED  # after 2 successes, not 4


def test_in_flight_results_are_recorded_in_open_without_changing_state() -> None:
    cb, _ = make(sliding_window_size=10, minimum_number_of_calls=2)
    cb.acquire_permission()  # a call that started while CLOSED ...
    open_breaker(cb, 2)
    assert cb.state is State.OPEN and cb.metrics.number_of_buffered_calls == 2
    cb.on_success(5 * MS)  # ... and finishes while OPEN
    assert cb.metrics.number_of_buffered_calls == 3
    cb.on_error(5 * MS, Boom())
    assert cb.metrics.number_of_buffered_calls == 4
    assert cb.state is State.OPEN


def test_exponential_backoff_1s_2s_4s_capped_and_reset_after_closed() -> None:
    cb, clock = make(
        sliding_window_size=2,
        minimum_number_of_calls=1,
        permitted_number_of_calls_in_half_open_state=1,
        wait_duration_in_open_state="1s",
        enable_exponential_backoff=True,
        exponential_backoff_multiplier=2.0,
        exponential_max_wait_duration_in_open_state="5s",
    )
    waits = []
    run(cb, fail)
    for _ in range(4):
        assert cb.state is State.OPEN
        waits.append(cb.remaining_open_ns())
        clock.advance_ns(cb.remaining_open_ns() + 1)
        assert run(cb, fail) == "failed"  # the half-open trial fails -> OPEN again, attempts + 1
    assert waits == [1 * S, 2 * S, 4 * S, 5 * S]  # 8 s capped at 5 s
    clock.advance_ns(cb.remaining_open_ns() + 1)
    assert run(cb, ok) == "ok" and cb.state is State.CLOSED  # attempts back to 0
    run(cb, fail)
    assert cb.remaining_open_ns() == 1 * S


def test_randomized_wait_stays_within_the_factor() -> None:
    cb, _ = make(wait_duration_in_open_state="10s", enable_randomized_wait=True, randomized_wait_factor=0.5)
    seen = set()
    for _ in range(50):
        cb.transition_to_open_state()
        wait = cb.remaining_open_ns()
        assert 5 * S <= wait <= 15 * S + MS
        seen.add(wait)
    assert len(seen) > 10


# ---------------------------------------------------------------- windows


def test_count_window_is_a_ring_of_the_last_n_calls() -> None:
    cb, _ = make(sliding_window_size=3, minimum_number_of_calls=3, failure_rate_threshold=100)
    for fn in (fail, ok, ok, ok):  # the failure is evicted by the 4th call
        run(cb, fn)
    m = cb.metrics
    assert (m.number_of_buffered_calls, m.number_of_failed_calls, m.number_of_successful_calls) == (3, 0, 3)
    assert m.failure_rate == 0.0


def test_count_window_clamps_minimum_calls_to_the_window_size() -> None:
    cb, _ = make(sliding_window_size=4, minimum_number_of_calls=100)
    open_breaker(cb, 3)
    assert cb.state is State.CLOSED and cb.metrics.failure_rate == -1.0
    open_breaker(cb, 1)
    assert cb.state is State.OPEN


def test_time_window_expires_buckets_with_the_injected_clock() -> None:
    cb, clock = make(
        sliding_window_type="TIME_BASED",
        sliding_window_size=3,
        minimum_number_of_calls=4,
        failure_rate_threshold=50,
    )
    clock.advance_ns(S - clock.now_ns() % S)  # start on a second boundary
    run(cb, fail)
    run(cb, ok)
    clock.advance(1)
    run(cb, ok)
    assert cb.metrics.number_of_buffered_calls == 3
    clock.advance(2)  # the first second's bucket falls out; reading expires it
    assert cb.metrics.number_of_buffered_calls == 1
    assert cb.metrics.number_of_failed_calls == 0
    clock.advance(10)
    assert cb.metrics.number_of_buffered_calls == 0
    for _ in range(3):
        run(cb, fail)
    assert cb.state is State.CLOSED  # minimum 4 is not clamped to the 3-second window
    run(cb, fail)
    assert cb.state is State.OPEN


# ---------------------------------------------------------------- OPEN / HALF_OPEN


def test_open_to_half_open_only_strictly_after_the_deadline() -> None:
    cb, clock = make(sliding_window_size=2, minimum_number_of_calls=2, wait_duration_in_open_state="3s")
    open_breaker(cb, 2)
    clock.advance(3)
    assert cb.remaining_open_ns() == 0
    with pytest.raises(CallNotPermitted) as info:
        cb.call(ok)
    assert info.value.state is State.OPEN and info.value.circuit_breaker is cb
    assert cb.metrics.number_of_not_permitted_calls == 1
    clock.advance_ns(1)
    assert cb.call(ok) == "ok"
    assert cb.state is State.HALF_OPEN


def test_rejection_carries_remaining_open_time() -> None:
    cb, clock = make(sliding_window_size=2, minimum_number_of_calls=2, wait_duration_in_open_state="3s")
    open_breaker(cb, 2)
    clock.advance(1.2)
    with pytest.raises(CallNotPermitted) as info:
        cb.acquire_permission()
    assert info.value.wait_ns == cb.remaining_open_ns() == 1_800 * MS
    assert info.value.retry_after == 2
    assert not cb.try_acquire_permission()
    assert cb.metrics.number_of_not_permitted_calls == 2
    assert cb.metrics.total_not_permitted_calls == 2


def test_half_open_rejects_beyond_permits_and_stays_below_minimum() -> None:
    cb, _ = make(
        sliding_window_size=10, minimum_number_of_calls=10, permitted_number_of_calls_in_half_open_state=3
    )
    cb.transition_to_open_state()
    cb.transition_to_half_open_state()
    log = record_events(cb)
    assert [cb.try_acquire_permission() for _ in range(4)] == [True, True, True, False]
    assert cb.metrics.number_of_not_permitted_calls == 1
    cb.on_error(MS, Boom())
    cb.on_success(MS)
    assert cb.state is State.HALF_OPEN  # 2 results < min(10, 3)
    cb.on_error(MS, Boom())
    assert cb.state is State.OPEN
    assert log == [
        "NOT_PERMITTED",
        "ERROR",
        "SUCCESS",
        "ERROR",
        "STATE_TRANSITION:HALF_OPEN->OPEN",
    ]  # no *_EXCEEDED


def test_release_permission_never_exceeds_the_configured_trials() -> None:
    cb, _ = make(permitted_number_of_calls_in_half_open_state=2)
    cb.transition_to_open_state()
    cb.transition_to_half_open_state()
    cb.release_permission()
    cb.release_permission()
    assert [cb.try_acquire_permission() for _ in range(3)] == [True, True, False]
    cb.release_permission()
    assert cb.try_acquire_permission() and not cb.try_acquire_permission()


def test_automatic_transition_is_lazy_and_dated_at_the_deadline() -> None:
    cb, clock = make(
        sliding_window_size=2,
        minimum_number_of_calls=2,
        wait_duration_in_open_state="2s",
        automatic_transition_from_open_to_half_open_enabled=True,
        max_wait_duration_in_half_open_state="1s",
    )
    log = record_events(cb)
    open_breaker(cb, 2)
    clock.advance(2)
    assert cb.state is State.HALF_OPEN  # a scheduler fires at the deadline
    cb.try_acquire_permission()  # a trial that never reports back
    clock.advance(1.5)
    # The half-open wait ran out 0.5 s ago: OPEN since then, so 1.5 s of the 2 s remain.
    assert cb.state is State.OPEN
    assert cb.remaining_open_ns() == 1_500 * MS
    assert log[-3:] == [
        "STATE_TRANSITION:CLOSED->OPEN",
        "STATE_TRANSITION:OPEN->HALF_OPEN",
        "STATE_TRANSITION:HALF_OPEN->OPEN",
    ]


def test_max_wait_in_half_open_can_close() -> None:
    cb, clock = make(
        max_wait_duration_in_half_open_state="1s", transition_to_state_after_wait_duration="CLOSED"
    )
    cb.transition_to_open_state()
    cb.transition_to_half_open_state()
    clock.advance(0.999)
    assert cb.state is State.HALF_OPEN
    clock.advance(0.001)
    assert cb.state is State.CLOSED


def test_without_automatic_transition_state_stays_open_until_a_call() -> None:
    cb, clock = make(wait_duration_in_open_state="1s")
    cb.transition_to_open_state()
    clock.advance(5)
    assert cb.state is State.OPEN
    assert cb.try_acquire_permission()
    assert cb.state is State.HALF_OPEN


def test_many_due_transitions_after_a_clock_jump_terminate() -> None:
    cb, clock = make(
        wait_duration_in_open_state="1ms",
        automatic_transition_from_open_to_half_open_enabled=True,
        max_wait_duration_in_half_open_state="1ms",
    )
    cb.transition_to_open_state()
    clock.advance(3600)
    assert cb.state in (State.OPEN, State.HALF_OPEN)


# ---------------------------------------------------------------- special states and transitions


@pytest.mark.parametrize(("frm", "to"), list(itertools.product(State, State)))
def test_transition_table_is_resilience4j_s(frm: State, to: State) -> None:
    cb, _ = make(initial_state=frm.name)
    assert cb.state is frm
    method = getattr(cb, f"transition_to_{to.name.lower()}_state")
    if (frm, to) in STATE_TRANSITIONS:
        method()
        assert cb.state is to
    else:
        with pytest.raises(IllegalStateTransition):
            method()
        assert cb.state is frm


def test_illegal_transitions_are_exactly_the_missing_ones() -> None:
    missing = set(itertools.product(State, State)) - STATE_TRANSITIONS
    assert missing == {
        (State.CLOSED, State.HALF_OPEN),
        (State.METRICS_ONLY, State.OPEN),
        (State.METRICS_ONLY, State.HALF_OPEN),
    }


def test_disabled_permits_records_nothing_and_publishes_only_transitions() -> None:
    cb, _ = make(sliding_window_size=2, minimum_number_of_calls=2)
    log = record_events(cb)
    cb.transition_to_disabled_state()
    for _ in range(10):
        run(cb, fail)
    assert cb.state is State.DISABLED
    assert cb.metrics.number_of_buffered_calls == 0
    assert cb.metrics.total_failed_calls == 10  # lifetime totals still count
    cb.reset()
    assert log == ["STATE_TRANSITION:CLOSED->DISABLED", "STATE_TRANSITION:DISABLED->CLOSED", "RESET"]


def test_forced_open_rejects_counts_and_hints_the_configured_wait() -> None:
    cb, _ = make(wait_duration_in_open_state="7s")
    log = record_events(cb)
    cb.transition_to_forced_open_state()
    with pytest.raises(CallNotPermitted) as info:
        cb.call(ok)
    assert info.value.state is State.FORCED_OPEN and info.value.wait_ns == 7 * S
    assert cb.remaining_open_ns() == 7 * S
    assert not cb.try_acquire_permission()
    assert cb.metrics.number_of_not_permitted_calls == 2
    assert log == ["STATE_TRANSITION:CLOSED->FORCED_OPEN"]  # NOT_PERMITTED suppressed


def test_metrics_only_records_reports_once_and_never_transitions() -> None:
    cb, _ = make(sliding_window_size=4, minimum_number_of_calls=2, slow_call_duration_threshold="1ms")
    cb.transition_to_metrics_only_state()
    log = record_events(cb)
    for _ in range(6):
        cb.on_error(2 * MS, Boom())
    assert cb.state is State.METRICS_ONLY
    assert cb.metrics.failure_rate == 100.0 and cb.metrics.slow_call_rate == 100.0
    assert log.count("FAILURE_RATE_EXCEEDED") == 1 and log.count("SLOW_CALL_RATE_EXCEEDED") == 1


def test_slow_call_rate_opens_the_breaker() -> None:
    cb, _ = make(
        sliding_window_size=4,
        minimum_number_of_calls=4,
        slow_call_duration_threshold="10ms",
        slow_call_rate_threshold=50,
    )
    log = record_events(cb)
    for d in (1, 11, 1, 11):
        cb.on_success(d * MS)
    assert cb.state is State.OPEN
    assert log[-2:] == ["SLOW_CALL_RATE_EXCEEDED", "STATE_TRANSITION:CLOSED->OPEN"]


def test_transition_to_open_state_for_keeps_attempts() -> None:
    cb, _ = make(
        wait_duration_in_open_state="1s", enable_exponential_backoff=True, exponential_backoff_multiplier=2.0
    )
    cb.transition_to_open_state_for("30s")
    assert cb.remaining_open_ns() == 30 * S
    cb.transition_to_open_state_for(Nanos(5 * S))
    assert cb.remaining_open_ns() == 5 * S
    cb.transition_to_open_state()  # attempts 0 -> 1: the first exponential step
    assert cb.remaining_open_ns() == 1 * S
    cb.transition_to_open_state()
    assert cb.remaining_open_ns() == 2 * S


def test_self_transitions_are_allowed_but_not_published() -> None:
    cb, _ = make()
    log = record_events(cb)
    cb.on_error(MS, Boom())
    cb.transition_to_closed_state()
    assert log == ["ERROR"]
    assert cb.metrics.number_of_buffered_calls == 0  # a fresh state object


def test_initial_state_open_and_reset_and_set_clock() -> None:
    cb, _clock = make(initial_state="OPEN", wait_duration_in_open_state="10s")
    assert cb.state is State.OPEN and cb.remaining_open_ns() == 10 * S
    log = record_events(cb)
    cb.reset()
    assert log == ["RESET"]  # back to the freshly-built OPEN: an internal transition is not published
    assert cb.state is State.OPEN
    other = FakeClock(start_ns=5 * S)
    cb.set_clock(other)
    assert cb.clock is other and cb.remaining_open_ns() == 10 * S


def test_reset_closes_and_leaves_no_stale_timer() -> None:
    cb, clock = make(
        sliding_window_size=2,
        minimum_number_of_calls=2,
        wait_duration_in_open_state="1s",
        automatic_transition_from_open_to_half_open_enabled=True,
    )
    open_breaker(cb, 2)
    log = record_events(cb)
    cb.reset()
    assert cb.state is State.CLOSED and cb.metrics.number_of_buffered_calls == 0
    assert log == ["STATE_TRANSITION:OPEN->CLOSED", "RESET"]
    clock.advance(5)
    assert cb.state is State.CLOSED and log == ["STATE_TRANSITION:OPEN->CLOSED", "RESET"]
    assert cb.metrics.total_failed_calls == 2  # lifetime totals survive reset


# ---------------------------------------------------------------- classification


def test_exception_outside_a_non_empty_record_list_is_a_success() -> None:
    cb, _ = make(record_exceptions=[Boom], sliding_window_size=2, minimum_number_of_calls=2)
    log = record_events(cb)
    with pytest.raises(KeyError):
        cb.call(lambda: {}["x"])
    assert cb.metrics.number_of_successful_calls == 1
    run(cb, fail)
    assert cb.metrics.number_of_failed_calls == 1
    assert log[:2] == ["SUCCESS", "ERROR"]


def test_ignored_exception_records_nothing_and_releases_the_trial() -> None:
    cb, _ = make(
        ignore_exceptions=["builtins.LookupError"],
        record_exceptions=[LookupError, Boom],
        permitted_number_of_calls_in_half_open_state=1,
    )
    log = record_events(cb)
    cb.transition_to_open_state()
    cb.transition_to_half_open_state()
    for _ in range(3):  # ignore wins over record, and the single trial permit comes back each time
        with pytest.raises(KeyError):
            cb.call(lambda: {}["x"])
    assert cb.metrics.number_of_buffered_calls == 0
    assert cb.metrics.total_ignored_calls == 3
    assert log.count("IGNORED_ERROR") == 3
    assert cb.state is State.HALF_OPEN and cb.try_acquire_permission()


def test_record_result_counts_a_returned_value_as_failure() -> None:
    cb, _ = make(record_result=lambda r: r == 503, sliding_window_size=2, minimum_number_of_calls=2)
    errors: list[object] = []
    cb.events.on_error(lambda e: errors.append(e.exception))
    assert cb.call(lambda: 503) == 503  # the caller still gets the value
    assert cb.call(lambda: 200) == 200
    assert cb.metrics.number_of_failed_calls == 1
    assert isinstance(errors[0], ResultRecordedAsFailure) and errors[0].result == 503
    cb.on_result(MS, 503)
    assert cb.state is State.OPEN


def test_base_exception_releases_the_half_open_permit_and_records_nothing() -> None:
    cb, _ = make(permitted_number_of_calls_in_half_open_state=1)
    cb.transition_to_open_state()
    cb.transition_to_half_open_state()

    def interrupted() -> None:
        raise KeyboardInterrupt

    for _ in range(3):
        with pytest.raises(KeyboardInterrupt):
            cb.call(interrupted)
    assert cb.metrics.number_of_buffered_calls == 0
    assert cb.call(ok) == "ok" and cb.state is State.CLOSED


def test_base_exception_from_an_older_state_does_not_add_trials() -> None:
    cb, _ = make(permitted_number_of_calls_in_half_open_state=1)
    started = threading.Event()
    finish = threading.Event()

    def slow_then_interrupted() -> None:
        started.set()
        finish.wait(5)
        raise SystemExit

    def worker() -> None:
        with pytest.raises(SystemExit):
            cb.call(slow_then_interrupted)

    t = threading.Thread(target=worker)
    t.start()
    started.wait(5)
    cb.transition_to_open_state()
    cb.transition_to_half_open_state()
    assert cb.try_acquire_permission()
    finish.set()
    t.join(5)
    assert not cb.try_acquire_permission()  # the CLOSED-era call gave nothing back


async def test_cancelled_acall_releases_the_permit() -> None:
    cb, _ = make(permitted_number_of_calls_in_half_open_state=1)
    cb.transition_to_open_state()
    cb.transition_to_half_open_state()

    async def forever() -> None:
        await asyncio.sleep(3600)

    task = asyncio.ensure_future(cb.acall(forever))
    await asyncio.sleep(0)
    assert not cb.try_acquire_permission()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cb.metrics.number_of_buffered_calls == 0
    assert cb.try_acquire_permission()


# ---------------------------------------------------------------- API surface


async def test_acall_and_decorate_sync_and_async() -> None:
    cb, clock = make(sliding_window_size=10, minimum_number_of_calls=10)

    @cb.decorate
    def add(a: int, b: int = 0) -> int:
        """Adds."""
        return a + b

    @cb.decorate
    async def aadd(a: int, b: int = 0) -> int:
        clock.advance_ns(3 * MS)
        return a + b

    assert add(1, b=2) == 3 and add.__doc__ == "Adds." and add.__name__ == "add"
    assert await aadd(2, b=3) == 5
    assert asyncio.iscoroutinefunction(aadd)

    async def afail() -> None:
        raise Boom

    with pytest.raises(Boom):
        await cb.acall(afail)
    m = cb.metrics
    assert (m.number_of_successful_calls, m.number_of_failed_calls) == (2, 1)
    assert m.total_successful_duration_ns == 3 * MS
    cb.transition_to_forced_open_state()
    with pytest.raises(CallNotPermitted):
        await aadd(1)


def test_metrics_rates_and_cumulative_totals() -> None:
    cb, _ = make(sliding_window_size=4, minimum_number_of_calls=4, failure_rate_threshold=80)
    cb.on_success(1 * MS)
    cb.on_error(2 * MS, Boom())
    cb.on_success(3 * MS)
    assert cb.metrics.failure_rate == -1.0 and cb.metrics.slow_call_rate == -1.0
    cb.on_success(4 * MS)
    m = cb.metrics
    assert m.failure_rate == 25.0 and m.slow_call_rate == 0.0
    assert (m.total_successful_calls, m.total_successful_duration_ns) == (3, 8 * MS)
    assert (m.total_failed_calls, m.total_failed_duration_ns) == (1, 2 * MS)
    assert "failure_rate=25.0" in repr(m)


def test_a_raising_listener_never_breaks_the_call(caplog: pytest.LogCaptureFixture) -> None:
    cb, _ = make(sliding_window_size=2, minimum_number_of_calls=2)

    def bad(event: object) -> None:
        raise RuntimeError("listener bug")

    cb.events.on_event(bad)
    assert cb.call(ok) == "ok"
    assert run(cb, fail) == "failed"
    assert cb.state is State.OPEN
    assert run(cb, ok) == "rejected"
    assert "listener bug" in caplog.text


def test_events_are_not_built_without_listeners(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("event built without listeners")

    for name in (
        "CircuitBreakerOnSuccessEvent",
        "CircuitBreakerOnErrorEvent",
        "CircuitBreakerOnStateTransitionEvent",
        "CircuitBreakerOnCallNotPermittedEvent",
        "CircuitBreakerOnFailureRateExceededEvent",
        "CircuitBreakerOnResetEvent",
    ):
        monkeypatch.setattr(cbmod, name, forbidden)
    cb, _ = make(sliding_window_size=2, minimum_number_of_calls=2)
    run(cb, ok)
    run(cb, fail)
    assert run(cb, ok) == "rejected"
    cb.reset()
    cb.events.on_success(lambda e: None)
    with pytest.raises(AssertionError):
        cb.call(ok)


def test_listener_may_call_back_into_the_breaker() -> None:
    cb, _ = make(sliding_window_size=2, minimum_number_of_calls=2)
    seen: list[State] = []
    cb.events.on_state_transition(lambda e: seen.append(cb.state))
    open_breaker(cb, 2)
    assert seen == [State.OPEN]


def test_unknown_event_type_is_refused() -> None:
    cb, _ = make()
    with pytest.raises(ValueError):
        cb.events._on("NOPE", lambda e: None)


# ---------------------------------------------------------------- concurrency


@pytest.mark.parametrize("trial", range(15))
def test_half_open_admits_exactly_n_trials_under_contention(trial: int) -> None:
    permitted = 1 + trial % 5
    cb, _ = make(permitted_number_of_calls_in_half_open_state=permitted, wait_duration_in_open_state="1ms")
    cb.transition_to_open_state()
    clock: FakeClock = cb.clock  # type: ignore[assignment]
    clock.advance(1)  # due: the first acquire moves OPEN -> HALF_OPEN under the lock
    threads = 16
    barrier = threading.Barrier(threads)
    release = threading.Event()
    admitted: list[int] = []
    outcomes: list[str] = []

    def trial_call() -> str:
        admitted.append(1)
        release.wait(5)
        return "ok"

    def worker() -> None:
        barrier.wait()
        outcomes.append(run(cb, trial_call))

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for _ in range(5000):  # rejections return while the trials are still inside
        if len(outcomes) >= threads - permitted:
            break
        threading.Event().wait(0.001)
    assert len(admitted) == permitted
    # No lock is held while the protected calls run: reads and rejections work meanwhile.
    assert cb.state is State.HALF_OPEN and cb.metrics.number_of_buffered_calls == 0
    release.set()
    for t in pool:
        t.join(5)
    assert outcomes.count("ok") == permitted and outcomes.count("rejected") == threads - permitted
    assert cb.state is State.CLOSED  # min(100, permitted) successes


def test_concurrent_records_are_exact() -> None:
    cb, _ = make(sliding_window_size=1000, minimum_number_of_calls=1000, failure_rate_threshold=100)
    threads, per_thread = 8, 200
    barrier = threading.Barrier(threads)

    def worker(i: int) -> None:
        barrier.wait()
        for j in range(per_thread):
            if (i + j) % 4 == 0:
                run(cb, fail)
            else:
                cb.call(ok)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    m = cb.metrics
    assert m.total_successful_calls + m.total_failed_calls == threads * per_thread
    assert m.total_failed_calls == threads * per_thread // 4
    assert m.number_of_buffered_calls == 1000
    assert m.number_of_failed_calls + m.number_of_successful_calls == 1000
    ring = cb._st.window.ring
    assert m.number_of_failed_calls == sum(1 for code in ring if code & 2)


def test_a_transition_listener_does_not_build_per_call_events(monkeypatch):
    """Signals and metrics listen to transitions only: successful calls must not build events for them."""
    from django_ratelimit_r4.core.circuitbreaker import CircuitBreaker, CircuitBreakerConfig
    from django_ratelimit_r4.core.circuitbreaker import breaker as cb_module
    from django_ratelimit_r4.core.clock import FakeClock

    built = []
    original = cb_module.CircuitBreakerOnSuccessEvent
    monkeypatch.setattr(cb_module, "CircuitBreakerOnSuccessEvent", lambda *a, **k: built.append(1) or original(*a, **k))
    breaker = CircuitBreaker(
        "x", CircuitBreakerConfig(sliding_window_size=2, minimum_number_of_calls=2), clock=FakeClock()
    )
    transitions = []
    breaker.events.on_state_transition(transitions.append)
    assert breaker.events.wants_calls is False
    for _ in range(5):
        breaker.call(lambda: None)
    assert built == []
    with pytest.raises(ZeroDivisionError):  # 1 failure of 2 calls: 50 % -> OPEN
        breaker.call(lambda: 1 / 0)
    assert [(e.from_state.name, e.to_state.name) for e in transitions] == [("CLOSED", "OPEN")]
    breaker.events.on_success(lambda e: None)
    assert breaker.events.wants_calls is True


def test_exponential_backoff_without_a_cap_stops_growing_at_366_days() -> None:
    # Without exponential_max_wait_duration_in_open_state, 1 s x 1000^n would reach a Retry-After of dozens
    # of digits (issue 8): the open time stops at MAX_PERIOD_NS instead.
    cb, clock = make(
        sliding_window_size=2,
        minimum_number_of_calls=1,
        permitted_number_of_calls_in_half_open_state=1,
        wait_duration_in_open_state="1s",
        enable_exponential_backoff=True,
        exponential_backoff_multiplier=1000.0,
    )
    run(cb, fail)
    waits = []
    for _ in range(6):
        waits.append(cb.remaining_open_ns())
        clock.advance_ns(cb.remaining_open_ns() + 1)
        run(cb, fail)
    assert waits[:3] == [S, 1000 * S, 1_000_000 * S]
    assert waits[3:] == [366 * 86_400 * S] * 3


@pytest.mark.parametrize("field", ["wait_duration_in_open_state", "exponential_max_wait_duration_in_open_state"])
def test_open_times_longer_than_366_days_are_refused(field: str) -> None:
    with pytest.raises(ConfigurationError, match=f"{field}.*must be at most 366d, got 367d"):
        CircuitBreakerConfig(**{field: "367d"})


@pytest.mark.parametrize("window_type", ["COUNT_BASED", "TIME_BASED"])
def test_sliding_windows_larger_than_the_maximum_are_refused(window_type: str) -> None:
    # Every slot is allocated when the breaker is built: 10**13 passed the config and raised MemoryError (a 500)
    # at the first request; 10**9 took gigabytes per worker.
    config = CircuitBreakerConfig(sliding_window_type=window_type, sliding_window_size=MAX_SLIDING_WINDOW_SIZE)
    assert CircuitBreaker("big", config, clock=FakeClock()).state is State.CLOSED
    with pytest.raises(ConfigurationError, match=rf"sliding_window_size.*must be <= {MAX_SLIDING_WINDOW_SIZE}"):
        CircuitBreakerConfig(sliding_window_type=window_type, sliding_window_size=MAX_SLIDING_WINDOW_SIZE + 1)


# ---------------------------------------------------------------- exception predicates (issue 8)


class HTTPError(Boom):  # a Boom, so run() reports it as "failed"
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def raise_status(status: int) -> object:
    def call() -> None:
        raise HTTPError(status)

    return call


def test_record_exception_predicate_records_only_server_errors() -> None:
    cb, _ = make(
        sliding_window_size=4, minimum_number_of_calls=4, failure_rate_threshold=50,
        record_exception=lambda e: isinstance(e, HTTPError) and e.status >= 500,
    )
    for status in (404, 404, 404, 503):  # 404s are successes: 25 % failures
        run(cb, raise_status(status))
    assert cb.state is State.CLOSED
    assert (cb.metrics.number_of_successful_calls, cb.metrics.number_of_failed_calls) == (3, 1)
    run(cb, raise_status(502))  # the window is now 404, 404, 503, 502: 50 %
    assert cb.state is State.OPEN


def test_record_exception_is_or_ed_with_record_exceptions_as_in_resilience4j() -> None:
    cb, _ = make(record_exceptions=[ValueError], record_exception=lambda e: isinstance(e, HTTPError))
    run(cb, raise_status(400))
    run(cb, fail)  # Boom: neither the class list nor the predicate -> a success
    cb.on_error(0, ValueError("x"))
    assert (cb.metrics.number_of_failed_calls, cb.metrics.number_of_successful_calls) == (2, 1)


def test_ignore_exception_predicate_ignores_and_wins() -> None:
    cb, _ = make(ignore_exception=lambda e: isinstance(e, HTTPError) and e.status == 409)
    run(cb, raise_status(409))
    run(cb, raise_status(500))
    assert cb.metrics.number_of_failed_calls == 1
    assert cb.metrics.number_of_not_permitted_calls == 0
    assert cb.metrics.number_of_buffered_calls == 1  # the 409 counted as neither


def test_a_raising_predicate_is_logged_and_the_breaker_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    def broken(exc: BaseException) -> bool:
        raise RuntimeError("bug in the predicate")

    cb, _ = make(record_exception=broken, ignore_exception=broken)
    run(cb, fail)
    assert cb.metrics.number_of_failed_calls == 1  # not ignored, recorded: the conservative answers
    assert "record_exception raised" in caplog.text and "ignore_exception raised" in caplog.text


def test_predicates_as_dotted_paths_and_bad_ones_are_config_errors() -> None:
    config = CircuitBreakerConfig(record_exception="tests.views.is_server_error")
    from tests.views import is_server_error

    assert config.record_exception is is_server_error
    with pytest.raises(ConfigurationError, match=r"record_exception.*cannot import 'tests.views.nope'"):
        CircuitBreakerConfig(record_exception="tests.views.nope")
    with pytest.raises(ConfigurationError, match=r"ignore_exception.*must be callable"):
        CircuitBreakerConfig(ignore_exception=42)


# ---------------------------------------------------------------- open-state interval function (issue 8)


def test_wait_interval_function_in_open_state_grows_with_the_openings() -> None:
    from datetime import timedelta

    cb, clock = make(
        sliding_window_size=2, minimum_number_of_calls=1, permitted_number_of_calls_in_half_open_state=1,
        wait_interval_function_in_open_state=lambda attempts: timedelta(seconds=10 * attempts),
    )
    run(cb, fail)
    waits = []
    for _ in range(3):
        waits.append(cb.remaining_open_ns())
        clock.advance_ns(cb.remaining_open_ns() + 1)
        run(cb, fail)  # the half-open trial fails: open again, one more attempt
    assert waits == [10 * S, 20 * S, 30 * S]
    clock.advance_ns(cb.remaining_open_ns() + 1)
    assert run(cb, ok) == "ok" and cb.state is State.CLOSED
    run(cb, fail)
    assert cb.remaining_open_ns() == 10 * S  # back to attempt 1 after CLOSED


def test_a_broken_or_extreme_open_interval_function_keeps_the_breaker_sane(caplog: pytest.LogCaptureFixture) -> None:
    cb, _ = make(wait_duration_in_open_state="5s", wait_interval_function_in_open_state=lambda attempts: 30)
    cb.transition_to_open_state()
    assert cb.remaining_open_ns() == 5 * S  # a bare number has no unit: logged, the configured wait used
    assert "wait_interval_function_in_open_state failed" in caplog.text
    huge, _ = make(wait_interval_function_in_open_state=lambda attempts: "100000d")
    huge.transition_to_open_state()
    assert huge.remaining_open_ns() == 366 * 86_400 * S  # a Retry-After within bounds


def test_wait_interval_function_in_open_state_config_errors() -> None:
    assert CircuitBreakerConfig(wait_interval_function_in_open_state="tests.views.upstream_retry_after")
    with pytest.raises(ConfigurationError, match=r"wait_interval_function_in_open_state.*cannot be combined"):
        CircuitBreakerConfig(wait_interval_function_in_open_state=lambda a: "1s", enable_exponential_backoff=True)
    with pytest.raises(ConfigurationError, match=r"wait_interval_function_in_open_state.*cannot import"):
        CircuitBreakerConfig(wait_interval_function_in_open_state="tests.views.nope")


def test_randomized_open_time_is_floored_at_one_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    # Resilience4j's randomize() returns Math.max(1.0, ...): factor 1 and a zero draw still wait 1 ms.
    monkeypatch.setattr(cbmod.random, "random", lambda: 0.0)
    cb, _ = make(wait_duration_in_open_state="10ms", enable_randomized_wait=True, randomized_wait_factor=1.0)
    cb.transition_to_open_state()
    assert cb.remaining_open_ns() == MS
