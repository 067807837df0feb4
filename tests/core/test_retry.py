"""Retry: Resilience4j 2.4's attempts, waits, predicates, metrics and events, driven by a FakeClock."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.core import retry as retry_module
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import ConfigurationError, MaxRetriesExceeded
from django_ratelimit_r4.core.retry import Retry, RetryConfig, RetryEvent

MS = 1_000_000
S = 1_000_000_000


class Flaky:
    """Raises the given exceptions in order, then returns the given results in order."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0
        self.args: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        self.args.append((args, kwargs))
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class AsyncFlaky(Flaky):
    async def __call__(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().__call__(*args, **kwargs)


def recording_retry(config: RetryConfig | None = None, **kwargs: object) -> tuple[Retry, list[RetryEvent], FakeClock]:
    clock = FakeClock()
    retry = Retry("r", config, clock=clock, **kwargs)  # type: ignore[arg-type]
    events: list[RetryEvent] = []
    retry.events.on_event(events.append)
    return retry, events, clock


def summary(events: list[RetryEvent]) -> list[tuple[str, int, int]]:
    return [(e.event_type, e.number_of_attempts, e.wait_ns) for e in events]


def counts(retry: Retry) -> tuple[int, int, int, int, int]:
    m = retry.metrics
    return (
        m.number_of_successful_calls_without_retry_attempt,
        m.number_of_successful_calls_with_retry_attempt,
        m.number_of_failed_calls_without_retry_attempt,
        m.number_of_failed_calls_with_retry_attempt,
        m.number_of_total_calls,
    )


# -- defaults and config -----------------------------------------------------------------------------


def test_defaults_match_resilience4j() -> None:
    retry = Retry("d")
    assert retry.config == RetryConfig()
    assert retry.config.max_attempts == 3
    assert retry.config.wait_duration == 500 * MS
    assert retry.config.fail_after_max_attempts is False
    assert [retry.interval_ns(n) for n in (1, 2, 3)] == [500 * MS] * 3


def test_config_collects_every_error() -> None:
    with pytest.raises(ConfigurationError) as info:
        RetryConfig(max_attempts=0, wait_duration=5, randomized_wait_factor=2, retry_exceptions=["no.such.Thing"])
    fields = [e.field for e in info.value.errors]
    assert fields == ["max_attempts", "wait_duration", "randomized_wait_factor", "retry_exceptions"]


# -- outcomes, metrics and events --------------------------------------------------------------------


def test_first_try_success_counts_without_retry_and_publishes_nothing() -> None:
    retry, events, clock = recording_retry()
    start = clock.now_ns()
    fn = Flaky("ok")
    assert retry.call(fn, 1, key="v") == "ok"
    assert fn.args == [((1,), {"key": "v"})]
    assert counts(retry) == (1, 0, 0, 0, 1)
    assert events == []
    assert clock.now_ns() == start


def test_success_after_retries_waits_and_reports() -> None:
    retry, events, clock = recording_retry()
    start = clock.now_ns()
    first, second = ValueError("1"), ValueError("2")
    fn = Flaky(first, second, "ok")
    assert retry.call(fn) == "ok"
    assert fn.calls == 3
    assert clock.now_ns() - start == 2 * 500 * MS
    assert counts(retry) == (0, 1, 0, 0, 3)
    assert summary(events) == [("RETRY", 1, 500 * MS), ("RETRY", 2, 500 * MS), ("SUCCESS", 2, 0)]
    assert events[0].last_exception is first
    assert events[1].last_exception is second
    assert events[2].last_exception is second
    assert all(e.name == "r" for e in events)


def test_exhausted_exceptions_reraise_the_last_one() -> None:
    retry, events, _ = recording_retry(RetryConfig(max_attempts=4, wait_duration="10ms"))
    errors = [OSError(i) for i in range(4)]
    fn = Flaky(*errors)
    with pytest.raises(OSError) as info:
        retry.call(fn)
    assert info.value is errors[-1]
    assert fn.calls == 4
    assert counts(retry) == (0, 0, 0, 1, 4)
    assert summary(events) == [("RETRY", 1, 10 * MS), ("RETRY", 2, 10 * MS), ("RETRY", 3, 10 * MS), ("ERROR", 4, 0)]
    assert events[-1].last_exception is errors[-1]


def test_max_attempts_one_never_retries() -> None:
    retry, events, clock = recording_retry(RetryConfig(max_attempts=1))
    start = clock.now_ns()
    with pytest.raises(ValueError):
        retry.call(Flaky(ValueError()))
    assert counts(retry) == (0, 0, 1, 0, 1)
    assert summary(events) == [("ERROR", 1, 0)]
    assert clock.now_ns() == start


def test_total_calls_counts_attempts_across_calls() -> None:
    retry, _, _ = recording_retry(RetryConfig(wait_duration=0))
    retry.call(Flaky("a"))
    retry.call(Flaky(ValueError(), "b"))
    with pytest.raises(KeyError):
        retry.call(Flaky(KeyError()))
    assert counts(retry) == (1, 1, 0, 1, 1 + 2 + 3)


# -- which exceptions are retried ------------------------------------------------------------------


def test_retry_exceptions_limits_what_is_retried() -> None:
    retry, events, _ = recording_retry(RetryConfig(wait_duration=0, retry_exceptions=(LookupError,)))
    assert retry.call(Flaky(KeyError(), IndexError(), "ok")) == "ok"  # subclasses match
    error = ValueError("not listed")
    fn = Flaky(error)
    with pytest.raises(ValueError) as info:
        retry.call(fn)
    assert info.value is error
    assert fn.calls == 1
    assert summary(events)[-1] == ("IGNORED_ERROR", 0, 0)
    assert events[-1].last_exception is error
    assert counts(retry) == (0, 1, 1, 0, 4)


def test_retry_exceptions_accept_dotted_paths() -> None:
    retry = Retry("p", RetryConfig(wait_duration=0, retry_exceptions=["builtins.ValueError"]), clock=FakeClock())
    assert retry.config.retry_exceptions == (ValueError,)
    assert retry.call(Flaky(ValueError(), "ok")) == "ok"
    with pytest.raises(TypeError):
        retry.call(Flaky(TypeError(), "never"))


def test_ignore_exceptions_always_win() -> None:
    config = RetryConfig(wait_duration=0, retry_exceptions=(LookupError,), ignore_exceptions=(KeyError,))
    retry, events, _ = recording_retry(config)
    fn = Flaky(KeyError())
    with pytest.raises(KeyError):
        retry.call(fn)
    assert fn.calls == 1
    assert [e.event_type for e in events] == ["IGNORED_ERROR"]
    # The sibling that is only in retry_exceptions is still retried.
    assert retry.call(Flaky(IndexError(), "ok")) == "ok"


def test_ignore_exceptions_win_over_the_default_of_everything() -> None:
    retry, _, _ = recording_retry(RetryConfig(wait_duration=0, ignore_exceptions=(ConnectionError,)))
    fn = Flaky(ConnectionRefusedError())
    with pytest.raises(ConnectionRefusedError):
        retry.call(fn)
    assert fn.calls == 1
    assert retry.call(Flaky(OSError(), "ok")) == "ok"


def test_ignored_error_after_a_retry_counts_as_failed_with_retry() -> None:
    retry, events, _ = recording_retry(RetryConfig(wait_duration=0, ignore_exceptions=(KeyError,)))
    with pytest.raises(KeyError):
        retry.call(Flaky(ValueError(), KeyError()))
    assert summary(events) == [("RETRY", 1, 0), ("IGNORED_ERROR", 1, 0)]
    assert counts(retry) == (0, 0, 0, 1, 2)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(1), asyncio.CancelledError()])
