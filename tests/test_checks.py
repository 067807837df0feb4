"""System checks: every mistake in RATELIMIT_R4 reported at once, with its id, path and hint."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_ratelimit_r4 import checks, conf
from django_ratelimit_r4.checks import check_settings, detect_multiprocess
from django_ratelimit_r4.conf import Code

ROOT = Path(__file__).resolve().parent.parent
RL = 'RATELIMIT_R4["ratelimiters"]'
CB = 'RATELIMIT_R4["circuitbreakers"]'
BH = 'RATELIMIT_R4["bulkheads"]'


def rl(instance: dict | None = None, configs: dict | None = None) -> dict:
    section: dict = {"instances": {"api": instance or {}}}
    if configs is not None:
        section["configs"] = configs
    return {"ratelimiters": section}


@pytest.fixture(autouse=True)
def single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the environment from triggering W001 unless a test asks for it."""
    for var in ("WEB_CONCURRENCY", "GUNICORN_CMD_ARGS", "SERVER_SOFTWARE"):
        monkeypatch.delenv(var, raising=False)


def ours(messages: list) -> list:
    return [m for m in messages if m.id.startswith("ratelimit_r4.")]


# (setting, id, exact path, text in the message, text in the hint)
CASES = [
    pytest.param(
        ["not", "a", "dict"],
        "E001",
        "RATELIMIT_R4",
        "must be a dict, got list",
        "Write it as",
        id="E001-not-dict",
    ),
    pytest.param(
        {"ratelimiter": {}},
        "E002",
        'RATELIMIT_R4["ratelimiter"]',
        "unknown key 'ratelimiter'",
        "Did you mean 'ratelimiters'?",
        id="E002-section",
    ),
    pytest.param(
        {"header": "draft-6"},
        "E002",
        'RATELIMIT_R4["header"]',
        "unknown key",
        "Did you mean 'headers'?",
        id="E002-option",
    ),
    pytest.param(
        {"ratelimiters": {"instance": {}}},
        "E002",
        f'{RL}["instance"]',
        "only 'configs' and 'instances'",
        "Did you mean 'instances'?",
        id="E002-group",
    ),
    pytest.param(
        rl({"limit_for_perod": 10}),
        "E002",
        f'{RL}["instances"]["api"]["limit_for_perod"]',
        "unknown option 'limit_for_perod'",
        "Did you mean 'limit_for_period'?",
        id="E002-field",
    ),
    pytest.param(
        rl(configs={"default": {"timeout": "1s"}}),
        "E002",
        f'{RL}["configs"]["default"]["timeout"]',
        "unknown option 'timeout'",
        "Did you mean 'timeout_duration'?",
        id="E002-config-field",
    ),
    pytest.param(
        {"bulkheads": {"instances": {"db": {"key": "ip"}}}},
        "E002",
        f'{BH}["instances"]["db"]["key"]',
        "unknown option 'key' for bulkheads",
        "'key' belongs to ratelimiters",
        id="E002-other-kind",
    ),
    pytest.param(
        {"retries": {"instances": {"r": {"zzz": 1}}}},
        "E002",
        'RATELIMIT_R4["retries"]["instances"]["r"]["zzz"]',
        "unknown option 'zzz'",
        "Known options: base_config, budget, enable_exponential_backoff",
        id="E002-known-list",
    ),
    pytest.param(
        {"stall_detector": {"treshold": "20ms"}},
        "E002",
        'RATELIMIT_R4["stall_detector"]["treshold"]',
        "unknown option",
        "Did you mean 'threshold'?",
        id="E002-stall",
    ),
    pytest.param(
        {"bulkheads": ["db"]},
        "E003",
        BH,
        "must be a dict with 'configs' and/or 'instances', got list",
        "Write it as",
        id="E003-section",
    ),
    pytest.param(
        {"ratelimiters": {"instances": ["api"]}},
        "E003",
        f'{RL}["instances"]',
        "must be a dict of name -> options",
        None,
        id="E003-instances",
    ),
    pytest.param(
        {"ratelimiters": {"instances": {"api": 10}}},
        "E003",
        f'{RL}["instances"]["api"]',
        "must be a dict of options, got int",
        "Write {} for all defaults.",
        id="E003-entry",
    ),
    pytest.param(
        {"ratelimiters": {"instances": {"": {}}}},
        "E003",
        f'{RL}["instances"][""]',
        "names must be non-empty strings",
        None,
        id="E003-name",
    ),
    pytest.param(
        {"stall_detector": True},
        "E003",
        'RATELIMIT_R4["stall_detector"]',
        "must be a dict, got bool",
        '"enabled": True',
        id="E003-stall",
    ),
    pytest.param(
        rl({"limit_refresh_period": 500}),
        "E004",
        f'{RL}["instances"]["api"]["limit_refresh_period"]',
        "bare number 500 has no unit",
        "Write durations as timedelta or a string with a unit",
        id="E004-unitless",
    ),
    pytest.param(
        rl({"timeout_duration": "1 sec"}),
        "E004",
        f'{RL}["instances"]["api"]["timeout_duration"]',
        "'1 sec' is not a duration",
        "Write durations",
        id="E004-malformed",
    ),
    pytest.param(
        rl({"limit_for_period": 0}),
        "E004",
        f'{RL}["instances"]["api"]["limit_for_period"]',
        "must be >= 1, got 0",
        None,
        id="E004-range",
    ),
    pytest.param(
        rl(configs={"default": {"limit_refresh_period": "0s"}}),
        "E004",
        f'{RL}["configs"]["default"]["limit_refresh_period"]',
        "must be at least 1ns",
        None,
        id="E004-reported-where-written",
    ),
    pytest.param(
        {"bulkheads": {"instances": {"db": {"fair_call_handling": "yes"}}}},
        "E004",
        f'{BH}["instances"]["db"]["fair_call_handling"]',
        "must be True or False, got 'yes'",
        None,
        id="E004-type",
    ),
    pytest.param(
        {"circuitbreakers": {"instances": {"p": {"sliding_window_size": 10**13}}}},
        "E004",
        f'{CB}["instances"]["p"]["sliding_window_size"]',
        "must be <= 1000000, got 10000000000000",
        None,
        id="E004-window-size",  # passed the check, then MemoryError at the first request
    ),
    pytest.param(
        {"circuitbreakers": {"instances": {"p": {"failure_rate_threshold": 10**400}}}},
        "E004",
        f'{CB}["instances"]["p"]["failure_rate_threshold"]',
        "must be a number, got an integer too large for a float (1329 bits)",
        None,
        id="E004-float-overflow",  # was "cannot be built: OverflowError(...)"
    ),
    pytest.param(
        {"circuitbreakers": {"instances": {"p": {"failure_rate_threshold": 150}}}},
        "E004",
        f'{CB}["instances"]["p"]["failure_rate_threshold"]',
        "must be <= 100",
        None,
        id="E004-float-range",
    ),
    pytest.param(
        {
            "circuitbreakers": {
                "instances": {"p": {"record_exceptions": ["requests_typo.exceptions.Timeout"]}}
            }
        },
        "E004",
        f'{CB}["instances"]["p"]["record_exceptions"]',
        "cannot import 'requests_typo.exceptions.Timeout'",
        "full dotted path",
        id="E004-exception-path",
    ),
    pytest.param(
        {"circuitbreakers": {"instances": {"p": {"record_exceptions": ["os.sep"]}}}},
        "E004",
        f'{CB}["instances"]["p"]["record_exceptions"]',
        "is not an exception class",
        None,
        id="E004-not-exception",
    ),
    pytest.param(
        {"retries": {"instances": {"r": {"retry_on_result": "os.sep"}}}},
        "E004",
        'RATELIMIT_R4["retries"]["instances"]["r"]["retry_on_result"]',
        "must be callable",
        None,
        id="E004-not-callable",
    ),
    pytest.param(
        {
            "circuitbreakers": {
                "instances": {"p": {"enable_exponential_backoff": True, "enable_randomized_wait": True}}
            }
        },
        "E004",
        f'{CB}["instances"]["p"]["enable_randomized_wait"]',
        "cannot be combined",
        "Pick one",
        id="E004-cross-field",
    ),
    pytest.param(
        rl({"base_config": "slo"}, {"slow": {}}),
        "E005",
        f'{RL}["instances"]["api"]["base_config"]',
        "unknown config 'slo'",
        "Did you mean 'slow'?",
        id="E005-typo",
    ),
    pytest.param(
        rl({"base_config": "zzz"}),
        "E005",
        f'{RL}["instances"]["api"]["base_config"]',
        "unknown config 'zzz'",
        'Define it under RATELIMIT_R4["ratelimiters"]["configs"]',
        id="E005-none",
    ),
    pytest.param(
        rl({"base_config": 3}, {"slow": {}}),
        "E005",
        f'{RL}["instances"]["api"]["base_config"]',
        "unknown config 3",
        "Configured configs: slow.",
        id="E005-type",
    ),
    pytest.param(
        rl({"base_config": "a"}, {"a": {"base_config": "b"}, "b": {"base_config": "a"}}),
        "E006",
        f'{RL}["configs"]["b"]["base_config"]',
        "circular base_config: a -> b -> a",
        "Break the cycle",
        id="E006-cycle",
    ),
    pytest.param(
        rl(configs={"default": {"base_config": "x"}, "x": {}}),
        "E006",
        f'{RL}["configs"]["default"]["base_config"]',
        "cannot have a base_config",
        "Remove base_config",
        id="E006-default",
    ),
    pytest.param(
        rl({"key": "ipp"}),
        "E007",
        f'{RL}["instances"]["api"]["key"]',
        "unknown key 'ipp'",
        "Did you mean 'ip'?",
        id="E007-typo",
    ),
    pytest.param(
        rl({"key": "header:"}),
        "E007",
        f'{RL}["instances"]["api"]["key"]',
        "header name after 'header:' is empty",
        "'header:<Name>'",
        id="E007-header",
    ),
    pytest.param(
        rl({"key": "myapp_typo.keys.tenant"}),
        "E007",
        f'{RL}["instances"]["api"]["key"]',
        "cannot import key function 'myapp_typo.keys.tenant'",
        "dotted path to callable(request)",
        id="E007-import",
    ),
    pytest.param(
        rl({"key": 5}),
        "E007",
        f'{RL}["instances"]["api"]["key"]',
        "key must be a string or a callable",
        None,
        id="E007-type",
    ),
    pytest.param(
        rl({"max_keys": 0}),
        "E008",
        f'{RL}["instances"]["api"]["max_keys"]',
        "must be >= 1, got 0",
        None,
        id="E008-max-keys",
    ),
    pytest.param(
        rl({"key_idle_timeout": 300}),
        "E008",
        f'{RL}["instances"]["api"]["key_idle_timeout"]',
        "bare number 300 has no unit",
        "Write durations",
        id="E008-idle",
    ),
    pytest.param(
        {"bulkheads": {"instances": {"db": {"retry_after": "0s"}}}},
        "E008",
        f'{BH}["instances"]["db"]["retry_after"]',
        "must be longer than 0s",
        "Write durations",
        id="E008-retry-after",
    ),
    pytest.param(
        {
            "backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://127.0.0.1:6379/15"}},
            "bulkheads": {
                "instances": {"db": {"max_concurrent_calls": 25, "backend": "shared", "adaptive": {"algorithm": "aimd"}}}
            },
        },
        "E027",
        f'{BH}["instances"]["db"]["adaptive"]',
        "an adaptive limit is implemented by the in-process bulkhead only",
        "remove its backend",
        id="E027-redis-adaptive-bulkhead",
    ),
    pytest.param(
        rl({"rate": "100/s", "lease": 0}),
        "E031",
        f'{RL}["instances"]["api"]["lease"]',
        "must be >= 1, got 0",
        'e.g. "lease": 20',
        id="E031-lease-zero",
    ),
    pytest.param(
        rl({"rate": "100/s", "lease": "20"}),
        "E031",
        f'{RL}["instances"]["api"]["lease"]',
        "must be a positive integer (permits per round trip) or None, got '20'",
        'e.g. "lease": 20',
        id="E031-lease-type",
    ),
    pytest.param(
        rl({"rate": "100/s", "lease": 20}),
        "E031",
        f'{RL}["instances"]["api"]["lease"]',
        "lease 20 needs a redis backend (permits are leased from a budget shared through Redis), but backend "
        "'default' is per process",
        "at a redis entry of",
        id="E031-lease-memory",
    ),
    pytest.param(
        {
            "backend": "redis",
            "redis_url": "redis://127.0.0.1:6379/15",
            "ratelimiters": {"instances": {"api": {"rate": "100/s", "lease": 101}}},
        },
        "E031",
        f'{RL}["instances"]["api"]["lease"]',
        "lease 101 is larger than limit_for_period 100",
        "Use a lease from 1 to 100, e.g. 10",
        id="E031-lease-above-limit",
    ),
    pytest.param(
        {
            "backend": "redis",
            "redis_url": "redis://127.0.0.1:6379/15",
            "ratelimiters": {"instances": {"api": {"rate": "100/s", "lease": 10, "algorithm": "gcra"}}},
        },
        "E031",
        f'{RL}["instances"]["api"]["lease"]',
        "lease is implemented for algorithm 'cycle' only, got 'gcra'",
        "gcra and sliding_window have no cycles",
        id="E031-lease-gcra",
    ),
    pytest.param(
        rl({"algorithm": "token_bucket"}),
        "E004",
        f'{RL}["instances"]["api"]["algorithm"]',
        "must be one of 'cycle', 'gcra', 'sliding_window', got 'token_bucket'",
        "no boundary bursts",
        id="E004-algorithm",
    ),
    pytest.param(
        rl({"burst": 3}),
        "E004",
        f'{RL}["instances"]["api"]["burst"]',
        "applies only to algorithm 'gcra', but algorithm is 'cycle'",
        "set algorithm to 'gcra'",
        id="E004-burst-without-gcra",
    ),
    pytest.param(
        rl({"algorithm": "sliding_window", "rate": "200000/h"}),
        "E004",
        f'{RL}["instances"]["api"]["rate"]',
        "is at most 100000 with algorithm 'sliding_window'",
        "Use algorithm 'gcra' for large limits",
        id="E004-sliding-window-limit",
    ),
    pytest.param(
        {"backend": "memcached"},
        "E009",
        'RATELIMIT_R4["backend"]',
        "must be 'memory' or 'redis', got 'memcached'",
        None,
        id="E009",
    ),
    pytest.param(
        {"backend": "redis"},
        "E011",
        'RATELIMIT_R4["redis_url"]',
        "backend 'redis' needs redis_url",
        "redis://127.0.0.1:6379/0",
        id="E011-missing",
    ),
    pytest.param(
        {"backend": "redis", "redis_url": "http://cache:6379"},
        "E011",
        'RATELIMIT_R4["redis_url"]',
        "must be a redis://, rediss:// or unix:// URL",
        "For example",
        id="E011-scheme",
    ),
    pytest.param(
        {"backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://m/0", "OPTIONS": {"cluster": True, "sentinel": ["s:26379"]}}}},
        "E034",
        'RATELIMIT_R4["backends"]["shared"]["OPTIONS"]["sentinel"]',
        "either a Redis Cluster or a Sentinel-managed primary",
        "Remove",
        id="E034-cluster-and-sentinel",
    ),
    pytest.param(
        {"redis_fault_policy": "opne"},
        "E019",
        'RATELIMIT_R4["redis_fault_policy"]',
        "must be 'open' or 'closed', got 'opne'",
        "Did you mean 'open'?",
        id="E019-fault-policy",
    ),
    pytest.param(
        {"redis_key_prefix": ""},
        "E019",
        'RATELIMIT_R4["redis_key_prefix"]',
        "must be a non-empty string without spaces",
        "For example",
        id="E019-key-prefix",
    ),
    pytest.param(
        {"backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://r:6379/0", "OPTIONS": {"socket_timout": "50ms"}}}},
        "E002",
        'RATELIMIT_R4["backends"]["shared"]["OPTIONS"]["socket_timout"]',
        "unknown option 'socket_timout' for a redis backend",
        "Did you mean 'socket_timeout'?",
        id="E002-backend-options",
    ),
    pytest.param(
        {"backends": {"shared": {"backend": "redis", "LOCATION": "redis://r:6379/0"}}},
        "E002",
        'RATELIMIT_R4["backends"]["shared"]["backend"]',
        "unknown key 'backend' of a backend",
        "Did you mean 'BACKEND'?",
        id="E002-backend-entry",
    ),
    pytest.param(
        {"backends": [{"BACKEND": "redis"}]},
        "E003",
        'RATELIMIT_R4["backends"]',
        "must be a dict of name -> backend, got list",
        '{"shared": {"BACKEND": "redis"',
        id="E003-backends",
    ),
    pytest.param(
        {"backends": {"shared": {"BACKEND": "rediss", "LOCATION": "redis://r:6379/0"}}},
        "E009",
        'RATELIMIT_R4["backends"]["shared"]["BACKEND"]',
        "must be 'memory', 'redis' or a dotted path to a backend factory, got 'rediss'",
        "Did you mean 'redis'?",
        id="E009-BACKEND",
    ),
    pytest.param(
        {"backends": {"shared": {"BACKEND": "myapp.nowhere.Store"}}},
        "E009",
        'RATELIMIT_R4["backends"]["shared"]["BACKEND"]',
        "cannot import 'myapp.nowhere.Store'",
        "callable(alias, location, options) -> Store",
        id="E009-BACKEND-path",
    ),
    pytest.param(
        {"backends": {"shared": {"BACKEND": "redis", "LOCATION": "http://cache:6379"}}},
        "E011",
        'RATELIMIT_R4["backends"]["shared"]["LOCATION"]',
        "must be a redis://, rediss:// or unix:// URL, got 'http://cache:6379'",
        "For example",
        id="E011-LOCATION",
    ),
    pytest.param(
        {"backends": {"shared": {"BACKEND": "redis"}}},
        "E011",
        'RATELIMIT_R4["backends"]["shared"]["LOCATION"]',
        "a redis backend needs LOCATION",
        "redis://127.0.0.1:6379/0",
        id="E011-LOCATION-missing",
    ),
    pytest.param(
        {"backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://r/0", "OPTIONS": {"socket_timeout": 0.05}}}},
        "E019",
        'RATELIMIT_R4["backends"]["shared"]["OPTIONS"]["socket_timeout"]',
        "bare number 0.05 has no unit",
        "'500ms'",
        id="E019-backend-timeout",
    ),
    pytest.param(
        {"backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://r/0", "OPTIONS": {"max_connections": 0}}}},
        "E019",
        'RATELIMIT_R4["backends"]["shared"]["OPTIONS"]["max_connections"]',
        "must be an integer >= 1, got 0",
        "Connections per pool",
        id="E019-backend-max-connections",
    ),
    pytest.param(
        {
            "backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://r:6379/0"}},
            "ratelimiters": {"instances": {"api": {"backend": "shraed"}}},
        },
        "E028",
        f'{RL}["instances"]["api"]["backend"]',
        "unknown backend 'shraed'; configured: 'default', 'shared'",
        "Did you mean 'shared'?",
        id="E028",
    ),
    pytest.param(
        rl(configs={"default": {"backend": "elsewhere"}}),
        "E028",
        f'{RL}["configs"]["default"]["backend"]',
        "unknown backend 'elsewhere'",
        'RATELIMIT_R4["backends"]["elsewhere"] = {"BACKEND": "redis"',
        id="E028-inherited",
    ),
    pytest.param(
        {
            "backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://r:6379/0"}},
            "circuitbreakers": {"instances": {"partner": {"backend": "shraed"}}},
        },
        "E028",
        'RATELIMIT_R4["circuitbreakers"]["instances"]["partner"]["backend"]',
        "unknown backend 'shraed'; configured: 'default', 'shared'",
        "Did you mean 'shared'?",
        id="E028-circuitbreaker",
    ),
    pytest.param(
        {
            "backends": {"local": {"BACKEND": "memory"}},
            "circuitbreakers": {"instances": {"partner": {"backend": "local"}}},
        },
        "E033",
        'RATELIMIT_R4["circuitbreakers"]["instances"]["partner"]["backend"]',
        "backend 'local' is a memory backend, but a circuit breaker's backend must be a redis backend",
        "to keep the breaker per process",
        id="E033",
    ),
    pytest.param(
        rl({"on_backend_error": "alow"}),
        "E029",
        f'{RL}["instances"]["api"]["on_backend_error"]',
        "must be 'local', 'allow' or 'deny', got 'alow'",
        "Did you mean 'allow'?",
        id="E029",
    ),
    pytest.param(
        rl({"on_backend_error": "open"}),
        "E029",
        f'{RL}["instances"]["api"]["on_backend_error"]',
        "must be 'local', 'allow' or 'deny', got 'open'",
        "redis_fault_policy 'open' is written 'allow' here.",
        id="E029-old-word",
    ),
    pytest.param(
        {"backend": "redis", "backends": {"default": {"BACKEND": "memory"}}},
        "E030",
        'RATELIMIT_R4["backends"]["default"]',
        "set twice: here and by the top-level shorthand backend",
        "move backend into backends['default']",
        id="E030",
    ),
    pytest.param(
        {"control": {"backend": "shraed"}, "backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://r:6379/0"}}},
        "E032",
        'RATELIMIT_R4["control"]["backend"]',
        "names no entry of RATELIMIT_R4[\"backends\"]: 'shraed'",
        "Did you mean 'shared'?",
        id="E032-unknown-backend",
    ),
    pytest.param(
        {"control": {"backend": "default"}},
        "E032",
        'RATELIMIT_R4["control"]["backend"]',
        "backend 'default' is 'memory'; the control plane needs a redis backend",
        "r4 commands reach one worker",
        id="E032-memory",
    ),
    pytest.param(
        {"control": {"backend": "default", "heartbeat_interval": "10ms"}, "backend": "redis", "redis_url": "redis://r/0"},
        "E032",
        'RATELIMIT_R4["control"]["heartbeat_interval"]',
        "must be between 100ms and 1h, got 10ms",
        "the default \"5s\" suits most",
        id="E032-interval",
    ),
    pytest.param(
        {"control": "shared"},
        "E032",
        'RATELIMIT_R4["control"]',
        "must be a dict, got str",
        '{"backend": "shared", "heartbeat_interval": "5s"}',
        id="E032-not-a-dict",
    ),
    pytest.param(
        {"headers": "draft10"},
        "E012",
        'RATELIMIT_R4["headers"]',
        "must be 'draft-10', 'draft-6' or None, got 'draft10'",
        "Did you mean 'draft-10'?",
        id="E012",
    ),
    pytest.param(
        {"response_builder": "myproject_typo.responses.build"},
        "E013",
        'RATELIMIT_R4["response_builder"]',
        "cannot import 'myproject_typo.responses.build'",
        "callable(request, exc)",
        id="E013-import",
    ),
    pytest.param(
        {"response_builder": "os.sep"},
        "E013",
        'RATELIMIT_R4["response_builder"]',
        "must be callable",
        None,
        id="E013-callable",
    ),
    pytest.param(
        {"trusted_proxies": ["10.0.0.0/8", "10.0.0.0/33", "proxy"]},
        "E014",
        'RATELIMIT_R4["trusted_proxies"]',
        "not valid CIDR networks: '10.0.0.0/33'",
        "e.g. '10.0.0.0/8'",
        id="E014-cidr",
    ),
    pytest.param(
        {"trusted_proxies": "10.0.0.0/8"},
        "E014",
        'RATELIMIT_R4["trusted_proxies"]',
        "must be an integer or a list of CIDR strings",
        "number of proxies",
        id="E014-str",
    ),
    pytest.param(
        {"trusted_proxies": -1},
        "E014",
        'RATELIMIT_R4["trusted_proxies"]',
        "must be >= 0, got -1",
        None,
        id="E014-negative",
    ),
    pytest.param(
        {"forwarded_header": "x-real-ip"},
        "E020",
        'RATELIMIT_R4["forwarded_header"]',
        "must be one of 'auto', 'x-forwarded-for', 'forwarded', got 'x-real-ip'",
        "Pin the header your proxy writes",
        id="E020",
    ),
    pytest.param(
        {"ipv6_prefix_length": 129},
        "E015",
        'RATELIMIT_R4["ipv6_prefix_length"]',
        "must be an integer from 1 to 128, got 129",
        "/64",
        id="E015",
    ),
    pytest.param(
        {"state_endpoint_token": ""},
        "E016",
        'RATELIMIT_R4["state_endpoint_token"]',
        "must be a non-empty string or None",
        "secrets.token_urlsafe",
        id="E016",
    ),
    pytest.param(
        {"stall_detector": {"enabled": "yes"}},
        "E017",
        'RATELIMIT_R4["stall_detector"]["enabled"]',
        "must be True or False",
        None,
        id="E017-enabled",
    ),
    pytest.param(
        {"stall_detector": {"threshold": 20}},
        "E017",
        'RATELIMIT_R4["stall_detector"]["threshold"]',
        "bare number 20 has no unit",
        "Write durations",
        id="E017-threshold",
    ),
    pytest.param(
        {"metrics": "yes"},
        "E018",
        'RATELIMIT_R4["metrics"]',
        "must be True or False, got 'yes'",
        None,
        id="E018",
    ),
    pytest.param(
        rl({"rate": "5/m", "limit_for_period": 5}),
        "E021",
        f'{RL}["instances"]["api"]["rate"]',
        "'rate' stands for limit_for_period and limit_refresh_period, but limit_for_period is set too",
        "Keep one spelling",
        id="E021-rate-and-limit",
    ),
    pytest.param(
        rl(configs={"default": {"rate": "10/s", "limit_refresh_period": "1m"}}),
        "E021",
        f'{RL}["configs"]["default"]["rate"]',
        "but limit_refresh_period is set too",
        "Keep one spelling",
        id="E021-in-a-config",
    ),
    pytest.param(
        rl({"rate": "5/ms"}),
        "E004",
        f'{RL}["instances"]["api"]["rate"]',
        "unknown unit 'ms'",
        '{"rate": "5/m"}',
        id="E004-rate-unit",
    ),
    pytest.param(
        rl({"rate": "5 per minute"}),
        "E004",
        f'{RL}["instances"]["api"]["rate"]',
        "'5 per minute' is not a rate",
        '{"rate": "100/5m"}',
        id="E004-rate-syntax",
    ),
    pytest.param(
        rl({"limit_for_period": "5/m"}),
        "E004",
        f'{RL}["instances"]["api"]["limit_for_period"]',
        "must be an integer, got '5/m'",
        'A rate is written as {"rate": "5/m"}, not as limit_for_period.',
        id="E004-rate-in-limit_for_period",
    ),
    pytest.param(
        rl({"limit_refresh_period": "100/5m"}),
        "E004",
        f'{RL}["instances"]["api"]["limit_refresh_period"]',
        "is not a duration",
        'A rate is written as {"rate": "100/5m"}, not as limit_refresh_period.',
        id="E004-rate-in-limit_refresh_period",
    ),
    pytest.param(
        rl({"throttle_rate": "3/min"}),
        "E002",
        f'{RL}["instances"]["api"]["throttle_rate"]',
        "unknown option 'throttle_rate'",
        'Write the rate as {"rate": "3/min"}.',
        id="E002-rate-under-another-name",
    ),
    pytest.param(
        {"bulkheads": {"instances": {"reports": {"rate": "5/m"}}}},
        "E002",
        f'{BH}["instances"]["reports"]["rate"]',
        "unknown option 'rate' for bulkheads",
        "'rate' belongs to ratelimiters, not bulkheads.",
        id="E002-rate-on-a-bulkhead",
    ),
    pytest.param(
        {"rate": "5/m"},
        "E002",
        'RATELIMIT_R4["rate"]',
        "unknown key 'rate'",
        '{"ratelimiters": {"instances": {"api": {"rate": "5/m"}}}}',
        id="E002-rate-at-the-top",
    ),
    pytest.param(
        rl({"limit_for_period": 2**53}),
        "E004",
        f'{RL}["instances"]["api"]["limit_for_period"]',
        "must be <= 999999999999999, got 9007199254740992",
        None,
        id="E004-limit-beyond-exact",
    ),
    pytest.param(
        rl({"limit_refresh_period": "100000000000000000000000000d"}),
        "E004",
        f'{RL}["instances"]["api"]["limit_refresh_period"]',
        "must be at most 366d",
        "more than a year",
        id="E004-period-of-centuries",
    ),
    pytest.param(
        rl({"rate": "1/1000d"}),
        "E004",
        f'{RL}["instances"]["api"]["rate"]',
        "must be at most 366d, got 1000d",
        "more than a year",
        id="E004-rate-period-too-long",
    ),
    pytest.param(
        rl({"timeout_duration": "367d"}),
        "E004",
        f'{RL}["instances"]["api"]["timeout_duration"]',
        "must be at most 366d, got 367d",
        None,
        id="E004-timeout-too-long",
    ),
    pytest.param(
        {"circuitbreakers": {"instances": {"pay": {"wait_duration_in_open_state": "400d"}}}},
        "E004",
        f'{CB}["instances"]["pay"]["wait_duration_in_open_state"]',
        "must be at most 366d, got 400d",
        None,
        id="E004-open-time-too-long",
    ),
    pytest.param(
        {"bulkheads": {"instances": {"reports": {"retry_after": "1000d"}}}},
        "E008",
        f'{BH}["instances"]["reports"]["retry_after"]',
        "must be at most 366d, got 1000d",
        "sent as Retry-After",
        id="E008-retry-after-too-long",
    ),
    pytest.param(
        {
            "backend": "redis",
            "redis_url": "redis://127.0.0.1:6379/15",
            "ratelimiters": {
                "configs": {"default": {"limit_refresh_period": "1000000000000001ns"}},
                "instances": {"api": {}},
            },
        },
        "E004",
        f'{RL}["configs"]["default"]["limit_refresh_period"]',
        "counted in microseconds by the Redis backend and must be a whole number of them",
        "whole microseconds",
        id="E004-redis-long-period-not-whole-microseconds",
    ),
    pytest.param(  # issue 13: 86399 per day in units of 1/86399 ns overflows the script's exact integers
        {
            "backend": "redis",
            "redis_url": "redis://127.0.0.1:6379/15",
            "ratelimiters": {"instances": {"api": {"rate": "86399/d", "algorithm": "gcra"}}},
        },
        "E004",
        f'{RL}["instances"]["api"]["rate"]',
        "algorithm 'gcra' on Redis cannot keep limit 86399 per 86400000000000 ns with burst 86399 exact",
        "a rounder limit (a divisor of the period in ns",
        id="E004-redis-gcra-rate-not-exact",
    ),
    pytest.param(
        {
            "backend": "redis",
            "redis_url": "redis://127.0.0.1:6379/15",
            "ratelimiters": {"instances": {"api": {"rate": "4/s", "algorithm": "gcra", "burst": 10**9}}},
        },
        "E004",
        f'{RL}["instances"]["api"]["rate"]',
        "algorithm 'gcra' on Redis cannot keep limit 4 per 1000000000 ns with burst 1000000000 exact",
        "a smaller burst",
        id="E004-redis-gcra-burst-not-exact",
    ),
    pytest.param(
        {"enabled": "false"},
        "E023",
        'RATELIMIT_R4["enabled"]',
        "must be True or False, got 'false'",
        "pass-through",
        id="E023",
    ),
    pytest.param(
        {"circuitbreakers": {"instances": {"pay": {"record_exception": "myapp.resilience.is_5xx"}}}},
        "E004",
        f'{CB}["instances"]["pay"]["record_exception"]',
        "cannot import 'myapp.resilience.is_5xx'",
        "full dotted path",
        id="E004-record-exception-path",
    ),
    pytest.param(
        {"circuitbreakers": {"instances": {"pay": {"ignore_exception": 404}}}},
        "E004",
        f'{CB}["instances"]["pay"]["ignore_exception"]',
        "must be callable or a dotted path to a callable, got 404",
        "dotted path as a string",
        id="E004-ignore-exception-not-callable",
    ),
    pytest.param(
        {"circuitbreakers": {"instances": {"pay": {"wait_interval_function_in_open_state": "tests.views.nope"}}}},
        "E004",
        f'{CB}["instances"]["pay"]["wait_interval_function_in_open_state"]',
        "cannot import 'tests.views.nope'",
        "full dotted path",
        id="E004-open-interval-function-path",
    ),
    pytest.param(
        {"retries": {"instances": {"up": {"retry_on_exception": "tests.views.no_such_predicate"}}}},
        "E004",
        'RATELIMIT_R4["retries"]["instances"]["up"]["retry_on_exception"]',
        "cannot import 'tests.views.no_such_predicate'",
        "full dotted path",
        id="E004-retry-on-exception-path",
    ),
    pytest.param(
        {"retries": {"instances": {"up": {"interval_function": "tests.views.upstream_retry_after",
                                          "enable_exponential_backoff": True}}}},
        "E004",
        'RATELIMIT_R4["retries"]["instances"]["up"]["interval_function"]',
        "cannot be combined with enable_exponential_backoff",
        "Compute the backoff in the function",
        id="E004-interval-function-twice",
    ),
    pytest.param(
        {"retries": {"instances": {"up": {"wait_duration": "500us", "enable_randomized_wait": True}}}},
        "E004",
        'RATELIMIT_R4["retries"]["instances"]["up"]["wait_duration"]',
        "must be at least 1ms with exponential or randomized backoff, got 500us",
        "whole milliseconds",
        id="E004-retry-interval-below-1ms",
    ),
    pytest.param(
        {"state_endpoint_token": "short"},
        "W003",
        'RATELIMIT_R4["state_endpoint_token"]',
        "5 characters long",
        "at least 32 random characters",
        id="W003",
    ),
    pytest.param(
        {"trusted_proxies": ["10.0.0.0/8", "0.0.0.0/0"]},
        "W006",
        'RATELIMIT_R4["trusted_proxies"]',
        "0.0.0.0/0 trusts public addresses no proxy fleet spans",
        "or give their count",
        id="W006",
    ),
    pytest.param(
        {"ipv6_prefix_length": 24},
        "W008",
        'RATELIMIT_R4["ipv6_prefix_length"]',
        "24 groups IPv6 clients by their /24, but a /32 is what a whole ISP is typically given: one per-IP budget",
        "48-64 is usual; 64 is one customer's subnet",
        id="W008",
    ),
    pytest.param(
        # A ceiling: 100 000 clients each holding its 100 000 permits in the window, 80 GB per worker. A log
        # grows with use, so a client that makes up X-Api-Key values no longer costs 800 KB a request.
        rl({"limit_for_period": 100_000, "algorithm": "sliding_window", "key": "header:X-Api-Key"}),
        "W005",
        f'{RL}["instances"]["api"]',
        "if up to 100000 clients (max_keys) used their 100000 permits within one period, that is 100000 x "
        "(8 bytes x limit_for_period 100000 + 360) = 80.0 GB per process (a client of one request costs about "
        "392 bytes)",
        "If clients can use that many permits in one period: use algorithm 'gcra'",
        id="W005",
    ),
]


