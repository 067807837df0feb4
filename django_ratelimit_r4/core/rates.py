"""Parse rate shorthands: ``"5/m"``, ``"100/5m"``, DRF's ``"3/min"`` and ``"1000/day"``.

One parser for every place a rate is written (``"rate"`` in ``RATELIMIT_R4``, DRF's
``DEFAULT_THROTTLE_RATES``), so they cannot disagree. The syntax is django-ratelimit's
(``count/[multiplier]unit``) and DRF's (``count/unit`` where DRF reads only the unit's first letter).
"""

from __future__ import annotations

import re

__all__ = ["RATE_UNITS_NS", "RateError", "format_rate", "parse_rate"]

_SECOND = 1_000_000_000

#: Nanoseconds of each rate unit.
RATE_UNITS_NS: dict[str, int] = {"s": _SECOND, "m": 60 * _SECOND, "h": 3_600 * _SECOND, "d": 86_400 * _SECOND}

# Every spelling DRF and django-ratelimit users write. DRF reads only the first letter, so it takes
# "5/ms" as five per *minute*; we refuse words that are not one of these rather than guess.
_UNIT_WORDS: dict[str, str] = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), "s"),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), "m"),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), "h"),
    **dict.fromkeys(("d", "day", "days"), "d"),
}
_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([A-Za-z]+)\s*$")
_HINT = "write it as '<count>/<unit>' or '<count>/<n><unit>' with unit s, m, h or d, e.g. '5/m', '100/5m', '1000/day'"


class RateError(ValueError):
    """A rate string could not be parsed. The message says what form is expected."""


def parse_rate(text: object) -> tuple[int, int]:
    """Return ``(limit, period_ns)`` for a rate such as ``"5/m"``: 5 permits per 60 s.

    Accepts ``"<count>/<unit>"`` and ``"<count>/<n><unit>"`` (``"100/5m"``: 100 per 5 minutes), the unit being
    ``s``, ``m``, ``h`` or ``d`` or a long form DRF users write (``sec``, ``second(s)``, ``min``, ``minute(s)``,
    ``hour(s)``, ``day(s)``), in any case. Count and multiplier must be at least 1. Raises :class:`RateError`
    (a ``ValueError``) for anything else, including ``"5/ms"``, which DRF would silently read as per minute.
    """
    if not isinstance(text, str):
        raise RateError(f"a rate must be a string such as '5/m', got {text!r}; {_HINT}")
    match = _RATE_RE.match(text)
    if match is None:
        raise RateError(f"{text!r} is not a rate; {_HINT}")
    count, multiplier, word = match.groups()
    unit = _UNIT_WORDS.get(word.lower())
    if unit is None:
        raise RateError(f"{text!r} has an unknown unit {word!r}; {_HINT}")
    limit = int(count)
    if limit < 1:
        raise RateError(f"{text!r} allows no call at all; the count must be at least 1: {_HINT}")
    times = int(multiplier) if multiplier else 1
    if times < 1:
        raise RateError(f"{text!r} has a period of 0; the multiplier must be at least 1: {_HINT}")
    return limit, times * RATE_UNITS_NS[unit]


def format_rate(limit: int, period_ns: int) -> str:
    """The shortest rate string for ``(limit, period_ns)``: ``(5, 60 s)`` -> ``"5/m"``, ``(100, 300 s)`` -> ``"100/5m"``.

    Raises ``ValueError`` when the period is not a whole number of seconds (no rate string can say it).
    """
    for unit in ("d", "h", "m", "s"):
        size = RATE_UNITS_NS[unit]
        if period_ns % size == 0:
            times = period_ns // size
            return f"{limit}/{unit}" if times == 1 else f"{limit}/{times}{unit}"
    raise ValueError(f"a period of {period_ns}ns is not a whole number of seconds")
