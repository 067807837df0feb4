"""Settings for the test suite."""

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "tests.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "rest_framework",
    "django_ratelimit_r4",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

RATELIMIT_R4 = {
    "ratelimiters": {
        "configs": {"default": {"limit_refresh_period": "1s", "timeout_duration": "0s"}},
        "instances": {
            "api": {"limit_for_period": 10},
            "slow": {"limit_for_period": 10, "limit_refresh_period": "60s"},
            # Used by views in tests/urls.py (`manage.py check` checks the names routed views use).
            "per_ip": {"limit_for_period": 2, "key": "ip"},
            "burst": {"limit_for_period": 2},
            "burst3": {"limit_for_period": 3},
            "sustained": {"limit_for_period": 3, "limit_refresh_period": "60s"},
        },
    },
    "bulkheads": {"instances": {"acquirer": {"max_concurrent_calls": 2}}},
    "circuitbreakers": {
        "instances": {
            "acquirer": {
                "sliding_window_size": 20,
                "minimum_number_of_calls": 10,
                "failure_rate_threshold": 50,
                "wait_duration_in_open_state": "3s",
                "permitted_number_of_calls_in_half_open_state": 3,
            }
        }
    },
    "retries": {"instances": {"acquirer": {"max_attempts": 3, "wait_duration": "100ms"}}},
    "timelimiters": {"instances": {"acquirer": {"timeout_duration": "1s"}}},
}

STATIC_URL = "static/"
