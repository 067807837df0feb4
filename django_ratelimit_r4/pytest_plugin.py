"""pytest plugin (``pytest11`` entry point ``django_ratelimit_r4``): the ``r4_clock`` fixture.

Side-effect free at import: Django and the registry are imported inside the fixture, after
pytest-django has configured settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .core.clock import FakeClock


@pytest.fixture
def r4_clock() -> Iterator[FakeClock]:
    """A :class:`~django_ratelimit_r4.testing.FakeClock` driving every configured instance.

    Installed into every instance of ``RATELIMIT_R4`` (built or future, per-key limiters too, and
    across ``override_settings``) with its state reset, so each limiter's first cycle starts at the
    clock's current time. Advance it with ``r4_clock.advance(seconds)``. Afterwards the real clock
    is restored and the instances are reset.
    """
    from django_ratelimit_r4.testing import fake_clock

    with fake_clock() as clock:
        yield clock
