"""The code in the README and the guides runs against the real API and does what the text around it says.

Python blocks are taken from the pages themselves (not copied here), so an example that drifts from the
code fails this file: settings blocks must pass ``manage.py check``'s checks, the README's views must
answer 429 with ``Retry-After`` once the limit is used up, and the tests the docs show are run as written.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import enum
import re
import sys
import types
import unittest
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.test import Client, override_settings
from django.urls import path
from django.utils.module_loading import import_string

from django_ratelimit_r4 import conf, get_circuit_breaker, get_rate_limiter
from django_ratelimit_r4.checks import check_url_names
from django_ratelimit_r4.core.durations import parse_duration

ROOT = Path(__file__).resolve().parent.parent
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_ANY_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(page: str) -> list[str]:
    """The ```python blocks of ``page`` (a path from the repository root), in order."""
    return _PYTHON_BLOCK.findall((ROOT / page).read_text(encoding="utf-8"))


def block(page: str, marker: str) -> str:
    """The one python block of ``page`` that contains ``marker``."""
    found = [b for b in blocks(page) if marker in "\n" + b]
    assert len(found) == 1, f"{len(found)} python blocks of {page} contain {marker!r}"
    return found[0]


def run(source: str, page: str, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Execute a block as a module would (a fresh namespace unless one is given) and return its names."""
    ns = namespace if namespace is not None else {}
    ns.setdefault("__name__", "docs_example")
    exec(compile(source, f"<{page}>", "exec"), ns)
    return ns


def settings_block(page: str, marker: str = '\nRATELIMIT_R4 = {\n    "ratelimiters"') -> dict[str, Any]:
    """The names a ``settings.py`` block defines; ``[..., "app"]`` placeholders are dropped."""
    source = re.sub(r"\.\.\.,\s*", "", block(page, marker))
    source = re.sub(r"^\s*\.\.\.\s*$", "", source, flags=re.M)
    return run(source, page)


def r4_problems(setting: dict[str, Any]) -> list[str]:
    """What ``manage.py check --tag ratelimit_r4`` prints for ``setting`` (W001 depends on the environment)."""
    with override_settings(RATELIMIT_R4=setting):
        messages = checks.run_checks(tags=["ratelimit_r4"])
    return [str(m) for m in messages if m.id != "ratelimit_r4.W001"]


@pytest.fixture
def fake_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """configuration.md names ``requests`` exceptions; stand them in when requests is not installed."""
    try:
        import requests.exceptions  # noqa: F401
    except ImportError:
        module = types.ModuleType("requests")
        exceptions = types.ModuleType("requests.exceptions")
        exceptions.ConnectionError = type("ConnectionError", (OSError,), {})  # type: ignore[attr-defined]
        exceptions.Timeout = type("Timeout", (OSError,), {})  # type: ignore[attr-defined]
        module.exceptions = exceptions  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "requests", module)
        monkeypatch.setitem(sys.modules, "requests.exceptions", exceptions)


def urlconf(**views: Any) -> types.ModuleType:
    """A URLconf module routing ``/<name>/`` to each view."""
    module = types.ModuleType("docs_example_urls")
    module.urlpatterns = [path(f"{name}/", view) for name, view in views.items()]  # type: ignore[attr-defined]
    return module


# ------------------------------------------------------------------------------------------ settings blocks


@pytest.mark.parametrize(
    ("page", "marker"),
    [
        ("README.md", "INSTALLED_APPS"),
        ("docs/configuration.md", "# settings.py"),
        ("docs/usage.md", '"sustained": {'),
        ("docs/testing.md", "# settings.py"),
        ("docs/redis.md", '"backends": {\n'),
        ("docs/redis.md", '"lease_ttl": "10s"'),
        ("docs/redis.md", '"lease": 20'),
        ("docs/configuration.md", '"backends": {'),
    ],
)
@pytest.mark.usefixtures("fake_requests")
def test_settings_examples_pass_the_checks(page: str, marker: str) -> None:
    settings = settings_block(page, marker)
    assert r4_problems(settings["RATELIMIT_R4"]) == []
    if "INSTALLED_APPS" in settings:
        assert "django_ratelimit_r4" in settings["INSTALLED_APPS"]


def test_the_trusted_proxies_fragment_passes_the_checks() -> None:
    fragment = settings_block("docs/usage.md", '"trusted_proxies": 1')["RATELIMIT_R4"]
    assert fragment == {"trusted_proxies": 1, "ipv6_prefix_length": 64}
    assert r4_problems(fragment) == []
    assert r4_problems({"trusted_proxies": ["10.0.0.0/8"]}) == []


def test_the_stall_detector_setting_passes_the_checks() -> None:
    setting = settings_block("docs/operations.md", '"stall_detector"')["RATELIMIT_R4"]
    assert setting == {"stall_detector": {"enabled": True, "threshold": "20ms"}}
    assert r4_problems(setting) == []


def test_the_documented_check_output_is_what_check_prints() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    (shown,) = [b for lang, b in _ANY_BLOCK.findall(text) if not lang and b.startswith("?: (ratelimit_r4.")]
    documented = re.split(r"\n(?=\?: )", shown.strip())
    wrong = {
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": 500}},
            "instances": {"api": {"limit_for_perod": 10}},
        }
    }
    assert sorted(r4_problems(wrong)) == sorted(documented)


def test_the_documented_unknown_name_message() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    (message,) = re.findall(r"`(no ratelimiter named 'apii'[^`]*)`", text)
    setting = {"ratelimiters": {"instances": {"api": {}, "search": {}}}}
    with override_settings(RATELIMIT_R4=setting), pytest.raises(KeyError) as caught:
        get_rate_limiter("apii")
    assert str(caught.value) == message


# ---------------------------------------------------------------------------------------------- README views


@pytest.fixture
def readme(settings: Any, r4_clock: Any) -> dict[str, Any]:
    """The README's settings and its view, DRF and service examples, routed at /orders/, /search/, /drf/."""
    settings.RATELIMIT_R4 = settings_block("README.md")["RATELIMIT_R4"]
    ns = run(block("README.md", "def orders(request)"), "README.md")
    ns.update(run(block("README.md", "class OrderView(APIView)"), "README.md"))
    settings.ROOT_URLCONF = urlconf(orders=ns["orders"], search=ns["search"], drf=ns["OrderView"].as_view())
    return ns


def test_readme_view_answers_429_with_retry_after(client: Any, readme: dict[str, Any], r4_clock: Any) -> None:
    for _ in range(10):
        assert client.get("/orders/").status_code == 200
    response = client.get("/orders/")
    assert response.status_code == 429
    assert response["Retry-After"] == "1"
    assert response["Cache-Control"] == "no-store"
    r4_clock.advance(1)
    assert client.get("/orders/").status_code == 200


def test_readme_async_view_is_all_or_nothing(client: Any, readme: dict[str, Any], r4_clock: Any) -> None:
    for _ in range(5):  # "per-client": 5 per second per IP
        assert client.get("/search/").status_code == 200
    response = client.get("/search/")
    assert response.status_code == 429
    assert response["Retry-After"] == "1"
    assert get_rate_limiter("api").metrics.available_permissions == 5  # the rejection took nothing from "api"
    r4_clock.advance(1)
    assert client.get("/search/").status_code == 200


def test_readme_drf_throttle_answers_429_with_retry_after(
    client: Any, readme: dict[str, Any], r4_clock: Any
) -> None:
    for _ in range(10):
        assert client.get("/drf/").status_code == 200
    response = client.get("/drf/")
    assert response.status_code == 429
    assert response["Retry-After"] == "1"
    r4_clock.advance(1)
    assert client.get("/drf/").status_code == 200


def test_readme_service_function_falls_back(readme: dict[str, Any]) -> None:
    calls = []

    class AcquirerClient:
        def capture(self, card: str, amount: int) -> None:
            calls.append((card, amount))
            raise ConnectionError("acquirer down")

    readme["acquirer_client"] = AcquirerClient()
    declined = {"status": "DECLINED", "reason": "TEMPORARILY_UNAVAILABLE"}
    for _ in range(12):
        assert readme["capture"]("4111", 100) == declined
    # minimum_number_of_calls 10 at 100 % failures opened the breaker: the last two never left the process.
    assert len(calls) == 10
    assert get_circuit_breaker("acquirer").state.name == "OPEN"


def test_readme_pytest_example_runs_as_written(client: Any, readme: dict[str, Any], r4_clock: Any) -> None:
    ns = run(block("README.md", "def test_ten_per_second"), "README.md")
    ns["test_ten_per_second"](client, r4_clock)


def test_readme_core_example_runs_without_django_settings() -> None:
    ns = run(block("README.md", 'RateLimiter("burst"'), "README.md")
    assert ns["burst"].metrics.available_permissions == 4


# ------------------------------------------------------------------------------------------------ testing.md


@pytest.fixture
def ping(settings: Any) -> dict[str, Any]:
    """testing.md's settings and /ping/ view."""
    settings.RATELIMIT_R4 = settings_block("docs/testing.md")["RATELIMIT_R4"]
    ns = run(block("docs/testing.md", "def ping(request)"), "docs/testing.md")
    settings.ROOT_URLCONF = urlconf(ping=ns["ping"])
    return ns


def test_testing_guide_pytest_examples_run_as_written(
    client: Any, settings: Any, ping: dict[str, Any], r4_clock: Any
) -> None:
    ns = run(block("docs/testing.md", "def test_ten_requests_per_second(client"), "docs/testing.md")
    ns["test_ten_requests_per_second"](client, r4_clock)
    r4_clock.advance(60)
    ns = run(block("docs/testing.md", "def test_two_per_minute"), "docs/testing.md")
    ns["test_two_per_minute"](client, r4_clock)
    ns["test_with_the_settings_fixture"](settings, client, r4_clock)


def test_testing_guide_sixty_second_cycle(
    client: Any, settings: Any, ping: dict[str, Any], r4_clock: Any
) -> None:
    """The text: with a 60 s period, a request rejected 10 s into the cycle says ``Retry-After: 50``."""
    settings.RATELIMIT_R4 = {
        "ratelimiters": {"instances": {"api": {"limit_for_period": 10, "limit_refresh_period": "60s"}}}
    }
    for _ in range(10):
        assert client.get("/ping/").status_code == 200
    r4_clock.advance(10)
    assert client.get("/ping/")["Retry-After"] == "50"


def test_testing_guide_breaker_example(settings: Any, r4_clock: Any) -> None:
    settings.RATELIMIT_R4 = {
        "circuitbreakers": {"instances": {"payments": {"wait_duration_in_open_state": "30s"}}}
    }
    ns = run(block("docs/testing.md", "def test_breaker_half_opens_after_the_wait"), "docs/testing.md")
    ns["test_breaker_half_opens_after_the_wait"](r4_clock)


def test_testing_guide_fake_clock_example() -> None:
    run(block("docs/testing.md", "clock = FakeClock()"), "docs/testing.md")  # its own asserts


@pytest.mark.django_db
def test_testing_guide_unittest_example(ping: dict[str, Any]) -> None:
    ns = run(block("docs/testing.md", "class PingTests(TestCase)"), "docs/testing.md")
    result = unittest.TestResult()
    ns["PingTests"]("test_ten_requests_per_second")(result)  # __call__: Django sets up self.client
    assert result.testsRun == 1
    assert not result.errors and not result.failures, result.errors + result.failures


# ----------------------------------------------------------------------------------- usage, configuration, ...


def test_usage_examples_run(client: Any, settings: Any, r4_clock: Any) -> None:
    """Every block of usage.md executes in one namespace, as a reader pastes them; then a few are called."""
    settings.RATELIMIT_R4 = settings_block("docs/usage.md")["RATELIMIT_R4"]
    ns: dict[str, Any] = {"payment_unavailable": lambda *args: None}
    for source in blocks("docs/usage.md"):
        if source.startswith("RATELIMIT_R4 = {") or "MIDDLEWARE = [" in source:
            continue  # settings, checked above
        run(source, "docs/usage.md", ns)
    assert ns["REST_FRAMEWORK"]["EXCEPTION_HANDLER"] == "django_ratelimit_r4.rest_framework.exception_handler"
    with pytest.raises(TypeError):
        ns["timelimiter"]("payments")(lambda: None)  # "refuses sync functions ... at decoration time"

    settings.ROOT_URLCONF = urlconf(search=ns["search"], export=ns["export"], rates=ns["rates"])
    ns["CACHE"] = {"rates": {"EUR": 1}}
    ns["fetch_rates"] = lambda: {"EUR": 2}
    assert client.get("/rates/").json() == {"rates": {"EUR": 2}}
    get_circuit_breaker("payments").transition_to_open_state()
    assert client.get("/rates/").json() == {"rates": {"EUR": 1}, "stale": True}  # the fallback

    # export's body is "...": an admitted request reaches it (500: a view must return a response).
    tolerant = Client(raise_request_exception=False)
    statuses = [tolerant.get("/export/", HTTP_X_API_KEY="k1").status_code for _ in range(3)]
    assert statuses == [500, 500, 429]  # "this call costs 5 permits" of 10
    assert tolerant.get("/export/", HTTP_X_API_KEY="k2").status_code == 500  # another key, another budget


@pytest.mark.usefixtures("fake_requests")
def test_configuration_accessor_example(settings: Any, r4_clock: Any) -> None:
    settings.RATELIMIT_R4 = settings_block("docs/configuration.md")["RATELIMIT_R4"]
    charged = []
    ns = run(
        block("docs/configuration.md", 'limiter = get_rate_limiter("api")'),
        "docs/configuration.md",
        {"charge_card": lambda order: charged.append(order) or "ok", "order": 42},
    )
    assert ns["result"] == "ok" and charged == [42]


def test_redis_programmatic_example_builds_without_a_server() -> None:
    pytest.importorskip("redis")
    source = block("docs/redis.md", "redis_backend(url)").replace("127.0.0.1:6379", "127.0.0.1:1")
    ns = run(source, "docs/redis.md")
    assert ns["limiter"].acquire_permission()  # nothing listens there: the "open" fault policy allows
    assert ns["per_ip"].acquire_permission("203.0.113.7")


def test_operations_examples_run() -> None:
    pytest.importorskip("prometheus_client")
    hooks = run(block("docs/operations.md", "def worker_exit(server, worker)"), "docs/operations.md")
    assert callable(hooks["worker_exit"]) and callable(hooks["child_exit"])
    ns = run(block("docs/operations.md", "async with StallDetector"), "docs/operations.md")
    asyncio.run(ns["main"]())
    run(
        block("docs/operations.md", 'include("django_ratelimit_r4.urls")'),
        "docs/operations.md",
        {"path": path, "include": __import__("django.urls").urls.include},
    )


# ------------------------------------------------------------------------------- configuration.md's tables


def _table(section_heading: str) -> dict[str, str]:
    """``{option: default cell}`` of the first table under the configuration.md heading that starts so."""
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    start = text.index(section_heading)
    rows: dict[str, str] = {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("#"):
            break
        match = re.match(r"^\| `([a-z_0-9]+)` \| (.+?) \|", line)
        if match:
            rows[match.group(1)] = match.group(2).strip().strip("`")
    return rows


def _same(documented: str, actual: Any) -> bool:
    """Whether a documented default (a Python literal, a duration string) is the real default."""
    value = ast.literal_eval(documented)
    if isinstance(value, str) and isinstance(actual, int) and not isinstance(actual, bool):
        return parse_duration(value) == actual
    if isinstance(actual, enum.Enum):
        return value in (actual.name, actual.value)
    if isinstance(value, bool) or isinstance(actual, bool):
        return value is actual
    if isinstance(value, tuple):
        return isinstance(actual, tuple) and value == actual
    return bool(value == actual)


@pytest.mark.parametrize("section", list(conf.SECTIONS))
def test_configuration_tables_list_every_field_with_its_real_default(section: str) -> None:
    spec = conf.SECTIONS[section]
    rows = _table(f"### `{section}`")
    assert set(rows) == set(spec.fields) | set(spec.extras) | set(spec.shorthands)
    defaults = spec.config_class()
    extras = {
        "rate": None,
        "key": None,
        "max_keys": conf.DEFAULT_MAX_KEYS,
        "key_idle_timeout": None,
        "retry_after": conf.DEFAULT_BULKHEAD_RETRY_AFTER,
        "budget": None,
        "backend": None if section in ("bulkheads", "circuitbreakers") else "default",
        "on_backend_error": None,
        "lease_ttl": conf.DEFAULT_LEASE_TTL,
        "lease": None,
    }
    for name, documented in rows.items():
        actual = extras[name] if name in (*spec.extras, *spec.shorthands) else getattr(defaults, name)
        assert _same(documented, actual), (name, documented, actual)


def test_configuration_top_level_options_table() -> None:
    rows = _table("## Top-level options")
    defaults = conf.R4Options()
    # backends (its own section, "## Backends") is analysed per entry, not an R4Options field.
    # control is analysed on its own too (a broken one turns only the control plane off): conf.ControlOptions.
    assert set(rows) == {f.name for f in dataclasses.fields(conf.R4Options)} | {"backends", "control"}
    for name, documented in rows.items():
        if name == "control":
            assert ast.literal_eval(documented) is None
            assert conf.analyse({}).control is None
        elif name == "backends":
            assert ast.literal_eval(documented) == {"default": {"BACKEND": "memory"}}
            assert conf.analyse({}).backends["default"].backend == "memory"
        elif name == "stall_detector":
            value = ast.literal_eval(documented)
            stall = defaults.stall_detector
            assert value == {"enabled": stall.enabled, "threshold": "20ms"}
            assert parse_duration(value["threshold"]) == stall.threshold_ns
        else:
            assert _same(documented, getattr(defaults, name)), (name, documented)


def test_configuration_predicate_examples_run_and_pass_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """configuration.md's myapp/resilience.py and its settings: importable by dotted path, clean under check."""
    from datetime import timedelta

    fake = types.ModuleType("requests")
    fake.HTTPError = type("HTTPError", (OSError,), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "requests", fake)
    module = types.ModuleType("myapp.resilience")
    run(block("docs/configuration.md", "# myapp/resilience.py"), "docs/configuration.md", module.__dict__)
    monkeypatch.setitem(sys.modules, "myapp", types.ModuleType("myapp"))
    monkeypatch.setitem(sys.modules, "myapp.resilience", module)
    sys.modules["myapp"].resilience = module  # type: ignore[attr-defined]

    def http_error(status: int, retry_after: str = "") -> BaseException:
        error = fake.HTTPError()  # type: ignore[attr-defined]
        error.response = types.SimpleNamespace(status_code=status, headers={"Retry-After": retry_after})
        return error

    assert module.is_server_error(http_error(503)) and not module.is_server_error(http_error(404))
    assert module.upstream_retry_after(1, http_error(429, "7")) == timedelta(seconds=7)
    assert module.upstream_retry_after(2, ValueError()) == timedelta(milliseconds=400)
    setting = run(block("docs/configuration.md", '"record_exception": "myapp.resilience'), "docs/configuration.md")
    assert r4_problems(setting["RATELIMIT_R4"]) == []


# ------------------------------------------------------------------------------------------------ migrating.md

MIGRATING = "docs/migrating.md"
DRF_BEFORE = "# settings.py (before: DRF throttling)"
DRF_AFTER = "# settings.py (after: django-ratelimit-r4 reads DRF's rates)"


def _checks(**overrides: Any) -> list[str]:
    """``manage.py check``'s messages of this app under ``overrides`` (W001 depends on the environment)."""
    with override_settings(**overrides):
        messages = checks.run_checks(tags=["ratelimit_r4"])
    return [str(m) for m in messages if m.id != "ratelimit_r4.W001"]


def test_migrating_from_drf_keeps_the_rates_and_passes_the_checks() -> None:
    before = settings_block(MIGRATING, DRF_BEFORE)["REST_FRAMEWORK"]
    after_ns = settings_block(MIGRATING, DRF_AFTER)
    after = after_ns["REST_FRAMEWORK"]
    assert after["DEFAULT_THROTTLE_RATES"] == before["DEFAULT_THROTTLE_RATES"]  # "unchanged"
    assert "django_ratelimit_r4" in after_ns["INSTALLED_APPS"]
    for dotted in (*before["DEFAULT_THROTTLE_CLASSES"], *after["DEFAULT_THROTTLE_CLASSES"]):
        import_string(dotted)
    assert _checks(REST_FRAMEWORK=after) == []
    step2 = settings_block(MIGRATING, "# settings.py (step 2")["RATELIMIT_R4"]
    assert _checks(REST_FRAMEWORK=after, RATELIMIT_R4=step2) == []


@pytest.mark.parametrize("which", ["before", "after", "step 2"])
def test_migrating_from_drf_the_unchanged_view_is_limited_the_same(
    which: str, client: Any, settings: Any, r4_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.core.cache import cache
    from rest_framework.throttling import SimpleRateThrottle

    drf = settings_block(MIGRATING, DRF_BEFORE if which == "before" else DRF_AFTER)["REST_FRAMEWORK"]
    settings.REST_FRAMEWORK = drf
    if which == "step 2":
        settings.RATELIMIT_R4 = settings_block(MIGRATING, "# settings.py (step 2")["RATELIMIT_R4"]
    # DRF binds its throttle settings when rest_framework is imported; do what a settings file gives it.
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", drf["DEFAULT_THROTTLE_RATES"])
    cache.clear()
    view = run(block(MIGRATING, "class UploadView(APIView)"), MIGRATING)["UploadView"]
    view.throttle_classes = [import_string(c) for c in drf["DEFAULT_THROTTLE_CLASSES"]]
    settings.ROOT_URLCONF = urlconf(upload=view.as_view())
    assert [client.post("/upload/").status_code for _ in range(4)] == [201, 201, 201, 429]  # "3 per minute"
    if which != "before":
        r4_clock.advance(20)
        rejected = client.post("/upload/")
        assert (rejected.status_code, rejected["Retry-After"]) == (429, "40")  # the real wait
        assert '"uploads";q=3;w=60' in rejected["RateLimit-Policy"]
        r4_clock.advance(40)
        assert client.post("/upload/").status_code == 201
        assert check_url_names() == []


_DJANGO_RATELIMIT_ALL = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT")


def _django_ratelimit_stand_in() -> types.ModuleType:
    """django-ratelimit's decorator signature (4.x), when the package is not installed: the block must bind."""
    module = types.ModuleType("django_ratelimit.decorators")

    def ratelimit(
        group: Any = None, key: Any = None, rate: Any = None, method: Any = _DJANGO_RATELIMIT_ALL, block: bool = True
    ) -> Any:
        assert key is not None and rate is not None
        return lambda fn: fn

    module.ratelimit = ratelimit  # type: ignore[attr-defined]
    return module


def test_migrating_from_django_ratelimit_before_blocks_run(monkeypatch: pytest.MonkeyPatch) -> None:
    before = settings_block(MIGRATING, "# settings.py (before: django-ratelimit)")
    assert before["RATELIMIT_ENABLE"] is True and before["RATELIMIT_IPV6_MASK"] == 64
    try:
        import django_ratelimit.decorators  # noqa: F401
    except ImportError:
        package = types.ModuleType("django_ratelimit")
        monkeypatch.setitem(sys.modules, "django_ratelimit", package)
        monkeypatch.setitem(sys.modules, "django_ratelimit.decorators", _django_ratelimit_stand_in())
    ns = run(block(MIGRATING, "from django_ratelimit.decorators import ratelimit"), MIGRATING)
    assert callable(ns["login"]) and callable(ns["search"])


def test_migrating_from_django_ratelimit_after(client: Any, settings: Any, r4_clock: Any) -> None:
    setting = settings_block(MIGRATING, "# settings.py (after: django-ratelimit-r4)")["RATELIMIT_R4"]
    assert setting["enabled"] is True
    assert _checks(RATELIMIT_R4=setting) == []
    settings.RATELIMIT_R4 = setting
    ns = run(block(MIGRATING, "# views.py (after: django-ratelimit-r4)"), MIGRATING)
    settings.ROOT_URLCONF = urlconf(login=ns["login"], search=ns["search"])
    assert check_url_names() == []
    assert [client.get("/login/").status_code for _ in range(10)] == [200] * 10  # "a GET ... is not counted"
    assert [client.post("/login/").status_code for _ in range(6)] == [200] * 5 + [429]  # "5/m" per IP
    r4_clock.advance(15)
    assert client.post("/login/")["Retry-After"] == "45"
    assert client.post("/login/", REMOTE_ADDR="198.51.100.2").status_code == 200
    keyed = client.get("/search/", HTTP_X_API_KEY="k1")
    assert keyed.status_code == 200 and keyed["RateLimit-Policy"].startswith('"search";q=100;w=3600;pk=')
    assert [client.get("/search/").status_code for _ in range(3)] == [200] * 3
    assert "RateLimit" not in client.get("/search/")  # "without X-Api-Key is not limited by this instance"
    from django_ratelimit_r4.decorators import UNSAFE_METHODS  # named in the table

    assert "POST" in UNSAFE_METHODS


def test_migrating_a_typo_is_a_check_error_with_the_closest_name(settings: Any) -> None:
    settings.RATELIMIT_R4 = settings_block(MIGRATING, "# settings.py (after: django-ratelimit-r4)")["RATELIMIT_R4"]
    source = block(MIGRATING, "# views.py (after: django-ratelimit-r4)").replace('ratelimit("login"', 'ratelimit("logn"')
    ns = run(source, MIGRATING)
    settings.ROOT_URLCONF = urlconf(login=ns["login"])
    (message,) = check_url_names()
    assert message.id == "ratelimit_r4.E024" and "Did you mean 'login'?" in message.hint