def test_base_exceptions_are_never_retried_even_if_listed(error: BaseException) -> None:
    retry, events, clock = recording_retry(RetryConfig(retry_exceptions=(BaseException,)))
    start = clock.now_ns()
    fn = Flaky(error, "never")
    with pytest.raises(type(error)) as info:
        retry.call(fn)
    assert info.value is error
    assert fn.calls == 1
    assert events == []
    assert counts(retry) == (0, 0, 0, 0, 0)
    assert clock.now_ns() == start


# -- results -----------------------------------------------------------------------------------------


def test_retry_on_result_retries_until_a_good_result() -> None:
    retry, events, clock = recording_retry(RetryConfig(wait_duration="1s", retry_on_result=lambda r: r is None))
    start = clock.now_ns()
    assert retry.call(Flaky(None, None, "ok")) == "ok"
    assert clock.now_ns() - start == 2 * S
    assert summary(events) == [("RETRY", 1, S), ("RETRY", 2, S), ("SUCCESS", 2, 0)]
    assert events[0].last_exception is None
    assert counts(retry) == (0, 1, 0, 0, 3)


def test_exhausted_results_return_the_last_bad_result() -> None:
    retry, events, _ = recording_retry(RetryConfig(wait_duration=0, retry_on_result=lambda r: r["status"] >= 500))
    bad = [{"status": 503, "n": i} for i in range(3)]
    assert retry.call(Flaky(*bad)) is bad[-1]
    assert counts(retry) == (0, 0, 0, 1, 3)
    assert [e.event_type for e in events] == ["RETRY", "RETRY", "ERROR"]
    assert isinstance(events[-1].last_exception, MaxRetriesExceeded)
    assert events[-1].number_of_attempts == 3


