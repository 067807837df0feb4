"""Settings of the demo: embedded SQLite, in-memory backend, nothing else to start."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "demo-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
# Django exports TIME_ZONE as $TZ in every process that loads it (gunicorn's workers, not its master):
# serve.py gives the master the same TZ, so every log line of one server shows one time zone.
TIME_ZONE = "UTC"
ROOT_URLCONF = "demo.urls"
WSGI_APPLICATION = "demo.wsgi.application"
ASGI_APPLICATION = "demo.asgi.application"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "health_check",
    "django_ratelimit_r4",
    "cards",
]

MIDDLEWARE = [
    # X-Worker-Pid on every response (outermost, so 429s and 503s get it too): which worker answered.
    "cards.middleware.worker_pid",
    # Counts every answer of /authorize (429s and 503s included), whoever sent it: the dashboard's charts.
    "cards.middleware.count_traffic",
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Turns RequestNotPermitted / CallNotPermitted / BulkheadFull raised below a view into 429/503.
    "django_ratelimit_r4.middleware.ResilienceMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# DEMO_DB=":memory:" lets the test suite drive the demo without writing a file.
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("DEMO_DB", BASE_DIR / "db.sqlite3")}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # django_ratelimit_r4.stall logs a WARNING with the blocking stack when the event loop stalls (uvicorn).
    "loggers": {
        "django_ratelimit_r4": {"handlers": ["console"], "level": "INFO"},
        # A 429 is the demo working, not a warning: keep "Too Many Requests" lines out of the console.
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}

# The numbers come from the two source articles: 10 per second per client with a 0 wait (seed 000),
# and the acquirer's bulkhead + breaker (seed 002: window 20, minimum 10, 50 %, 3 s open, 3 trial calls).
# Bulkhead size from Little's law: 100 calls/s x 0.3 s = 30 in flight on average, plus headroom.
RATELIMIT_R4 = {
    # The demo pretends to sit behind exactly one reverse proxy, so load.py --clients and the dashboard's
    # load button can play many clients by sending X-Forwarded-For. Only set this when a proxy you run
    # really appends that header: otherwise any client can claim a fresh IP and a fresh budget.
    "trusted_proxies": 1,
    "ratelimiters": {
        "configs": {"default": {"limit_refresh_period": "1s", "timeout_duration": "0s"}},
        "instances": {
            # DEMO_PER_CLIENT_PERIOD: the server tests use "60s" so a slow, loaded CI machine still sees
            # the 11th request of one client land in the same cycle as the first ten.
            "per-client": {
                "limit_for_period": 10,
                "limit_refresh_period": os.environ.get("DEMO_PER_CLIENT_PERIOD", "1s"),
                "key": "ip",
            },
            "authorize-global": {"limit_for_period": 200},
        },
    },
    # Adaptive (issue 12): 40 is only the start; littles_law moves the limit to throughput x the partner's
    # no-load latency x 1.1 every second, so slowing the partner on the dashboard moves it.
    "bulkheads": {
        "instances": {
            "acquirer": {
                "max_concurrent_calls": 40,
                "max_wait_duration": "0s",
                "adaptive": {"algorithm": "littles_law", "min_limit": 10, "max_limit": 400},
            }
        }
    },
    "circuitbreakers": {
        "instances": {
            "acquirer": {
                "sliding_window_type": "COUNT_BASED",
                "sliding_window_size": 20,
                "minimum_number_of_calls": 10,
                "failure_rate_threshold": 50,
                # DEMO_BREAKER_OPEN_WAIT: the server tests use "60s" so a slow machine still reads OPEN.
                "wait_duration_in_open_state": os.environ.get("DEMO_BREAKER_OPEN_WAIT", "3s"),
                "permitted_number_of_calls_in_half_open_state": 3,
                "record_exceptions": ["cards.acquirer.AcquirerError"],
                # A full bulkhead says "we are busy", not "the partner is sick": neither success nor failure.
                "ignore_exceptions": ["django_ratelimit_r4.exceptions.BulkheadFull"],
            }
        }
    },
    # `manage.py r4 status --url http://127.0.0.1:8000/r4/ --token <this>` reads the running server with it.
    "state_endpoint_token": "demo-token-for-local-use-only-0123456789",
}

# DEMO_BACKEND=redis (make demo-redis): every rate limiter lives in Redis, so "10 per second per client"
# holds across all gunicorn workers. Bulkheads and breakers stay per process, by design.
DEMO_BACKEND = os.environ.get("DEMO_BACKEND", "memory")
if DEMO_BACKEND == "redis":
    RATELIMIT_R4["backend"] = "redis"
    RATELIMIT_R4["redis_url"] = os.environ.get("DEMO_REDIS_URL", "redis://127.0.0.1:6379/0")
    RATELIMIT_R4["redis_key_prefix"] = "r4demo"
elif DEMO_BACKEND != "memory":
    raise ValueError(f"DEMO_BACKEND must be 'memory' or 'redis', not {DEMO_BACKEND!r}")

# DEMO_CONTROL=1 (make demo-cluster): one control plane on that Redis. Every worker of every "host" sends a
# heartbeat each second; `manage.py r4 status` lists them all and `r4 transition` reaches them all.
if os.environ.get("DEMO_CONTROL") == "1":
    if DEMO_BACKEND != "redis":
        raise ValueError("DEMO_CONTROL=1 needs DEMO_BACKEND=redis: the control plane lives in Redis")
    RATELIMIT_R4["control"] = {"backend": "default", "heartbeat_interval": "1s"}
    # The partner contract: at most N concurrent calls from all our instances. The acquirer's bulkhead holds
    # its slots as leases in Redis (cluster-wide), and cards/cluster_meter.py counts what the partner sees.
    RATELIMIT_R4["bulkheads"]["instances"]["acquirer"]["backend"] = "default"
    # A contract is a fixed number, and a cluster-wide bulkhead cannot be adaptive (ratelimit_r4.E027).
    RATELIMIT_R4["bulkheads"]["instances"]["acquirer"].pop("adaptive", None)
    # One breaker for the whole deployment: failures seen by any worker open it for every worker of every
    # host (transitions shared through Redis; each CLOSED call is still decided locally).
    RATELIMIT_R4["circuitbreakers"]["instances"]["acquirer"]["backend"] = "default"
    RATELIMIT_R4["bulkheads"]["instances"]["acquirer"]["max_concurrent_calls"] = int(
        os.environ.get("DEMO_PARTNER_CONTRACT", "40")
    )
