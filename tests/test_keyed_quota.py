"""The keyed fast path: KeyedRateLimiter.acquire_quota() and the gate's keyed RateLimit fields.

``acquire_quota`` decides and returns the header figures in one locked step (with a cached current
cycle); it must equal ``acquire_or_raise`` followed by ``quota`` at every step, stay exact under
threads, and the gate must write exactly what the reference formatter writes.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import RequestFactory, override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from django_ratelimit_r4 import gate as gate_module
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import RateLimiterConfig
from django_ratelimit_r4.gate import RateLimitGate, _secret_salt
from django_ratelimit_r4.headers import QuotaStatus, delay_seconds, draft10_headers, window_seconds
from django_ratelimit_r4.keyed import KeyedRateLimiter
from tests import views

pytestmark = pytest.mark.django_db(databases=[])

S = 1_000_000_000
rf = RequestFactory()


def pair(
    limit: int, timeout_ms: int, max_keys: int
) -> tuple[KeyedRateLimiter, FakeClock, KeyedRateLimiter, FakeClock]:
    """Two identical limiters on two clocks kept in lockstep (a reserved permit sleeps on its own clock)."""
    config = RateLimiterConfig(
        limit_for_period=limit, limit_refresh_period="1s", timeout_duration=f"{timeout_ms}ms"
    )
    clock_a, clock_b = FakeClock(start_ns=7 * S), FakeClock(start_ns=7 * S)
    a = KeyedRateLimiter("a", config, clock=clock_a, max_keys=max_keys)
    b = KeyedRateLimiter("b", config, clock=clock_b, max_keys=max_keys)
    return a, clock_a, b, clock_b


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from("abc"), st.integers(1, 4)),
        st.tuples(st.just("advance"), st.one_of(st.integers(0, 2500), st.just(1000))),  # milliseconds
        st.tuples(st.just("drain"), st.sampled_from("abc")),
        st.tuples(st.just("reset"), st.sampled_from(["a", None])),
        st.tuples(st.just("set_clock"), st.integers(0, 5000)),  # a new clock starting at this many ms
    ),
    max_size=60,
)


@pytest.mark.parametrize("inlined", [True, False], ids=["inlined fast path", "KeyedBackend.decide_quota"])
@settings(max_examples=150, deadline=None)
@given(
    ops=_ops,
    limit=st.integers(1, 3),
    timeout_ms=st.sampled_from([0, 500, 3000]),
    max_keys=st.sampled_from([2, 10]),
)
def test_acquire_quota_equals_acquire_then_quota(inlined, ops, limit, timeout_ms, max_keys):
    """Both ways the default store decides acquire_quota: the common case inlined in the limiter, and the
    store's own ``decide_quota`` (what every other store answers through), against a decision then quota()."""
    subject, clock_s, reference, clock_r = pair(limit, timeout_ms, max_keys)
    if not inlined:
        subject.acquire_quota = subject._acquire_quota_of_store  # type: ignore[method-assign]
    for op in ops:
        if op[0] == "advance":
            clock_s.advance_ns(op[1] * 1_000_000)
            clock_r.advance_ns(op[1] * 1_000_000)
        elif op[0] == "drain":
            assert subject.drain_permissions(op[1]) == reference.drain_permissions(op[1])
        elif op[0] == "reset":
            subject.reset(op[1])
            reference.reset(op[1])
        elif op[0] == "set_clock":
            clock_s, clock_r = FakeClock(start_ns=op[1] * 1_000_000), FakeClock(start_ns=op[1] * 1_000_000)
            subject.set_clock(clock_s)
            reference.set_clock(clock_r)
        else:
            _, key, permits = op
            try:
                got: Any = subject.acquire_quota(key, permits)
            except RequestNotPermitted as exc:
                got = ("rejected", exc.wait_ns, exc.quotas)  # the figures come with the rejection
            except ValueError:  # more permits than could ever be granted
                got = ("never",)
            try:
                reference.acquire_or_raise(key, permits)
                expected: Any = reference.quota(key)
            except RequestNotPermitted as exc:
                expected = ("rejected", exc.wait_ns, (reference.quota(key),))
            except ValueError:
                expected = ("never",)
            assert got == expected
        assert clock_s.now_ns() == clock_r.now_ns()
        for k in "abc":
            assert subject.state(k) == reference.state(k)
        assert subject.keys() == reference.keys()
        assert (subject.successful_calls, subject.failed_calls, subject.lossy_evictions) == (
            reference.successful_calls,
            reference.failed_calls,
            reference.lossy_evictions,
        )


