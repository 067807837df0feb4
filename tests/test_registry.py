"""The settings-driven registry: inheritance, accessors, errors, rebuilds, clocks, thread safety."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

import django_ratelimit_r4
from django_ratelimit_r4 import conf, registry
from django_ratelimit_r4.core.bulkhead import Bulkhead
from django_ratelimit_r4.core.circuitbreaker import CircuitBreaker
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiter
from django_ratelimit_r4.core.retry import Retry
from django_ratelimit_r4.core.timelimiter import TimeLimiter
from django_ratelimit_r4.registry import MisconfiguredInstance, UnknownInstance

S = 1_000_000_000

INHERITING = {
    "ratelimiters": {
        "configs": {
            "default": {"limit_refresh_period": "1s", "limit_for_period": 7},
            "slow": {"limit_refresh_period": "1m"},
            "slower": {"base_config": "slow", "limit_for_period": 2},
        },
        "instances": {
            "plain": {},
            "own": {"limit_for_period": 3},
            "search": {"base_config": "slow", "timeout_duration": timedelta(milliseconds=5)},
            "deep": {"base_config": "slower", "limit_for_period": 4},
            "per_ip": {"key": "ip", "max_keys": 10, "key_idle_timeout": "5m"},
        },
    },
    "bulkheads": {
        "configs": {"default": {"max_concurrent_calls": 3, "retry_after": "2s"}},
        "instances": {"db": {}, "io": {"retry_after": timedelta(seconds=7), "max_wait_duration": "10ms"}},
    },
}


def test_every_accessor_builds_its_primitive_from_tests_settings() -> None:
    api = django_ratelimit_r4.get_rate_limiter("api")
    assert isinstance(api, RateLimiter)
    assert (api.name, api.config.limit_for_period, api.config.limit_refresh_period) == ("api", 10, S)
    assert django_ratelimit_r4.get_rate_limiter("slow").config.limit_refresh_period == 60 * S
    assert isinstance(django_ratelimit_r4.get_bulkhead("acquirer"), Bulkhead)
    assert django_ratelimit_r4.get_bulkhead("acquirer").config.max_concurrent_calls == 2
    cb = django_ratelimit_r4.get_circuit_breaker("acquirer")
    assert isinstance(cb, CircuitBreaker) and cb.config.wait_duration_in_open_state == 3 * S
    assert isinstance(django_ratelimit_r4.get_retry("acquirer"), Retry)
    assert django_ratelimit_r4.get_retry("acquirer").config.wait_duration == 100_000_000
    assert isinstance(django_ratelimit_r4.get_time_limiter("acquirer"), TimeLimiter)
    # Built once: the same object every time.
    assert django_ratelimit_r4.get_rate_limiter("api") is api


@override_settings(RATELIMIT_R4=INHERITING)
def test_default_config_named_configs_and_instance_values_merge_in_order() -> None:
    get = registry.get_rate_limiter
    assert (get("plain").config.limit_for_period, get("plain").config.limit_refresh_period) == (7, S)
    assert (get("own").config.limit_for_period, get("own").config.limit_refresh_period) == (3, S)
    # base_config "slow" still inherits default's limit_for_period.
    search = get("search").config
    assert (search.limit_for_period, search.limit_refresh_period, search.timeout_duration) == (
        7,
        60 * S,
        5_000_000,
    )
    deep = get("deep").config
    assert (deep.limit_for_period, deep.limit_refresh_period) == (4, 60 * S)
    # Library defaults where nothing is set.
    assert get("plain").config.timeout_duration == 0
    assert registry.get_bulkhead("db").config.max_concurrent_calls == 3
    assert registry.get_bulkhead("io").config.max_wait_duration == 10_000_000


@override_settings(RATELIMIT_R4=INHERITING)
def test_instance_options_have_defaults_and_inherit() -> None:
    assert dict(registry.instance_options("ratelimiters", "plain")) == {
        "key": None,
        "max_keys": 100_000,
        "key_idle_timeout": None,
        "backend": "default",
        "on_backend_error": None,
        "lease": None,
    }
    assert dict(registry.instance_options("ratelimiters", "per_ip")) == {
        "key": "ip",
        "max_keys": 10,
        "key_idle_timeout": 300 * S,
        "backend": "default",
        "on_backend_error": None,
        "lease": None,
    }
    assert registry.instance_options("bulkheads", "db")["retry_after"] == 2 * S  # from configs.default
    assert registry.instance_options("bulkheads", "io")["retry_after"] == 7 * S
    with pytest.raises(TypeError):
        registry.instance_options("ratelimiters", "plain")["max_keys"] = 1  # read-only view


def test_instance_options_default_bulkhead_retry_after_is_one_second() -> None:
    assert registry.instance_options("bulkheads", "acquirer")["retry_after"] == S
    assert dict(registry.instance_options("retries", "acquirer")) == {"budget": None}


@pytest.mark.parametrize(
    ("accessor", "section"),
    [
        (registry.get_rate_limiter, "ratelimiters"),
        (registry.get_bulkhead, "bulkheads"),
        (registry.get_circuit_breaker, "circuitbreakers"),
        (registry.get_retry, "retries"),
        (registry.get_time_limiter, "timelimiters"),
    ],
)
def test_unknown_name_lists_configured_names_and_the_setting_path(accessor, section) -> None:
    with pytest.raises(UnknownInstance) as info:
        accessor("nope")
    err = info.value
    assert isinstance(err, ImproperlyConfigured) and isinstance(err, KeyError)
    text = str(err)
    assert f'RATELIMIT_R4["{section}"]["instances"]' in text
    assert "'nope'" in text
    configured = conf.get_analysis().names(section)
    assert configured and all(repr(n) in text for n in configured)
    assert (err.section, err.name, err.known) == (section, "nope", configured)


def test_old_kind_names_still_work_with_a_deprecation_warning() -> None:
    # "kind" named a settings section before 0.2; the public spellings stay as deprecated aliases.
    with pytest.raises(UnknownInstance) as info:
        registry.get_rate_limiter("nope")
    with pytest.warns(DeprecationWarning, match="UnknownInstance.kind"):
        assert info.value.kind == "ratelimiters"
    with pytest.warns(DeprecationWarning, match="registry.KINDS"):
        assert registry.KINDS is registry.SECTIONS
    with pytest.warns(DeprecationWarning, match="conf.KINDS"):
        assert conf.KINDS is conf.SECTIONS
    with pytest.warns(DeprecationWarning, match="conf.Kind"):
        assert conf.Kind is conf.Section
    with pytest.warns(DeprecationWarning, match="Section.section"):
        assert conf.SECTIONS["bulkheads"].section == "bulkheads"
    spec = conf.get_analysis().specs["ratelimiters"]["api"]
    with pytest.warns(DeprecationWarning, match="InstanceSpec.kind"):
        assert spec.kind == spec.section == "ratelimiters"
    misconfigured = registry.MisconfiguredInstance("bulkheads", "x", [])
    with pytest.warns(DeprecationWarning, match="MisconfiguredInstance.kind"):
        assert misconfigured.kind == "bulkheads"


@override_settings(RATELIMIT_R4={"ratelimiter": {"instances": {"api": {}}}})
def test_unknown_name_mentions_other_problems_such_as_a_misspelt_section() -> None:
    with pytest.raises(KeyError) as info:
        registry.get_rate_limiter("api")
    text = str(info.value)
    assert "configured: none" in text
    assert "Did you mean 'ratelimiters'?" in text


@override_settings(
    RATELIMIT_R4={
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": "1s"}},
            "instances": {"bad": {"limit_for_period": 0, "limit_refresh_period": 500}, "good": {}},
        }
    }
)
def test_a_misconfigured_instance_raises_at_first_use_and_the_others_still_work() -> None:
    with pytest.raises(MisconfiguredInstance) as info:
        registry.get_rate_limiter("bad")
    text = str(info.value)
    assert 'RATELIMIT_R4["ratelimiters"]["instances"]["bad"]["limit_for_period"]: must be >= 1, got 0' in text
    assert 'RATELIMIT_R4["ratelimiters"]["instances"]["bad"]["limit_refresh_period"]: bare number 500' in text
    assert "ratelimit_r4.E004" in text
    assert len(info.value.problems) == 2
    assert registry.get_rate_limiter("good").config.limit_refresh_period == S
    assert registry.names("ratelimiters") == ("good", "bad")
    assert [name for name, _ in registry.instances("ratelimiters")] == ["good"]


@override_settings(RATELIMIT_R4="not a dict")
def test_a_setting_that_is_not_a_dict_fails_every_accessor_clearly() -> None:
    for accessor in (registry.get_rate_limiter, registry.get_bulkhead, registry.get_time_limiter):
        with pytest.raises(ImproperlyConfigured, match=r"RATELIMIT_R4: must be a dict, got str"):
            accessor("api")
    with pytest.raises(ImproperlyConfigured, match="must be a dict"):
        conf.get_options()
    assert list(registry.iter_instances()) == []


def test_override_settings_rebuilds_and_bumps_generation() -> None:
    before = registry.get_rate_limiter("api")
    gen0, looked_up = registry.lookup("ratelimiters", "api")
    assert looked_up is before and gen0 == registry.generation
    with override_settings(
        RATELIMIT_R4={
            "ratelimiters": {"instances": {"api": {"limit_for_period": 3, "limit_refresh_period": "1m"}}}
        }
    ):
        assert registry.generation == gen0 + 1
        inside = registry.get_rate_limiter("api")
        assert inside is not before
        assert (inside.config.limit_for_period, inside.config.limit_refresh_period) == (3, 60 * S)
        gen1, _ = registry.lookup("ratelimiters", "api")
        assert gen1 == gen0 + 1
        with pytest.raises(UnknownInstance):
            registry.get_bulkhead("acquirer")
    assert registry.generation == gen0 + 2
    after = registry.get_rate_limiter("api")
    assert after is not before and after is not inside
    assert after.config.limit_for_period == 10


def test_other_settings_do_not_rebuild() -> None:
    api = registry.get_rate_limiter("api")
    gen = registry.generation
    with override_settings(DEBUG=True, SOME_OTHER_SETTING=1):
        assert registry.generation == gen
        assert registry.get_rate_limiter("api") is api


def test_lookup_reports_the_generation_the_instance_belongs_to_even_when_a_rebuild_races() -> None:
    registry.get_rate_limiter("api")
    state = registry._state
    assert state is not None
    registry.invalidate()  # a rebuild after the caller grabbed the old state
    # The stale state hands out its own generation, so the caller's cache is already out of date.
    assert state.generation == registry.generation - 1
    gen, fresh = registry.lookup("ratelimiters", "api")
    assert gen == registry.generation
    assert fresh is not state.instances["ratelimiters"]["api"]


def test_concurrent_first_use_builds_each_instance_exactly_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    class CountingLimiter(RateLimiter):
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            built.append(args[0])
            time.sleep(0.0005)  # widen the window in which a second builder could slip in
            super().__init__(*args, **kwargs)

    monkeypatch.setitem(registry._classes, "ratelimiters", CountingLimiter)
    threads_per_trial = 8
    for _trial in range(40):
        registry.invalidate()
        built.clear()
        barrier = threading.Barrier(threads_per_trial)
        seen: list[object] = []

        def worker(barrier: threading.Barrier, seen: list[object]) -> None:
            barrier.wait()
            seen.append(registry.get_rate_limiter("api"))
            seen.append(registry.get_rate_limiter("slow"))

        threads = [threading.Thread(target=worker, args=(barrier, seen)) for _ in range(threads_per_trial)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(built) == ["api", "slow"]
        assert len({id(x) for x in seen}) == 2
    registry.invalidate()  # drop the counting instances


def test_iteration_covers_every_configured_instance_by_section() -> None:
    assert list(registry.SECTIONS) == [
        "ratelimiters",
        "bulkheads",
        "circuitbreakers",
        "retries",
        "timelimiters",
        "adaptivethrottlers",
    ]
    items = [(section, name) for section, name, _ in registry.iter_instances()]
    assert items == [
        ("ratelimiters", "api"),
        ("ratelimiters", "slow"),
        ("ratelimiters", "per_ip"),
        ("ratelimiters", "burst"),
        ("ratelimiters", "burst3"),
        ("ratelimiters", "sustained"),
        ("bulkheads", "acquirer"),
        ("circuitbreakers", "acquirer"),
        ("retries", "acquirer"),
        ("timelimiters", "acquirer"),
    ]
    for section, name, instance in registry.iter_instances():
        assert instance.name == name
        assert registry.lookup(section, name)[1] is instance
    assert registry.names("ratelimiters") == ("api", "slow", "per_ip", "burst", "burst3", "sustained")


def test_install_clock_resets_built_instances_and_reaches_future_ones() -> None:
    api = registry.get_rate_limiter("api")
    while api.acquire_permission():
        pass  # exhaust it on the real clock
    clock = FakeClock(start_ns=5 * S)
    try:
        registry.install_clock(clock)
        assert api.clock is clock
        # Reset: a full budget whose first cycle starts at the fake clock's now.
        assert sum(api.acquire_permission() for _ in range(11)) == 10
        assert api.metrics.nanos_to_wait == S
        clock.advance(1)
        assert api.acquire_permission()
        # Built after installing: uses the fake clock too.
        cb = registry.get_circuit_breaker("acquirer")
        assert cb.clock is clock
        with override_settings(
            RATELIMIT_R4={"ratelimiters": {"instances": {"x": {"limit_refresh_period": "1s"}}}}
        ):
            assert registry.get_rate_limiter("x").clock is clock
    finally:
        registry.restore_clock()
    assert api.clock is SYSTEM_CLOCK
    assert registry.get_rate_limiter("api").clock is SYSTEM_CLOCK
    assert registry._clock is SYSTEM_CLOCK


def test_reset_all_returns_instances_to_a_full_budget() -> None:
    api = registry.get_rate_limiter("api")
    clock = FakeClock()
    registry.install_clock(clock)
    try:
        assert sum(api.acquire_permission() for _ in range(10)) == 10
        assert not api.acquire_permission()
        registry.reset_all()
        assert api.acquire_permission()
    finally:
        registry.restore_clock()


@override_settings(
    RATELIMIT_R4={
        "backend": "memory",
        "headers": "DRAFT-6",
        "response_builder": "django.http.HttpResponse",
        "trusted_proxies": ["10.0.0.0/8", "2001:db8::/32"],
        "ipv6_prefix_length": 64,
        "state_endpoint_token": "x" * 40,
        "stall_detector": {"enabled": True, "threshold": "50ms"},
        "metrics": False,
    }
)
def test_get_options_parses_every_top_level_option() -> None:
    from django.http import HttpResponse

    options = conf.get_options()
    assert options.backend == "memory"
    assert options.headers == "draft-6"
    assert options.response_builder is HttpResponse
    assert [str(n) for n in options.trusted_proxies] == ["10.0.0.0/8", "2001:db8::/32"]  # type: ignore[union-attr]
    assert options.ipv6_prefix_length == 64
    assert options.state_endpoint_token == "x" * 40
    assert (options.stall_detector.enabled, options.stall_detector.threshold_ns) == (True, 50_000_000)
    assert options.metrics is False
    assert conf.get_options() is options  # cached


def test_get_options_defaults_and_cache_invalidation() -> None:
    defaults = conf.get_options()
    assert defaults == conf.R4Options()
    assert (defaults.headers, defaults.trusted_proxies, defaults.metrics) == ("draft-10", 0, True)
    assert defaults.stall_detector.threshold_ns == 20_000_000
    with override_settings(RATELIMIT_R4={"headers": None, "trusted_proxies": 2}):
        assert (conf.get_options().headers, conf.get_options().trusted_proxies) == (None, 2)
    assert conf.get_options() == defaults


@override_settings(RATELIMIT_R4={"headers": "draft10", "trusted_proxies": ["999.0.0.0/8"], "metrics": "yes"})
def test_get_options_raises_one_error_listing_every_bad_option() -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        conf.get_options()
    text = str(info.value)
    assert 'RATELIMIT_R4["headers"]' in text and "Did you mean 'draft-10'?" in text
    assert 'RATELIMIT_R4["trusted_proxies"]' in text
    assert 'RATELIMIT_R4["metrics"]' in text


def test_a_bad_setting_never_breaks_app_start_up() -> None:
    from django.apps import apps

    with override_settings(RATELIMIT_R4={"ratelimiters": 5}):
        apps.get_app_config("ratelimit_r4").ready()  # what start-up runs; it must not parse the setting
        assert conf._cached is None
        with pytest.raises(ImproperlyConfigured, match=r'RATELIMIT_R4\["ratelimiters"\]: must be a dict'):
            registry.get_rate_limiter("api")


# ------------------------------------------------------------------------------------------- keyed


def test_keyed_limiters_are_per_key_and_share_the_instance_config() -> None:
    pytest.importorskip("django_ratelimit_r4.keyed")
    clock = FakeClock()
    registry.install_clock(clock)
    try:
        a = registry.get_rate_limiter("api", key="203.0.113.7")
        b = registry.get_rate_limiter("api", key="198.51.100.1")
        assert registry.get_rate_limiter("api", key="203.0.113.7") == a
        assert a != b
        assert sum(a.acquire_permission() for _ in range(11)) == 10
        assert b.acquire_permission()  # its own budget
        keyed = registry.get_keyed_rate_limiter("api")
        assert len(keyed) == 2
        assert [name for name, _ in registry.keyed_rate_limiters()] == ["api", "per_ip"]  # per_ip: key "ip"
        # install_clock reaches keyed limiters: reset, fresh budgets on the new clock.
        other = FakeClock(start_ns=77 * S)
        registry.install_clock(other)
        again = registry.get_rate_limiter("api", key="203.0.113.7")
        assert sum(again.acquire_permission() for _ in range(11)) == 10
    finally:
        registry.restore_clock()


@override_settings(RATELIMIT_R4=INHERITING)
def test_keyed_limiter_gets_max_keys_from_settings() -> None:
    keyed_module = pytest.importorskip("django_ratelimit_r4.keyed")
    keyed = registry.get_keyed_rate_limiter("per_ip")
    assert isinstance(keyed, keyed_module.KeyedRateLimiter)
    for i in range(25):
        assert keyed.get(f"10.0.0.{i}").acquire_permission()
    assert len(keyed) == 10  # bounded by max_keys from the settings
    assert [name for name, _ in registry.keyed_rate_limiters()] == ["per_ip"]


def test_unknown_name_with_a_key_is_still_an_unknown_instance() -> None:
    with pytest.raises(UnknownInstance):
        registry.get_rate_limiter("nope", key="1.2.3.4")


def test_a_missing_installed_apps_entry_is_reported_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decorators work without the app installed, but checks and metrics would silently be off: warn once."""
    from django.apps import apps

    monkeypatch.setattr(registry, "_warned_not_installed", False)
    monkeypatch.setattr(apps, "is_installed", lambda name: name != "django_ratelimit_r4")
    registry.invalidate()
    with pytest.warns(RuntimeWarning, match="not in INSTALLED_APPS"):
        registry.get_rate_limiter("api")
    registry.invalidate()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry.get_rate_limiter("api")  # once per process, not per rebuild


def test_no_warning_when_the_app_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    monkeypatch.setattr(registry, "_warned_not_installed", False)
    registry.invalidate()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry.get_rate_limiter("api")