@pytest.mark.parametrize(("setting", "code", "path", "text", "hint"), CASES)
def test_each_mistake_has_its_id_path_message_and_hint(setting, code, path, text, hint) -> None:
    with override_settings(RATELIMIT_R4=setting):
        messages = ours(check_settings())
    matching = [m for m in messages if m.id == f"ratelimit_r4.{code}"]
    assert len(matching) == 1, [(m.id, m.msg) for m in messages]
    message = matching[0]
    assert message.msg.startswith(path + ": "), message.msg
    assert text in message.msg, message.msg
    if hint is None:
        assert message.hint is None or message.hint
    else:
        assert message.hint and hint in message.hint, message.hint
    assert message.is_serious() == code.startswith("E")


@pytest.mark.parametrize(
    ("setting", "code", "path", "text", "hint"), [c for c in CASES if c.values[1].startswith("E")][::5]
)
def test_manage_py_check_fails_with_the_formatted_message(setting, code, path, text, hint) -> None:
    with override_settings(RATELIMIT_R4=setting), pytest.raises(SystemCheckError) as info:
        call_command("check")
    output = str(info.value)
    assert f"(ratelimit_r4.{code}) {path}: " in output
    assert text in output
    if hint:
        assert f"HINT: {hint}" in output or hint in output


