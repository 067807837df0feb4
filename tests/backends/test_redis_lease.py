"""Permit leases (``"lease": N``, backends/redis_lease.py + lua/lease.lua) against a real Redis.

What is checked: batches shrink as the budget nears empty and are spent locally (round trips counted); a
leased permit dies exactly at its cycle's end (FakeClock) and leftovers are never carried over; leasing and
non-leasing processes share one budget; Retry-After and the RateLimit figures come from the shared state (plus
the process's own lease); exactness across 4 processes over many cycles (a clock shared through shared memory,
so every cycle boundary is exact) and across 4 processes on Redis server time (many trials, and short real
cycles checked by bracketing each grant with the host clock Redis reads); the under-use bound measured and
asserted; async on redis.asyncio only; fault policies; no ghost charge from a late call; keyed leases with a
bounded table; the settings option and the registry wiring.
"""

from __future__ import annotations

import multiprocessing
import random
import time
import uuid
from dataclasses import asdict
from typing import Any

import pytest

from django_ratelimit_r4.backends import redis as rb
from django_ratelimit_r4.backends import redis_lease as rl
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig
from tests.backends.patient import patient
from tests.noblock import forbid_blocking

redis = pytest.importorskip("redis")

S = 1_000_000_000


def leased(url: str, prefix: str, limit: int, period_ns: int, lease: int, *, clock: Any = None,
           name: str = "rl", policy: str = "open") -> rl.RedisLeaseBackend:
    return rl.RedisLeaseBackend(
        name, limit, period_ns, clock if clock is not None else FakeClock(), lease=lease, url=url, prefix=prefix,
        fault_policy=policy,
    )


#: The multi-process tests: a generous command timeout and the "closed" policy, so a machine too loaded to
#: answer within the default 250 ms can only make a decision fail loudly (faults are asserted to be 0), never
#: admit through a fault policy.
PATIENT = {"socket_timeout": 10.0}


@pytest.fixture(name="redis_url")
def patient_redis_url(redis_url: str) -> str:
    """The shared Redis with :data:`PATIENT`'s timeout in the URL: the one-process tests count exactly too, and a
    URL's query overrides a backend's options (a 5 s one would cut the multi-process tests' 10 s)."""
    return patient(redis_url, PATIENT["socket_timeout"])


def under_use_bound(processes: int, lease: int) -> int:
    """The documented bound (docs/redis.md, Permit leases) for 1-permit requests."""
    return (processes - 1) * (lease - 1)


# ------------------------------------------------------------------------------------ one process, FakeClock


def test_batches_shrink_as_the_budget_empties_and_are_spent_locally(redis_url: str, prefix: str) -> None:
    b = leased(redis_url, prefix, 10, 60 * S, 4)
    waits = [b.acquire(1, 0) for _ in range(10)]
    assert waits == [0] * 10
    # batches: min(4, 10//2+1)=4, min(4, 6//2+1)=4, min(4, 2//2+1)=2 -> 3 round trips for 10 permits
    assert b.lease_stats.round_trips == 3
    assert b.lease_stats.local_grants == 7
    assert b.acquire(1, 0) < 0  # the 11th: a round trip to the shared state
    assert b.lease_stats.round_trips == 4
    assert b.successful_calls == 10 and b.failed_calls == 1


