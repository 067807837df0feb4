"""Parse durations written in settings: ``timedelta`` or a string with a unit."""

from __future__ import annotations

import re
from datetime import timedelta
from fractions import Fraction

__all__ = ["DURATION_HINT", "MAX_PERIOD_NS", "DurationError", "Nanos", "format_duration", "parse_duration"]

#: How to write a duration: the hint of every duration error (configs and settings alike).
DURATION_HINT = "Write durations as timedelta or a string with a unit: '500ms', '1s', '5m'."

#: Longest period, wait or open time a config may set: 366 days. Longer is a mistake (a typo'd unit, an
#: "infinite" sentinel) that would otherwise reach clients as a Retry-After of dozens of digits.
MAX_PERIOD_NS = 366 * 86_400_000_000_000

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
    "d": 86_400_000_000_000,
}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|m|h|d)\s*$")


class Nanos(int):
    """An integer already known to be nanoseconds; :func:`parse_duration` passes it through.

    Configs store durations as ``Nanos`` so ``dataclasses.replace(config, ...)`` re-validates cleanly.
    """

    __slots__ = ()


class DurationError(ValueError):
    """A duration could not be parsed. The message says what form is expected."""


def parse_duration(value: object) -> Nanos:
    """Return ``value`` as integer nanoseconds.

    Accepts a :class:`datetime.timedelta`, a string with a unit (``"500ns"``, ``"250us"``,
    ``"200ms"``, ``"1s"``, ``"5m"``, ``"1h"``, ``"1d"``; decimals allowed, e.g. ``"1.5s"``), or the
    number ``0``. Any other bare number is refused: ``500`` could mean nanoseconds (Resilience4j's
    ``limitRefreshPeriod`` default) or milliseconds, and guessing wrong is silent.
    """
    if isinstance(value, Nanos):
        if value < 0:
            raise DurationError(f"duration must not be negative, got {int(value)}ns")
        return value
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise DurationError(f"duration must not be negative, got {value!r}")
        return Nanos((value.days * 86_400 + value.seconds) * 1_000_000_000 + value.microseconds * 1_000)
    if isinstance(value, bool):
        raise DurationError(f"expected a duration such as '1s', got {value!r}")
    if isinstance(value, (int, float)):
        if value == 0:
            return Nanos(0)
        if value < 0:
            raise DurationError(f"duration must not be negative, got {value!r}")
        raise DurationError(
            f"bare number {value!r} has no unit; write it with one, e.g. '{value}ms' or '{value}s'"
        )
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match is None:
            stripped = value.strip()
            if stripped.startswith("-") and _DURATION_RE.match(stripped[1:]):
                raise DurationError(f"duration must not be negative, got '{value}'")
            if stripped.lstrip("-").replace(".", "", 1).isdigit():
                if stripped.startswith("-"):
                    raise DurationError(f"duration must not be negative, got '{value}'")
                raise DurationError(
                    f"'{value}' has no unit; write it with one, e.g. '{stripped}ms' or '{stripped}s'"
                )
            raise DurationError(
                f"'{value}' is not a duration; use a number and a unit: ns, us, ms, s, m, h or d (e.g. '200ms')"
            )
        number, unit = match.groups()
        # Fraction keeps decimals exact ("0.3s" is 300000000ns, not a float's neighbour of it).
        return Nanos(round(Fraction(number) * _UNITS_NS[unit]))
    raise DurationError(f"expected a timedelta or a string such as '1s', got {type(value).__name__}")


def format_duration(nanos: int) -> str:
    """Render integer nanoseconds with the largest unit that keeps it whole (``"1s"``, ``"500ns"``)."""
    if nanos == 0:
        return "0s"
    for unit in ("d", "h", "m", "s", "ms", "us"):
        size = _UNITS_NS[unit]
        if nanos % size == 0:
            return f"{nanos // size}{unit}"
    return f"{nanos}ns"
