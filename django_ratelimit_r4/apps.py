"""Django app config: wires checks and the settings-change receiver."""

from __future__ import annotations

from django.apps import AppConfig


class RateLimitR4Config(AppConfig):
    """``INSTALLED_APPS`` entry: ``"django_ratelimit_r4"``."""

    name = "django_ratelimit_r4"
    label = "ratelimit_r4"
    verbose_name = "Rate limiting and resilience (Resilience4j semantics)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported for their side effects (check registration, signal receivers). Safe to run twice.
        from . import checks, registry  # noqa: F401
