"""Django settings of the small site ``test_prometheus_gunicorn.py`` serves with gunicorn."""

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "tests.contrib.gunicorn_urls"
INSTALLED_APPS = ["django_ratelimit_r4"]
MIDDLEWARE: list[str] = []
DATABASES: dict[str, dict[str, str]] = {}
LOGGING_CONFIG = None

RATELIMIT_R4 = {
    "ratelimiters": {
        "instances": {"api": {"limit_for_period": 10, "limit_refresh_period": "1s", "timeout_duration": "0s"}}
    },
    "circuitbreakers": {"instances": {"payments": {"wait_duration_in_open_state": "60s"}}},
}
