"""Fixtures of the Redis backend tests (the `redis_url` fixture is in tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test only; its keys are deleted afterwards."""
    value = f"r4test:{uuid.uuid4().hex[:12]}"
    yield value
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=value + ":*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