def _redis_url_settings(url: object) -> list[dict]:
    return [
        {"backend": "redis", "redis_url": url},
        {"backends": {"shared": {"BACKEND": "redis", "LOCATION": url}}},
    ]


@pytest.mark.parametrize(
    "setting",
    [
        setting
        for url in (
            "http://user:s3cret-pw@cache:6379/0",  # a wrong scheme, password written
            "redis//:s3cret-pw@cache:6379/0",  # a missing ":": no "://" to split the user part at
            "cache:6379/0?password=s3cret-pw",  # no scheme, password in the query
            b"redis://:s3cret-pw@cache:6379/0",  # bytes, not str
        )
        for setting in _redis_url_settings(url)
    ],
)
def test_a_wrong_redis_url_is_reported_without_its_password(setting: dict) -> None:
    with override_settings(RATELIMIT_R4=setting):
        messages = ours(check_settings())
    assert [m.id for m in messages if m.id == "ratelimit_r4.E011"] == ["ratelimit_r4.E011"], messages
    shown = " ".join(f"{m.msg} {m.hint}" for m in messages)
    assert "s3cret-pw" not in shown, shown
    assert "***" in shown or "bytes" in shown, shown


@pytest.mark.parametrize(
    "setting",
    [
        setting
        for url in (
            "redis://:s3cret-pw@cache:abc/0",  # a port that is not a number
            "redis://:s3cret-pw@cache:99999/0",  # a port out of range
            "redis://:s3cret-pw@[::1/0",  # an IPv6 host without its closing bracket
            "redis://:s3cret-pw@cache:6379/0?db=zero",  # a query value redis-py cannot read
            "redis://:s3cret-pw@cache:6379/O",  # a db that is not a number: redis-py would silently use db 0
        )
        for setting in (
            {"backend": "redis", "redis_url": url},
            {"backends": {"default": {"BACKEND": "redis", "LOCATION": url}}},
        )
    ],
)
def test_a_malformed_redis_url_is_e011_not_a_crash_of_the_check_or_a_500(setting: dict) -> None:
    from django.http import HttpResponse
    from django.test import RequestFactory

    from django_ratelimit_r4.decorators import ratelimit

    with override_settings(RATELIMIT_R4={**setting, "ratelimiters": {"instances": {"api": {"rate": "5/m"}}}}):
        messages = ours(check_settings())  # raised ValueError ("Invalid IPv6 URL") for the bracket
        assert [m.id for m in messages if m.id == "ratelimit_r4.E011"] == ["ratelimit_r4.E011"], messages
        shown = " ".join(f"{m.msg} {m.hint}" for m in messages)
        assert "s3cret-pw" not in shown, shown

        @ratelimit("api")
        def view(request: object) -> HttpResponse:
            return HttpResponse("ok")

        # A request says what the check says (it was a ValueError from redis-py: a 500 on every request).
        from django.core.exceptions import ImproperlyConfigured

        with pytest.raises(ImproperlyConfigured, match=r"redis_url|LOCATION") as raised:
            view(RequestFactory().get("/"))
        assert "s3cret-pw" not in str(raised.value)



