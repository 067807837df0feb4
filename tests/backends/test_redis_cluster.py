"""Redis Cluster (issue 11): every script touches one slot, a keyed limiter's clients spread over the slots,
and decisions stay exact across processes on a real 3-primary cluster (the session's ``redis_cluster``).

Exactness is shown the strong way: 4 processes start together (a barrier), each asks many times, and the
grants add up to exactly the limit -- for unkeyed, keyed and all-or-nothing decisions over limits living in
different slots (which the client splits per slot and compensates, see docs/redis.md).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

from django_ratelimit_r4.core.clock import FakeClock  # noqa: E402
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig  # noqa: E402

from .conftest import start_cluster_or_fail  # noqa: E402
from .redis_cluster import LocalCluster  # noqa: E402

CLUSTER = {"cluster": True}
PROCESSES = 4


def _config(limit: int, period: str = "60s") -> RateLimiterConfig:
    return RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, timeout_duration=0)


def _prefix() -> str:
    return f"r4c:{uuid.uuid4().hex[:10]}"


def _unkeyed(url: str, prefix: str, name: str, limit: int, clock: Any = None) -> RateLimiter:
    factory = rb.redis_backend(url, prefix=prefix, fault_policy="closed", connection_options=CLUSTER)
    kwargs = {} if clock is None else {"clock": clock}
    return RateLimiter(name, _config(limit), backend=factory, **kwargs)


def _in_processes(work: Callable[[int], Any], processes: int = PROCESSES) -> list[Any]:
    """``work(index)`` in ``processes`` forked processes started together (a barrier); their results."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()

    def child(index: int) -> None:
        barrier.wait(30)
        try:
            results.put((index, work(index)))
        except BaseException as exc:  # pragma: no cover - reported by the parent
            results.put((index, exc))

    procs = [ctx.Process(target=child, args=(i,)) for i in range(processes)]
    for proc in procs:
        proc.start()
    out = dict(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    for value in out.values():
        if isinstance(value, BaseException):
            raise value
    return [out[i] for i in range(processes)]


def _slot(key: str | bytes) -> int:
    from redis.crc import key_slot

    return int(key_slot(key.encode() if isinstance(key, str) else key))


# --------------------------------------------------------------------------------------------- key layout


def test_every_script_touches_one_slot_and_keyed_clients_spread(redis_cluster: LocalCluster) -> None:
    prefix = _prefix()
    rl = _unkeyed(redis_cluster.url, prefix, "api", 5)
    backend = rl.backend
    assert _slot(backend.anchor_key) == _slot(backend.state_key)
    keyed = rb.RedisKeyedRateLimiter("per_ip", _config(3), url=redis_cluster.url, prefix=prefix, connection_options=CLUSTER)
    slots = set()
    for i in range(400):
        state = keyed.store._state_key(f"198.51.100.{i}")
        anchor = keyed.store._phase_of(state).anchor_key
        assert _slot(state) == _slot(anchor)  # one script, one slot
        slots.add(_slot(state))
    assert len(slots) > 150  # ~256 shards: no hot slot
    nodes = {keyed.store._conn.sync.get_node_from_key(keyed.store._state_key(f"198.51.100.{i}")).name for i in range(400)}
    assert len(nodes) == 3  # every primary takes part
    # The same layout helper names a plain server's keys: one tag per limiter there.
    assert rb.key_base("r4", "rlk", "a:b") == "r4:rlk:{a%3Ab}"
    assert rb.key_base("r4", "rlk", "a", "0f") == "r4:rlk:{a:0f}"


# ------------------------------------------------------------------------------------ one process, exact


def test_unkeyed_and_keyed_decisions_sync_and_async(redis_cluster: LocalCluster) -> None:
    prefix = _prefix()
    rl = _unkeyed(redis_cluster.url, prefix, "api", 5)
    assert [rl.acquire_permission() for _ in range(7)] == [True] * 5 + [False] * 2
    keyed = rb.RedisKeyedRateLimiter("k", _config(2), url=redis_cluster.url, prefix=prefix, connection_options=CLUSTER)
    for client in ("a", "b", "c"):
        assert [keyed.acquire_permission(client) for _ in range(3)] == [True, True, False]
    assert keyed.state("a")[1] == 0 and len(keyed) == 3 and "a" in keyed
    keyed.reset("a")
    assert keyed.acquire_permission("a")

    async def run() -> None:
        other = _unkeyed(redis_cluster.url, prefix, "async", 4)
        assert [await other.aacquire_permission() for _ in range(5)] == [True] * 4 + [False]
        assert [await keyed.aacquire_permission("d") for _ in range(3)] == [True, True, False]
        remaining, _ = await keyed.aquota("d")
        assert remaining == 0

    asyncio.run(run())
    keyed.reset()
    assert len(keyed) == 0 and keyed.acquire_permission("b")


def test_a_fake_clock_drives_cluster_limiters_and_reset_restarts_every_shard(redis_cluster: LocalCluster) -> None:
    clock = FakeClock()
    prefix = _prefix()
    keyed = rb.RedisKeyedRateLimiter(
        "k", _config(1, "10s"), clock=clock, url=redis_cluster.url, prefix=prefix, connection_options=CLUSTER
    )
    clients = [f"c{i}" for i in range(20)]
    assert all(keyed.acquire_permission(c) for c in clients)
    assert not any(keyed.acquire_permission(c) for c in clients)
    clock.advance_ns(10_000_000_000)
    assert all(keyed.acquire_permission(c) for c in clients)  # every shard's cycle moved on together
    keyed.reset()
    assert all(keyed.acquire_permission(c) for c in clients)


def test_gcra_on_the_cluster(redis_cluster: LocalCluster) -> None:
    prefix = _prefix()
    config = RateLimiterConfig(limit_for_period=3, limit_refresh_period="60s", timeout_duration=0, algorithm="gcra")
    rl = RateLimiter("g", config, backend=rb.redis_backend(redis_cluster.url, prefix=prefix, connection_options=CLUSTER))
    assert [rl.acquire_permission() for _ in range(4)] == [True] * 3 + [False]
    from django_ratelimit_r4.backends.redis_gcra import RedisGcraKeyedRateLimiter

    keyed = RedisGcraKeyedRateLimiter("gk", config, url=redis_cluster.url, prefix=prefix, connection_options=CLUSTER)
    assert [keyed.acquire_permission("x") for _ in range(4)] == [True] * 3 + [False]
    assert asyncio.run(keyed.aacquire_permission("y"))


# ------------------------------------------------------------------------------- 4 processes, exact


def test_unkeyed_exact_across_four_processes(redis_cluster: LocalCluster) -> None:
    prefix = _prefix()
    limit = 60

    def work(index: int) -> int:
        rl = _unkeyed(redis_cluster.url, prefix, "shared", limit)
        if index % 2:
            return sum(asyncio.run(_many_async(rl.aacquire_permission, 40)))
        return sum(rl.acquire_permission() for _ in range(40))

    assert sum(_in_processes(work)) == limit


async def _many_async(call: Callable[[], Any], n: int) -> list[bool]:
    return list(await asyncio.gather(*(call() for _ in range(n))))


def test_keyed_exact_across_four_processes(redis_cluster: LocalCluster) -> None:
    prefix = _prefix()
    clients = [f"203.0.113.{i}" for i in range(12)]
    limit = 5

    def work(index: int) -> dict[str, int]:
        keyed = rb.RedisKeyedRateLimiter(
            "per_ip", _config(limit), url=redis_cluster.url, prefix=prefix, fault_policy="closed",
            connection_options=CLUSTER,
        )
        granted = dict.fromkeys(clients, 0)
        for _ in range(4):
            for client in clients:
                granted[client] += keyed.acquire_permission(client)
        return granted

    results = _in_processes(work)
    for client in clients:
        assert sum(r[client] for r in results) == limit, client


# ----------------------------------------------------------------------------------------- the fixture


def test_the_cluster_fixture_fails_rather_than_skips_under_r4_require_redis(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server here
    monkeypatch.setenv("R4_REQUIRE_REDIS", "1")
    with pytest.raises(pytest.fail.Exception, match="R4_REQUIRE_REDIS=1"):
        start_cluster_or_fail(tmp_path)
    monkeypatch.setenv("R4_REQUIRE_REDIS", "0")
    with pytest.raises(pytest.skip.Exception):
        start_cluster_or_fail(tmp_path)


def test_a_shared_bulkhead_on_the_cluster_waits_and_wakes(redis_cluster: LocalCluster) -> None:
    """The bulkhead's keys share one tag, and its waiting (BLPOP on a key of the same slot) works there."""
    import threading

    from django_ratelimit_r4.backends.redis_bulkhead import RedisBulkhead
    from django_ratelimit_r4.core.bulkhead import BulkheadConfig

    prefix = _prefix()
    config = BulkheadConfig(max_concurrent_calls=1, max_wait_duration="20s")
    a = RedisBulkhead("partner", config, url=redis_cluster.url, prefix=prefix, connection_options=CLUSTER)
    b = RedisBulkhead("partner", config, url=redis_cluster.url, prefix=prefix, connection_options=CLUSTER)
    try:
        assert len({_slot(k) for k in a._keys} | {_slot(a._wake_key)}) == 1
        assert a.try_acquire_permission()
        got = threading.Event()
        waiter = threading.Thread(target=lambda: (b.acquire_permission(), got.set()))
        waiter.start()
        assert not got.wait(0.2)  # hang guard only: b waits while a holds the slot
        a.on_complete()
        assert got.wait(20)
        waiter.join(20)
        assert b.cluster_concurrent_calls() == 1
        b.on_complete()
        assert asyncio.run(_async_slot(a))
    finally:
        a.close()
        b.close()
    client = redis.cluster.RedisCluster.from_url(redis_cluster.url)
    try:  # close() poked the threads' BLPOP: whatever nobody popped expires (one slot: a plain pipeline)
        assert [k for k in client.scan_iter(match=f"{prefix}:*:wake:*") if client.pttl(k) == -1] == []
    finally:
        client.close()


async def _async_slot(bulkhead: Any) -> bool:
    granted = await bulkhead.aacquire_permission()
    await bulkhead.aon_complete()
    return bool(granted is None or granted)


# ------------------------------------------------------------------- all-or-nothing over several slots


def _spread_names(conn: Any, count: int, stem: str) -> list[str]:
    """``count`` limiter names whose keys live on ``count`` different primaries (when count <= 3)."""
    names: list[str] = []
    nodes: set[str] = set()
    i = 0
    while len(names) < count:
        name = f"{stem}{i}"
        node = conn.sync.get_node_from_key(rb.key_base("x", "rl", name)).name
        if node not in nodes or len(nodes) >= 3:
            names.append(name)
            nodes.add(node)
        i += 1
    return names


def _aged(*limiters: Any, keys: tuple[str, ...] = ()) -> None:
    """Start the limiters' cycle 0 30 s ago (server time) instead of at first use: a split decision gives
    permits back only when its take and the give-back fall in one cycle, seen with a margin of
    CLUSTER_CLOCK_SKEW_US, so right after a cycle begins it under-admits instead (see docs/redis.md)."""
    for limiter in limiters:
        target = limiter.backend if hasattr(limiter, "backend") else limiter.store
        conn = target._connection()
        seconds, micros = conn.sync.time()
        anchors = [target.anchor_key] if not keys else [target._phase_of(target._state_key(k)).anchor_key for k in keys]
        for anchor in anchors:
            conn.sync.set(anchor, f"{seconds - 30} {micros * 1000}")


def _probe(url: str, cluster: bool) -> Any:
    return rb.connection(url, CLUSTER if cluster else None)


def test_a_split_decision_compensates_the_slots_that_granted(redis_cluster: LocalCluster) -> None:
    from django_ratelimit_r4.core.ratelimiter import acquire_all

    prefix = _prefix()
    names = _spread_names(_probe(redis_cluster.url, True), 3, "multi")
    tight, wide, wider = (_unkeyed(redis_cluster.url, prefix, n, limit) for n, limit in zip(names, (2, 5, 6), strict=True))
    members = rb._many_members(tight.backend, [(r.backend, None) for r in (tight, wide, wider)], 1)
    groups = rb._groups(tight.backend._connection(), members)
    assert groups is not None and len(groups) == 3  # three slots: the decision is split
    _aged(tight, wide, wider)
    assert acquire_all([tight, wide, wider]) is None
    assert acquire_all([tight, wide, wider]) is None
    rejected = acquire_all([wide, tight, wider])
    assert rejected is not None and rejected[0] is tight
    # The two slots that granted got their permit back: nothing leaked.
    assert wide.backend.state()[1] == 3 and wider.backend.state()[1] == 4
    assert tight.metrics.failed_calls == 1 and wide.metrics.failed_calls == 0


def _split_refused_by(redis_cluster: LocalCluster, tag: str) -> tuple[RateLimiter, RateLimiter]:
    """``tight`` (spent) and ``wide`` (3 left) in two slots: a decision over both is split, ``wide`` grants
    in the first round trip and must get its permit back in the second."""
    from django_ratelimit_r4.core.ratelimiter import acquire_all

    names = _spread_names(_probe(redis_cluster.url, True), 2, tag)
    tight, wide = (_unkeyed(redis_cluster.url, _prefix(), n, limit) for n, limit in zip(names, (1, 3), strict=True))
    _aged(tight, wide)
    assert acquire_all([tight]) is None
    return tight, wide


async def _finish_background() -> None:
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), 20)


