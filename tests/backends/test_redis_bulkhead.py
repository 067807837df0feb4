"""Cluster-wide bulkhead (issue 11): slots are leases in Redis, shared by every process.

Against a real Redis (db 15, a unique prefix per test). Checked: the Bulkhead interface (sync and async,
BulkheadFull, metrics with the cluster count), a peak of exactly N across 4 processes x 8 threads released
together by a barrier (many rounds), a kill -9 of a process holding slots gives them back within the lease
TTL (and renewal keeps them while it lives), waiters are woken by a release with no polling (Redis commands
counted on a dedicated server), FIFO hand-off, interrupted waiters keep nothing, the async path never
blocks the loop, and the fault policies with Redis unreachable.

Real time is inherent here (leases expire in Redis server time); every wait goes through the bulkhead's own
budget or a kill, bounds are loose, and nothing sleeps to let time pass except where noted.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from django_ratelimit_r4.backends.redis_bulkhead import RedisBulkhead
from django_ratelimit_r4.core.bulkhead import BulkheadConfig
from django_ratelimit_r4.core.exceptions import BulkheadFull
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)
from tests.noblock import forbid_blocking

redis = pytest.importorskip("redis")

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = "redis://127.0.0.1:1/15"
HANG_GUARD_S = 20.0
# A busy 2-core machine can stall a call past the default 0.25 s socket timeout, and the fault policy would
# decide it: these tests are about the cluster's queue, not about faults (those pass options of their own).
PATIENT = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}


def bulkhead(
    url: str, prefix: str, n: int, wait: Any = 0, *, name: str = "partner", **kw: Any
) -> RedisBulkhead:
    config = BulkheadConfig(max_concurrent_calls=n, max_wait_duration=wait)
    kw.setdefault("connection_options", PATIENT)
    return RedisBulkhead(name, config, url=url, prefix=prefix, **kw)


@pytest.fixture
def made() -> Any:
    """Bulkheads built by a test, closed afterwards (their renewal threads stop)."""
    built: list[RedisBulkhead] = []
    yield built
    for b in built:
        b.close()


def test_slots_are_shared_by_instances_of_the_same_name(redis_url: str, prefix: str, made: list) -> None:
    """Two instances (two workers) of one name share max_concurrent_calls; another name has its own."""
    a, b = bulkhead(redis_url, prefix, 2), bulkhead(redis_url, prefix, 2)
    other = bulkhead(redis_url, prefix, 2, name="other")
    made += [a, b, other]
    assert a.try_acquire_permission()
    assert b.try_acquire_permission()
    assert not a.try_acquire_permission() and not b.try_acquire_permission()
    with pytest.raises(BulkheadFull) as info, b:
        pass
    assert info.value.name == "partner"
    assert other.try_acquire_permission()
    assert a.metrics.concurrent_calls == 1 and b.metrics.concurrent_calls == 1
    assert b.metrics.cluster_concurrent_calls == 2 and b.metrics.available_concurrent_calls == 0
    assert a.cluster_concurrent_calls() == 2
    a.on_complete()
    assert b.call(lambda: "ran") == "ran"
    assert b.metrics.cluster_concurrent_calls == 1  # b's own slot is still held
    b.release_permission()
    assert a.cluster_concurrent_calls() == 0
    assert (b.metrics.permitted_calls, b.metrics.rejected_calls, b.metrics.finished_calls) == (2, 2, 1)
    assert a.metrics.finished_calls == 1


def test_a_release_without_a_permit_is_ignored(redis_url: str, prefix: str, made: list) -> None:
    a = bulkhead(redis_url, prefix, 1)
    made.append(a)
    a.on_complete()
    assert a.try_acquire_permission()
    assert not a.try_acquire_permission()


def test_events_and_decorate(redis_url: str, prefix: str, made: list) -> None:
    a = bulkhead(redis_url, prefix, 1)
    made.append(a)
    seen: list[str] = []
    a.events.on_event(lambda e: seen.append(e.event_type))

    @a.decorate
    def work() -> int:
        assert not a.try_acquire_permission()
        return 7

    assert work() == 7
    assert seen == ["CALL_PERMITTED", "CALL_REJECTED", "CALL_FINISHED"]


# ------------------------------------------------------------------------------------- across processes

_PEAK = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""


def _peak_worker(
    url: str, prefix: str, n: int, threads: int, rounds: int, barrier: Any, inside: Any, out: Any
) -> None:
    b = bulkhead(url, prefix, n, "20s")
    client = redis.Redis.from_url(url)
    peak = client.register_script(_PEAK)
    cur, top = f"{prefix}:cur", f"{prefix}:peak"
    done = [0] * threads

    def run(i: int) -> None:
        for _ in range(rounds):
            barrier.wait(60)
            with b:
                peak(keys=[cur, top])
                inside.wait(60)  # N holders meet here: N is reached whatever the load, and held
                client.decr(cur)
            done[i] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    out.put((sum(done), b.metrics.rejected_calls, b.metrics.lost_leases))
    b.close()


def test_peak_is_exactly_n_across_4_processes(redis_url: str, prefix: str) -> None:
    """4 processes x 8 threads, all released together by a barrier, 15 rounds: never more than N at once
    cluster-wide (measured in Redis around each call), every call served (waits, no refusals). Inside its
    slot each call waits for N holders (a barrier of N parties across processes), so N is reached and held
    in every group whatever the load, while the others queue for the hand-off; an N+1-th holder would show
    in the peak."""
    n, procs, threads, rounds = 4, 4, 8, 15  # 32 callers per round: 8 groups of N
    ctx = multiprocessing.get_context("fork")
    barrier, inside, out = ctx.Barrier(procs * threads), ctx.Barrier(n), ctx.Queue()
    workers = [
        ctx.Process(target=_peak_worker, args=(redis_url, prefix, n, threads, rounds, barrier, inside, out))
        for _ in range(procs)
    ]
    for p in workers:
        p.start()
    results = [out.get(timeout=120) for _ in workers]
    for p in workers:
        p.join(30)
    client = redis.Redis.from_url(redis_url)
    assert int(client.get(f"{prefix}:peak")) == n
    assert int(client.get(f"{prefix}:cur")) == 0
    assert sum(r[0] for r in results) == procs * threads * rounds
    assert sum(r[1] for r in results) == 0 and sum(r[2] for r in results) == 0
    probe = bulkhead(redis_url, prefix, n)
    assert probe.cluster_concurrent_calls() == 0  # every lease given back
    client.close()


def test_a_forked_child_holds_nothing_of_its_parent_and_shares_the_slots(
    redis_url: str, prefix: str, made: list
) -> None:
    a = bulkhead(redis_url, prefix, 2)
    made.append(a)
    assert a.try_acquire_permission()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()

    def child() -> None:
        held = a.metrics.concurrent_calls
        a.on_complete()  # holds nothing here: ignored, the parent's lease stays
        out.put((held, [a.try_acquire_permission() for _ in range(2)]))
        a.close()

    proc = ctx.Process(target=child)
    proc.start()
    assert out.get(timeout=30) == (0, [True, False])
    proc.join(30)
    assert a.metrics.concurrent_calls == 1
    assert a.cluster_concurrent_calls() == 1  # the child gave its slot back on close()


_HOLDER = textwrap.dedent(
    """
    import sys, threading
    sys.path.insert(0, {root!r})
    from django_ratelimit_r4.backends.redis_bulkhead import RedisBulkhead
    from django_ratelimit_r4.core.bulkhead import BulkheadConfig
    b = RedisBulkhead("partner", BulkheadConfig(max_concurrent_calls=3), url={url!r}, prefix={prefix!r},
                      lease_ttl={ttl!r})
    for _ in range(3):
        assert b.try_acquire_permission()
    print("held", flush=True)
    threading.Event().wait()  # mid-call, forever
    """
)


def test_kill_9_mid_call_gives_the_slots_back_within_the_lease_ttl(
    redis_url: str, prefix: str, made: list
) -> None:
    ttl = 0.6
    code = _HOLDER.format(root=str(ROOT), url=redis_url, prefix=prefix, ttl=f"{int(ttl * 1000)}ms")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        b = bulkhead(redis_url, prefix, 3, f"{int(ttl * 3000)}ms", lease_ttl=f"{int(ttl * 1000)}ms")
        made.append(b)
        # Alive, the holder renews: a wait of 3 TTLs gets nothing.
        assert not b.try_acquire_permission()
        assert b.metrics.cluster_concurrent_calls == 3
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    killed = time.monotonic()
    b.change_config(BulkheadConfig(max_concurrent_calls=3, max_wait_duration="10s"))
    assert b.try_acquire_permission()
    # Lease expiry (<= TTL) plus the next renewal of a waiting process (<= TTL/3) hands the slot over; the
    # bound is loose for a loaded machine but far below the 10 s budget.
    assert time.monotonic() - killed < ttl * 4 / 3 + 2.0
    assert b.try_acquire_permission() and b.try_acquire_permission()
    assert b.cluster_concurrent_calls() == 3


# -------------------------------------------------------------------------------- waiting, no polling


def test_waiters_are_woken_by_release_in_fifo_order_without_polling(redis_server: Any, made: list) -> None:
    url = redis_server.url
    holder = bulkhead(url, "r4test", 1, lease_ttl="60s")  # renewals every 20 s: none during the test
    waiters = bulkhead(url, "r4test", 1, "60s", lease_ttl="60s")
    made += [holder, waiters]
    assert holder.try_acquire_permission()
    order: list[int] = []
    done = threading.Event()

    def wait_for_slot(i: int) -> None:
        with waiters:
            order.append(i)
        if len(order) == 3:
            done.set()

    client = redis.Redis.from_url(url)
    threads = []
    for i in range(3):
        threads.append(threading.Thread(target=wait_for_slot, args=(i,)))
        threads[-1].start()
        while client.zcard(waiters._keys[1]) < i + 1:  # queued in Redis one after the other: a known order
            time.sleep(0.001)
    # Both renewal threads (the holder's and the waiters') sit in BLPOP before the window opens: a BLPOP
    # that a loaded machine sends late would otherwise count as polling.
    while client.info("clients")["blocked_clients"] < 2:
        time.sleep(0.001)

    def scripts_and_pops() -> int:
        stats = client.info("commandstats")
        return sum(
            stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval", "blpop", "lpop")
        )

    before = scripts_and_pops()
    threading.Event().wait(0.5)  # a window in which a polling waiter would send commands
    assert scripts_and_pops() == before
    holder.on_complete()
    assert done.wait(30)
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2]
    # 1 release by the holder, then per waiter its release; grants arrive on the BLPOP the thread had open.
    assert scripts_and_pops() - before <= 4 + 3
    assert waiters.metrics.permitted_calls == 3 and waiters.metrics.rejected_calls == 0
    client.close()


def test_a_waiter_out_of_budget_is_refused_and_leaves_the_queue(
    redis_url: str, prefix: str, made: list
) -> None:
    a = bulkhead(redis_url, prefix, 1, "50ms")
    made.append(a)
    assert a.try_acquire_permission()
    assert not a.try_acquire_permission()
    assert a.metrics.waiting_calls == 0
    client = redis.Redis.from_url(redis_url)
    assert client.zcard(a._keys[1]) == 0  # the queue
    a.on_complete()
    assert a.try_acquire_permission()  # nobody stale in the queue took the slot
    client.close()


# ------------------------------------------------------------------------------------------------ async


async def test_async_waits_never_block_the_loop(redis_url: str, prefix: str, made: list, monkeypatch) -> None:
    a = bulkhead(redis_url, prefix, 2, "20s")
    made.append(a)
    served: list[int] = []

    async def call(i: int) -> None:
        async with a:
            served.append(i)
            await asyncio.sleep(0.01)

    with forbid_blocking(monkeypatch) as blocking:
        await asyncio.gather(*(call(i) for i in range(8)))
        assert await a.acall(asyncio.sleep, 0, result="x") == "x"
    assert blocking == [], blocking
    assert sorted(served) == list(range(8))
    assert a.metrics.permitted_calls == 9 and a.metrics.rejected_calls == 0
    assert a.cluster_concurrent_calls() == 0


async def test_a_cancelled_waiter_keeps_no_slot(redis_url: str, prefix: str, made: list) -> None:
    """A waiter cancelled in the queue, or right after its grant: the slot goes back (default 10 s TTL, so
    expiry cannot be what frees it within the 8 s wait; a release hit by a timeout is retried within 10 s / 3)."""
    a = bulkhead(redis_url, prefix, 1, "20s")
    b = bulkhead(redis_url, prefix, 1, "8s")
    made += [a, b]
    for grant_first in (False, True):
        await a.aacquire_permission()
        task = asyncio.create_task(a.aacquire_permission())
        while a.metrics.waiting_calls == 0:
            await asyncio.sleep(0.001)
        if grant_first:
            a.on_complete()  # sync: the slot goes to the waiter in Redis, its thread may wake it...
            task.cancel()  # ...but the task is cancelled before it runs again
        else:
            task.cancel()
            await asyncio.sleep(0)
            await a.aon_complete()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await b.atry_acquire_permission()
        assert a.metrics.concurrent_calls == 0
        await b.aon_complete()


async def test_a_cancellation_swallowed_below_the_acquire_still_cancels_and_keeps_no_slot(
    redis_url: str, prefix: str, made: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py 8.2's asyncio client once in a while returns a reply although the task was cancelled during the
    call (test_a_cancelled_waiter_keeps_no_slot flaked so: the EVALSHA answered QUEUED after the cancel, and the
    waiter then got its slot). The cancelled caller must still get CancelledError and keep nothing. The client
    itself swallows here (below RedisConnection.areply, which every async Redis call goes through)."""
    a = bulkhead(redis_url, prefix, 1, "20s")
    b = bulkhead(redis_url, prefix, 1, "8s")
    made += [a, b]
    await a.aacquire_permission()
    client = a._conn.aio()
    real = client.evalsha
    entered = asyncio.Event()

    async def swallowing(*args: Any) -> Any:
        if "acquire" in args:
            entered.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(HANG_GUARD_S)  # a slow reply, then the cancellation is lost below us
        return await real(*args)

    monkeypatch.setattr(client, "evalsha", swallowing)
    task = asyncio.create_task(a.aacquire_permission())
    await asyncio.wait_for(entered.wait(), HANG_GUARD_S)
    await a.aon_complete()  # the slot is free: the late acquire is granted at once
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert a.metrics.concurrent_calls == 0
    assert await b.atry_acquire_permission()  # the slot went back (b waits up to 8 s for the release)
    await b.aon_complete()


