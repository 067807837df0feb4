"""parse_rate / format_rate: django-ratelimit's and DRF's rate strings, and refusing what they would misread."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_ratelimit_r4.core.rates import RateError, format_rate, parse_rate

S = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5/s", (5, S)),
        ("5/m", (5, 60 * S)),
        ("5/h", (5, 3_600 * S)),
        ("5/d", (5, 86_400 * S)),
        ("100/5m", (100, 300 * S)),
        ("10/30s", (10, 30 * S)),
        ("1/2d", (1, 2 * 86_400 * S)),
        (" 7 / 2 h ", (7, 7_200 * S)),
        ("5/M", (5, 60 * S)),  # django-ratelimit lower-cases the unit
        # DRF's long forms (DRF reads only the first letter)
        ("5/sec", (5, S)),
        ("5/second", (5, S)),
        ("5/seconds", (5, S)),
        ("3/min", (3, 60 * S)),
        ("3/minute", (3, 60 * S)),
        ("3/minutes", (3, 60 * S)),
        ("60/hour", (60, 3_600 * S)),
        ("60/hr", (60, 3_600 * S)),
        ("1000/day", (1000, 86_400 * S)),
        ("1000/days", (1000, 86_400 * S)),
        ("1000/Day", (1000, 86_400 * S)),
    ],
)
def test_accepted_spellings(text: str, expected: tuple[int, int]) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("5/ms", "unknown unit 'ms'"),  # DRF would read this as 5 per *minute*
        ("5/mo", "unknown unit"),
        ("5 per minute", "not a rate"),
        ("5", "not a rate"),
        ("/m", "not a rate"),
        ("5/", "not a rate"),
        ("-5/m", "not a rate"),
        ("5.5/m", "not a rate"),
        ("0/m", "at least 1"),
        ("5/0m", "multiplier must be at least 1"),
        (5, "must be a string"),
        (None, "must be a string"),
        ((5, 60), "must be a string"),
    ],
)
def test_refused(value: object, match: str) -> None:
    with pytest.raises(RateError, match=match) as info:
        parse_rate(value)
    assert isinstance(info.value, ValueError)
    assert "'5/m'" in str(info.value)  # every message shows the right spelling


def test_format_rate() -> None:
    assert format_rate(5, 60 * S) == "5/m"
    assert format_rate(100, 300 * S) == "100/5m"
    assert format_rate(1, 90 * S) == "1/90s"
    assert format_rate(2, 2 * 86_400 * S) == "2/2d"
    with pytest.raises(ValueError, match="whole number of seconds"):
        format_rate(1, S // 2)


@given(st.integers(1, 10**9), st.integers(1, 10**6), st.sampled_from("smhd"))
def test_format_round_trips(limit: int, times: int, unit: str) -> None:
    parsed = parse_rate(f"{limit}/{times}{unit}")
    assert parse_rate(format_rate(*parsed)) == parsed