def test_exhausted_results_after_an_exception_report_that_exception() -> None:
    retry, events, _ = recording_retry(RetryConfig(wait_duration=0, retry_on_result=lambda r: r == "bad"))
    error = ValueError()
    assert retry.call(Flaky(error, "bad", "bad")) == "bad"
    assert events[-1].event_type == "ERROR"
    assert events[-1].last_exception is error


def test_fail_after_max_attempts_raises_max_retries_exceeded() -> None:
    config = RetryConfig(wait_duration=0, retry_on_result=lambda r: r == "bad", fail_after_max_attempts=True)
    retry, events, _ = recording_retry(config)
    with pytest.raises(MaxRetriesExceeded) as info:
        retry.call(Flaky("bad"))
    assert info.value.retry is retry
    assert info.value.attempts == 3
    assert info.value.name == "r"
    assert str(info.value) == "Retry 'r' has exhausted all attempts (3)"
    assert events[-1].last_exception is info.value
    assert counts(retry) == (0, 0, 0, 1, 3)


def test_retry_on_result_as_dotted_path() -> None:
    retry = Retry("p", RetryConfig(wait_duration=0, retry_on_result="builtins.callable"), clock=FakeClock())
    assert retry.call(Flaky(len, len, 7)) == 7


# -- waits -------------------------------------------------------------------------------------------


