"""A test's Redis prefix stays deleted: no thread of a cluster-wide breaker writes under it afterwards.

Seen once in ~20 CI runs: db 15 kept ``r4test:<hex>:cb:{acquirer}:state`` (no TTL) after the suite. The breaker
was built by the registry in tests/test_control.py; restoring the settings made the registry forget it without
closing it, so its listener and sender threads ran on. A listener fault after the prefix fixture had deleted the
keys (a ping timeout on a loaded machine) made it read the state again, find none and write its own back, as a
worker must when Redis lost its data. The registry now closes what a settings change drops; tests/redis_prefix.py
also closes breakers and bulkheads built outside the registry before deleting.
"""

from __future__ import annotations

import copy
import gc
import time
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from django_ratelimit_r4 import get_circuit_breaker
from tests.redis_prefix import delete_prefix

redis = pytest.importorskip("redis")

HANG_GUARD_S = 30.0


def _until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not predicate():
        assert time.monotonic() < deadline, f"hang guard: {what} not seen within {HANG_GUARD_S}s"
        time.sleep(0.02)


def _drop_subscriptions(raw: Any, channel: str) -> int:
    """End this process's subscriptions to ``channel`` from the server's side (what a dropped connection or a
    ping timeout does to a listener); the number ended."""
    ports = [
        ps.connection._sock.getsockname()[1]
        for ps in gc.get_objects()
        if type(ps) is redis.client.PubSub  # type(), not isinstance(): that would set up lazy objects (admin.site)
        and ps.connection is not None
        and ps.connection._sock is not None
        and channel.encode() in {c if isinstance(c, bytes) else c.encode() for c in ps.channels}
    ]
    for port in ports:
        raw.execute_command("CLIENT", "KILL", "ADDR", f"127.0.0.1:{port}")
    return len(ports)


@pytest.mark.django_db(databases=[])
def test_a_shared_breaker_dropped_by_a_settings_change_writes_nothing_under_the_deleted_prefix(redis_url: str, prefix: str) -> None:
    config = copy.deepcopy(django_settings.RATELIMIT_R4)
    config["backends"] = {"shared": {"BACKEND": "redis", "LOCATION": redis_url, "OPTIONS": {"key_prefix": prefix}}}
    config["circuitbreakers"]["instances"]["acquirer"]["backend"] = "shared"
    with override_settings(RATELIMIT_R4=config):  # as test_control.py's shared-breaker test does
        breaker: Any = get_circuit_breaker("acquirer")
        assert breaker.wait_listening(HANG_GUARD_S)
        breaker.transition_to_open_state()
        breaker.transition_to_closed_state()
        channel = breaker._channel
    state_key = f"{prefix}:cb:{{acquirer}}:state"
    raw = redis.Redis.from_url(redis_url)
    try:
        # Restoring the settings closed it (registry.invalidate closes what it drops, b9cd5af): before, it ran
        # on, and a listener fault after the keys were deleted (CLIENT KILL of its subscription here) wrote its
        # state back with no TTL.
        _until(lambda: not breaker._listener.is_alive() and not breaker._sender.is_alive(), "its threads to end")
        delete_prefix(redis_url, prefix)
        assert _drop_subscriptions(raw, channel) == 0
        assert raw.pubsub_numsub(channel) == [(channel.encode(), 0)]
        assert raw.exists(state_key) == 0
    finally:
        breaker.close()
        raw.close()
