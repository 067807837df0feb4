"""parse_duration / format_duration: units, decimals, timedelta, and refusing ambiguous input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.core.durations import DurationError, Nanos, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("500ns", 500),
        ("250us", 250_000),
        ("250µs", 250_000),
        ("200ms", 200_000_000),
        ("1s", 1_000_000_000),
        ("5m", 300_000_000_000),
        ("1h", 3_600_000_000_000),
        ("1d", 86_400_000_000_000),
        ("0s", 0),
        ("0ms", 0),
        (" 2 ms ", 2_000_000),
        ("007s", 7_000_000_000),
    ],
)
def test_every_unit(text: str, nanos: int) -> None:
    value = parse_duration(text)
    assert value == nanos
    assert type(value) is Nanos


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("1.5s", 1_500_000_000),
        ("0.5ms", 500_000),
        ("2.25us", 2_250),
        ("0.3s", 300_000_000),  # exact, not a float's neighbour
        ("0.1h", 360_000_000_000),
        ("1.000000001s", 1_000_000_001),
        ("9007199.254740993s", 9_007_199_254_740_993),  # beyond a float's 53-bit mantissa
        ("0.0s", 0),
        ("1.5ns", 2),  # rounded half to even
        ("2.5ns", 2),
    ],
)
def test_decimals(text: str, nanos: int) -> None:
    assert parse_duration(text) == nanos


def test_timedelta() -> None:
    assert parse_duration(timedelta(seconds=1)) == 1_000_000_000
    assert parse_duration(timedelta(milliseconds=250)) == 250_000_000
    assert parse_duration(timedelta(microseconds=1)) == 1_000
    assert parse_duration(timedelta(days=2, hours=1, microseconds=5)) == (2 * 86_400 + 3_600) * 10**9 + 5_000
    assert parse_duration(timedelta(0)) == 0
    assert type(parse_duration(timedelta(seconds=1))) is Nanos


@pytest.mark.parametrize("zero", [0, 0.0, "0s", "0ns", timedelta(0)])
def test_zero_is_allowed_without_a_unit(zero: object) -> None:
    assert parse_duration(zero) == 0


@pytest.mark.parametrize("bare", [500, 1, 2.5, 1000])
def test_bare_non_zero_numbers_are_refused_with_a_unit_suggestion(bare: float) -> None:
    with pytest.raises(DurationError) as info:
        parse_duration(bare)
    message = str(info.value)
    assert "no unit" in message
    assert f"'{bare}ms'" in message and f"'{bare}s'" in message


@pytest.mark.parametrize("bare", ["500", " 60 ", "1.5"])
def test_bare_numeric_strings_are_refused_with_a_unit_suggestion(bare: str) -> None:
    with pytest.raises(DurationError, match="has no unit") as info:
        parse_duration(bare)
    assert f"'{bare.strip()}ms'" in str(info.value)


@pytest.mark.parametrize("bad", ["", "s", "1 sec", "1S", "1M", "abc", "1.s", ".5s", "1e3ms", "1s 2ms", "1,5s", "ms5"])
def test_malformed_strings(bad: str) -> None:
    with pytest.raises(DurationError, match="is not a duration; use a number and a unit"):
        parse_duration(bad)


@pytest.mark.parametrize("negative", ["-1s", " -200ms", "-500", -5, -0.5, timedelta(seconds=-1), Nanos(-1)])
def test_negative_durations_are_refused(negative: object) -> None:
    with pytest.raises(DurationError, match="must not be negative"):
        parse_duration(negative)


@pytest.mark.parametrize("wrong", [True, False, None, [1], object()])
def test_other_types_are_refused(wrong: object) -> None:
    with pytest.raises(DurationError, match="expected a"):
        parse_duration(wrong)


def test_duration_error_is_a_value_error() -> None:
    assert issubclass(DurationError, ValueError)


def test_nanos_pass_through_unchanged() -> None:
    value = Nanos(500)  # a bare 500 would be refused; Nanos says it is already nanoseconds
    assert parse_duration(value) is value
    assert parse_duration(Nanos(0)) == 0


@pytest.mark.parametrize(
    ("nanos", "text"),
    [
        (0, "0s"),
        (1, "1ns"),
        (1_500, "1500ns"),
        (2_000, "2us"),
        (1_000_000, "1ms"),
        (1_500_000_000, "1500ms"),
        (1_000_000_000, "1s"),
        (90_000_000_000, "90s"),
        (60_000_000_000, "1m"),
        (7_200_000_000_000, "2h"),
        (86_400_000_000_000, "1d"),
        (Nanos(5_000_000), "5ms"),
    ],
)
def test_format_duration(nanos: int, text: str) -> None:
    assert format_duration(nanos) == text


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**18))
def test_format_then_parse_round_trips(nanos: int) -> None:
    assert parse_duration(format_duration(nanos)) == nanos