def waits_of(config: RetryConfig, attempts: int, **kwargs: object) -> list[float]:
    slept: list[float] = []
    retry = Retry("w", config, sleep=slept.append, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        retry.call(Flaky(ValueError()))
    assert len(slept) == attempts - 1
    return slept


def test_constant_waits_through_injected_sleep() -> None:
    assert waits_of(RetryConfig(max_attempts=4, wait_duration="250ms"), 4) == [0.25, 0.25, 0.25]


def test_fake_clock_advances_by_exact_constant_waits() -> None:
    clock = FakeClock()
    retry = Retry("c", RetryConfig(max_attempts=5, wait_duration="1.5s"), clock=clock)
    start = clock.now_ns()
    with pytest.raises(ValueError):
        retry.call(Flaky(ValueError()))
    assert clock.now_ns() - start == 4 * 1_500 * MS


def test_exponential_backoff_doubles_and_caps() -> None:
    config = RetryConfig(
        max_attempts=6, wait_duration="1s", enable_exponential_backoff=True, exponential_backoff_multiplier=2,
        exponential_max_wait_duration="5s",
    )
    assert waits_of(config, 6) == [1.0, 2.0, 4.0, 5.0, 5.0]
    clock = FakeClock()
    start = clock.now_ns()
    with pytest.raises(ValueError):
        Retry("e", config, clock=clock).call(Flaky(ValueError()))
    assert clock.now_ns() - start == (1 + 2 + 4 + 5 + 5) * S


def test_exponential_backoff_uncapped_truncates_like_java_long() -> None:
    # Resilience4j: LongStream.iterate(500, n -> (long) (n * 1.5)) in milliseconds.
    retry = Retry("e", RetryConfig(wait_duration="500ms", enable_exponential_backoff=True))
    assert [retry.interval_ns(n) // MS for n in range(1, 7)] == [500, 750, 1125, 1687, 2530, 3795]
    odd = Retry("o", RetryConfig(wait_duration="7ms", enable_exponential_backoff=True, exponential_backoff_multiplier=1.5))
    assert [odd.interval_ns(n) for n in range(1, 5)] == [7 * MS, 10 * MS, 15 * MS, 22 * MS]  # int() every step
    # The wait is taken in whole milliseconds first, as Duration.toMillis() does: 1.9 ms grows as 1 ms.
    sub = Retry("s", RetryConfig(wait_duration="1900us", enable_exponential_backoff=True, exponential_backoff_multiplier=3))
    assert [sub.interval_ns(n) for n in (1, 2, 3)] == [MS, 3 * MS, 9 * MS]
    # Huge attempt numbers stay finite instead of overflowing a float (Java's long saturates).
    assert Retry("h", RetryConfig(wait_duration="1s", enable_exponential_backoff=True,
                                  exponential_backoff_multiplier=10)).interval_ns(10_000) == (2**63 - 1) * MS


def test_max_wait_is_ignored_without_exponential_backoff() -> None:
    retry = Retry("m", RetryConfig(wait_duration="2s", exponential_max_wait_duration="1s"))
    assert retry.interval_ns(3) == 2 * S


def test_randomized_wait_stays_in_resilience4j_bounds_and_is_reproducible() -> None:
    config = RetryConfig(wait_duration="1s", enable_randomized_wait=True, randomized_wait_factor=0.5)
    retry = Retry("r", config, random=random.Random(1234))
    samples = [retry.interval_ns(1) for _ in range(2000)]
    # Java: [i - f*i, i + f*i + 1) in ms.
    assert all(500 * MS <= s < 1_501 * MS for s in samples)
    assert min(samples) < 520 * MS and max(samples) > 1_480 * MS  # the whole range is used
    assert len(set(samples)) > 800  # of the 1001 whole milliseconds in range
    assert all(s % MS == 0 for s in samples)  # whole milliseconds, as Resilience4j's (long) cast
    # The same seed reproduces the same waits, and the formula is exactly R4's (in ms).
    expected_rng = random.Random(1234)
    assert samples[:50] == [int(500 + expected_rng.random() * (1_000 + 1)) * MS for _ in range(50)]
    again = Retry("r2", config, random=random.Random(1234))
    assert [again.interval_ns(1) for _ in range(2000)] == samples


def test_randomized_wait_through_the_fake_clock() -> None:
    clock = FakeClock()
    config = RetryConfig(max_attempts=3, wait_duration="100ms", enable_randomized_wait=True, randomized_wait_factor=0.2)
    retry = Retry("r", config, clock=clock, random=random.Random(9))
    events: list[RetryEvent] = []
    retry.events.on_retry(events.append)
    start = clock.now_ns()
    with pytest.raises(ValueError):
        retry.call(Flaky(ValueError()))
    waits = [e.wait_ns for e in events]
    assert len(waits) == 2 and len(set(waits)) == 2
    assert all(80 * MS <= w < 121 * MS for w in waits)
    assert abs((clock.now_ns() - start) - sum(waits)) <= 2  # float seconds round-trip


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def test_randomized_wait_is_floored_at_one_millisecond() -> None:
    config = RetryConfig(wait_duration="1ms", enable_randomized_wait=True, randomized_wait_factor=1.0)
    assert Retry("f", config, random=FixedRandom(0.0)).interval_ns(1) == MS
    top = Retry("f", config, random=FixedRandom(0.999999)).interval_ns(1)
    assert 2 * MS <= top < 3 * MS


# -- Resilience4j's IntervalFunctionTest, translated -------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        # shouldRejectNonPositiveDuration: of(0), ofExponentialBackoff(100, 1, 0 / -1), ofExponentialRandomBackoff(...)
        {"wait_duration": 0, "enable_randomized_wait": True},
        {"wait_duration": 0, "enable_exponential_backoff": True},
        {"wait_duration": "999us", "enable_exponential_backoff": True, "enable_randomized_wait": True},
        {"wait_duration": "100ms", "enable_exponential_backoff": True, "exponential_backoff_multiplier": 1,
         "exponential_max_wait_duration": 0},
        {"wait_duration": "100ms", "enable_exponential_backoff": True, "enable_randomized_wait": True,
         "exponential_backoff_multiplier": 1, "exponential_max_wait_duration": "500us"},
    ],
)
def test_non_positive_intervals_and_caps_below_one_millisecond_are_rejected(fields: dict) -> None:
    with pytest.raises(ConfigurationError, match="must be at least 1ms"):
        RetryConfig(**fields)


def test_a_constant_wait_of_zero_stays_allowed() -> None:
    # Resilience4j's waitDuration(Duration.ZERO) is accepted; only the interval functions refuse it.
    assert Retry("z", RetryConfig(wait_duration=0)).interval_ns(1) == 0


@pytest.mark.parametrize("millis", [10, 99, 981])
def test_positive_intervals_pass(millis: int) -> None:  # shouldPassPositiveDuration
    for fields in (
        {},
        {"enable_randomized_wait": True},
        {"enable_exponential_backoff": True},
        {"enable_exponential_backoff": True, "enable_randomized_wait": True},
        {"enable_exponential_backoff": True, "exponential_backoff_multiplier": 1,
         "exponential_max_wait_duration": f"{millis}ms"},
    ):
        Retry("p", RetryConfig(wait_duration=f"{millis}ms", **fields)).interval_ns(1)


