"""Namespaced client keys (issue 8, items 2 and 3) with every rate limiter in Redis.

The views and instances are tests/test_keys_security.py's; here their state lives in Redis (db 15, this
test's own key prefix, deleted afterwards), where client keys are stored only as digests.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client, override_settings

from django_ratelimit_r4 import get_rate_limiter, registry, state
from tests import test_keys_security as views
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)

rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

pytestmark = pytest.mark.django_db(databases=[])

IP = views.IP


@pytest.fixture
def on_redis(redis_url: str, prefix: str, r4_clock: Any) -> Any:
    settings = views.r4(backend="redis", redis_url=redis_url, redis_key_prefix=prefix)
    with override_settings(ROOT_URLCONF=views.__name__, RATELIMIT_R4=settings):
        assert isinstance(registry.get_keyed_rate_limiter("shared").store, rb.RedisKeyedStore)
        yield r4_clock


def test_a_header_value_equal_to_an_ip_does_not_drain_that_ip_in_redis(on_redis: Any) -> None:
    client = Client()
    assert views.get(client, "/shared/header/", 3, HTTP_X_API_KEY=IP, REMOTE_ADDR="192.0.2.1") == [
        200,
        200,
        429,
    ]
    assert views.get(client, "/shared/tenant/?tenant=" + IP, 2) == [200, 200]
    assert views.get(client, "/shared/ip/", 3, REMOTE_ADDR=IP) == [200, 200, 429]
    assert get_rate_limiter("shared", key="ip:" + IP).metrics.available_permissions == 0
    assert get_rate_limiter("shared", key=IP).metrics.available_permissions == 2  # the raw value: no client


def test_reset_takes_the_namespaced_key_in_redis(on_redis: Any) -> None:
    client = Client()
    views.get(client, "/shared/ip/", 2, REMOTE_ADDR=IP)
    views.get(client, "/shared/header/", 2, HTTP_X_API_KEY=IP)
    state.reset("shared", key="ip:" + IP)
    assert views.get(client, "/shared/ip/", 1, REMOTE_ADDR=IP) == [200]
    assert views.get(client, "/shared/header/", 1, HTTP_X_API_KEY=IP) == [429]


@pytest.mark.django_db
def test_made_up_session_ids_share_the_ip_budget_in_redis(on_redis: Any) -> None:
    codes = [
        views.get(views.with_cookie(f"madeup{n}" + "x" * 24), "/per-session/", 1, REMOTE_ADDR=IP)[0]
        for n in range(3)
    ]
    assert codes == [200, 200, 429]
    alice = Client()
    views.real_session(alice)
    assert views.get(alice, "/per-session/", 3, REMOTE_ADDR=IP) == [200, 200, 429]
