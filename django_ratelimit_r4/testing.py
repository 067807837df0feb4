"""Helpers for testing code that uses django-ratelimit-r4, without sleeping.

* :class:`FakeClock` -- a nanosecond clock that moves only when told (``advance(seconds)``,
  ``advance_ns(n)``, ``now_ns()``); its ``sleep`` advances instead of blocking.
* :func:`fake_clock` -- context manager installing a FakeClock into every configured instance
  (existing and future, per-key limiters too) with their state reset; restores the real clock.
  The ``r4_clock`` pytest fixture (:mod:`django_ratelimit_r4.pytest_plugin`) does the same.
* :func:`install_clock` / :func:`restore_clock` / :func:`reset_all` -- the underlying registry calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .core.clock import FakeClock
from .registry import install_clock, reset_all, restore_clock

__all__ = ["FakeClock", "fake_clock", "install_clock", "reset_all", "restore_clock"]


@contextmanager
def fake_clock(start_ns: int | None = None) -> Iterator[FakeClock]:
    """Install a :class:`FakeClock` into the registry for the ``with`` block and yield it.

    For ``unittest``/Django ``TestCase`` users (pytest users have the ``r4_clock`` fixture)::

        with fake_clock() as clock:
            ...             # 10 requests pass, the 11th is 429
            clock.advance(1)
    """
    clock = FakeClock() if start_ns is None else FakeClock(start_ns)
    install_clock(clock)
    try:
        yield clock
    finally:
        restore_clock()