@pytest.mark.parametrize(
    "fields",
    [{}, {"enable_randomized_wait": True}, {"enable_exponential_backoff": True},
     {"enable_exponential_backoff": True, "enable_randomized_wait": True}],
)
def test_attempt_less_than_one_is_rejected(fields: dict) -> None:  # shouldRejectAttemptLessThenOne
    retry = Retry("a", RetryConfig(**fields))
    for attempt in (0, -1):
        with pytest.raises(ValueError, match="attempt must be >= 1"):
            retry.interval_ns(attempt)
    assert retry.interval_ns(1) > 0 and retry.interval_ns(2) > 0  # shouldPassAttemptGreaterThenZero


def test_generates_randomized_intervals() -> None:
    retry = Retry("r", RetryConfig(wait_duration="100ms", enable_randomized_wait=True, randomized_wait_factor=0.5))
    for attempt in range(1, 50):
        assert 50 * MS <= retry.interval_ns(attempt) <= 150 * MS


def test_generates_exponential_intervals() -> None:
    retry = Retry("e", RetryConfig(wait_duration="100ms", enable_exponential_backoff=True,
                                   exponential_backoff_multiplier=1.5))
    values = [retry.interval_ns(attempt) for attempt in range(1, 50)]
    assert all(b > a for a, b in itertools.pairwise(values))


def test_generates_capped_exponential_intervals() -> None:
    retry = Retry("c", RetryConfig(wait_duration="100ms", enable_exponential_backoff=True,
                                   exponential_backoff_multiplier=2, exponential_max_wait_duration="100s"))
    values = [retry.interval_ns(attempt) for attempt in range(1, 12)]
    assert all(b > a for a, b in itertools.pairwise(values))
    assert retry.interval_ns(12) == retry.interval_ns(13) == 100 * S


@pytest.mark.parametrize("cap", [None, "100s"])
def test_generates_exponential_random_intervals(cap: str | None) -> None:
    retry = Retry("x", RetryConfig(wait_duration="100ms", enable_exponential_backoff=True,
                                   exponential_backoff_multiplier=1.5, enable_randomized_wait=True,
                                   randomized_wait_factor=0.5, exponential_max_wait_duration=cap))
    expected = 100
    for attempt in range(1, 50):
        value = retry.interval_ns(attempt) // MS
        capped = cap is not None and value == 100_000
        assert capped or int(expected * 0.5) - 1 <= value <= int(expected * 1.5) + 1
        expected = int(expected * 1.5)


def test_exponential_random_backoff_randomizes_first_then_caps() -> None:
    config = RetryConfig(
        wait_duration="1s", enable_exponential_backoff=True, exponential_backoff_multiplier=2,
        exponential_max_wait_duration="3s", enable_randomized_wait=True, randomized_wait_factor=0.5,
    )
    # Attempt 3: base 4s, randomized into [2s, 6s + 1ms). Randomizing the capped 3s would give 1.5s.
    assert Retry("x", config, random=FixedRandom(0.0)).interval_ns(3) == 2 * S
    assert Retry("x", config, random=FixedRandom(0.9)).interval_ns(3) == 3 * S
    assert Retry("x", config, random=FixedRandom(0.0)).interval_ns(1) == 500 * MS


@settings(max_examples=150, deadline=None)
@given(
    wait_ms=st.integers(1, 10_000),
    multiplier=st.floats(1, 4),
    factor=st.floats(0, 1),
    cap_ms=st.one_of(st.none(), st.integers(1, 60_000)),
    attempt=st.integers(1, 30),
    draw=st.floats(0, 1, exclude_max=True),
)
def test_interval_bounds_property(
    wait_ms: int, multiplier: float, factor: float, cap_ms: int | None, attempt: int, draw: float
) -> None:
    config = RetryConfig(
        wait_duration=f"{wait_ms}ms", enable_exponential_backoff=True, exponential_backoff_multiplier=multiplier,
        exponential_max_wait_duration=None if cap_ms is None else f"{cap_ms}ms",
        enable_randomized_wait=True, randomized_wait_factor=factor,
    )
    base = Retry("b", RetryConfig(wait_duration=f"{wait_ms}ms", enable_exponential_backoff=True,
                                  exponential_backoff_multiplier=multiplier)).interval_ns(attempt)
    value = Retry("p", config, random=FixedRandom(draw)).interval_ns(attempt)
    base_ms = base // MS
    # Whole milliseconds, truncated like Java's (long); the relative slack covers doubles beyond 2**53 ms.
    low = max(1, int((base_ms - factor * base_ms) * (1 - 1e-12))) * MS
    high = (int((base_ms + factor * base_ms + 1) * (1 + 1e-12)) + 1) * MS
    if cap_ms is not None:
        low, high = min(low, cap_ms * MS), min(high, cap_ms * MS)
    assert low <= value <= high


