"""The pytest plugin: the ``r4_clock`` fixture, run in a separate pytest session via ``pytester``."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent

SETTINGS = """
SECRET_KEY = "plugin-tests"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_ratelimit_r4"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
RATELIMIT_R4 = {
    "ratelimiters": {
        "configs": {"default": {"limit_refresh_period": "1s"}},
        "instances": {"api": {"limit_for_period": 10}},
    },
    "circuitbreakers": {"instances": {"payments": {"wait_duration_in_open_state": "3s"}}},
}
"""

INNER_TESTS = """
import pytest
from django.test import override_settings

from django_ratelimit_r4 import get_circuit_breaker, get_rate_limiter, registry
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
from django_ratelimit_r4.testing import FakeClock

S = 1_000_000_000
HELD = []


@pytest.fixture
def drained_on_the_real_clock():
    limiter = get_rate_limiter("api")
    while limiter.acquire_permission():
        pass
    return limiter


def test_a_first_cycle_starts_at_the_fixture_time(r4_clock):
    assert isinstance(r4_clock, FakeClock)
    limiter = get_rate_limiter("api")
    assert limiter.clock is r4_clock
    assert sum(limiter.acquire_permission() for _ in range(11)) == 10
    assert limiter.metrics.nanos_to_wait == S  # a whole period: the cycle began exactly now
    r4_clock.advance(0.999)
    assert not limiter.acquire_permission()
    r4_clock.advance(0.001)
    assert limiter.acquire_permission()


def test_b_existing_instances_get_the_clock_and_a_reset(drained_on_the_real_clock, r4_clock):
    assert drained_on_the_real_clock.clock is r4_clock
    assert sum(drained_on_the_real_clock.acquire_permission() for _ in range(11)) == 10


def test_c_breaker_open_time_follows_the_fake_clock(r4_clock):
    breaker = get_circuit_breaker("payments")
    breaker.transition_to_open_state()
    assert breaker.remaining_open_ns() == 3 * S
    r4_clock.advance(2)
    assert not breaker.try_acquire_permission()
    r4_clock.advance(1.5)
    assert breaker.try_acquire_permission()  # half-open trial allowed


def test_d_override_settings_inside_a_test(r4_clock):
    with override_settings(RATELIMIT_R4={"ratelimiters": {"instances": {"api": {"limit_for_period": 3, "limit_refresh_period": "1m"}}}}):
        limiter = get_rate_limiter("api")
        HELD.append(limiter)
        assert limiter.clock is r4_clock
        assert sum(limiter.acquire_permission() for _ in range(4)) == 3
        assert limiter.metrics.nanos_to_wait == 60 * S
        r4_clock.advance(60)
        assert limiter.acquire_permission()
    limiter = get_rate_limiter("api")
    assert limiter.config.limit_for_period == 10 and limiter.clock is r4_clock


@override_settings(RATELIMIT_R4={"ratelimiters": {"instances": {"api": {"limit_for_period": 2, "limit_refresh_period": "1s"}}}})
def test_e_override_settings_decorator(r4_clock):
    limiter = get_rate_limiter("api")
    assert limiter.clock is r4_clock
    assert [limiter.acquire_permission() for _ in range(3)] == [True, True, False]


def test_f_pytest_django_settings_fixture(settings, r4_clock):
    settings.RATELIMIT_R4 = {"ratelimiters": {"instances": {"api": {"limit_for_period": 1, "limit_refresh_period": "5s"}}}}
    limiter = get_rate_limiter("api")
    assert [limiter.acquire_permission() for _ in range(2)] == [True, False]
    r4_clock.advance(5)
    assert limiter.acquire_permission()


def test_g_keyed_limiters_use_the_fake_clock(r4_clock):
    pytest.importorskip("django_ratelimit_r4.keyed")
    client = get_rate_limiter("api", key="203.0.113.7")
    assert sum(client.acquire_permission() for _ in range(11)) == 10
    r4_clock.advance(1)
    assert client.acquire_permission()


def test_y_a_failing_test_still_restores(r4_clock):
    get_rate_limiter("api").acquire_permission()
    assert False, "deliberate failure"


def test_z_the_real_clock_is_back_everywhere():
    assert registry._clock is SYSTEM_CLOCK
    assert get_rate_limiter("api").clock is SYSTEM_CLOCK
    assert HELD and HELD[0].clock is SYSTEM_CLOCK  # even an instance override_settings orphaned