def smooth_pair(
    algorithm: str, limit: int, timeout_ms: int, max_keys: int
) -> tuple[Any, FakeClock, Any, FakeClock]:
    """:func:`pair` for GCRA (burst ``limit``) and the sliding window: two in-memory keyed limiters in lockstep."""
    config = RateLimiterConfig(
        limit_for_period=limit,
        limit_refresh_period="1s",
        timeout_duration=f"{timeout_ms}ms",
        algorithm=algorithm,
    )
    clock_a, clock_b = FakeClock(start_ns=7 * S), FakeClock(start_ns=7 * S)
    a = KeyedRateLimiter("a", config, clock=clock_a, max_keys=max_keys)
    b = KeyedRateLimiter("b", config, clock=clock_b, max_keys=max_keys)
    return a, clock_a, b, clock_b


@pytest.mark.parametrize("algorithm", ["gcra", "sliding_window"])
@settings(max_examples=150, deadline=None)
@given(
    ops=_ops,
    limit=st.integers(1, 4),
    timeout_ms=st.sampled_from([0, 500, 3000]),
    max_keys=st.sampled_from([2, 10]),
)
def test_smooth_acquire_quota_equals_acquire_then_quota(algorithm, ops, limit, timeout_ms, max_keys):
    """The GCRA and sliding-window stores' ``decide_quota`` (their keyed ``@ratelimit`` path) against a decision
    then quota(), a rejection's figures included (the stores say ``rejection_quotas``: a 429's RateLimit fields
    are these). They used to answer a rejection with ``(0, 0)`` where quota() read ``(0, wait)``."""
    subject, clock_s, reference, clock_r = smooth_pair(algorithm, limit, timeout_ms, max_keys)
    assert subject.store.rejection_quotas
    for op in ops:
        if op[0] == "advance":
            clock_s.advance_ns(op[1] * 1_000_000)
            clock_r.advance_ns(op[1] * 1_000_000)
        elif op[0] == "drain":
            assert subject.drain_permissions(op[1]) == reference.drain_permissions(op[1])
        elif op[0] == "reset":
            subject.reset(op[1])
            reference.reset(op[1])
        elif op[0] == "set_clock":
            clock_s, clock_r = FakeClock(start_ns=op[1] * 1_000_000), FakeClock(start_ns=op[1] * 1_000_000)
            subject.set_clock(clock_s)
            reference.set_clock(clock_r)
        else:
            _, key, permits = op
            try:
                got: Any = subject.acquire_quota(key, permits)
            except RequestNotPermitted as exc:
                got = ("rejected", exc.wait_ns, exc.quotas)
            except ValueError:
                got = ("never",)
            try:
                reference.acquire_or_raise(key, permits)
                expected: Any = reference.quota(key)
            except RequestNotPermitted as exc:
                expected = ("rejected", exc.wait_ns, (reference.quota(key),))
            except ValueError:
                expected = ("never",)
            assert got == expected
        assert clock_s.now_ns() == clock_r.now_ns()
        for k in "abc":
            assert subject.state(k) == reference.state(k)
            assert subject.quota(k) == reference.quota(k)
        assert len(subject) == len(reference)
        assert (subject.successful_calls, subject.failed_calls, subject.lossy_evictions) == (
            reference.successful_calls,
            reference.failed_calls,
            reference.lossy_evictions,
        )


def test_acquire_quota_crosses_cycle_boundaries_on_the_real_clock_anchor():
    """The cached cycle moves on at the boundary: the first call of a new cycle refreshes the key."""
    limiter, clock, _, _ = pair(limit=3, timeout_ms=0, max_keys=10)
    assert limiter.acquire_quota("k") == (2, S)
    clock.advance_ns(S - 1)
    assert limiter.acquire_quota("k") == (1, 1)
    clock.advance_ns(1)  # exactly on the boundary: a new cycle, a full budget again
    assert limiter.acquire_quota("k") == (2, S)
    assert limiter.acquire_quota("k", 2) == (0, S)  # no permit left: reset is the wait for one
    with pytest.raises(RequestNotPermitted) as info:
        limiter.acquire_quota("k")
    assert info.value.wait_ns == S
    clock.advance_ns(5 * S)  # several idle cycles: refreshed to the limit, never beyond
    assert limiter.acquire_quota("k") == (2, S)


def test_acquire_quota_rejects_bad_permits_and_publishes_events():
    limiter, _, _, _ = pair(limit=3, timeout_ms=0, max_keys=10)
    seen: list[str] = []
    limiter.events.on_event(lambda event: seen.append(event.event_type))
    limiter.acquire_quota("k")
    with pytest.raises(ValueError):
        limiter.acquire_quota("k", 0)
    with pytest.raises(RequestNotPermitted):
        limiter.acquire_quota("k", 3)
    assert seen == ["SUCCESSFUL_ACQUIRE", "FAILED_ACQUIRE"]


