"""core/config.py: the value rules, Validator (which applies them and collects every bad field at once),
import_string and field_names."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from django_ratelimit_r4.core import config as config_module
from django_ratelimit_r4.core.config import (
    InvalidValue,
    Validator,
    boolean_value,
    callable_value,
    duration_value,
    field_names,
    import_string,
    integer_value,
    positive_duration_value,
)
from django_ratelimit_r4.core.durations import DURATION_HINT
from django_ratelimit_r4.core.exceptions import ConfigurationError


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
        ({"ratio": 10**400}, "must be a number, got an integer too large for a float (1329 bits)"),
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


# ------------------------------------------------------------------ the rules, shared with the settings checks


@pytest.mark.parametrize(
    ("rule", "value", "message", "hint"),
    [
        (duration_value, 500, "bare number 500 has no unit; write it with one, e.g. '500ms' or '500s'", DURATION_HINT),
        (lambda v: duration_value(v, min_ns=1_000_000), "1us", "must be at least 1ms, got 1us", None),
        (positive_duration_value, "0s", "must be longer than 0s, got 0s", DURATION_HINT),
        (
            lambda v: positive_duration_value(v, between=(1_000_000, 10**9), hint="why"),
            "2s",
            "must be between 1ms and 1s, got 2s",
            "why",
        ),
        (integer_value, True, "must be an integer, got True", None),
        (lambda v: integer_value(v, minimum=1), 0, "must be >= 1, got 0", None),
        (boolean_value, "yes", "must be True or False, got 'yes'", None),
        (callable_value, NOT_CALLABLE, "must be callable or a dotted path to a callable, got 42", None),
    ],
)
def test_each_rule_raises_one_invalid_value_with_message_and_hint(rule, value, message, hint) -> None:
    with pytest.raises(InvalidValue) as info:
        rule(value)
    assert info.value.message == message and str(info.value) == message
    if hint is not None:
        assert info.value.hint == hint
    assert isinstance(info.value, ValueError)


def test_the_validator_records_exactly_what_the_rules_say() -> None:
    # One source: a config field and a settings option with the same bad value get the same message and hint.
    @dataclass(frozen=True)
    class Cfg:
        wait: Any = 500
        count: Any = "3"
        flag: Any = "yes"

        def __post_init__(self) -> None:
            v = Validator(self)
            v.duration("wait")
            v.integer("count", minimum=1)
            v.boolean("flag")
            v.done()

    with pytest.raises(ConfigurationError) as info:
        Cfg()
    got = {e.field: (e.message, e.hint) for e in info.value.errors}
    for field, rule, value in (("wait", duration_value, 500), ("count", integer_value, "3"), ("flag", boolean_value, "yes")):
        with pytest.raises(InvalidValue) as rule_info:
            rule(value)
        assert got[field] == (rule_info.value.message, rule_info.value.hint)