def test_close_leaves_no_key_without_an_expiry(redis_url: str, prefix: str, made: list) -> None:
    """close() pokes the renewal thread's BLPOP with an item on this process's wake list. A thread that was not
    in BLPOP then (idle: it waits for work with no lease held, the common case at shutdown) never pops it, and
    the list stayed in Redis for ever: one key per process and bulkhead name at every restart. It expires now."""
    a = bulkhead(redis_url, prefix, 1)
    made.append(a)
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + HANG_GUARD_S

    def idle() -> None:  # alive but not in BLPOP, like the real thread waiting for work; ends once poked
        while not client.exists(a._wake_key) and time.monotonic() < deadline:
            time.sleep(0.001)

    a._thread = threading.Thread(target=idle, daemon=True)
    a._thread.start()
    a.close()
    assert client.exists(a._wake_key)  # the poke was made (nobody popped it)
    forever = [key for key in client.scan_iter(match=f"{prefix}:*") if client.pttl(key) == -1]
    client.close()
    assert [k for k in forever if b":wake:" in k] == [], forever


# ------------------------------------------------------------------------------------------------ faults


@pytest.mark.parametrize(
    ("policy", "expected"), [("local", [True, True, False]), ("open", [True] * 3), ("closed", [False] * 3)]
)
def test_fault_policies_with_redis_unreachable(policy: str, expected: list, made: list) -> None:
    a = bulkhead(UNREACHABLE, "r4test", 2, fault_policy=policy)
    made.append(a)
    assert [a.try_acquire_permission() for _ in range(3)] == expected
    assert a.metrics.fault_decisions == 3
    for _ in range(3):
        a.on_complete()
    assert a.metrics.concurrent_calls == 0


