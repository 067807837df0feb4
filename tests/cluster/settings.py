"""Django settings of the small site ``tests/test_control_cluster.py`` serves with gunicorn (several "hosts").

The Redis URL and the key prefix come from the environment, so every test run has keys of its own.
"""

import os

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "tests.cluster.urls"
INSTALLED_APPS = ["django_ratelimit_r4"]
MIDDLEWARE: list[str] = []
DATABASES: dict[str, dict[str, str]] = {}
LOGGING_CONFIG = None

RATELIMIT_R4 = {
    "backends": {
        "shared": {
            "BACKEND": "redis",
            "LOCATION": os.environ.get("R4_CONTROL_REDIS_URL", "redis://127.0.0.1:6379/15"),
            "OPTIONS": {"key_prefix": os.environ.get("R4_CONTROL_PREFIX", "r4test:cluster")},
        }
    },
    "control": {"backend": "shared", "heartbeat_interval": os.environ.get("R4_CONTROL_INTERVAL", "200ms")},
    "state_endpoint_token": "cluster-test-token-" + "x" * 32,
    "ratelimiters": {
        "instances": {"api": {"limit_for_period": 1000, "limit_refresh_period": "1s", "timeout_duration": "0s"}}
    },
    "bulkheads": {"instances": {"partner": {"max_concurrent_calls": 3, "backend": "shared", "lease_ttl": "2s"}}},
    "circuitbreakers": {"instances": {"payments": {"wait_duration_in_open_state": "60s"}}},
}