@pytest.mark.parametrize(
    "token",
    [
        "s3cret-token-0123456789\x00012345678901234567",
        "s3cret-token-0123456789\x1b[2J012345678901234",
        "s3cret-t\u00f8ken-\u20ac-0123456789012345678901234567",  # curl sends UTF-8, Django reads latin-1
        b"s3cret-token-as-bytes-0123456789012345678",
    ],
    ids=["nul", "escape", "non-ascii", "bytes"],
)
def test_a_state_endpoint_token_no_client_can_send_is_e016_and_the_check_does_not_show_it(token: object) -> None:
    # No request carries it as written (and r4 --url died on urllib's ValueError, which printed it); a bytes token
    # was echoed by E016 as written.
    with override_settings(RATELIMIT_R4={"state_endpoint_token": token}):
        messages = ours(check_settings())
    assert [m.id for m in messages] == ["ratelimit_r4.E016"], messages
    shown = " ".join(f"{m.msg} {m.hint}" for m in messages)
    assert "s3cret" not in shown, shown


@pytest.mark.parametrize("written", ["\n", "\r\n", " "], ids=["newline", "crlf", "space"])
def test_a_state_endpoint_token_read_from_a_file_is_stripped_as_the_endpoint_strips_what_it_is_sent(
    written: str, client: object
) -> None:
    # Path(...).read_text() keeps the line ending: the endpoint compared the stripped credentials with it, so no
    # bearer request ever matched (a 404 each, no word why).
    token = "token-read-from-a-file-0123456789abcdef"
    with override_settings(RATELIMIT_R4={"state_endpoint_token": token + written}, ROOT_URLCONF="tests.state_urls"):
        assert ours(check_settings()) == []
        assert conf.get_options().state_endpoint_token == token
        from django.urls import reverse

        url = reverse("ratelimit_r4:state")
        assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200  # type: ignore[attr-defined]


