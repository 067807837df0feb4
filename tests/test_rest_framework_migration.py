"""DRF migration: RateLimiterThrottle next to DRF's ScopedRateThrottle, DRF's rates as limiters, drop-in
Anon/User throttles. Every test goes through an APIView and the Django test client."""

from __future__ import annotations

import types
from typing import Any

import pytest
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings
from django.urls import path
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from django_ratelimit_r4 import registry
from django_ratelimit_r4.rest_framework import AnonRateThrottle, RateLimiterThrottle, UserRateThrottle

pytestmark = pytest.mark.django_db(databases=[])


@pytest.fixture(autouse=True)
def _clear_drf_cache() -> None:
    cache.clear()  # DRF's own throttles keep history in the default cache


class _User:
    """An authenticated user as DRF's authentication would set it (no database needed)."""

    is_authenticated = True
    is_active = True

    def __init__(self, pk: int) -> None:
        self.pk = pk


class HeaderUserAuthentication:
    """``X-User: <pk>`` authenticates as that user; without it the request is anonymous."""

    def authenticate(self, request: Any) -> tuple[Any, None] | None:
        pk = request.META.get("HTTP_X_USER")
        return (_User(int(pk)), None) if pk else None

    def authenticate_header(self, request: Any) -> str:
        return "X-User"


def _view(throttles: list[type], **attrs: Any) -> Any:
    body = {
        "throttle_classes": throttles,
        "authentication_classes": [HeaderUserAuthentication],
        "permission_classes": [],
        "get": lambda self, request: Response({"ok": True}),
        **attrs,
    }
    return type("MigrationView", (APIView,), body).as_view()


def _urls(**views: Any) -> types.ModuleType:
    module = types.ModuleType("migration_urls")
    module.urlpatterns = [path(f"{name}/", view) for name, view in views.items()]  # type: ignore[attr-defined]
    return module


def drf(**rates: Any) -> dict[str, Any]:
    return {"DEFAULT_THROTTLE_RATES": rates}


def codes(client: Client, url: str, n: int, **extra: Any) -> list[int]:
    return [client.get(url, **extra).status_code for _ in range(n)]


BOTH = [RateLimiterThrottle, ScopedRateThrottle]  # DEFAULT_THROTTLE_CLASSES during a migration


def test_a_drf_scope_becomes_a_limiter_with_a_computed_retry_after(settings: Any, r4_clock: Any) -> None:
    settings.REST_FRAMEWORK = drf(uploads="3/min")
    settings.ROOT_URLCONF = _urls(uploads=_view([RateLimiterThrottle], throttle_scope="uploads"))
    client = Client()
    assert codes(client, "/uploads/", 3) == [200, 200, 200]
    r4_clock.advance(10)
    rejected = client.get("/uploads/")
    assert (rejected.status_code, rejected["Retry-After"]) == (429, "50")
    assert rejected["RateLimit-Policy"].startswith('"uploads";q=3;w=60')
    # Per client, as DRF's ScopedRateThrottle: another IP, and a user, have their own budgets.
    assert client.get("/uploads/", REMOTE_ADDR="198.51.100.2").status_code == 200
    assert codes(client, "/uploads/", 4, HTTP_X_USER="7") == [200, 200, 200, 429]
    r4_clock.advance(50)
    assert client.get("/uploads/").status_code == 200


