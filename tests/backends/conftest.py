"""Fixtures of the Redis backend tests (the `redis_url` fixture is in tests/conftest.py).

Nothing a test does in Redis reaches the next test: its keys live under its own prefix and are deleted
afterwards, and every connection (with its fault cool-down) is closed after each test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

_PREFIXES: list[tuple[str, str]] = []  # (redis_url, prefix) handed out in this session


def _delete_prefix(client: redis.Redis, value: str) -> None:
    keys = list(client.scan_iter(match=value + ":*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test only; its keys are deleted afterwards.

    Request it before ``r4_clock`` (or a fixture using it): ``r4_clock``'s teardown resets the limiters, which
    writes their anchors again, and fixtures are torn down in reverse order. A session-end sweep deletes
    whatever a teardown wrote after this one anyway.
    """
    value = f"r4test:{uuid.uuid4().hex[:12]}"
    _PREFIXES.append((redis_url, value))
    yield value
    client = redis.Redis.from_url(redis_url)
    try:
        _delete_prefix(client, value)
    finally:
        client.close()


@pytest.fixture(scope="session", autouse=True)
def _sweep_prefixes() -> Iterator[None]:
    yield
    for url, value in _PREFIXES:
        client = redis.Redis.from_url(url)
        try:
            _delete_prefix(client, value)
        finally:
            client.close()


@pytest.fixture(autouse=True)
def _fresh_connections() -> Iterator[None]:
    yield
    from django_ratelimit_r4.backends import redis as rb

    rb.close_connections()