@pytest.mark.parametrize(("length", "expected"), [(1, ["W008"]), (31, ["W008"]), (32, []), (48, []), (64, []), (128, [])])
def test_an_ipv6_prefix_shorter_than_32_is_w008(length: int, expected: list[str], r4_clock: object) -> None:
    from django.http import HttpResponse
    from django.test import RequestFactory

    from django_ratelimit_r4.decorators import ratelimit

    setting = {"ipv6_prefix_length": length, "ratelimiters": {"instances": {"per_ip": {"rate": "2/m", "key": "ip"}}}}
    with override_settings(RATELIMIT_R4=setting):
        assert [m.id.removeprefix("ratelimit_r4.") for m in ours(check_settings())] == expected

        @ratelimit("per_ip")
        def view(request: object) -> HttpResponse:
            return HttpResponse("ok")

        # Clients of two ISPs' /32s (2001:db8::/32, 2001:db9::/32) share one budget below /32: what W008 warns of.
        addresses = ("2001:db8::7", "2001:db9::7", "2001:db8:1::1")
        codes = [view(RequestFactory().get("/", REMOTE_ADDR=a)).status_code for a in addresses]
        assert codes == ([200, 200, 429] if length < 32 else [200, 200, 200]), length


def test_an_invalid_ipv6_prefix_is_e015_only() -> None:
    with override_settings(RATELIMIT_R4={"ipv6_prefix_length": 0}):
        assert [m.id for m in ours(check_settings())] == ["ratelimit_r4.E015"]