"""


def _entry_point_installed() -> bool:
    return any(
        ep.name == "django_ratelimit_r4" and ep.value == "django_ratelimit_r4.pytest_plugin"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *plugin_args: str) -> pytest.RunResult:
    pytester.makepyfile(r4_plugin_settings=SETTINGS, test_inner=INNER_TESTS)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    return pytester.runpytest_subprocess(
        "--ds=r4_plugin_settings", "-p", "no:cacheprovider", *plugin_args, timeout=120
    )


def test_r4_clock_fixture(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    args = () if _entry_point_installed() else ("-p", "django_ratelimit_r4.pytest_plugin")
    result = _run(pytester, monkeypatch, *args)
    skipped = 0
    try:
        import django_ratelimit_r4.keyed  # noqa: F401
    except ImportError:
        skipped = 1
    result.assert_outcomes(passed=8 - skipped, failed=1, skipped=skipped)
    result.stdout.fnmatch_lines(["*AssertionError: deliberate failure"])


def test_the_plugin_is_registered_through_the_pytest11_entry_point(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = re.search(
        r"^\[project\.entry-points\.pytest11\]\n(.*?)(?:^\[|\Z)", pyproject, re.MULTILINE | re.DOTALL
    )
    assert section, "pyproject.toml has no [project.entry-points.pytest11]"
    assert re.search(
        r'^django_ratelimit_r4\s*=\s*"django_ratelimit_r4\.pytest_plugin"', section.group(1), re.MULTILINE
    )
    if not _entry_point_installed():
        pytest.skip("package not installed in this environment (pip install -e . registers the entry point)")
    pytester.makepyfile(test_fixture_listed="def test_it(r4_clock):\n    assert r4_clock.now_ns() > 0\n")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(r4_plugin_settings=SETTINGS)
    result = pytester.runpytest_subprocess(
        "--ds=r4_plugin_settings", "-p", "no:cacheprovider", "test_fixture_listed.py", timeout=120
    )
    result.assert_outcomes(passed=1)


def test_importing_the_plugin_has_no_side_effects() -> None:
    probe = (
        "import sys, django_ratelimit_r4.pytest_plugin as p; "
        "assert callable(p.r4_clock); "
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.') "
        "or m in ('django_ratelimit_r4.registry', 'django_ratelimit_r4.conf')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_testing_module_reexports_fake_clock_and_fake_clock_context_manager() -> None:
    from django_ratelimit_r4 import get_rate_limiter, registry
    from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock
    from django_ratelimit_r4.testing import FakeClock as Reexported
    from django_ratelimit_r4.testing import fake_clock

    assert Reexported is FakeClock
    with fake_clock(start_ns=42 * 1_000_000_000) as clock:
        assert clock.now_ns() == 42 * 1_000_000_000
        limiter = get_rate_limiter("api")
        assert limiter.clock is clock
        assert sum(limiter.acquire_permission() for _ in range(11)) == 10
        clock.advance(1)
        assert limiter.acquire_permission()
    assert limiter.clock is SYSTEM_CLOCK and registry._clock is SYSTEM_CLOCK


# ------------------------------------------------------------------------- r4_reset: no state leaks (issue 8)

RESET_SETTINGS = """
SECRET_KEY = "plugin-tests"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_ratelimit_r4"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
RATELIMIT_R4 = {
    "ratelimiters": {"instances": {"api": {"rate": "2/h"}, "per_ip": {"rate": "1/h", "key": "ip"}}},
    "circuitbreakers": {"instances": {"payments": {"wait_duration_in_open_state": "1h"}}},
}
"""

RESET_TESTS = """
from django_ratelimit_r4 import get_circuit_breaker, get_rate_limiter


def test_a_uses_everything_up():
    assert [get_rate_limiter("api").acquire_permission() for _ in range(3)] == [True, True, False]
    assert get_rate_limiter("per_ip", key="203.0.113.7").acquire_permission()
    get_circuit_breaker("payments").transition_to_open_state()


def test_b_starts_fresh():
    assert get_rate_limiter("api").metrics.available_permissions == 2
    assert get_rate_limiter("per_ip", key="203.0.113.7").acquire_permission()
    assert get_circuit_breaker("payments").try_acquire_permission()


async def test_c_async_uses_everything_up():
    limiter = get_rate_limiter("api")
    assert [await limiter.aacquire_permission() for _ in range(3)] == [True, True, False]


async def test_d_async_starts_fresh():
    assert await get_rate_limiter("api").aacquire_permission()
    assert get_rate_limiter("api").metrics.available_permissions == 1
"""


def _run_reset(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ini: str, conftest: str = "") -> Any:
    pytester.makepyfile(r4_reset_settings=RESET_SETTINGS, test_reset=RESET_TESTS)
    if conftest:
        pytester.makeconftest(conftest)
    pytester.makeini(f"[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n{ini}")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    args = () if _entry_point_installed() else ("-p", "django_ratelimit_r4.pytest_plugin")
    return pytester.runpytest_subprocess(
        "--ds=r4_reset_settings", "-p", "no:cacheprovider", "-p", "no:randomly", *args, timeout=120
    )


def test_without_opting_in_state_leaks_between_tests(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run_reset(pytester, monkeypatch, "")
    result.assert_outcomes(passed=1, failed=3)  # b, c and d see what the tests before them used


def test_the_r4_reset_ini_option_resets_every_instance_before_each_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run_reset(pytester, monkeypatch, "r4_reset = true\n")
    result.assert_outcomes(passed=4)


def test_the_r4_reset_fixture_made_autouse_in_a_conftest(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    conftest = "import pytest\n\n\n@pytest.fixture(autouse=True)\ndef _fresh_limits(r4_reset):\n    pass\n"
    result = _run_reset(pytester, monkeypatch, "", conftest)
    result.assert_outcomes(passed=4)