def test_a_give_back_runs_to_its_end_when_the_caller_is_cancelled(
    redis_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The give-back restores permits OTHER requests need: the cancellation of the request that took them
    (a client gone, a timeout around the view) must not leave them taken until the cycle ends."""
    from django_ratelimit_r4.core.ratelimiter import aacquire_all

    tight, wide = _split_refused_by(redis_cluster, "gbc")
    real = rb.RedisConnection.arun_scripts
    seen: list[int] = []

    async def run() -> None:
        entered, gate = asyncio.Event(), asyncio.Event()

        async def gated(self: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(1)
            if len(seen) == 2:  # the give-back: the caller is cancelled before it is sent
                entered.set()
                await gate.wait()
            return await real(self, *args, **kwargs)

        monkeypatch.setattr(rb.RedisConnection, "arun_scripts", gated)
        task = asyncio.ensure_future(aacquire_all([wide, tight]))
        await asyncio.wait_for(entered.wait(), 20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        await _finish_background()

    asyncio.run(run())
    assert len(seen) == 2
    assert wide.backend.state()[1] == 3  # its permit came back
    assert tight.backend.state()[1] == 0


@pytest.mark.parametrize("seen_by", ["this Python's way", "watched task"])
def test_a_refused_split_whose_cancellation_was_lost_gives_back_what_it_took(
    redis_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, seen_by: str
) -> None:
    """The first round trip answered although the task was cancelled (redis-py lost the CancelledError): the
    replies are known, so the slots that granted a refused decision get their permits back; the task still
    ends cancelled. Seen by ``Task.cancelling()`` (3.11+) or by the watched task (3.10's way, forced too)."""
    if seen_by == "watched task":
        monkeypatch.setattr(rb, "_CANCELLING", False)
    from django_ratelimit_r4.core.ratelimiter import aacquire_all

    from .lost_cancel import Loser, cancel_lost

    tight, wide = _split_refused_by(redis_cluster, "gbl")

    async def run() -> asyncio.Task[Any]:
        loser = Loser()
        conn: Any = rb.RedisConnection
        real = conn._arun_scripts
        conn._arun_scripts = loser.wrap(real)
        try:
            task = await cancel_lost(loser, aacquire_all([wide, tight]))
        finally:
            conn._arun_scripts = real
        await _finish_background()
        return task

    task = asyncio.run(run())
    assert task.cancelled(), task
    assert wide.backend.state()[1] == 3
    assert tight.backend.state()[1] == 0


def _mirror_ops(seed: int, n: int = 60) -> list[tuple[int, int, int]]:
    import random

    rnd = random.Random(seed)
    return [(rnd.choice((1, 1, 1, 2, 3)), rnd.choice((0, 0, 0, 300, 1000, 2500)), rnd.randrange(3)) for _ in range(n)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_split_decisions_match_one_server_exactly(
    redis_cluster: LocalCluster, redis_url: str, prefix: str, seed: int
) -> None:
    """Split over slots (and compensated) or in one script on one server: the same grants, waits and RateLimit
    figures, step by step, for unkeyed and keyed entries, on the FakeClock. On the shared server the keys go
    under the ``prefix`` fixture's prefix, deleted when the test ends (a session-end sweep alone left them, the
    anchors for ever, whenever a session was killed before its end)."""
    results = []
    shared = prefix
    for url, cluster in ((redis_cluster.url, True), (redis_url, False)):
        clock = FakeClock()
        prefix = _prefix() if cluster else shared
        opts = CLUSTER if cluster else None
        names = _spread_names(_probe(redis_cluster.url, True), 2, "m")

        factory = rb.redis_backend(url, prefix=prefix, connection_options=opts)
        a, b = (
            RateLimiter(name, RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, timeout_duration=0),
                        backend=factory, clock=clock)
            for name, limit, period in ((names[0], 4, "1s"), (names[1], 7, "3s"))
        )
        keyed = rb.RedisKeyedRateLimiter(
            "k", _config(3, "2s"), clock=clock, url=url, prefix=prefix, connection_options=opts
        )
        seen = []
        for permits, advance_ms, key in _mirror_ops(seed):
            clock.advance_ns(advance_ms * 1_000_000)
            entries = [(a, None), (keyed, f"client-{key}"), (b, None)]
            outcome, quotas = rb.acquire_all_quotas(entries, permits)
            seen.append((None if outcome is None else outcome, quotas))
        results.append(seen)
    assert results[0] == results[1]


def test_async_split_decisions(redis_cluster: LocalCluster) -> None:
    from django_ratelimit_r4.core.ratelimiter import aacquire_all

    prefix = _prefix()
    names = _spread_names(_probe(redis_cluster.url, True), 3, "am")
    tight, wide, wider = (_unkeyed(redis_cluster.url, prefix, n, limit) for n, limit in zip(names, (1, 3, 3), strict=True))
    keyed = rb.RedisKeyedRateLimiter("ak", _config(5), url=redis_cluster.url, prefix=prefix, connection_options=CLUSTER)
    _aged(tight, wide, wider)
    _aged(keyed, keys=("x",))

    async def run() -> None:
        assert await aacquire_all([tight, wide, wider]) is None
        outcome = await aacquire_all([wide, wider, tight])
        assert outcome is not None and outcome[0] is tight
        assert await rb.aacquire_all_keyed([(wide, None), (keyed, "x")]) is None
        outcome, quotas = await rb.aacquire_all_quotas([(tight, None), (keyed, "x"), (wider, None)])
        assert outcome is not None and outcome[0] == 0
        assert quotas[1][0] == 4 and quotas[2][0] == 2  # the keyed and wider permits came back
        await keyed.store._conn.aclose()

    asyncio.run(run())
    assert wide.backend.state()[1] == 1 and wider.backend.state()[1] == 2 and keyed.state("x")[1] == 4


def test_multi_limit_exact_across_four_processes(redis_cluster: LocalCluster) -> None:
    """One binding limit among limits in other slots: exactly its limit is granted in all, every other limit
    consumed exactly what was granted (compensations leaked nothing), on the sync and async paths."""
    from django_ratelimit_r4.core.ratelimiter import aacquire_all

    prefix = _prefix()
    names = _spread_names(_probe(redis_cluster.url, True), 3, "mp")
    limits = (40, 70, 90)
    clients = ["a", "b"]

    def build() -> tuple[list[RateLimiter], Any]:
        limiters = [_unkeyed(redis_cluster.url, prefix, n, limit) for n, limit in zip(names, limits, strict=True)]
        keyed = rb.RedisKeyedRateLimiter(
            "mk", _config(60), url=redis_cluster.url, prefix=prefix, fault_policy="closed",
            connection_options=CLUSTER,
        )
        return limiters, keyed

    def work(index: int) -> int:
        limiters, keyed = build()
        entries = [(limiters[1], None), (keyed, clients[index % 2]), (limiters[0], None), (limiters[2], None)]
        if index % 2:
            async def run() -> int:
                granted = 0
                for i in range(30):
                    if i % 3:
                        granted += await rb.aacquire_all_keyed(entries) is None
                    else:
                        granted += await aacquire_all(limiters) is None
                return granted

            return asyncio.run(run())
        return sum(rb.acquire_all_keyed(entries) is None for _ in range(30))

    limiters, keyed = build()
    _aged(*limiters)
    _aged(keyed, keys=tuple(clients))
    granted = sum(_in_processes(work))
    assert granted == limits[0]
    assert [r.backend.state()[1] for r in limiters] == [limit - granted for limit in limits]


@pytest.mark.parametrize(("advance_ms", "given_back"), [(100, True), (1200, False)])
def test_a_give_back_after_a_cycle_boundary_returns_nothing(
    redis_cluster: LocalCluster, advance_ms: int, given_back: bool
) -> None:
    """In the take's cycle the permits come back exactly; once a new cycle began its refill may have absorbed
    them, so nothing comes back (never more permissive than without the take)."""
    clock = FakeClock()
    factory = rb.redis_backend(redis_cluster.url, prefix=_prefix(), connection_options=CLUSTER)
    config = RateLimiterConfig(limit_for_period=5, limit_refresh_period="1s", timeout_duration=0)
    rl = RateLimiter("gb", config, backend=factory, clock=clock)
    clock.advance_ns(500_000_000)
    assert rl.acquire_permission(3)  # 2 left in cycle 0
    backend = rl.backend
    conn = backend._connection()
    members = rb._many_members(backend, [(backend, None)], 1)
    taken_at = clock.now_ns()
    assert rb._many_call(conn, backend, members, 1) == [0]  # 1 left
    clock.advance_ns(advance_ms * 1_000_000)
    calls = rb._give_back_calls(conn, backend, members, [[0]], 1, [0], taken_at)
    [(reply, _, _)] = conn.run_scripts(rb.SCRIPT_SHA, rb.SCRIPT, calls)
    remaining = backend._settle(reply, [members[0].phase])[0]
    assert remaining == (2 if given_back else 5)
    assert backend.state()[1] == remaining


@pytest.mark.parametrize("algorithm", ["gcra", "sliding_window"])
def test_gcra_and_sliding_all_or_nothing_across_slots_is_split_and_given_back(
    redis_cluster: LocalCluster, algorithm: str
) -> None:
    """Was ValueError ("needs all of their keys in one slot"): now one call per slot, and the slots that granted
    get their permits back (op "g" of the algorithm's script) when another rejects."""
    from django_ratelimit_r4.core.ratelimiter import acquire_all

    prefix = _prefix()
    names = _spread_names(_probe(redis_cluster.url, True), 2, "gm")
    factory = rb.redis_backend(redis_cluster.url, prefix=prefix, connection_options=CLUSTER)
    clock = FakeClock()
    one, two = (
        RateLimiter(
            n,
            RateLimiterConfig(limit_for_period=limit, limit_refresh_period="60s", timeout_duration=0, algorithm=algorithm),
            backend=factory,
            clock=clock,
        )
        for n, limit in zip(names, (3, 1), strict=True)
    )
    assert acquire_all([one, two]) is None
    rejected = acquire_all([one, two])
    assert rejected is not None and rejected[0] is two
    assert one.backend.quota()[0] == 2  # its take of the rejected decision came back


def test_mixed_algorithms_over_slots_on_the_cluster(redis_cluster: LocalCluster) -> None:
    """A cycle, a GCRA and a sliding-window limiter in three slots: all-or-nothing, nothing leaked."""
    from django_ratelimit_r4.core.ratelimiter import acquire_all

    prefix = _prefix()
    names = _spread_names(_probe(redis_cluster.url, True), 3, "mx")
    factory = rb.redis_backend(redis_cluster.url, prefix=prefix, connection_options=CLUSTER)
    clock = FakeClock()
    limiters = [
        RateLimiter(
            n,
            RateLimiterConfig(limit_for_period=limit, limit_refresh_period="60s", timeout_duration=0, algorithm=a),
            backend=factory,
            clock=clock,
        )
        for n, a, limit in zip(names, ("cycle", "gcra", "sliding_window"), (5, 2, 4), strict=True)
    ]
    assert acquire_all(limiters) is None and acquire_all(limiters) is None
    for _ in range(3):
        rejected = acquire_all(limiters)
        assert rejected is not None and rejected[0] is limiters[1]
    assert [rl.backend.quota()[0] for rl in limiters] == [3, 0, 2]


@pytest.mark.django_db(databases=[])
def test_settings_name_a_cluster_backend(redis_cluster: LocalCluster) -> None:
    """``{"BACKEND": "redis", "LOCATION": <any node>, "OPTIONS": {"cluster": True}}`` passes the checks and
    builds cluster limiters (keyed ones sharded)."""
    from django.core import checks
    from django.test import override_settings

    from django_ratelimit_r4 import get_rate_limiter, registry

    prefix = _prefix()
    node = f"redis://127.0.0.1:{redis_cluster.ports[2]}/0"  # any node is a start node
    settings = {
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": node, "OPTIONS": {"cluster": True, "key_prefix": prefix}}},
        "ratelimiters": {"instances": {
            "api": {"limit_for_period": 2, "limit_refresh_period": "1m", "backend": "shared"},
            "per_ip": {"limit_for_period": 1, "limit_refresh_period": "1m", "key": "ip", "backend": "shared"},
        }},
    }
    with override_settings(RATELIMIT_R4=settings):
        assert [m for m in checks.run_checks(tags=["ratelimit_r4"]) if m.id.startswith("ratelimit_r4.E")] == []
        api = get_rate_limiter("api")
        assert api.backend._connection().cluster
        assert [api.acquire_permission() for _ in range(3)] == [True, True, False]
        keyed = registry.get_keyed_rate_limiter("per_ip")
        assert keyed.store._phases is not None
        assert keyed.acquire_permission("198.51.100.1") and not keyed.acquire_permission("198.51.100.1")


def _same_slot_names(count: int, stem: str) -> list[str]:
    """``count`` limiter names whose hash tags (the names) fall in one cluster slot."""
    from redis.crc import key_slot

    names = [f"{stem}0"]
    slot = key_slot(names[0].encode())
    i = 1
    while len(names) < count:
        if key_slot(f"{stem}{i}".encode()) == slot:
            names.append(f"{stem}{i}")
        i += 1
    return names


def test_mixed_algorithms_in_one_slot_run_one_script_on_the_cluster(
    redis_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle, a GCRA and a sliding-window limiter whose keys share a slot: one run of the mixed script (no
    split, no give-back round trip), all-or-nothing, nothing leaked; sync and async."""
    from django_ratelimit_r4.backends.redis_mixed import MIXED_SCRIPT_SHA
    from django_ratelimit_r4.core.ratelimiter import aacquire_all, acquire_all

    prefix = _prefix()
    names = _same_slot_names(3, "one")
    factory = rb.redis_backend(redis_cluster.url, prefix=prefix, connection_options=CLUSTER)
    clock = FakeClock()
    limiters = [
        RateLimiter(
            n,
            RateLimiterConfig(limit_for_period=limit, limit_refresh_period="60s", timeout_duration=0, algorithm=a),
            backend=factory,
            clock=clock,
        )
        for n, a, limit in zip(names, ("cycle", "gcra", "sliding_window"), (5, 2, 4), strict=True)
    ]
    conn = limiters[0].backend._connection()  # type: ignore[attr-defined]
    runs: list[str] = []
    run_script = conn.run_script

    def counting(sha: str, *args: Any, **kw: Any) -> Any:
        runs.append(sha)
        return run_script(sha, *args, **kw)

    arun_script = conn.arun_script

    async def acounting(sha: str, *args: Any, **kw: Any) -> Any:
        runs.append(sha)
        return await arun_script(sha, *args, **kw)

    monkeypatch.setattr(conn, "run_script", counting)
    monkeypatch.setattr(conn, "arun_script", acounting)
    monkeypatch.setattr(conn, "run_scripts", None)  # the split's paths: must not be taken
    monkeypatch.setattr(conn, "arun_scripts", None)
    assert acquire_all(limiters) is None and asyncio.run(aacquire_all(limiters)) is None
    for _ in range(3):
        rejected = acquire_all(limiters)
        assert rejected is not None and rejected[0] is limiters[1]
    assert runs == [MIXED_SCRIPT_SHA] * 5
    monkeypatch.undo()
    assert [rl.backend.quota()[0] for rl in limiters] == [3, 0, 2]  # type: ignore[attr-defined]


def test_figures_of_limits_over_slots_read_in_one_round_trip(redis_cluster: LocalCluster) -> None:
    """A decision refused in memory reads its Redis limits' figures (here in three slots on three primaries, of
    three algorithms, server time) at once: one write per node before any reply, one round trip in all."""
    from django_ratelimit_r4.keyed import aacquire_all_quotas, acquire_all_quotas

    prefix = _prefix()
    conn = _probe(redis_cluster.url, True)
    names = _spread_names(conn, 3, "rq")
    factory = rb.redis_backend(redis_cluster.url, prefix=prefix, connection_options=CLUSTER)
    limiters = [
        RateLimiter(
            n,
            RateLimiterConfig(limit_for_period=5, limit_refresh_period="60s", timeout_duration=0, algorithm=a),
            backend=factory,
        )
        for n, a in zip(names, ("cycle", "gcra", "sliding_window"), strict=True)
    ]
    memory = RateLimiter("mem", _config(1))
    entries: list[tuple[Any, Any]] = [(memory, None), *((rl, None) for rl in limiters)]
    assert acquire_all_quotas(entries)[0] is None
    replies = conn.replies
    outcome, quotas = acquire_all_quotas(entries)
    assert outcome is not None and outcome[0] == 0  # memory said no: nothing decided in Redis
    assert conn.replies - replies == 1
    assert [q[0] for q in quotas[1:]] == [rl.backend.quota()[0] for rl in limiters] == [4, 4, 4]
    outcome, quotas = asyncio.run(aacquire_all_quotas(entries))
    assert outcome is not None and [q[0] for q in quotas[1:]] == [4, 4, 4]


# ------------------------------------------------------------------------------- unreachable when built


@pytest.mark.parametrize(("policy", "granted"), [("local", [True, True, False]), ("open", [True] * 3), ("closed", [False] * 3)])
def test_a_cluster_no_node_of_which_answers_when_a_limiter_is_built_gets_the_fault_policy(
    policy: str, granted: list[bool]
) -> None:
    """A process that starts while the cluster is away: building a limiter needs no node, and its decisions get
    the fault policy (sync, async, keyed, all-or-nothing over two slots). Before, making the cluster client
    raised RedisClusterUnreachableError when the limiter was built: a 500 for every request of the instance."""
    url = "redis://127.0.0.1:1/0"  # nothing listens: connection refused
    prefix = _prefix()
    options = {"fault_policy": policy, "connection_options": CLUSTER}
    a = RateLimiter("away-a", _config(2), backend=rb.redis_backend(url, prefix=prefix, **options))
    b = RateLimiter("away-b", _config(2), backend=rb.redis_backend(url, prefix=prefix, **options))
    keyed = rb.RedisKeyedRateLimiter("away-k", _config(2), url=url, prefix=prefix, **options)
    assert [a.acquire_permission() for _ in range(3)] == granted
    assert [keyed.acquire_permission("client") for _ in range(3)] == granted
    assert asyncio.run(b.aacquire_permission()) is granted[0]
    outcome = rb.acquire_all_keyed([(b, None), (keyed, "other")])
    assert (outcome is None) is granted[0]
    conn = rb.connection(url, CLUSTER)
    assert conn.is_down() and conn.server_faults >= 1
    # The reason, not its class: redis-py 8.2 raises RedisClusterUnreachableError, 8.1 a RedisClusterException.
    assert "Redis Cluster cannot be connected" in (conn.last_error or "")
    assert "Connection refused" in (conn.last_error or "")


def test_a_cluster_that_answers_again_decides_again(redis_cluster: LocalCluster, monkeypatch) -> None:
    """The client is made at the first call after the cluster answers: recovery needs no restart."""
    away = [True]
    real = rb.RedisConnection.new_client

    def new_client(self: Any, **overrides: Any) -> Any:
        if away[0]:
            raise redis.exceptions.RedisClusterException("Redis Cluster cannot be connected (test)")
        return real(self, **overrides)

    monkeypatch.setattr(rb.RedisConnection, "new_client", new_client)
    options = {**CLUSTER, "socket_timeout": 0.75}  # a connection of this test's own (connections are per process)
    rl = RateLimiter(
        "comes-back",
        _config(2),
        backend=rb.redis_backend(redis_cluster.url, prefix=_prefix(), fault_policy="closed", connection_options=options),
    )
    assert not rl.acquire_permission()  # closed: the cluster is away
    away[0] = False
    conn = rb.connection(redis_cluster.url, options)
    conn.down_until = time.monotonic() - 1  # the cool-down is over
    assert [rl.acquire_permission() for _ in range(3)] == [True, True, False]  # the cluster decides: 2 a minute
    assert not conn.is_down() and rl.backend.faults == 1  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------- every node gone mid-run


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_cluster_every_node_of_which_dies_mid_run_gets_the_fault_policy_never_an_exception(
    tmp_path: Any, side: str
) -> None:
    """A cluster that answered, then lost every node (a restart of the whole cluster, a partition): the
    decision after the cool-down relearns the topology, and redis-py raises RedisClusterException ("cannot be
    connected"), which is not a RedisError. That must be a fault like any other (the policy decides), not an
    exception out of the decision: a 500 for every request until the cluster came back."""
    cluster = start_cluster_or_fail(tmp_path)
    try:
        options = {**CLUSTER, "socket_timeout": 0.75}
        rl = RateLimiter(
            f"dies-{side}",
            _config(5),
            backend=rb.redis_backend(cluster.url, prefix=_prefix(), fault_policy="closed", connection_options=options),
        )

        def decide() -> bool:
            return asyncio.run(rl.aacquire_permission()) if side == "async" else rl.acquire_permission()

        assert decide()  # the cluster answers
        cluster.stop()
        conn = rb.connection(cluster.url, options)
        for _ in range(3):  # each after the cool-down: the topology is learned again, and no node answers
            conn.down_until = time.monotonic() - 1
            assert decide() is False  # closed: the policy, not an exception
        assert conn.is_down()
    finally:
        cluster.stop()


def test_a_closed_loops_cluster_client_is_let_go_with_its_connections_closed(redis_cluster: LocalCluster) -> None:
    """As on a single server (test_redis_connection_lean_async.py): a loop per job (``asyncio.run``), each
    closed without aclose(), must not keep its cluster client and sockets to every node it reached."""
    limiter = _unkeyed(redis_cluster.url, _prefix(), "loops", 1000)
    conn: Any = limiter.backend._connection()  # type: ignore[attr-defined]
    opened: list[Any] = []

    async def decide() -> None:
        assert await limiter.aacquire_permission()
        nodes = conn.aio().nodes_manager.nodes_cache.values()
        opened.extend(c for node in nodes for c in node._connections if c.is_connected)

    for _ in range(5):
        asyncio.run(decide())
    assert len(opened) >= 5
    assert len(conn._aio) == 1 and len(conn._aio_slots) == 1
    nodes = conn._aio[next(iter(conn._aio))].nodes_manager.nodes_cache.values()
    last = {id(c) for node in nodes for c in node._connections}
    assert [c for c in opened if id(c) not in last and c.is_connected] == []


def test_async_decisions_under_wsgi_go_through_the_sync_cluster_client(redis_cluster: LocalCluster) -> None:
    """An async view under WSGI (asgiref's loop of one ``async_to_sync`` call) is decided in the request's
    thread on the sync cluster client: no asyncio cluster client (and its sockets to every node) per request
    (tests/backends/test_redis_call_loop.py has the single-server counts)."""
    from asgiref.sync import async_to_sync

    limiter = _unkeyed(redis_cluster.url, _prefix(), "wsgi", 3)
    conn: Any = limiter.backend._connection()  # type: ignore[attr-defined]

    async def decide() -> bool:
        return await limiter.aacquire_permission()

    assert [async_to_sync(decide)() for _ in range(4)] == [True, True, True, False]
    assert len(conn._aio) == 0