@pytest.mark.parametrize(
    ("proxies", "peer"),
    [
        (["0.0.0.0/0"], "198.51.100.7"),
        (["::/0"], "2001:db8::7"),
        (["10.0.0.0/8", "0.0.0.0/1"], "98.51.100.7"),
        (["::ffff:0.0.0.0/96"], "198.51.100.7"),
        (["unix", "2000::/3"], "2001:db8::7"),
    ],
)
def test_trusting_the_whole_internet_as_proxies_is_w006(proxies: list[str], peer: str, r4_clock: object) -> None:
    # Every peer is then a trusted proxy: any client picks its own address with X-Forwarded-For, and a
    # per-IP limit is a fresh budget per forged header. manage.py check said nothing.
    from django.http import HttpResponse
    from django.test import RequestFactory

    from django_ratelimit_r4.decorators import ratelimit

    setting = {"trusted_proxies": proxies, "ratelimiters": {"instances": {"per_ip": {"rate": "1/m", "key": "ip"}}}}
    with override_settings(RATELIMIT_R4=setting):
        messages = ours(check_settings())
        assert [m.id for m in messages] == ["ratelimit_r4.W006"], messages
        assert messages[0].msg.startswith('RATELIMIT_R4["trusted_proxies"]')
        assert "X-Forwarded-For" in messages[0].msg and "count" in messages[0].hint

        @ratelimit("per_ip")
        def view(request: object) -> HttpResponse:
            return HttpResponse("ok")

        forged = [view(RequestFactory().get("/", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=f"203.0.113.{i}"))
                  for i in range(3)]
        assert [r.status_code for r in forged] == [200, 200, 200]  # what W006 warns of