# -- sleeping: injection and clocks --------------------------------------------------------------------


def test_explicit_sleep_overrides_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", lambda s: pytest.fail("time.sleep must not be called"))
    clock = FakeClock()
    slept: list[float] = []
    retry = Retry("s", RetryConfig(wait_duration="2s"), clock=clock, sleep=slept.append)
    start = clock.now_ns()
    assert retry.call(Flaky(ValueError(), "ok")) == "ok"
    assert slept == [2.0]
    assert clock.now_ns() == start


def test_set_clock_moves_default_sleeps_but_keeps_explicit_ones() -> None:
    old, new = FakeClock(), FakeClock(start_ns=5 * S)
    retry = Retry("c", RetryConfig(wait_duration="1s"), clock=old)
    retry.set_clock(new)
    assert retry.clock is new
    retry.call(Flaky(ValueError(), "ok"))
    assert (old.now_ns(), new.now_ns()) == (1_000_000_000_000, 6 * S)

    slept: list[float] = []
    pinned = Retry("p", RetryConfig(wait_duration="1s"), clock=old, sleep=slept.append)
    pinned.set_clock(new)
    pinned.call(Flaky(ValueError(), "ok"))
    assert slept == [1.0] and new.now_ns() == 6 * S


def test_reset_zeroes_metrics_in_place_and_keeps_listeners() -> None:
    retry, events, _ = recording_retry(RetryConfig(wait_duration=0))
    metrics = retry.metrics
    retry.call(Flaky(ValueError(), "ok"))
    retry.reset()
    assert retry.metrics is metrics
    assert counts(retry) == (0, 0, 0, 0, 0)
    retry.call(Flaky(ValueError(), "ok"))
    assert counts(retry) == (0, 1, 0, 0, 2)
    assert [e.event_type for e in events] == ["RETRY", "SUCCESS", "RETRY", "SUCCESS"]
    assert "number_of_total_calls=2" in repr(retry.metrics)


# -- events ------------------------------------------------------------------------------------------


def test_events_are_not_built_without_listeners(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object, **kwargs: object) -> None:
        raise AssertionError("event built without a listener")

    monkeypatch.setattr(retry_module, "RetryEvent", explode)
    config = RetryConfig(wait_duration=0, retry_on_result=lambda r: r == "bad", ignore_exceptions=(KeyError,))
    retry = Retry("n", config, clock=FakeClock())
    assert retry.call(Flaky(ValueError(), "bad", "ok")) == "ok"
    assert retry.call(Flaky("bad")) == "bad"
    with pytest.raises(KeyError):
        retry.call(Flaky(KeyError()))
    with pytest.raises(ValueError):
        retry.call(Flaky(ValueError()))
    # The same calls with a listener do build events (so the patch above is effective).
    retry.events.on_success(lambda e: None)
    with pytest.raises(AssertionError, match="without a listener"):
        retry.call(Flaky(ValueError(), "ok"))


def test_typed_listeners_get_only_their_type() -> None:
    retry = Retry("t", RetryConfig(wait_duration="3ms", ignore_exceptions=(KeyError,)), clock=FakeClock())
    seen: dict[str, list[RetryEvent]] = {"retry": [], "error": [], "success": [], "ignored": []}
    retry.events.on_retry(seen["retry"].append)
    retry.events.on_error(seen["error"].append)
    retry.events.on_success(seen["success"].append)
    retry.events.on_ignored_error(seen["ignored"].append)
    retry.call(Flaky(ValueError(), "ok"))
    with pytest.raises(ValueError):
        retry.call(Flaky(ValueError()))
    with pytest.raises(KeyError):
        retry.call(Flaky(KeyError()))
    assert {k: [e.event_type for e in v] for k, v in seen.items()} == {
        "retry": ["RETRY", "RETRY", "RETRY"],
        "error": ["ERROR"],
        "success": ["SUCCESS"],
        "ignored": ["IGNORED_ERROR"],
    }
    assert seen["retry"][0].wait_ns == 3 * MS