@pytest.mark.parametrize("trial", range(10))
def test_acquire_quota_exact_under_threads(trial, fast_switching):
    """8 threads oversubscribe 3 keys: each key grants exactly its limit, and the remaining counts
    the grants report are exactly limit-1 .. 0, each once (every figure is its own decision's)."""
    limit, keys, threads = 40, 3, 8
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period="1h")
    limiter = KeyedRateLimiter("t", config, clock=FakeClock())
    barrier = threading.Barrier(threads)
    seen: list[list[tuple[int, int]]] = [[] for _ in range(threads)]

    def worker(index: int) -> None:
        barrier.wait()
        for i in range(limit * keys // 3):  # 8 x 40 tries on 3 keys: 2.7x oversubscribed
            try:
                remaining, _ = limiter.acquire_quota(f"k{i % keys}")
            except RequestNotPermitted:
                continue
            seen[index].append((i % keys, remaining))

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    grants = [g for per_thread in seen for g in per_thread]
    for key in range(keys):
        assert sorted(r for k, r in grants if k == key) == list(range(limit))
    assert limiter.successful_calls == limit * keys
    assert limiter.failed_calls == threads * (limit * keys // 3) - limit * keys


# ------------------------------------------------------------------------------------------ the gate


def keyed_settings(**top: Any) -> dict[str, Any]:
    value = views.r4_settings(**top)
    value["ratelimiters"]["instances"]["per_ip_60"] = {
        "limit_for_period": 3,
        "limit_refresh_period": "60s",
        "key": "ip",
    }
    return value


def ok(request: Any) -> HttpResponse:
    return HttpResponse("ok")


async def aok(request: Any) -> HttpResponse:
    return HttpResponse("ok")


def reference(
    name: str, limit: int, period_ns: int, remaining: int, reset_ns: int, key: str
) -> dict[str, str]:
    # ``key`` is the client's IP: the gate stores (and hashes into pk) its namespaced form.
    status = QuotaStatus(name, limit, window_seconds(period_ns), remaining, delay_seconds(reset_ns), "ip:" + key)
    return draft10_headers([status], salt=_secret_salt())


def fields(response: HttpResponse) -> dict[str, str]:
    return {name: response[name] for name in ("RateLimit-Policy", "RateLimit")}


def test_gate_keyed_fields_equal_the_reference_formatter_step_by_step(r4_clock) -> None:
    with override_settings(RATELIMIT_R4=keyed_settings()):
        gate = RateLimitGate("per_ip_60")
        assert gate.plan().fast_keyed is not None  # in memory, draft-10: the fast path
        a = rf.get("/", REMOTE_ADDR="203.0.113.7")
        b = rf.get("/", REMOTE_ADDR="198.51.100.2")
        assert fields(gate.call(ok, a)) == reference("per_ip_60", 3, 60 * S, 2, 60 * S, "203.0.113.7")
        r4_clock.advance(10)
        assert fields(gate.call(ok, a)) == reference("per_ip_60", 3, 60 * S, 1, 50 * S, "203.0.113.7")
        assert fields(gate.call(ok, b)) == reference("per_ip_60", 3, 60 * S, 2, 50 * S, "198.51.100.2")
        r4_clock.advance(20.5)
        assert fields(gate.call(ok, a)) == reference("per_ip_60", 3, 60 * S, 0, 29_500_000_000, "203.0.113.7")
        with pytest.raises(RequestNotPermitted):
            gate.call(ok, a)
        assert fields(gate.call(ok, b)) == reference(
            "per_ip_60", 3, 60 * S, 1, 29_500_000_000, "198.51.100.2"
        )
        r4_clock.advance(29.5)  # the next cycle
        assert fields(gate.call(ok, a)) == reference("per_ip_60", 3, 60 * S, 2, 60 * S, "203.0.113.7")


async def test_gate_keyed_fields_async_twin(r4_clock) -> None:
    with override_settings(RATELIMIT_R4=keyed_settings()):
        gate = RateLimitGate("per_ip_60")
        a = rf.get("/", REMOTE_ADDR="203.0.113.7")
        assert fields(await gate.acall(aok, a)) == reference("per_ip_60", 3, 60 * S, 2, 60 * S, "203.0.113.7")
        r4_clock.advance(15)
        assert fields(await gate.acall(aok, a)) == reference("per_ip_60", 3, 60 * S, 1, 45 * S, "203.0.113.7")


@pytest.mark.parametrize("style", ["draft-6", None])
def test_other_header_styles_take_the_general_path(r4_clock, style) -> None:
    with override_settings(RATELIMIT_R4=keyed_settings(headers=style)):
        gate = RateLimitGate("per_ip_60")
        assert gate.plan().fast_keyed is None
        response = gate.call(ok, rf.get("/", REMOTE_ADDR="203.0.113.7"))
        if style is None:
            assert "RateLimit" not in response and "RateLimit-Remaining" not in response
        else:
            assert (response["RateLimit-Remaining"], response["RateLimit-Reset"]) == ("2", "60")


def test_per_key_header_cache_is_bounded_and_stays_exact(r4_clock, monkeypatch) -> None:
    monkeypatch.setattr(gate_module, "_KEYED_ENTRIES_MAX", 3)
    with override_settings(RATELIMIT_R4=keyed_settings()):
        gate = RateLimitGate("per_ip_60")
        clients = [f"192.0.2.{n}" for n in range(1, 8)]
        for round_ in range(2):  # the second round finds most keys evicted from the cache
            for client in clients:
                response = gate.call(ok, rf.get("/", REMOTE_ADDR=client))
                assert fields(response) == reference("per_ip_60", 3, 60 * S, 2 - round_, 60 * S, client)
                assert len(gate.plan().keyed_entries) <= 3


def test_key_none_exempts_without_touching_the_store(r4_clock) -> None:
    with override_settings(RATELIMIT_R4=keyed_settings()):
        gate = RateLimitGate("per_ip_60", key=lambda request: None)
        assert gate.plan().fast_keyed is not None
        response = gate.call(ok, rf.get("/", REMOTE_ADDR="203.0.113.7"))
        assert "RateLimit" not in response
        assert len(gate.plan().fast_keyed.keyed) == 0


def test_ip_entries_are_found_by_remote_addr_text_and_share_the_normalised_budget(r4_clock) -> None:
    """Key "ip" without proxies caches clients by the REMOTE_ADDR text; spellings of one client
    (IPv4-mapped IPv6, a /64 group) still share one budget and one pk, and odd text is never a key."""
    with override_settings(RATELIMIT_R4=keyed_settings(ipv6_prefix_length=64)):
        gate = RateLimitGate("per_ip_60")
        plan = gate.plan()
        assert plan.keyed_by_remote_addr
        seen = [
            fields(gate.call(ok, rf.get("/", REMOTE_ADDR=text)))
            for text in ("203.0.113.7", "::ffff:203.0.113.7", "203.0.113.7")
        ]
        assert seen == [reference("per_ip_60", 3, 60 * S, r, 60 * S, "203.0.113.7") for r in (2, 1, 0)]
        with pytest.raises(RequestNotPermitted):
            gate.call(ok, rf.get("/", REMOTE_ADDR="::ffff:203.0.113.7"))
        group = "2001:db8:1:2::/64"
        assert fields(gate.call(ok, rf.get("/", REMOTE_ADDR="2001:db8:1:2::1"))) == reference(
            "per_ip_60", 3, 60 * S, 2, 60 * S, group
        )
        assert fields(gate.call(ok, rf.get("/", REMOTE_ADDR="2001:db8:1:2::ffff"))) == reference(
            "per_ip_60", 3, 60 * S, 1, 60 * S, group
        )
        # A REMOTE_ADDR spelled like a group is not an address: it is the unknown client, not the group.
        assert fields(gate.call(ok, rf.get("/", REMOTE_ADDR=group))) == reference(
            "per_ip_60", 3, 60 * S, 2, 60 * S, "unknown"
        )
        long_text = "9" * 300
        assert fields(gate.call(ok, rf.get("/", REMOTE_ADDR=long_text))) == reference(
            "per_ip_60", 3, 60 * S, 1, 60 * S, "unknown"
        )
        assert long_text not in plan.keyed_entries
        assert {entry[0] for entry in plan.keyed_entries.values()} == {"ip:203.0.113.7", "ip:" + group, "ip:unknown"}


def test_trusted_proxies_key_by_the_resolved_client(r4_clock) -> None:
    with override_settings(RATELIMIT_R4=keyed_settings(trusted_proxies=1)):
        gate = RateLimitGate("per_ip_60")
        assert gate.plan().fast_keyed is not None and not gate.plan().keyed_by_remote_addr
        for remaining, peer in ((2, "10.0.0.1"), (1, "10.0.0.2")):  # two proxies, one client
            request = rf.get("/", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR="203.0.113.7")
            assert fields(gate.call(ok, request)) == reference(
                "per_ip_60", 3, 60 * S, remaining, 60 * S, "203.0.113.7"
            )