def test_a_leased_permit_dies_exactly_at_its_cycles_end(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    b = leased(redis_url, prefix, 10, 10 * S, 4, clock=clock)
    assert b.acquire(1, 0) == 0  # leases 4, holds 3
    clock.advance_ns(10 * S - 1)  # the last nanosecond of cycle 0: the lease still pays
    assert b.acquire(1, 0) == 0
    assert b.lease_stats.local_grants == 1
    clock.advance_ns(1)  # cycle 1: the 2 left are dead, the shared budget is full again
    assert b.acquire(1, 0) == 0
    assert b.lease_stats.round_trips == 2
    assert b.lease_stats.expired_permits == 2
    # Cycle 1 admits exactly 10 more, never 10 + the dead leftovers.
    assert sum(b.acquire(1, 0) >= 0 for _ in range(20)) == 9


def test_leasing_and_plain_processes_share_one_budget_and_retry_after_is_shared(
    redis_url: str, prefix: str
) -> None:
    clock = FakeClock()
    a = leased(redis_url, prefix, 10, 60 * S, 5, clock=clock, name="shared")
    plain = rb.RedisBackend("shared", 10, 60 * S, clock, url=redis_url, prefix=prefix)
    assert a.acquire(1, 0) == 0  # a holds 4 of the 5 it took
    assert sum(plain.acquire(1, 0) >= 0 for _ in range(10)) == 5
    clock.advance(10.5)
    wait = plain.acquire(1, 0)
    assert wait == -49_500_000_000
    assert [a.acquire(1, 0) for _ in range(4)] == [0] * 4  # a's lease still pays
    assert a.acquire(1, 0) == -49_500_000_000  # then the shared state rejects, with its own wait
    assert plain.state()[1] == 0


def test_remaining_is_the_shared_budget_plus_this_processs_lease(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    a = leased(redis_url, prefix, 20, 60 * S, 6, clock=clock, name="q")
    other = leased(redis_url, prefix, 20, 60 * S, 6, clock=clock, name="q")
    assert a.acquire_quota(1, 0) == (0, 19, 60 * S)  # took 6: 14 shared + 5 held
    clock.advance(1)
    assert a.acquire_quota(1, 0) == (0, 18, 59 * S)  # from the lease: 14 (as last read) + 4
    assert a.quota() == (18, 59 * S)
    assert other.acquire(1, 0) == 0  # takes 6 more
    assert a.quota() == (12, 59 * S)  # a fresh read: 8 shared + a's 4 (other's 5 count as spent)
    assert other.quota() == (13, 59 * S)
    assert a.state()[1] == 12
    wait, remaining, _ = a.acquire_quota(1, 0)
    assert (wait, remaining) == (0, 11)  # served from a's lease: 8 + 3


def test_reservations_are_not_leased(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    b = leased(redis_url, prefix, 2, 10 * S, 2, clock=clock)
    assert b.acquire(1, 0) == 0 and b.acquire(1, 0) == 0
    assert b.acquire(1, 25 * S) == 10 * S  # reserved in the shared state (debt), nothing leased
    clock.advance(10)
    assert b.acquire(1, 0) == 0  # cycle 1 repays the debt: 1 left
    assert b.acquire(1, 0) < 0


def test_drain_reset_and_change_limit_drop_the_lease(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    b = leased(redis_url, prefix, 10, 60 * S, 4, clock=clock)
    assert b.acquire(1, 0) == 0
    assert b.drain() == 3 + 6
    assert b.acquire(1, 0) < 0
    b.reset(clock)
    assert b.acquire(1, 0) == 0
    b.change_limit(2)
    assert b.lease_stats.dropped_permits == 3 + 3


# ------------------------------------------------------------------------------------------ across processes


class SharedClock:
    """A clock every forked process reads from shared memory; the test's parent moves it (client-time mode)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def now_ns(self) -> int:
        return int(self.value.value)

    def sleep(self, seconds: float) -> None:
        raise AssertionError("no waits here")

    async def asleep(self, seconds: float) -> None:
        raise AssertionError("no waits here")


def _cycle_worker(url: str, prefix: str, name: str, limit: int, period: int, lease: int | None, value: Any,
                  steps: int, attempts: int, barrier: Any, out: Any, seed: int) -> None:
    clock = SharedClock(value)
    if lease is None:
        b: Any = rb.RedisBackend(name, limit, period, clock, url=url, prefix=prefix, fault_policy="closed",
                                 connection_options=PATIENT)
    else:
        b = rl.RedisLeaseBackend(name, limit, period, clock, lease=lease, url=url, prefix=prefix,
                                 fault_policy="closed", connection_options=PATIENT)
    barrier.wait(60)  # every process built (each reset the anchor to the same shared time)
    rng = random.Random(seed)
    rows = []
    for _ in range(steps):
        barrier.wait(60)  # the parent set this step's time
        granted = rejected = 0
        for _ in range(rng.randint(0, attempts)):
            if b.acquire(1, 0) >= 0:
                granted += 1
            else:
                rejected += 1
        rows.append((granted, rejected))
        barrier.wait(60)
    out.put((rows, asdict(b.lease_stats) if lease is not None else None, b.faults))


def test_exact_across_4_processes_over_many_cycles_with_a_shared_clock(redis_url: str, prefix: str) -> None:
    """3 leasing processes + 1 plain one, a clock in shared memory moved by the parent in quarter cycles
    (every boundary exact), 60 cycles: never more than the limit in any cycle (a leftover carried over would
    show), and in every cycle with a rejection the under-use stays within (processes - 1) * (lease - 1)."""
    limit, lease, period, per_cycle, cycles, attempts = 40, 8, 10 * S, 4, 60, 14
    ctx = multiprocessing.get_context("fork")
    value = ctx.Value("q", 10**12, lock=False)
    barrier, out = ctx.Barrier(5), ctx.Queue()
    steps = per_cycle * cycles
    procs = [
        ctx.Process(target=_cycle_worker, args=(redis_url, prefix, "mp", limit, period, None if i == 3 else lease,
                                                value, steps, attempts, barrier, out, 1000 + i))
        for i in range(4)
    ]
    for p in procs:
        p.start()
    barrier.wait(60)
    for step in range(steps):
        value.value = 10**12 + step * (period // per_cycle)
        barrier.wait(60)
        barrier.wait(60)
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert sum(r[2] for r in results) == 0
    admitted = [0] * cycles
    rejected = [0] * cycles
    for rows, _, _ in results:
        for step, (g, r) in enumerate(rows):
            admitted[step // per_cycle] += g
            rejected[step // per_cycle] += r
    assert max(admitted) <= limit, admitted
    under = [limit - a for a, r in zip(admitted, rejected, strict=True) if r]
    assert len(under) >= cycles // 2  # the load exceeds the limit in most cycles
    assert max(under) <= under_use_bound(4, lease), under
    # Every leased permit is spent, dies at its cycle's end or is dropped at most once (whether a process holds
    # a leftover at a boundary depends on how the processes interleave: the death itself is shown exactly by
    # test_a_leased_permit_dies_exactly_at_its_cycles_end; here, no cycle exceeded the limit).
    for _, stats, _ in results:
        if stats:
            used = stats["spent_permits"] + stats["expired_permits"] + stats["dropped_permits"]
            assert used <= stats["leased_permits"], stats


def _burst_worker(url: str, prefix: str, names: list[str], limit: int, lease: int, barrier: Any, out: Any) -> None:
    granted, faults = [], 0
    for name in names:
        b = rl.RedisLeaseBackend(name, limit, 600 * S, SYSTEM_CLOCK, lease=lease, url=url, prefix=prefix,
                                 fault_policy="closed", connection_options=PATIENT)
        barrier.wait(60)
        granted.append(sum(b.acquire(1, 0) >= 0 for _ in range(limit)))
        faults += b.faults
    out.put((granted, faults))


def test_exact_across_4_processes_on_server_time_many_trials(redis_url: str, prefix: str) -> None:
    """Redis TIME (no client clock): 4 processes released together by a barrier, 40 trials of a fresh
    50-per-10-minutes limit, each process asking 50 times: exactly within [limit - bound, limit]."""
    limit, lease, trials = 50, 10, 40
    names = [f"burst{i}" for i in range(trials)]
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_burst_worker, args=(redis_url, prefix, names, limit, lease, barrier, out))
             for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert sum(r[1] for r in results) == 0
    totals = [sum(r[0][t] for r in results) for t in range(trials)]
    assert max(totals) <= limit, totals
    assert min(totals) >= limit - under_use_bound(4, lease), totals


def _real_cycle_worker(url: str, prefix: str, limit: int, period: int, lease: int, seconds: float,
                       barrier: Any, out: Any) -> None:
    b = rl.RedisLeaseBackend("real", limit, period, SYSTEM_CLOCK, lease=lease, url=url, prefix=prefix,
                             fault_policy="closed", connection_options=PATIENT)
    barrier.wait(60)
    grants = []
    rng = random.Random()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        before = time.time_ns()
        if b.acquire(1, 0) >= 0:
            grants.append((before, time.time_ns()))
        # Paced (about 90 attempts/s each, 1.2x the limit together), so budgets run out late in their cycle,
        # with permits still leased: the case where a lease outliving its cycle would over-admit.
        time.sleep(rng.uniform(0.0, 0.022))
    out.put(grants)


def test_leases_die_at_real_cycle_boundaries_across_4_processes(redis_url: str, prefix: str) -> None:
    """Server time, 100 ms cycles, 4 paced processes for 2 s: every grant is bracketed by the host's
    clock (the one Redis TIME reads on loopback); the grants lying wholly inside one cycle never exceed the
    limit. A lease outliving its cycle (spent after the boundary, next to a full new budget) would show."""
    limit, lease, period = 30, 8, 100_000_000
    client = redis.Redis.from_url(redis_url)
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_real_cycle_worker, args=(redis_url, prefix, limit, period, lease, 2.0, barrier, out))
             for _ in range(4)]
    for p in procs:
        p.start()
    grants = [g for _ in procs for g in out.get(timeout=120)]
    for p in procs:
        p.join(30)
    s, ns = client.get(rb.key_base(prefix, "rl", "real") + ":anchor").split()
    client.close()
    anchor = int(s) * S + int(ns)
    per_cycle: dict[int, int] = {}
    for before, after in grants:
        first, last = (before - anchor) // period, (after - anchor) // period
        if first == last:
            per_cycle[first] = per_cycle.get(first, 0) + 1
    assert len(per_cycle) >= 5
    assert max(per_cycle.values()) <= limit, per_cycle


# ----------------------------------------------------------------------------------- async, faults, late calls


async def test_async_path_uses_redis_asyncio_only(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = leased(redis_url, prefix, 10, 60 * S, 4, clock=SYSTEM_CLOCK)
    cfg = RateLimiterConfig(limit_for_period=3, limit_refresh_period="60s")
    limiter = RateLimiter("rla", cfg, backend=rl.redis_lease_backend(redis_url, lease=2, prefix=prefix))

    def no_sync(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("sync Redis call on the event loop")

    monkeypatch.setattr(rb.RedisConnection, "run_script", no_sync)
    with forbid_blocking(monkeypatch) as blocking:
        waits = [await b.aacquire(1, 0) for _ in range(11)]
        quota = await b.aacquire_quota(1, 0)
        remaining, _ = await limiter.aacquire_quota()
        await limiter.aacquire_or_raise()
        await limiter.aacquire_or_raise()
        with pytest.raises(RequestNotPermitted) as info:
            await limiter.aacquire_or_raise()
    assert blocking == [], blocking
    assert waits[:10] == [0] * 10 and waits[10] < 0 and quota[0] < 0
    assert b.lease_stats.round_trips == 5 and b.faults == 0
    assert remaining == 2
    assert 0 < info.value.wait_ns <= 60 * S


@pytest.mark.parametrize("policy", ["local", "open", "closed"])
def test_fault_policies_after_the_lease_is_spent(redis_server: Any, prefix: str, policy: str) -> None:
    b = leased(redis_server.url, prefix, 10, 60 * S, 4, clock=SYSTEM_CLOCK, policy=policy)
    assert b.acquire(1, 0) == 0  # holds 3
    redis_server.stop()
    assert [b.acquire(1, 0) for _ in range(3)] == [0, 0, 0]  # the lease keeps paying while Redis is down
    assert b.faults == 0
    decisions = [b.acquire(1, 0) for _ in range(12)]
    assert b.faults == 12
    if policy == "open":
        assert decisions == [0] * 12
    elif policy == "closed":
        assert decisions == [-rb.FAULT_RETRY_AFTER_NS] * 12
    else:
        assert decisions[:10] == [0] * 10 and all(w < 0 for w in decisions[10:])  # the in-process limiter


def test_a_late_call_changes_nothing(redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    b = leased(redis_url, prefix, 10, 60 * S, 4, clock=SYSTEM_CLOCK, policy="closed")
    monkeypatch.setattr(b._connection(), "deadline", lambda started_ns: 1)  # long past: every call is LATE
    assert b.acquire(1, 0) == -rb.FAULT_RETRY_AFTER_NS
    assert b.faults == 1 and b.lease_stats.round_trips == 0
    plain = rb.RedisBackend("rl", 10, 60 * S, SYSTEM_CLOCK, url=redis_url, prefix=prefix)
    assert plain.state()[1] == 10  # no ghost charge


# ------------------------------------------------------------------------------------------------ keyed


def test_keyed_leases_per_client_key_in_a_bounded_table(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    cfg = RateLimiterConfig(limit_for_period=10, limit_refresh_period="60s")
    k = rl.RedisLeaseKeyedRateLimiter("k", cfg, lease=4, clock=clock, url=redis_url, prefix=prefix, max_keys=3)
    other = rl.RedisLeaseKeyedRateLimiter("k", cfg, lease=4, clock=clock, url=redis_url, prefix=prefix)
    assert sum(k.acquire_permission("alice") for _ in range(12)) == 10
    assert k.store.lease_stats.round_trips == 3 + 2
    assert other.acquire_permission("bob")
    assert not other.acquire_permission("alice")  # one budget per key for every process
    for key in ("c1", "c2", "c3", "c4"):
        assert k.acquire_permission(key)
    assert len(k.store._leases) == 3  # bounded: the least recently used lease was dropped
    assert k.store.lease_stats.dropped_permits == 3
    assert k.quota("c4") == (9, 60 * S)  # 6 shared + 3 held
    assert k.acquire_quota("c4") == (8, 60 * S)
    k.reset("c4")
    assert k.quota("c4") == (10, 60 * S)


# --------------------------------------------------------------------------------------- settings and registry


def test_the_lease_option_builds_leased_limiters(redis_url: str, prefix: str, settings: Any) -> None:
    from django_ratelimit_r4 import registry

    name = f"leased{uuid.uuid4().hex[:6]}"
    settings.RATELIMIT_R4 = {
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": redis_url, "OPTIONS": {"key_prefix": prefix}}},
        "ratelimiters": {"instances": {name: {"rate": "20/m", "backend": "shared", "lease": 5,
                                              "on_backend_error": "deny"}}},
    }
    limiter = registry.get_rate_limiter(name)
    assert isinstance(limiter.backend, rl.RedisLeaseBackend)
    assert limiter.backend.lease == 5 and limiter.backend.fault_policy == "closed"
    assert sum(limiter.acquire_permission() for _ in range(25)) == 20
    assert limiter.backend.lease_stats.round_trips <= 12
    keyed = registry.get_keyed_rate_limiter(name)
    assert isinstance(keyed.store, rl.RedisLeaseKeyedStore) and keyed.store.lease == 5
    assert keyed.acquire_permission("a")


# ------------------------------------------------------------------------------------------ Redis Cluster


def _cluster_worker(url: str, prefix: str, limit: int, lease: int, keys: list[str], barrier: Any, out: Any) -> None:
    cfg = RateLimiterConfig(limit_for_period=limit, limit_refresh_period="600s")
    options = {"cluster": True, **PATIENT}
    b = rl.RedisLeaseBackend("u", limit, 600 * S, SYSTEM_CLOCK, lease=lease, url=url, prefix=prefix,
                             fault_policy="closed", connection_options=options)
    k = rl.RedisLeaseKeyedRateLimiter("k", cfg, lease=lease, url=url, prefix=prefix, fault_policy="closed",
                                      connection_options=options)
    barrier.wait(60)
    unkeyed = sum(b.acquire(1, 0) >= 0 for _ in range(limit))
    keyed = {key: sum(k.acquire_permission(key) for _ in range(limit)) for key in keys}
    out.put((unkeyed, keyed, b.faults + k.store.faults))


def test_exact_across_4_processes_on_a_redis_cluster(redis_cluster: Any) -> None:
    """A 3-primary cluster: each lease script touches its key's slot (keyed clients spread over the shards),
    and 4 processes together never exceed the limit, unkeyed and for each of 12 client keys."""
    limit, lease = 30, 6
    prefix = f"r4c:{uuid.uuid4().hex[:10]}"
    keys = [f"198.51.100.{i}" for i in range(12)]
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_cluster_worker, args=(redis_cluster.url, prefix, limit, lease, keys, barrier, out))
             for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert sum(r[2] for r in results) == 0  # no fault: every script found its slot
    bound = under_use_bound(4, lease)
    assert limit - bound <= sum(r[0] for r in results) <= limit
    for key in keys:
        assert limit - bound <= sum(r[1][key] for r in results) <= limit, key


# ----------------------------------------------------------------------------- visible to operators


def test_lease_counters_in_the_snapshot_r4_status_and_prometheus(
    redis_url: str, prefix: str, settings: Any, r4_clock: Any
) -> None:
    import io

    from django.core.management import call_command
    from prometheus_client import CollectorRegistry

    from django_ratelimit_r4 import registry, state
    from django_ratelimit_r4.contrib import prometheus

    name = f"leased{uuid.uuid4().hex[:6]}"
    settings.RATELIMIT_R4 = {
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": redis_url, "OPTIONS": {"key_prefix": prefix}}},
        "ratelimiters": {"instances": {name: {"rate": "10/m", "backend": "shared", "lease": 5},
                                       "plain": {"rate": "10/m"}}},
    }
    limiter = registry.get_rate_limiter(name)

    def lease() -> dict[str, int]:
        (item,) = state.snapshot([f"ratelimiter:{name}"])
        return item["state"]["lease"]

    # batches of min(5, left // 2 + 1): 5 (10 left), 3 (5 left), 2 (2 left); each spends 1 at once
    assert all(limiter.acquire_permission() for _ in range(9))
    assert lease() == {"lease": 5, "round_trips": 3, "local_grants": 6, "batches": 3, "leased_permits": 7,
                       "spent_permits": 6, "expired_permits": 0, "dropped_permits": 0, "held_permits": 1}
    r4_clock.advance(60)  # the held permit dies at the cycle's end; the next decision takes a new batch of 5
    assert limiter.acquire_permission()
    assert lease() == {"lease": 5, "round_trips": 4, "local_grants": 6, "batches": 4, "leased_permits": 11,
                       "spent_permits": 6, "expired_permits": 1, "dropped_permits": 0, "held_permits": 4}
    state.reset(f"ratelimiter:{name}")  # drops this process's live lease
    figures = lease()
    assert (figures["dropped_permits"], figures["held_permits"]) == (4, 0)
    (plain,) = state.snapshot(["ratelimiter:plain"])
    assert "lease" not in plain["state"]  # no lease, no block

    out = io.StringIO()
    call_command("r4", "status", stdout=out)
    text = out.getvalue()
    line = (f"  {name}: lease 5: 4 batches, 11 permits leased, 6 spent locally, 1 expired, 4 dropped, "
            "0 held")
    assert line in text.splitlines()
    assert text.count(": lease ") == 1  # only the leased limiter has the line
    out = io.StringIO()
    call_command("r4", "status", "plain", stdout=out)
    assert ": lease " not in out.getvalue()

    target = CollectorRegistry()
    target.register(prometheus.R4Collector())
    assert target.get_sample_value("resilience4j_ratelimiter_lease_batches_total", {"name": name}) == 4
    permits = {kind: target.get_sample_value("resilience4j_ratelimiter_lease_permits_total",
                                             {"name": name, "kind": kind})
               for kind in ("leased", "spent", "expired", "dropped")}
    assert permits == {"leased": 11, "spent": 6, "expired": 1, "dropped": 4}
    assert target.get_sample_value("resilience4j_ratelimiter_lease_batches_total", {"name": "plain"}) is None
