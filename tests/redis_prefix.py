"""Deleting a test's Redis key prefix so that nothing writes under it afterwards.

A cluster-wide circuit breaker runs a listener and a sender thread, a cluster-wide bulkhead a renewal thread,
until ``close()``. Built by the registry under ``override_settings`` (or the ``settings`` fixture), they outlive
the test: restoring the setting only makes the registry forget them. A listener that faults later (a ping
timeout on a loaded machine, a dropped connection) reads the state again, finds the prefix deleted and writes
its own state back, as it must for a Redis that lost its data: a key without a TTL under a prefix nobody
deletes any more. So every such thread is stopped before the keys are deleted.
"""

from __future__ import annotations

import threading
from typing import Any

import redis


def _threads(instance: Any) -> list[threading.Thread]:
    # A breaker's listener and sender, a bulkhead's renewal thread (None until started).
    return [t for name in ("_listener", "_sender", "_thread") if (t := getattr(instance, name, None)) is not None]


def close_redis_threads() -> None:
    """Close every cluster-wide circuit breaker and bulkhead of this process whose threads still run
    (registry-built or not): they have ended when this returns (``close()`` joins them)."""
    from django_ratelimit_r4.backends import redis_breaker, redis_bulkhead

    # The modules' own registries of live instances (weak sets, kept for fork handling): the only way to reach
    # an instance the settings registry has already forgotten. Closed ones are skipped: a closed breaker's
    # close() publishes again, which a Redis Cluster stopped by then refuses with an error redis-py does not
    # derive from RedisError (RedisClusterUnreachableError), and close() lets it through.
    for instance in [*redis_breaker._instances, *redis_bulkhead._instances]:
        if any(t.is_alive() for t in _threads(instance)):
            instance.close()


def delete_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (``<prefix>:*``) in the Redis at ``url``."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=prefix + ":*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def close_and_delete(url: str, prefix: str) -> None:
    """:func:`close_redis_threads`, then :func:`delete_prefix`: what a ``prefix`` fixture does at teardown."""
    close_redis_threads()
    delete_prefix(url, prefix)