def test_lease_ttl_and_fault_policy_are_validated() -> None:
    with pytest.raises(ValueError, match="lease_ttl"):
        RedisBulkhead("x", url=UNREACHABLE, lease_ttl="100ms")
    with pytest.raises(ValueError, match="fault_policy"):
        RedisBulkhead("x", url=UNREACHABLE, fault_policy="maybe")


def test_the_documented_example_runs(redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_docs_examples import block, run

    source = block("docs/redis.md", "RedisBulkhead(").replace(
        'url="redis://127.0.0.1:6379/15",', f"url={redis_url!r}, prefix={prefix!r},"
    )
    assert f"prefix={prefix!r}" in source
    ns = run(source, "docs/redis.md")
    assert capsys.readouterr().out == "1\n"  # its own slot, printed inside the with block
    assert ns["partner"].cluster_concurrent_calls() == 0


def test_redis_down_falls_back_to_a_local_bulkhead_then_back_to_redis(redis_server: Any, made: list) -> None:
    from django_ratelimit_r4.backends import redis as rb

    url = redis_server.url
    a = bulkhead(url, "r4test", 2, connection_options={})  # the URL's own connection: recovered() below
    made.append(a)
    assert a.try_acquire_permission()
    redis_server.stop()
    # Refused, then the cool-down: the in-process bulkhead of the same config decides (2 in this process).
    assert [a.try_acquire_permission() for _ in range(3)] == [True, True, False]
    assert a.metrics.fault_decisions == 3 and a.metrics.concurrent_calls == 3
    for _ in range(3):
        a.on_complete()  # never raises; the lease taken before the outage is left to expire
    assert a.metrics.concurrent_calls == 0
    redis_server.start()
    rb.connection(url).recovered()  # end the 0.5 s cool-down now instead of waiting for it
    assert a.try_acquire_permission() and a.try_acquire_permission()
    assert a.cluster_concurrent_calls() == 2  # decided by Redis again (the restarted server is empty)
    assert a.metrics.fault_decisions == 3


def test_a_lease_lost_while_its_call_runs_is_counted_and_absorbs_its_release(
    redis_url: str, prefix: str, made: list
) -> None:
    """A lease that expired in Redis (its process stalled past lease_ttl) while the call still runs: the next
    renewal counts it, and that call's release does not give back a slot another call holds."""
    a = bulkhead(redis_url, prefix, 2, lease_ttl="600ms")
    other = bulkhead(redis_url, prefix, 2)
    made += [a, other]
    assert a.try_acquire_permission() and a.try_acquire_permission()
    client = redis.Redis.from_url(redis_url)
    lease = sorted(a._live)[0]
    client.zrem(a._keys[0], lease)  # as if it had expired during a stall
    deadline = time.monotonic() + 30
    while a.metrics.lost_leases == 0:  # the renewal runs every 200 ms
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert a.metrics.concurrent_calls == 2  # both calls still run
    assert other.try_acquire_permission()  # the lost slot went back to the cluster
    a.on_complete()  # absorbs the lost lease: the other lease of `a` stays
    assert a.cluster_concurrent_calls() == 2
    a.on_complete()
    assert a.cluster_concurrent_calls() == 1
    client.close()


def test_a_release_that_fails_is_retried_by_the_renewal_thread(redis_url: str, prefix: str, made: list) -> None:
    """A release hit by a fault (here: the cool-down) is not left to the lease TTL: the renewal thread gives
    the slot back at its next turn (every 2 s with a 6 s TTL), i.e. before the lease's expiry."""
    from django_ratelimit_r4.backends import redis as rb

    a = bulkhead(redis_url, prefix, 1, lease_ttl="6s")
    made.append(a)
    assert a.try_acquire_permission()
    [lease] = a._live
    client = redis.Redis.from_url(redis_url)
    expiry_ms = client.zscore(a._keys[0], lease)
    conn = rb.connection(redis_url)
    conn.down_until = time.monotonic() + 0.5  # as after a fault: this process skips Redis for a while
    a.on_complete()
    assert a.metrics.concurrent_calls == 0
    deadline = time.monotonic() + 30
    while client.zscore(a._keys[0], lease) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    seconds, micros = client.time()
    assert seconds * 1000 + micros // 1000 < expiry_ms  # given back, not expired
    client.close()