def test_a_failing_listener_does_not_break_the_call(caplog: pytest.LogCaptureFixture) -> None:
    retry = Retry("l", RetryConfig(wait_duration=0), clock=FakeClock())

    @retry.events.on_retry
    def broken(event: RetryEvent) -> None:
        raise RuntimeError("listener bug")

    assert retry.call(Flaky(ValueError(), "ok")) == "ok"
    assert "listener bug" in caplog.text


# -- async ---------------------------------------------------------------------------------------------


async def test_acall_retries_with_the_fake_clock_and_never_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", lambda s: pytest.fail("time.sleep must not be called"))
    retry, events, clock = recording_retry(RetryConfig(wait_duration="1s", enable_exponential_backoff=True,
                                                       exponential_backoff_multiplier=2))
    start = clock.now_ns()
    fn = AsyncFlaky(ValueError(), ValueError(), "ok")
    assert await retry.acall(fn, 1, k=2) == "ok"
    assert fn.calls == 3 and fn.args[0] == ((1,), {"k": 2})
    assert clock.now_ns() - start == 3 * S
    assert summary(events) == [("RETRY", 1, S), ("RETRY", 2, 2 * S), ("SUCCESS", 2, 0)]
    assert counts(retry) == (0, 1, 0, 0, 3)


async def test_acall_exhaustion_ignore_and_results_match_call() -> None:
    config = RetryConfig(wait_duration=0, ignore_exceptions=(KeyError,), retry_on_result=lambda r: r == "bad",
                         fail_after_max_attempts=True)
    retry, events, _ = recording_retry(config)
    with pytest.raises(ValueError):
        await retry.acall(AsyncFlaky(ValueError()))
    with pytest.raises(KeyError):
        await retry.acall(AsyncFlaky(KeyError()))
    with pytest.raises(MaxRetriesExceeded):
        await retry.acall(AsyncFlaky("bad"))
    assert await retry.acall(AsyncFlaky("ok")) == "ok"
    assert [e.event_type for e in events] == ["RETRY", "RETRY", "ERROR", "IGNORED_ERROR", "RETRY", "RETRY", "ERROR"]
    assert counts(retry) == (1, 0, 1, 2, 3 + 1 + 3 + 1)


async def test_acall_does_not_retry_cancellation() -> None:
    retry, events, _ = recording_retry(RetryConfig(wait_duration=0, retry_exceptions=(BaseException,)))
    fn = AsyncFlaky(asyncio.CancelledError(), "never")
    with pytest.raises(asyncio.CancelledError):
        await retry.acall(fn)
    assert fn.calls == 1 and events == [] and counts(retry) == (0, 0, 0, 0, 0)


async def test_acall_waits_let_other_tasks_run() -> None:
    # The retry can only finish if the loop runs another task while it waits.
    gate = asyncio.Event()
    waited: list[float] = []

    async def gated_sleep(seconds: float) -> None:
        waited.append(seconds)
        await gate.wait()
        gate.clear()

    async def opener() -> None:
        for _ in range(2):
            await asyncio.sleep(0)
            gate.set()
            while gate.is_set():
                await asyncio.sleep(0)

    retry = Retry("g", RetryConfig(wait_duration="40ms"), asleep=gated_sleep)
    result, _ = await asyncio.wait_for(
        asyncio.gather(retry.acall(AsyncFlaky(ValueError(), ValueError(), "ok")), opener()), timeout=5
    )
    assert result == "ok" and waited == [0.04, 0.04]


async def test_acall_with_real_clock_keeps_the_loop_responsive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", lambda s: pytest.fail("time.sleep must not be called"))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.002)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    loop = asyncio.get_running_loop()
    started = loop.time()
    retry = Retry("real", RetryConfig(wait_duration="25ms"))
    assert await retry.acall(AsyncFlaky(ValueError(), ValueError(), "ok")) == "ok"
    elapsed = loop.time() - started
    task.cancel()
    assert elapsed >= 0.049
    assert ticks >= 5


def test_decorate_sync_and_async() -> None:
    retry = Retry("d", RetryConfig(wait_duration=0), clock=FakeClock())
    fn = Flaky(ValueError(), 42)

    def original(x: int, *, y: int) -> int:
        """Doc."""
        return fn(x, y=y)  # type: ignore[return-value]

    wrapped = retry.decorate(original)
    assert wrapped.__name__ == "original" and wrapped.__doc__ == "Doc." and wrapped.__wrapped__ is original  # type: ignore[attr-defined]
    assert not inspect.iscoroutinefunction(wrapped)
    assert wrapped(1, y=2) == 42
    assert fn.args == [((1,), {"y": 2})] * 2

    afn = AsyncFlaky(ValueError(), "async-ok")

    async def aoriginal(x: int) -> str:
        return await afn(x)  # type: ignore[no-any-return]

    awrapped = retry.decorate(aoriginal)
    assert inspect.iscoroutinefunction(awrapped)
    assert asyncio.run(awrapped(5)) == "async-ok"
    assert afn.calls == 2


