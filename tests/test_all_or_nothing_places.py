"""All-or-nothing over limits kept in several places asks the limiters where their state lives (issue 9).

``keyed.acquire_all_keyed`` and a gate's plan classify entries by what the limiters say (``store.remote``,
``RateLimiter.remote_backend``) and hand the remote ones to the decider their holder names
(``core.backend.AllOrNothingPlace``), not by looking for ``backends.redis`` in ``sys.modules``: so a third-party
remote backend next to in-memory limits is decided by the mixed path (in memory first, then the remote one,
the in-memory permits given back on its rejection), never as if it were in memory. No Redis needed here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from django.test import RequestFactory, override_settings

from django_ratelimit_r4 import registry
from django_ratelimit_r4.backends.memory import MemoryBackend, MemoryStore
from django_ratelimit_r4.core.backend import KeyedBackend, RemoteRateLimiterBackend
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig
from django_ratelimit_r4.decorators import RateLimitGate
from django_ratelimit_r4.keyed import AllOrNothingPlan, KeyedRateLimiter, MemoryKeyedStore, acquire_all_keyed

S = 1_000_000_000


class FarBackend:
    """A third-party remote backend (its own protocol methods only; the state happens to be a MemoryBackend)."""

    def __init__(self, name: str, limit: int, period_ns: int, clock: Any) -> None:
        self._inner = MemoryBackend(name, limit, period_ns, clock)
        self.calls = 0

    @property
    def successful_calls(self) -> int:
        return self._inner.successful_calls

    @property
    def failed_calls(self) -> int:
        return self._inner.failed_calls

    def acquire(self, permits: int, timeout_ns: int) -> int:
        self.calls += 1  # a round trip
        return self._inner.acquire(permits, timeout_ns)

    def state(self) -> tuple[int, int, int]:
        return self._inner.state()

    def quota(self) -> tuple[int, int]:
        self.calls += 1
        return self._inner.quota()

    def drain(self) -> int:
        return self._inner.drain()

    def change_limit(self, limit_for_period: int) -> None:
        self._inner.change_limit(limit_for_period)

    def reset(self, clock: Any) -> None:
        self._inner.reset(clock)

    def acquire_many(self, backends: Sequence[Any], permits: int) -> tuple[int, int] | None:
        raise AssertionError("a remote backend without all_or_nothing() is decided alone")

    async def aacquire(self, permits: int, timeout_ns: int) -> int:
        return self.acquire(permits, timeout_ns)

    async def aquota(self) -> tuple[int, int]:
        return self.quota()

    async def aacquire_many(self, backends: Sequence[Any], permits: int) -> tuple[int, int] | None:
        return self.acquire_many(backends, permits)

    def acquire_quota(self, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        self.calls += 1  # one round trip: the decision and the figures after it
        return (self._inner.acquire(permits, timeout_ns), *self._inner.quota())

    async def aacquire_quota(self, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        return self.acquire_quota(permits, timeout_ns)


class FarKeyedStore:
    """A third-party remote keyed store: the protocol's methods only (no lock, no internals to reach into)."""

    remote = True
    rejection_quotas = False

    def __init__(self, config: RateLimiterConfig, clock: Any) -> None:
        self._inner = MemoryKeyedStore(config, clock)

    successful_calls = property(lambda self: self._inner.successful_calls)
    failed_calls = property(lambda self: self._inner.failed_calls)
    lossy_evictions = property(lambda self: self._inner.lossy_evictions)

    def decide(self, key: str, permits: int, timeout_ns: int) -> int:
        return self._inner.decide(key, permits, timeout_ns)

    async def adecide(self, key: str, permits: int, timeout_ns: int) -> int:
        return self.decide(key, permits, timeout_ns)

    def decide_quota(self, key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        return self._inner.decide_quota(key, permits, timeout_ns)

    async def adecide_quota(self, key: str, permits: int, timeout_ns: int) -> tuple[int, int, int]:
        return self.decide_quota(key, permits, timeout_ns)

    def state(self, key: str) -> tuple[int, int, int]:
        return self._inner.state(key)

    def quota(self, key: str) -> tuple[int, int]:
        return self._inner.quota(key)

    async def aquota(self, key: str) -> tuple[int, int]:
        return self.quota(key)

    def drain(self, key: str) -> int:
        return self._inner.drain(key)

    def reset(self, key: str | None = None) -> None:
        self._inner.reset(key)

    def set_clock(self, clock: Any) -> None:
        self._inner.set_clock(clock)

    def purge(self) -> int:
        return self._inner.purge()

    def keys(self, limit: int | None = None) -> list[str]:
        return self._inner.keys(limit)

    def live_keys(self) -> int:
        return self._inner.live_keys()

    def __len__(self) -> int:
        return len(self._inner)

    def __contains__(self, key: object) -> bool:
        return key in self._inner


class FarStore(MemoryStore):
    """A ``BACKEND`` dotted path whose limiters are remote (FarBackend, FarKeyedStore)."""

    per_process = False

    def __init__(self, alias: str, location: str | None = None, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, location, options)

    def backend_factory(self, on_error: str | None) -> Any:
        return FarBackend

    def keyed_store(self, name: str, config: Any, *, clock: Any, **_: Any) -> Any:
        return FarKeyedStore(config, clock)


def _config(limit: int) -> RateLimiterConfig:
    return RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1s", timeout_duration="0s")


def test_the_fakes_are_what_they_claim() -> None:
    clock = FakeClock()
    assert isinstance(FarBackend("f", 1, S, clock), RemoteRateLimiterBackend)
    assert isinstance(FarKeyedStore(_config(1), clock), KeyedBackend)
    assert RateLimiter("f", _config(1), clock=clock, backend=FarBackend).remote_backend is not None


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_a_third_party_remote_limit_beside_memory_is_decided_by_the_mixed_path(keyed: bool) -> None:
    clock = FakeClock()
    local = RateLimiter("local", _config(5), clock=clock)
    if keyed:
        far: Any = KeyedRateLimiter("far", _config(2), clock=clock, store=FarKeyedStore(_config(2), clock))
    else:
        far = RateLimiter("far", _config(2), clock=clock, backend=FarBackend)
    entries = [(local, None), (far, "k" if keyed else None)]
    plan = AllOrNothingPlan([local, far])
    assert (plan.remote, plan.mixed, plan.decider) == (True, True, None)
    outcomes = [acquire_all_keyed(entries) for _ in range(3)]
    assert outcomes[:2] == [None, None] and outcomes[2] is not None and outcomes[2][0] == 1
    # The far limit's rejection gave the local permit back: 2 taken of 5, not 3.
    assert local.metrics.available_permissions == 3
    assert asyncio.run(plan.aacquire_all(entries, 1))[0] == 1
    assert local.metrics.available_permissions == 3


def test_two_third_party_remote_limits_without_a_decider_are_refused() -> None:
    clock = FakeClock()
    one = RateLimiter("one", _config(2), clock=clock, backend=FarBackend)
    two = RateLimiter("two", _config(2), clock=clock, backend=FarBackend)
    with pytest.raises(TypeError, match=r"\['one', 'two'\].*cannot decide several limits at once"):
        AllOrNothingPlan([one, two])


def test_a_memory_only_plan_is_bound_to_the_in_memory_decision() -> None:
    """Nothing to classify per request: the plan's function is the in-memory one."""
    clock = FakeClock()
    plan = AllOrNothingPlan([RateLimiter("a", _config(1), clock=clock), KeyedRateLimiter("b", _config(1), clock=clock)])
    assert (plan.remote, plan.mixed, plan.aacquire_all, plan.acquire_all.__name__) == (
        False, False, None, "_acquire_memory"
    )


@pytest.mark.django_db(databases=[])
def test_a_gate_over_memory_and_a_third_party_remote_backend(r4_clock: Any) -> None:
    setting = {
        "backends": {"far": {"BACKEND": f"{__name__}.FarStore"}},
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": "1s", "timeout_duration": "0s"}},
            "instances": {"local": {"limit_for_period": 5}, "far": {"limit_for_period": 2, "backend": "far"}},
        },
    }
    request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.7")
    with override_settings(RATELIMIT_R4=setting):
        gate = RateLimitGate(["local", "far"])
        assert gate.plan().remote
        outcomes = [gate.check(request) for _ in range(3)]
        assert [rejection is None for rejection, _ in outcomes] == [True, True, False]
        assert outcomes[2][0].rate_limiter is registry.get_rate_limiter("far")  # type: ignore[union-attr]
        assert registry.get_rate_limiter("local").metrics.available_permissions == 3
        assert "RateLimit" in outcomes[2][1]


