"""Exceptions carry their instance and a state-derived wait (config validation: test_config.py)."""

from __future__ import annotations

import enum
from types import SimpleNamespace

import pytest

from django_ratelimit_r4 import exceptions as public
from django_ratelimit_r4.core.exceptions import (
    BulkheadFull,
    CallNotPermitted,
    ConfigurationError,
    FieldError,
    IllegalStateTransition,
    MaxRetriesExceeded,
    RequestNotPermitted,
    ResilienceError,
    TimeLimitExceeded,
    retry_after_seconds,
)

S = 1_000_000_000


# -- exceptions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait_ns", "seconds"),
    [(-5, 1), (0, 1), (1, 1), (S - 1, 1), (S, 1), (S + 1, 2), (59 * S + 1, 60), (60 * S, 60)],
)
def test_retry_after_rounds_up_and_is_never_zero(wait_ns: int, seconds: int) -> None:
    assert retry_after_seconds(wait_ns) == seconds


def test_rejections_carry_instance_name_and_wait() -> None:
    rl, bh, cb = SimpleNamespace(name="rl"), SimpleNamespace(name="bh"), SimpleNamespace(name="cb")
    rnp = RequestNotPermitted(rl, wait_ns=2 * S + 1)  # type: ignore[arg-type]
    assert (rnp.rate_limiter, rnp.name, rnp.wait_ns, rnp.retry_after) == (rl, "rl", 2 * S + 1, 3)
    assert str(rnp) == "RateLimiter 'rl' does not permit further calls"
    full = BulkheadFull(bh)  # type: ignore[arg-type]
    assert (full.bulkhead, full.name, full.wait_ns, full.retry_after) == (bh, "bh", 0, 1)
    assert str(full) == "Bulkhead 'bh' is full and does not permit further calls"

    class State(enum.Enum):
        OPEN = 1

    cnp = CallNotPermitted(cb, State.OPEN, wait_ns=30 * S)  # type: ignore[arg-type]
    assert (cnp.circuit_breaker, cnp.name, cnp.state, cnp.retry_after) == (cb, "cb", State.OPEN, 30)
    assert str(cnp) == "CircuitBreaker 'cb' is OPEN and does not permit further calls"
    assert "is FORCED_OPEN" in str(CallNotPermitted(cb, "FORCED_OPEN"))  # type: ignore[arg-type]


def test_retry_and_time_limiter_exceptions() -> None:
    retry, limiter = SimpleNamespace(name="r"), SimpleNamespace(name="t")
    exhausted = MaxRetriesExceeded(retry, 3)  # type: ignore[arg-type]
    assert (exhausted.retry, exhausted.name, exhausted.attempts) == (retry, "r", 3)
    assert str(exhausted) == "Retry 'r' has exhausted all attempts (3)"
    timeout = TimeLimitExceeded(limiter)  # type: ignore[arg-type]
    assert (timeout.time_limiter, timeout.name) == (limiter, "t")
    assert isinstance(timeout, TimeoutError)
    assert str(timeout) == "TimeLimiter 't' recorded a timeout exception."
    with pytest.raises(TimeoutError):
        raise timeout


def test_illegal_state_transition_names_both_states() -> None:
    class State(enum.Enum):
        CLOSED = 0
        HALF_OPEN = 2

    error = IllegalStateTransition("cb", State.CLOSED, State.HALF_OPEN)
    assert (error.name, error.from_state, error.to_state) == ("cb", State.CLOSED, State.HALF_OPEN)
    assert str(error) == "CircuitBreaker 'cb' tried an illegal state transition from CLOSED to HALF_OPEN"


def test_hierarchy_and_public_reexports() -> None:
    for cls in (RequestNotPermitted, BulkheadFull, CallNotPermitted, MaxRetriesExceeded, TimeLimitExceeded,
                IllegalStateTransition):
        assert issubclass(cls, ResilienceError)
        assert getattr(public, cls.__name__) is cls
    assert issubclass(ConfigurationError, ValueError) and not issubclass(ConfigurationError, ResilienceError)
    assert public.ConfigurationError is ConfigurationError


def test_configuration_error_lists_every_field() -> None:
    errors = [FieldError("a", "must be >= 1, got 0"), FieldError("b", "bad", hint="fix it")]
    error = ConfigurationError("DemoConfig", errors)
    assert error.config_name == "DemoConfig" and error.errors is errors
    assert str(error) == "invalid DemoConfig: a: must be >= 1, got 0; b: bad"
    assert repr(errors[1]) == "FieldError('b', 'bad')" and errors[1].hint == "fix it"


def test_rejections_survive_pickling_without_their_live_instance() -> None:
    """Task queues and multiprocessing pickle exceptions; the instance (locks) must not break that."""
    import pickle

    from django_ratelimit_r4.core.bulkhead import Bulkhead
    from django_ratelimit_r4.core.circuitbreaker import CircuitBreaker, State
    from django_ratelimit_r4.core.exceptions import BulkheadFull, CallNotPermitted, RequestNotPermitted
    from django_ratelimit_r4.core.ratelimiter import RateLimiter

    for exc in (
        RequestNotPermitted(RateLimiter("api"), 1_500_000_000),
        BulkheadFull(Bulkhead("acquirer")),
        CallNotPermitted(CircuitBreaker("acquirer"), State.OPEN, 2_000_000_000),
    ):
        copy = pickle.loads(pickle.dumps(exc))
        assert type(copy) is type(exc)
        assert (copy.name, copy.wait_ns, copy.retry_after, str(copy)) == (exc.name, exc.wait_ns, exc.retry_after, str(exc))


def test_a_rejection_knows_its_key() -> None:
    """``RequestNotPermitted(..., key=...)``: a per-client rejection carries its key (for logs), pickled too."""
    import pickle

    from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig
    from django_ratelimit_r4.keyed import KeyedRateLimiter

    assert RequestNotPermitted(SimpleNamespace(name="rl"), 1).key is None  # type: ignore[arg-type]
    exc = RequestNotPermitted(RateLimiter("api"), 1_000, key="ip:203.0.113.7")
    assert exc.key == "ip:203.0.113.7"
    assert pickle.loads(pickle.dumps(exc)).key == "ip:203.0.113.7"
    store = KeyedRateLimiter("per_ip", RateLimiterConfig(limit_for_period=1, limit_refresh_period="1h"))
    store.acquire_or_raise("k")
    with pytest.raises(RequestNotPermitted) as info:
        store.acquire_or_raise("k")
    assert info.value.key == "k" and info.value.wait_ns > 0
