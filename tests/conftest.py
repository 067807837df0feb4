"""Shared fixtures. Redis-backed tests skip without a server unless R4_REQUIRE_REDIS=1 (CI)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of a reachable Redis; skips (or fails under R4_REQUIRE_REDIS=1) when none answers."""
    url = os.environ.get("R4_REDIS_URL", "redis://127.0.0.1:6379/15")
    try:
        import redis

        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except Exception as exc:  # pragma: no cover - depends on the machine
        if os.environ.get("R4_REQUIRE_REDIS") == "1":
            pytest.fail(f"Redis required (R4_REQUIRE_REDIS=1) but not reachable at {url}: {exc}")
        pytest.skip(f"no Redis at {url}")
    return url


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads every microsecond so races in shared state would actually interleave."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)
