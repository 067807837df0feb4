"""pytest plugin (``pytest11`` entry point ``django_ratelimit_r4``): the ``r4_clock`` and ``r4_reset`` fixtures.

``r4_reset = true`` in the pytest ini file resets every configured instance before each test (an autouse
fixture that does nothing otherwise), so budgets, open breakers and per-client limiters never leak from one
test into the next.

Side-effect free at import: Django and the registry are imported inside the fixtures, after
pytest-django has configured settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .core.clock import FakeClock

#: The ini option that turns the autouse reset on.
RESET_INI = "r4_reset"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``r4_reset`` ini option."""
    parser.addini(
        RESET_INI,
        "django-ratelimit-r4: reset every RATELIMIT_R4 instance (rate limiters, per-client budgets, breakers, "
        "bulkheads) before each test",
        type="bool",
        default=False,
    )


def _reset_registry() -> None:
    from django.conf import settings

    if not settings.configured:  # a test run without Django: nothing to reset
        return
    from django_ratelimit_r4.registry import reset_all

    reset_all()


@pytest.fixture
def r4_reset() -> None:
    """Reset every built ``RATELIMIT_R4`` instance to its freshly built state before the test.

    Make it autouse in your ``conftest.py`` (``@pytest.fixture(autouse=True)`` depending on it), or set
    ``r4_reset = true`` in the pytest ini file. A synchronous fixture: it runs outside any event loop, so it
    serves async tests under every pytest-asyncio loop scope.
    """
    _reset_registry()


@pytest.fixture(autouse=True)
def _r4_reset_if_configured(request: pytest.FixtureRequest) -> None:
    # One ini lookup per test; the reset itself only with `r4_reset = true`.
    if request.config.getini(RESET_INI):
        _reset_registry()


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
