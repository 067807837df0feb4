"""Exceptions carry their instance and a state-derived wait; configs report every bad field at once."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from django_ratelimit_r4 import exceptions as public
from django_ratelimit_r4.core import config as config_module
from django_ratelimit_r4.core.config import Validator, field_names, import_string
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


# -- config.Validator --------------------------------------------------------------------------------


class Color(enum.Enum):
    RED = 1
    BLUE = 2


def predicate(value: object) -> bool:
    return bool(value)


NOT_CALLABLE = 42


@dataclass(frozen=True)
class DemoConfig:
    wait: Any = "1s"
    optional_wait: Any = None
    count: Any = 1
    ratio: Any = 0.5
    flag: Any = True
    mode: Any = "fast"
    errors: Any = ()
    check: Any = None
    _private: int = 0

    def __post_init__(self) -> None:
        v = Validator(self)
        v.duration("wait", min_ns=1_000_000)
        v.duration("optional_wait", allow_none=True)
        v.integer("count", minimum=1, maximum=10)
        v.number("ratio", gt=0, le=1)
        v.boolean("flag")
        v.choice("mode", ("FAST", "SLOW", "RED"))
        v.exception_classes("errors")
        v.callable_or_path("check")
        v.done()


def field_errors(**kwargs: Any) -> dict[str, str]:
    with pytest.raises(ConfigurationError) as info:
        DemoConfig(**kwargs)
    assert info.value.config_name == "DemoConfig"
    return {e.field: e.message for e in info.value.errors}


def test_validator_collects_every_error_at_once() -> None:
    errors = field_errors(wait=500, count=0, ratio=2, flag="yes")
    assert list(errors) == ["wait", "count", "ratio", "flag"]
    assert "'500ms'" in errors["wait"]
    assert errors["count"] == "must be >= 1, got 0"
    assert errors["ratio"] == "must be <= 1, got 2"
    assert errors["flag"] == "must be True or False, got 'yes'"


def test_validator_normalises_valid_values() -> None:
    config = DemoConfig(wait="1.5s", optional_wait="2ms", ratio=1, mode="slow", errors=("builtins.KeyError", ValueError),
                        check=f"{__name__}.predicate")
    assert config.wait == 1_500_000_000 and config.optional_wait == 2_000_000
    assert config.ratio == 1.0 and isinstance(config.ratio, float)
    assert config.mode == "SLOW"
    assert config.errors == (KeyError, ValueError)
    assert config.check is predicate
    assert dataclasses.replace(config, count=2).wait == 1_500_000_000  # Nanos re-validate cleanly
    assert DemoConfig(mode=Color.RED).mode == "RED"  # enum members by name
    assert DemoConfig(errors=OSError).errors == (OSError,)
    assert DemoConfig(errors="builtins.OSError").errors == (OSError,)
    assert DemoConfig(check=len).check is len


def test_duration_errors_carry_a_hint_and_bounds() -> None:
    with pytest.raises(ConfigurationError) as info:
        DemoConfig(wait="fast")
    (error,) = info.value.errors
    assert error.field == "wait" and "'200ms'" in error.message and "timedelta" in (error.hint or "")
    assert field_errors(wait="999us") == {"wait": "must be at least 1ms, got 999us"}
    assert field_errors(optional_wait="-1s") == {"optional_wait": "duration must not be negative, got '-1s'"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"count": True}, "must be an integer, got True"),
        ({"count": 1.0}, "must be an integer, got 1.0"),
        ({"count": 11}, "must be <= 10, got 11"),
        ({"ratio": 0}, "must be > 0, got 0"),
        ({"ratio": "0.5"}, "must be a number, got '0.5'"),
        ({"ratio": False}, "must be a number, got False"),
        ({"flag": 1}, "must be True or False, got 1"),
        ({"mode": "medium"}, "must be one of FAST, SLOW, RED, got 'medium'"),
        ({"mode": 3}, "must be one of FAST, SLOW, RED, got 3"),
        ({"errors": 5}, "must be a list of exception classes or dotted paths, got 5"),
        ({"errors": [int]}, "<class 'int'> is not an exception class"),
        ({"check": NOT_CALLABLE}, "must be callable or a dotted path to a callable, got 42"),
        ({"check": f"{__name__}.NOT_CALLABLE"}, "must be callable or a dotted path to a callable, got 42"),
    ],
)
def test_field_error_messages(kwargs: dict[str, Any], message: str) -> None:
    assert field_errors(**kwargs) == {next(iter(kwargs)): message}


def test_unimportable_paths_are_reported_per_item_with_a_hint() -> None:
    with pytest.raises(ConfigurationError) as info:
        DemoConfig(errors=["no_such_module_xyz.Error", "builtins.NoSuchError", KeyError, "nodots"],
                   check="builtins.no_such_callable")
    errors = info.value.errors
    assert [e.field for e in errors] == ["errors", "errors", "errors", "check"]
    assert "cannot import 'no_such_module_xyz.Error'" in errors[0].message
    assert "has no attribute 'NoSuchError'" in errors[1].message
    assert "'nodots' is not a dotted path" in errors[2].message
    assert errors[0].hint and "dotted path" in errors[0].hint
    assert "cannot import 'builtins.no_such_callable'" in errors[3].message


def test_check_and_done() -> None:
    v = Validator(SimpleNamespace(x=1))
    v.check("x", True, "never")
    v.done()  # no errors: no exception
    v.check("x", False, "x is wrong", "set it right")
    with pytest.raises(ConfigurationError) as info:
        v.done()
    assert info.value.config_name == "SimpleNamespace"
    assert (info.value.errors[0].message, info.value.errors[0].hint) == ("x is wrong", "set it right")


def test_import_string() -> None:
    assert import_string("collections.OrderedDict").__name__ == "OrderedDict"
    with pytest.raises(ImportError, match="not a dotted path"):
        import_string("OrderedDict")
    with pytest.raises(ImportError, match="has no attribute 'Nope'"):
        import_string("collections.Nope")
    with pytest.raises(ImportError):
        import_string("no_such_module_xyz.Thing")


def test_field_names_skip_private_fields() -> None:
    assert field_names(DemoConfig) == ("wait", "optional_wait", "count", "ratio", "flag", "mode", "errors", "check")
    assert config_module.field_names is field_names


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