@pytest.mark.parametrize(
    "proxies",
    [["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "unix"], ["173.245.48.0/20", "2400:cb00::/32"], 2],
)
def test_proxy_networks_of_one_fleet_are_not_w006(proxies: object) -> None:
    with override_settings(RATELIMIT_R4={"trusted_proxies": proxies}):
        assert ours(check_settings()) == []


def store_factory_without_options(alias, location):  # forgot the third argument
    from django_ratelimit_r4.backends.memory import MemoryStore

    return MemoryStore(alias, location, {})


def test_a_backend_factory_that_cannot_take_alias_location_options_is_e009_not_a_500_per_request() -> None:
    # It passed manage.py check (E009 asks only for a callable) and every request through a limiter on it
    # raised TypeError when the registry built the store: a 500 each time, the store never built.
    from django.http import HttpResponse
    from django.test import RequestFactory

    from django_ratelimit_r4.decorators import ratelimit

    setting = {
        "backends": {"default": {"BACKEND": "tests.test_checks.store_factory_without_options"}},
        "ratelimiters": {"instances": {"api": {"rate": "5/m"}}},
    }
    with override_settings(RATELIMIT_R4=setting):
        messages = ours(check_settings())
        assert [m.id for m in messages] == ["ratelimit_r4.E009"], messages
        assert "cannot be called as factory(alias, location, options)" in messages[0].msg

        @ratelimit("api")
        def view(request: object) -> HttpResponse:
            return HttpResponse("ok")

        from django.core.exceptions import ImproperlyConfigured

        with pytest.raises(ImproperlyConfigured, match=r'RATELIMIT_R4\["backends"\]\["default"\]'):
            view(RequestFactory().get("/"))

EVERYTHING_WRONG = {
    "ratelimiter": {},
    "ratelimiters": {
        "configs": {
            "default": {"limit_refresh_period": 500},
            "a": {"base_config": "b"},
            "b": {"base_config": "a"},
        },
        "instances": {
            "api": {"limit_for_perod": 10, "key": "ipp", "max_keys": 0},
            "search": {"base_config": "slo"},
            "burst": {"limit_for_period": -1, "timeout_duration": "5 seconds"},
        },
    },
    "bulkheads": {"instances": {"db": {"max_concurrent_calls": "ten", "retry_after": 1}}},
    "circuitbreakers": {
        "instances": {"p": {"record_exceptions": ["nope_pkg.Error"], "sliding_window_type": "COUNTED"}}
    },
    "retries": [],
    "timelimiters": {"instances": {"t": {"timeout_duration": 0}}},
    "backend": "redis",
    "headers": "draft-7",
    "response_builder": "nope_pkg.build",
    "trusted_proxies": ["10.0.0.1/40"],
    "ipv6_prefix_length": 0,
    "state_endpoint_token": 42,
    "stall_detector": {"enabled": 1, "threshold": "fast"},
    "metrics": None,
}


def test_every_mistake_is_reported_at_once() -> None:
    with override_settings(RATELIMIT_R4=EVERYTHING_WRONG):
        messages = ours(check_settings())
        with pytest.raises(SystemCheckError) as info:
            call_command("check")
    paths = {m.msg.split(": ", 1)[0] for m in messages}
    expected_paths = {
        'RATELIMIT_R4["ratelimiter"]',
        f'{RL}["configs"]["default"]["limit_refresh_period"]',
        f'{RL}["configs"]["b"]["base_config"]',
        f'{RL}["instances"]["api"]["limit_for_perod"]',
        f'{RL}["instances"]["api"]["key"]',
        f'{RL}["instances"]["api"]["max_keys"]',
        f'{RL}["instances"]["search"]["base_config"]',
        f'{RL}["instances"]["burst"]["limit_for_period"]',
        f'{RL}["instances"]["burst"]["timeout_duration"]',
        f'{BH}["instances"]["db"]["max_concurrent_calls"]',
        f'{BH}["instances"]["db"]["retry_after"]',
        f'{CB}["instances"]["p"]["record_exceptions"]',
        f'{CB}["instances"]["p"]["sliding_window_type"]',
        'RATELIMIT_R4["retries"]',
        'RATELIMIT_R4["timelimiters"]["instances"]["t"]["timeout_duration"]',
        'RATELIMIT_R4["redis_url"]',
        'RATELIMIT_R4["headers"]',
        'RATELIMIT_R4["response_builder"]',
        'RATELIMIT_R4["trusted_proxies"]',
        'RATELIMIT_R4["ipv6_prefix_length"]',
        'RATELIMIT_R4["state_endpoint_token"]',
        'RATELIMIT_R4["stall_detector"]["enabled"]',
        'RATELIMIT_R4["stall_detector"]["threshold"]',
        'RATELIMIT_R4["metrics"]',
    }
    assert paths == expected_paths
    # Each mistake once, even when several instances inherit the same broken config.
    assert len(messages) == len({(m.id, m.msg) for m in messages})
    assert len(messages) == len(expected_paths)
    output = str(info.value)
    assert f"identified {len(messages)} issues" in output or all(m.msg in output for m in messages)


def test_inherited_mistakes_are_reported_once_where_they_were_written() -> None:
    setting = rl(configs={"default": {"limit_refresh_period": 500}})
    setting["ratelimiters"]["instances"].update({"b": {}, "c": {"limit_for_period": 1}})
    with override_settings(RATELIMIT_R4=setting):
        messages = ours(check_settings())
    assert [(m.id, m.msg.split(": ")[0]) for m in messages] == [
        ("ratelimit_r4.E004", f'{RL}["configs"]["default"]["limit_refresh_period"]')
    ]


def test_the_test_settings_are_clean() -> None:
    assert ours(check_settings()) == []
    out = io.StringIO()
    call_command("check", stdout=out, stderr=out)
    assert "ratelimit_r4" not in out.getvalue()


def test_no_setting_at_all_is_clean() -> None:
    from django.conf import settings

    with override_settings():
        del settings.RATELIMIT_R4
        assert ours(check_settings()) == []


def test_a_dotted_path_whose_module_raises_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "r4_exploding_module.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    setting = {
        "ratelimiters": {"instances": {"api": {"key": "r4_exploding_module.key"}}},
        "circuitbreakers": {"instances": {"p": {"record_result": "r4_exploding_module.pred"}}},
        "response_builder": "r4_exploding_module.build",
    }
    with override_settings(RATELIMIT_R4=setting):
        messages = ours(check_settings())
    assert sorted(m.id for m in messages) == ["ratelimit_r4.E004", "ratelimit_r4.E007", "ratelimit_r4.E013"]
    assert all("boom at import" in m.msg for m in messages), [m.msg for m in messages]


# ------------------------------------------------------------------------------- environment checks


def test_redis_backend_without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = conf.importlib.util.find_spec
    monkeypatch.setattr(
        conf.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "redis" else real_find_spec(name, *a),
    )
    with override_settings(RATELIMIT_R4={"backend": "redis", "redis_url": "redis://127.0.0.1:6379/0"}):
        messages = ours(check_settings())
    assert [m.id for m in messages] == ["ratelimit_r4.E010"]
    assert messages[0].msg.startswith('RATELIMIT_R4["backend"]: ')
    assert "pip install 'django-ratelimit-r4[redis]'" in messages[0].hint


def test_a_redis_backends_entry_without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = conf.importlib.util.find_spec
    monkeypatch.setattr(
        conf.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "redis" else real_find_spec(name, *a),
    )
    setting = {
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://127.0.0.1:6379/0"}},
        "ratelimiters": {"instances": {"api": {"backend": "shared"}, "pool": {}}},
    }
    with override_settings(RATELIMIT_R4=setting):
        messages = ours(check_settings())
    assert [m.id for m in messages] == ["ratelimit_r4.E010"]
    assert messages[0].msg.startswith('RATELIMIT_R4["backends"]["shared"]["BACKEND"]: ')
    assert "pip install 'django-ratelimit-r4[redis]'" in messages[0].hint
    analysis = conf.analyse(setting)
    assert list(analysis.specs["ratelimiters"]) == ["pool"]  # only the instance on that backend is broken
    assert [p.check_id for p in analysis.broken["ratelimiters"]["api"]] == ["ratelimit_r4.E010"]


def test_multiprocess_warning_names_only_the_per_process_limiters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEB_CONCURRENCY", "4")
    setting = {
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://r:6379/0"}},
        "ratelimiters": {"instances": {"global": {"backend": "shared"}, "pool": {}}},
    }
    with override_settings(RATELIMIT_R4=setting):
        messages = ours(check_settings())
    assert [m.id for m in messages] == ["ratelimit_r4.W001"]
    assert "rate limiters 'pool' keep their state in memory" in messages[0].msg
    setting["ratelimiters"]["instances"]["pool"] = {"backend": "shared"}
    with override_settings(RATELIMIT_R4=setting):
        assert ours(check_settings()) == []


def test_redis_backend_with_package_and_url_is_clean() -> None:
    with override_settings(
        RATELIMIT_R4={
            "backend": "redis",
            "redis_url": "rediss://cache:6380/1",
            "ratelimiters": {"instances": {"a": {"limit_refresh_period": "1s"}}},
        }
    ):
        assert ours(check_settings()) == []


def test_metrics_true_without_prometheus_client_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = checks.importlib.util.find_spec
    monkeypatch.setattr(
        checks.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "prometheus_client" else real_find_spec(name, *a),
    )
    with override_settings(RATELIMIT_R4={"metrics": True}):
        messages = ours(check_settings())
    assert [m.id for m in messages] == ["ratelimit_r4.W002"]
    assert messages[0].msg.startswith('RATELIMIT_R4["metrics"]: ')
    assert "[prometheus]" in messages[0].hint
    with override_settings(RATELIMIT_R4={}):  # the default (not written) never warns
        assert ours(check_settings()) == []


@pytest.mark.parametrize(
    ("environ", "argv", "expected"),
    [
        ({"WEB_CONCURRENCY": "4"}, ["manage.py", "check"], "WEB_CONCURRENCY=4"),
        ({"GUNICORN_CMD_ARGS": "--bind 0.0.0.0:8000 -w 3"}, ["manage.py"], "GUNICORN_CMD_ARGS workers=3"),
        ({"GUNICORN_CMD_ARGS": "--workers=2 --threads 4"}, ["manage.py"], "GUNICORN_CMD_ARGS workers=2"),
        ({}, ["/venv/bin/gunicorn", "proj.wsgi", "-w4"], "--workers 4 on the command line"),
        (
            {},
            ["/venv/bin/uvicorn", "proj.asgi:application", "--workers", "2"],
            "--workers 2 on the command line",
        ),
        (
            {"SERVER_SOFTWARE": "gunicorn/23.0.0"},
            ["x"],
            "SERVER_SOFTWARE=gunicorn/23.0.0 (worker count unknown)",
        ),
        ({"WEB_CONCURRENCY": "1", "SERVER_SOFTWARE": "gunicorn/23.0.0"}, ["x"], None),
        ({"WEB_CONCURRENCY": "1"}, ["/venv/bin/gunicorn", "-w", "1"], None),
        ({"WEB_CONCURRENCY": "lots"}, ["manage.py"], None),
        ({"GUNICORN_CMD_ARGS": "--threads 8"}, ["manage.py", "check", "-w", "9"], None),
        ({}, ["manage.py", "runserver"], None),
    ],
)
def test_detect_multiprocess(environ: dict, argv: list, expected: str | None) -> None:
    assert detect_multiprocess(environ, argv) == expected


def test_in_memory_limiters_under_several_workers_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEB_CONCURRENCY", "4")
    messages = ours(check_settings())
    assert [m.id for m in messages] == ["ratelimit_r4.W001"]
    msg = messages[0].msg
    assert msg.startswith('RATELIMIT_R4["backend"]: ')
    assert "WEB_CONCURRENCY=4" in msg
    assert "limits are per process: a limit of 10 becomes 10 x N workers" in msg
    assert "use the redis backend for global quotas".lower() in messages[0].hint.lower()
    err = io.StringIO()
    call_command("check", stderr=err, stdout=io.StringIO())  # a warning does not fail the command
    assert "(ratelimit_r4.W001)" in err.getvalue()
    with override_settings(SILENCED_SYSTEM_CHECKS=["ratelimit_r4.W001"]):
        err = io.StringIO()
        call_command("check", stderr=err, stdout=io.StringIO())
        assert "ratelimit_r4.W001" not in err.getvalue()


def test_no_multiprocess_warning_with_redis_or_without_rate_limiters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEB_CONCURRENCY", "4")
    with override_settings(
        RATELIMIT_R4={
            "backend": "redis",
            "redis_url": "redis://r:6379/0",
            "ratelimiters": {"instances": {"a": {"limit_refresh_period": "1s"}}},
        }
    ):
        assert ours(check_settings()) == []
    with override_settings(RATELIMIT_R4={"bulkheads": {"instances": {"db": {}}}}):
        assert ours(check_settings()) == []


# ------------------------------------------------------------------------------------ the id table


def test_ids_are_unique_stable_and_documented() -> None:
    ids = [c.value for c in Code]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[EW]\d{3}", i) for i in ids)
    errors = sorted(i for i in ids if i.startswith("E"))
    assert errors == [f"E{n:03d}" for n in range(1, len(errors) + 1)]  # no gaps
    doc = (ROOT / "docs" / "configuration.md").read_text()
    rows = re.findall(r"^\|\s*`ratelimit_r4\.([EW]\d{3})`\s*\|", doc, flags=re.MULTILINE)
    assert sorted(rows) == sorted(ids), "the table lists each id exactly once"


@pytest.mark.parametrize(
    "instance",
    [
        {"limit_for_period": 100, "algorithm": "sliding_window", "key": "ip"},  # ~110 MB at the default max_keys
        {"limit_for_period": 100_000, "algorithm": "sliding_window", "key": "ip", "max_keys": 300},
        {"limit_for_period": 100_000, "algorithm": "sliding_window"},  # unkeyed: one ring, 800 KB
        {"limit_for_period": 100_000, "algorithm": "gcra", "key": "ip"},  # one integer per client
        {"limit_for_period": 100_000, "key": "ip"},  # cycle: two integers per client
    ],
)
def test_w005_only_for_keyed_in_memory_sliding_windows_past_256_mib(instance: dict) -> None:
    with override_settings(RATELIMIT_R4=rl(instance)):
        assert not [m for m in checks.check_settings() if m.id == "ratelimit_r4.W005"]


def test_w005_not_for_a_sliding_window_in_redis() -> None:
    setting = rl({"limit_for_period": 100_000, "algorithm": "sliding_window", "key": "ip"})
    setting["backend"], setting["redis_url"] = "redis", "redis://127.0.0.1:6379/15"
    with override_settings(RATELIMIT_R4=setting):
        assert not [m for m in checks.check_settings() if m.id == "ratelimit_r4.W005"]


def test_every_error_id_has_a_test_case() -> None:
    tested = {p.values[1] for p in CASES} | {"E010", "E022", "E024", "E025", "E026", "E035", "E036", "W001", "W002", "W004", "W007", "W009"}  # E024, E025, E035, E036, W004, W007, W009: test_checks_urls.py; E026: test_retry_budgets.py
    assert tested == {c.value for c in Code}


def test_configuration_docs_list_every_field_and_option() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_0-9]+)` \|", doc, flags=re.MULTILINE))
    for section in conf.SECTIONS.values():
        missing = {f for f in (*section.fields, *section.extras) if f not in documented}
        assert not missing, f"{section.name}: {missing} not documented"
    assert set(conf._OPTION_KEYS) <= documented


# ------------------------------------------------------------------------------------- rate shorthand


@pytest.mark.parametrize(
    ("rate", "limit", "period_ns"),
    [("5/m", 5, 60 * 10**9), ("100/5m", 100, 300 * 10**9), ("3/min", 3, 60 * 10**9), ("1000/day", 1000, 86_400 * 10**9)],
)
def test_rate_shorthand_sets_both_fields(rate: str, limit: int, period_ns: int) -> None:
    analysis = conf.analyse(rl({"rate": rate}))
    assert analysis.problems == []
    config = analysis.specs["ratelimiters"]["api"].config
    assert (config.limit_for_period, config.limit_refresh_period) == (limit, period_ns)


def test_rate_in_a_config_is_inherited_and_the_leaf_wins_field_by_field() -> None:
    analysis = conf.analyse(
        {
            "ratelimiters": {
                "configs": {"default": {"rate": "5/m"}, "hourly": {"rate": "100/h"}},
                "instances": {
                    "a": {},
                    "b": {"limit_for_period": 7},  # 7 per minute: the inherited period stays
                    "c": {"base_config": "hourly"},
                    "d": {"base_config": "hourly", "rate": "2/s"},  # the instance's rate wins
                },
            }
        }
    )
    assert analysis.problems == []
    got = {
        n: (s.config.limit_for_period, s.config.limit_refresh_period // 10**9)
        for n, s in analysis.specs["ratelimiters"].items()
    }
    assert got == {"a": (5, 60), "b": (7, 60), "c": (100, 3600), "d": (2, 1)}


def test_an_unreadable_drf_rate_is_reported_where_drf_reads_it() -> None:
    """E022: a DEFAULT_THROTTLE_RATES scope not declared in RATELIMIT_R4 becomes a limiter, so its rate is checked."""
    rates = {"uploads": "3/fortnight", "anon": "many/min", "slow": "nonsense", "off": None}
    with override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": rates}):
        messages = ours(check_settings())
        with pytest.raises(SystemCheckError) as info:
            call_command("check")
    found = {m.msg.split(": ")[0]: m for m in messages}
    # "slow" is declared in RATELIMIT_R4 (it wins, its DRF rate is not used); None means "not throttled".
    assert set(found) == {f'REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["{s}"]' for s in ("uploads", "anon")}
    for message in found.values():
        assert message.id == "ratelimit_r4.E022"
        assert "'3/min'" in message.hint and "RATELIMIT_R4" in message.hint
    assert "unknown unit 'fortnight'" in found['REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["uploads"]'].msg
    assert "(ratelimit_r4.E022)" in str(info.value)


def test_parse_key_spec_still_works_but_is_deprecated() -> None:
    with pytest.warns(DeprecationWarning, match="validate_key_spec"):
        assert conf.parse_key_spec("ip") == "ip"
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError):
        conf.parse_key_spec("nonsense-kind")