# -- threads -------------------------------------------------------------------------------------------


def test_metrics_are_exact_under_threads(fast_switching: None) -> None:
    threads, per_thread, trials = 8, 200, 3
    for _ in range(trials):
        retry = Retry("t", RetryConfig(wait_duration=0), sleep=lambda s: None)
        barrier = threading.Barrier(threads)

        def worker(retry: Retry = retry, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            for i in range(per_thread):
                if i % 2:
                    retry.call(Flaky(ValueError(), "ok"))
                else:
                    retry.call(Flaky("ok"))

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        half = threads * per_thread // 2
        assert counts(retry) == (half, half, 0, 0, half + 2 * half)


# -- predicates and a custom interval function (issue 8) ----------------------------------------------


class HTTPError(Exception):
    def __init__(self, status: int, retry_after_s: int | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.retry_after_s = retry_after_s


def test_retry_on_exception_predicate_retries_only_what_it_accepts() -> None:
    config = RetryConfig(max_attempts=3, wait_duration=0, retry_on_exception=lambda e: getattr(e, "status", 0) == 503)
    unavailable = Flaky(HTTPError(503), HTTPError(503), "ok")
    assert Retry("r", config).call(unavailable) == "ok" and unavailable.calls == 3
    not_found = Flaky(HTTPError(404), "ok")
    with pytest.raises(HTTPError):
        Retry("r", config).call(not_found)
    assert not_found.calls == 1
    with pytest.raises(KeyError):  # a predicate given: other exceptions are no longer retried by default
        Retry("r", config).call(Flaky(KeyError("x"), "ok"))


def test_retry_on_exception_is_or_ed_with_retry_exceptions_and_ignore_wins() -> None:
    config = RetryConfig(
        max_attempts=2, wait_duration=0, retry_exceptions=[KeyError],
        retry_on_exception=lambda e: isinstance(e, HTTPError), ignore_exceptions=[LookupError],
    )
    assert Retry("r", config).call(Flaky(HTTPError(500), "ok")) == "ok"
    with pytest.raises(KeyError):  # KeyError is a LookupError: ignore wins over both
        Retry("r", config).call(Flaky(KeyError("x"), "ok"))


def test_interval_function_of_the_attempt() -> None:
    from datetime import timedelta

    config = RetryConfig(max_attempts=4, interval_function=lambda attempt: timedelta(milliseconds=100 * attempt**2))
    assert waits_of(config, 4) == [0.1, 0.4, 0.9]
    assert Retry("f", config).interval_ns(3) == 900 * MS


def test_interval_function_of_the_attempt_and_the_outcome_waits_what_the_upstream_said() -> None:
    clock = FakeClock()
    config = RetryConfig(max_attempts=3, interval_function="tests.views.upstream_retry_after")
    retry = Retry("u", config, clock=clock)
    events: list[RetryEvent] = []
    retry.events.on_retry(events.append)
    start = clock.now_ns()
    assert retry.call(Flaky(HTTPError(429, retry_after_s=7), HTTPError(500), "ok")) == "ok"
    assert [e.wait_ns for e in events] == [7 * S, 200 * MS]  # the 429's Retry-After, then 100 ms x attempt 2
    assert clock.now_ns() - start == 7 * S + 200 * MS


def test_interval_function_must_return_a_duration_with_a_unit() -> None:
    retry = Retry("n", RetryConfig(max_attempts=2, interval_function=lambda attempt: 500))
    with pytest.raises(ValueError, match=r"interval_function returned 500 for attempt 1.*'500ms'"):
        retry.call(Flaky(ValueError("x"), "ok"))


def test_interval_function_with_built_in_backoff_or_unimportable_is_a_config_error() -> None:
    with pytest.raises(ConfigurationError, match=r"interval_function.*cannot be combined with enable_exponential"):
        RetryConfig(interval_function="tests.views.upstream_retry_after", enable_exponential_backoff=True)
    with pytest.raises(ConfigurationError, match=r"interval_function.*cannot import 'tests.views.nope'"):
        RetryConfig(interval_function="tests.views.nope")
    with pytest.raises(ConfigurationError, match=r"retry_on_exception.*must be callable"):
        RetryConfig(retry_on_exception=3)
