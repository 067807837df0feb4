"""Django app config: wires checks, the settings-change receivers and the Prometheus exporter."""

from __future__ import annotations

import importlib.util

from django.apps import AppConfig
from django.conf import settings


class RateLimitR4Config(AppConfig):
    """``INSTALLED_APPS`` entry: ``"django_ratelimit_r4"``."""

    name = "django_ratelimit_r4"
    label = "ratelimit_r4"
    verbose_name = "Rate limiting and resilience (Resilience4j semantics)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported for their side effects (check registration, signal receivers). Safe to run twice.
        from . import checks, registry  # noqa: F401
        # Start-up reads only this one flag and never parses RATELIMIT_R4: a bad setting must not stop
        # start-up (`manage.py check` reports it, accessors raise at first use).
        raw = getattr(settings, "RATELIMIT_R4", None)
        if isinstance(raw, dict) and raw.get("control"):
            from . import control

            # The control plane's thread starts at the process's first request (never in a gunicorn master).
            control.connect_request_started()
        metrics = raw.get("metrics", True) if isinstance(raw, dict) else True
        if metrics is not False and importlib.util.find_spec("prometheus_client") is not None:
            from .contrib import prometheus

            # Idempotent; reads no settings and builds no instance. Single process: a scrape-time
            # collector (the hot path pays nothing); PROMETHEUS_MULTIPROC_DIR: a per-worker syncer.
            prometheus.install()
