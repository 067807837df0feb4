"""GCRA and sliding-window limiters (in memory) decided all-or-nothing with a Redis-backed cycle limiter:
a Redis rejection gives their permits back; every algorithm is valid on Redis (no E027 for rate limiters)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from django_ratelimit_r4 import conf, get_rate_limiter
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.keyed import acquire_all_keyed
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)

from .test_backends_config import mixed

pytestmark = pytest.mark.django_db(databases=[])


@pytest.mark.parametrize(("algorithm", "keyed"), [("gcra", False), ("sliding_window", False), ("gcra", True), ("sliding_window", True)])
def test_a_redis_rejection_gives_the_smooth_permits_back(
    redis_url: str, prefix: str, r4_clock: FakeClock, algorithm: str, keyed: bool
) -> None:
    setting: dict[str, Any] = mixed(redis_url, prefix)
    setting["ratelimiters"]["instances"]["local_big"].update({"algorithm": algorithm, **({"key": "ip"} if keyed else {})})
    with override_settings(RATELIMIT_R4=setting):
        remote = get_rate_limiter("remote_small")
        remote.reset()
        if keyed:
            from django_ratelimit_r4.registry import get_keyed_rate_limiter

            local: Any = get_keyed_rate_limiter("local_big")
            entry: tuple[Any, Any] = (local, "client")
        else:
            local = get_rate_limiter("local_big")
            entry = (local, None)
        outcomes = [acquire_all_keyed([entry, (remote, None)]) for _ in range(4)]
        assert [o is None for o in outcomes] == [True, True, False, False]
        assert all(o[0] == 1 for o in outcomes[2:])  # type: ignore[index]  # Redis said no
        available = local.state("client")[1] if keyed else local.metrics.available_permissions
        assert available == 3  # 5 - 2: the rejected decisions cost the in-memory limiter nothing
        remote.reset()


@pytest.mark.parametrize("algorithm", ["gcra", "sliding_window"])
def test_redis_with_a_smooth_algorithm_is_valid(redis_url: str, prefix: str, algorithm: str) -> None:
    setting: dict[str, Any] = mixed(redis_url, prefix)
    setting["ratelimiters"]["instances"]["remote_small"]["algorithm"] = algorithm
    analysis = conf.analyse(setting)
    assert analysis.problems == []
    assert "remote_small" in analysis.specs["ratelimiters"]
