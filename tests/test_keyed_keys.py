"""KeyedRateLimiter.keys(): the public key listing, and the state snapshot built on it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.test import override_settings

from django_ratelimit_r4 import registry, state
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiterConfig
from django_ratelimit_r4.keyed import KeyedRateLimiter
from tests import views


def make(limit: int = 3, **kwargs: Any) -> tuple[KeyedRateLimiter, FakeClock]:
    clock = FakeClock()
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1s", timeout_duration=0)
    return KeyedRateLimiter("api", config, clock=clock, **kwargs), clock


class TestKeys:
    def test_empty_store_lists_nothing(self) -> None:
        limiter, _ = make()
        assert limiter.keys() == [] and limiter.keys(5) == []

    def test_least_recently_used_cycle_first(self) -> None:
        limiter, clock = make(limit=3)
        for key in ("a", "b", "c", "d"):
            limiter.acquire_permission(key)
        assert limiter.keys() == ["a", "b", "c", "d"]
        clock.advance(1)
        # "a"'s first use in a new cycle moves it to the back, and the two oldest entries, refilled
        # by then, are swept. "d" has refilled too but is dropped lazily, so it is still listed.
        limiter.acquire_permission("a")
        assert limiter.keys() == ["d", "a"]

    def test_limit_caps_at_the_oldest(self) -> None:
        limiter, _ = make()
        for key in ("a", "b", "c"):
            limiter.acquire_permission(key)
        assert limiter.keys(2) == ["a", "b"]
        assert limiter.keys(0) == []
        assert limiter.keys(3) == limiter.keys(99) == limiter.keys() == ["a", "b", "c"]

    def test_keys_without_state_are_not_listed(self) -> None:
        limiter, _ = make(limit=1)
        limiter.acquire_permission("spent")
        limiter.acquire_permission("forgotten")
        limiter.reset("forgotten")
        assert limiter.keys() == ["spent"]
        assert not limiter.acquire_permission("spent")  # a rejection changes nothing
        assert limiter.keys() == ["spent"]

    def test_listing_is_a_copy(self) -> None:
        limiter, _ = make()
        limiter.acquire_permission("a")
        listed = limiter.keys()
        listed.append("intruder")
        limiter.acquire_permission("b")
        assert limiter.keys() == ["a", "b"] and listed == ["a", "intruder"]

    @pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
    def test_bad_limits_are_refused(self, bad: Any) -> None:
        limiter, _ = make()
        with pytest.raises(ValueError, match="limit"):
            limiter.keys(bad)

    def test_copied_under_the_store_lock(self) -> None:
        limiter, _ = make()
        limiter.acquire_permission("a")
        got: list[list[str]] = []
        with limiter.store._lock:  # a decision in progress
            reader = threading.Thread(target=lambda: got.append(limiter.keys()))
            reader.start()
            reader.join(0.2)
            assert reader.is_alive() and got == []  # waits for the decision instead of racing it
            limiter.store._states["late"] = limiter.store._states["a"]
        reader.join(5)
        assert got == [["a", "late"]]

    def test_snapshots_during_concurrent_decisions_are_consistent(self) -> None:
        for _trial in range(20):
            self._trial(writers=3, per_writer=200, reads=100)

    @staticmethod
    def _trial(writers: int, per_writer: int, reads: int) -> None:
        limiter, _ = make(limit=1, max_keys=64)
        barrier = threading.Barrier(writers + 1)
        errors: list[BaseException] = []
        snapshots: list[list[str]] = []

        def write(n: int) -> None:
            barrier.wait()
            for i in range(per_writer):
                limiter.acquire_permission(f"{n}-{i}")

        def read() -> None:
            barrier.wait()
            try:
                for _ in range(reads):
                    snapshots.append(limiter.keys())
            except BaseException as exc:  # pragma: no cover - the failure being tested for
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
        threads.append(threading.Thread(target=read))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(snapshots) == reads
        for snap in snapshots:
            assert len(snap) == len(set(snap)) <= 64
        assert sorted(limiter.keys()) == sorted(limiter.store._states)


# ------------------------------------------------------------------------- state snapshot uses keys()


@pytest.fixture
def per_ip(r4_clock: Any) -> Any:
    with override_settings(RATELIMIT_R4=views.r4_settings()):
        yield registry.get_keyed_rate_limiter("per_ip")


def _keyed_state(include_keys: bool = True) -> dict[str, Any]:
    (item,) = state.snapshot(["ratelimiter:per_ip"], include_keys=include_keys)
    return item["state"]["keyed"]


def test_snapshot_lists_keys_oldest_first_with_their_state(per_ip: KeyedRateLimiter) -> None:
    per_ip.acquire_permission("198.51.100.1")
    per_ip.acquire_permission("198.51.100.2")
    per_ip.acquire_permission("198.51.100.2")
    keyed = _keyed_state()
    assert list(keyed["keys"]) == ["198.51.100.1", "198.51.100.2"]
    assert keyed["keys"]["198.51.100.2"] == {"available_permissions": 0, "nanos_to_wait": 1_000_000_000}
    assert keyed["keys"]["198.51.100.1"]["available_permissions"] == 1


def test_snapshot_caps_the_listing(per_ip: KeyedRateLimiter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "MAX_LISTED_KEYS", 2)
    for i in range(5):
        per_ip.acquire_permission(f"198.51.100.{i}")
    keyed = _keyed_state()
    assert list(keyed["keys"]) == ["198.51.100.0", "198.51.100.1"] and keyed["live_keys"] == 5


def test_snapshot_reads_no_private_attribute(
    per_ip: KeyedRateLimiter, monkeypatch: pytest.MonkeyPatch
) -> None:
    per_ip.acquire_permission("198.51.100.9")
    calls: list[int | None] = []
    real = per_ip.keys

    def spy(limit: int | None = None) -> list[str]:
        calls.append(limit)
        return real(limit)

    monkeypatch.setattr(per_ip, "keys", spy)
    assert list(_keyed_state()["keys"]) == ["198.51.100.9"]
    assert calls == [state.MAX_LISTED_KEYS]
    assert "keys" not in _keyed_state(include_keys=False) and len(calls) == 1