def test_scoped_rate_throttle_and_ours_coexist_on_every_kind_of_view(
    settings: Any, r4_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both in DEFAULT_THROTTLE_CLASSES: a DRF scope, a configured limiter and a scope-less view all work."""
    settings.REST_FRAMEWORK = drf(uploads="3/min", slow="100/min")
    # DRF binds THROTTLE_RATES when rest_framework.throttling is imported: what a settings file gives it.
    monkeypatch.setattr(ScopedRateThrottle, "THROTTLE_RATES", settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"])
    settings.ROOT_URLCONF = _urls(
        uploads=_view(BOTH, throttle_scope="uploads"),
        named=_view(BOTH, rate_limiter="api"),
        plain=_view(BOTH),
    )
    client = Client()
    assert codes(client, "/uploads/", 4) == [200, 200, 200, 429]
    assert codes(client, "/named/", 11) == [200] * 10 + [429]
    assert codes(client, "/plain/", 20) == [200] * 20


def test_a_scope_nobody_configured_passes_through(settings: Any, r4_clock: Any) -> None:
    """Not in RATELIMIT_R4 nor in DEFAULT_THROTTLE_RATES: like a view without a scope, never a 500."""
    settings.REST_FRAMEWORK = drf(uploads="3/min")
    settings.ROOT_URLCONF = _urls(other=_view([RateLimiterThrottle], throttle_scope="reports"))
    assert codes(Client(), "/other/", 30) == [200] * 30


def test_a_none_rate_means_not_throttled(settings: Any, r4_clock: Any) -> None:
    settings.REST_FRAMEWORK = drf(uploads=None, anon=None)
    settings.ROOT_URLCONF = _urls(
        uploads=_view([RateLimiterThrottle], throttle_scope="uploads"), anon=_view([AnonRateThrottle])
    )
    client = Client()
    assert codes(client, "/uploads/", 20) == [200] * 20
    assert codes(client, "/anon/", 20) == [200] * 20


def test_a_declared_limiter_wins_over_the_drf_rate(settings: Any, r4_clock: Any) -> None:
    settings.REST_FRAMEWORK = drf(slow="1/min")
    settings.ROOT_URLCONF = _urls(slow=_view([RateLimiterThrottle], throttle_scope="slow"))
    assert codes(Client(), "/slow/", 11) == [200] * 10 + [429]  # RATELIMIT_R4's "slow": 10 per 60 s


def test_anon_drop_in_limits_anonymous_clients_per_ip_only(settings: Any, r4_clock: Any) -> None:
    settings.REST_FRAMEWORK = drf(anon="2/min")
    settings.ROOT_URLCONF = _urls(anon=_view([AnonRateThrottle]))
    client = Client()
    assert codes(client, "/anon/", 3) == [200, 200, 429]
    r4_clock.advance(15)
    assert client.get("/anon/")["Retry-After"] == "45"
    assert codes(client, "/anon/", 2, REMOTE_ADDR="198.51.100.2") == [200, 200]
    assert codes(client, "/anon/", 10, HTTP_X_USER="1") == [200] * 10  # authenticated: not this throttle's


def test_user_drop_in_keys_users_by_pk_and_anonymous_clients_by_ip(settings: Any, r4_clock: Any) -> None:
    settings.REST_FRAMEWORK = drf(user="2/min")
    settings.ROOT_URLCONF = _urls(user=_view([UserRateThrottle]))
    client = Client()
    assert codes(client, "/user/", 3, HTTP_X_USER="1") == [200, 200, 429]
    assert codes(client, "/user/", 3, HTTP_X_USER="1", REMOTE_ADDR="198.51.100.9") == [429] * 3  # same user
    assert codes(client, "/user/", 2, HTTP_X_USER="2") == [200, 200]
    assert codes(client, "/user/", 3) == [200, 200, 429]  # anonymous: by IP
    assert codes(client, "/user/", 1, REMOTE_ADDR="198.51.100.2") == [200]


def test_a_drop_in_subclass_reads_its_own_scope(settings: Any, r4_clock: Any) -> None:
    class BurstRateThrottle(UserRateThrottle):
        scope = "user_burst"

    settings.REST_FRAMEWORK = drf(user_burst="1/s", user="100/day")
    settings.ROOT_URLCONF = _urls(burst=_view([BurstRateThrottle, UserRateThrottle]))
    client = Client()
    assert codes(client, "/burst/", 2) == [200, 429]
    r4_clock.advance(1)
    allowed = client.get("/burst/")
    assert allowed.status_code == 200
    assert '"user";r=97;' in allowed["RateLimit"]  # "user" counted all three (DRF asks every throttle)


def test_a_drop_in_without_any_rate_is_improperly_configured_like_drf(settings: Any, r4_clock: Any) -> None:
    settings.REST_FRAMEWORK = drf(users="2/min")
    settings.ROOT_URLCONF = _urls(user=_view([UserRateThrottle]))
    with pytest.raises(ImproperlyConfigured, match=r"'user'.*Did you mean 'users'"):
        Client().get("/user/")


def test_changing_drf_rates_rebuilds_the_limiters(settings: Any, r4_clock: Any) -> None:
    settings.REST_FRAMEWORK = drf(uploads="1/min")
    settings.ROOT_URLCONF = _urls(uploads=_view([RateLimiterThrottle], throttle_scope="uploads"))
    client = Client()
    assert codes(client, "/uploads/", 2) == [200, 429]
    generation = registry.generation
    settings.REST_FRAMEWORK = drf(uploads="3/min")
    assert registry.generation != generation
    assert codes(client, "/uploads/", 4) == [200, 200, 200, 429]


def test_a_broken_drf_rate_is_a_clear_error_at_first_use(settings: Any, r4_clock: Any) -> None:
    settings.REST_FRAMEWORK = drf(uploads="3/fortnight")
    settings.ROOT_URLCONF = _urls(uploads=_view([RateLimiterThrottle], throttle_scope="uploads"))
    with pytest.raises(ImproperlyConfigured, match=r'REST_FRAMEWORK\["DEFAULT_THROTTLE_RATES"\]\["uploads"\]'):
        Client().get("/uploads/")


def test_drf_rates_are_read_from_settings_not_from_drf_import_time() -> None:
    with override_settings(REST_FRAMEWORK=drf(uploads="3/min")):
        assert "uploads" in registry.names("ratelimiters")
    assert "uploads" not in registry.names("ratelimiters")