@pytest.mark.django_db(databases=[])
@pytest.mark.parametrize("first", ["local", "far"])
def test_a_mixed_gate_with_headers_calls_the_remote_backend_once_per_request(r4_clock: Any, first: str) -> None:
    """The header figures come with the decision (keyed.acquire_all_quotas): the remote limit is called once per
    request, allowed or denied, and the fields are what separate quota reads give."""
    setting = {
        "backends": {"far": {"BACKEND": f"{__name__}.FarStore"}},
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": "1s", "timeout_duration": "0s"}},
            "instances": {
                "local": {"limit_for_period": 2 if first == "local" else 5},
                "far": {"limit_for_period": 2 if first == "far" else 5, "backend": "far"},
            },
        },
    }
    request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.7")
    with override_settings(RATELIMIT_R4=setting):
        gate = RateLimitGate(["local", "far"])
        far = registry.get_rate_limiter("far").backend
        statuses = []
        for _ in range(3):
            far.calls = 0  # type: ignore[attr-defined]
            rejection, fields = gate.check(request)
            assert far.calls == 1  # type: ignore[attr-defined]
            statuses.append(rejection is None)
            assert fields == gate.headers([None, None])
        assert statuses == [True, True, False]
        assert registry.get_rate_limiter("local").metrics.available_permissions == (0 if first == "local" else 3)
