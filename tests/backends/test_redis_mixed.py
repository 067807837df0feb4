"""All-or-nothing decisions on Redis over limiters of several algorithms (cycle, GCRA, sliding window; keyed and
unkeyed): one run of the mixed script (``backends/redis_mixed.py``), whose takes and give-backs (op "g" of each
script) of the groups that granted when another rejected run in that one script (atomicity, LATE and the one
EVALSHA: ``test_redis_mixed_one_script.py``). A rejection by any limit leaves the others' budgets as they were (no ghost
charges), Retry-After is the largest wait among the rejecting limits, the RateLimit figures come from the
replies; exact across processes; the fault policies decide while Redis is down.

Against a real Redis (db 15, a unique key prefix per test; CI sets R4_REQUIRE_REDIS=1).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_ratelimit_r4 import get_rate_limiter
from django_ratelimit_r4.backends.algorithms import (
    gcra_decide,
    gcra_give_back,
    gcra_quota,
    sliding_decide,
    sliding_give_back,
    sliding_initial,
    sliding_quota,
)
from django_ratelimit_r4.backends.memory import GcraBackend
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, aacquire_all, acquire_all
from django_ratelimit_r4.decorators import ratelimit
from django_ratelimit_r4.keyed import acquire_all_keyed
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")
scripted = pytest.importorskip("django_ratelimit_r4.backends.redis_scripted")
rg = pytest.importorskip("django_ratelimit_r4.backends.redis_gcra")
rs = pytest.importorskip("django_ratelimit_r4.backends.redis_sliding")

ROOT = Path(__file__).resolve().parents[2]
S = 1_000_000_000



def limiter(url: str, prefix: str, name: str, algorithm: str, limit: int, period: Any, clock: Any, **kw: Any) -> Any:
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm, **kw)
    return RateLimiter(name, config, clock=clock, backend=rb.redis_backend(url, prefix=prefix))


def keyed(url: str, prefix: str, name: str, algorithm: str, limit: int, period: Any, clock: Any) -> Any:
    config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm)
    cls = {"cycle": rb.RedisKeyedRateLimiter, "gcra": rg.RedisGcraKeyedRateLimiter,
           "sliding_window": rs.RedisSlidingKeyedRateLimiter}[algorithm]
    return cls(name, config, clock=clock, url=url, prefix=prefix)


def three(url: str, prefix: str, clock: Any, limits: tuple[int, int, int] = (3, 4, 5)) -> list[Any]:
    """A cycle, a GCRA and a sliding-window limiter, all per 10 s."""
    return [
        limiter(url, prefix, "cyc", "cycle", limits[0], "10s", clock),
        limiter(url, prefix, "gcra", "gcra", limits[1], "10s", clock),
        limiter(url, prefix, "slide", "sliding_window", limits[2], "10s", clock),
    ]


def remaining(limiters: list[Any]) -> list[int]:
    return [rl.backend.quota()[0] for rl in limiters]


def test_a_mixed_decision_on_redis_decides_all_or_nothing(redis_url: str, prefix: str) -> None:
    """Was TypeError ("cannot combine GCRA and cycle Redis limiters in one all-or-nothing decision")."""
    clock = FakeClock()
    cyc, gcra, slide = limiters = three(redis_url, prefix, clock)
    for order in (limiters, [gcra, slide, cyc], [slide, cyc, gcra]):
        assert acquire_all(order) is None
    assert remaining(limiters) == [0, 1, 2]
    loser, wait = acquire_all(limiters)  # type: ignore[misc]
    assert loser is cyc and wait == 10 * S  # the cycle limiter's next cycle
    assert remaining(limiters) == [0, 1, 2]  # GCRA and the sliding window got their permits back
    assert acquire_all([gcra, slide]) is None
    loser, wait = acquire_all([slide, gcra, cyc])  # type: ignore[misc]
    assert loser is cyc and wait == 10 * S  # the largest wait among the rejecting ones (GCRA's is 2.5 s)
    assert remaining(limiters) == [0, 0, 1]
    assert cyc.metrics.failed_calls == 2 and gcra.metrics.failed_calls == 1 and slide.metrics.failed_calls == 0
    clock.advance(2.5)  # GCRA: one permit back; the cycle still empty
    assert acquire_all([gcra, slide, cyc])[0] is cyc  # type: ignore[index]
    assert remaining(limiters) == [0, 1, 1]


@pytest.mark.parametrize("tight", ["cycle", "gcra", "sliding_window"])
@pytest.mark.parametrize("keyed_one", [None, "cycle", "gcra", "sliding_window"])
def test_a_rejection_by_any_limit_leaves_the_others_budgets_intact(
    redis_url: str, prefix: str, tight: str, keyed_one: str | None
) -> None:
    """One limit of 2 (``tight``) among limits of 5; one of them keyed. After 2 grants, 6 rejections: the
    others still have exactly 3 each, the tight one's wait is Retry-After."""
    clock = FakeClock()
    entries: list[tuple[Any, Any]] = []
    for algorithm in ("cycle", "gcra", "sliding_window"):
        limit = 2 if algorithm == tight else 5
        if algorithm == keyed_one:
            entries.append((keyed(redis_url, prefix, f"k-{algorithm}", algorithm, limit, "10s", clock), "client"))
        else:
            entries.append((limiter(redis_url, prefix, f"u-{algorithm}", algorithm, limit, "10s", clock), None))
    outcomes = [rb.acquire_all_keyed(entries) for _ in range(8)]
    assert outcomes[:2] == [None, None]
    index = ["cycle", "gcra", "sliding_window"].index(tight)
    wait = {"cycle": 10 * S, "gcra": 5 * S, "sliding_window": 10 * S}[tight]
    assert outcomes[2:] == [(index, wait)] * 6

    def left(entry: tuple[Any, Any]) -> int:
        target, key = entry
        return target.quota(key)[0] if key is not None else target.backend.quota()[0]

    assert [left(e) for e in entries] == [0 if a == tight else 3 for a in ("cycle", "gcra", "sliding_window")]
    outcome, quotas = rb.acquire_all_quotas(entries)
    assert outcome == (index, wait)
    assert [q[0] for q in quotas] == [left(e) for e in entries]  # the figures of the replies are the states'
    assert quotas[index] == (0, wait)


def test_figures_come_with_the_decision_and_equal_quota(redis_url: str, prefix: str) -> None:
    clock = FakeClock()
    limiters = three(redis_url, prefix, clock)
    entries = [(rl, None) for rl in limiters]
    for _ in range(5):
        outcome, quotas = rb.acquire_all_quotas(entries)
        assert quotas == [rl.backend.quota() for rl in limiters], outcome
        clock.advance(0.7)


def test_async_gives_the_sync_answers(redis_url: str, prefix: str) -> None:
    sync_clock, async_clock = FakeClock(), FakeClock()
    sync = three(redis_url, f"{prefix}:s", sync_clock)
    other = three(redis_url, f"{prefix}:a", async_clock)

    async def run() -> list[Any]:
        out = []
        for _ in range(5):
            result = await aacquire_all(other)
            out.append(None if result is None else (other.index(result[0]), result[1]))
            out.append(await rb.aacquire_all_quotas([(rl, None) for rl in other]))
            async_clock.advance(1)
        return out

    expected = []
    for _ in range(5):
        result = acquire_all(sync)
        expected.append(None if result is None else (sync.index(result[0]), result[1]))
        expected.append(rb.acquire_all_quotas([(rl, None) for rl in sync]))
        sync_clock.advance(1)
    assert asyncio.run(run()) == expected
    assert any(e is not None for e in expected[::2])  # some rejected (and gave back)


def test_server_time_mixed_decision_gives_back_exactly(redis_url: str, prefix: str) -> None:
    """On the server's clock too: GCRA's give-back gets what its take wrote, the sliding window the take's time."""
    limiters = three(redis_url, prefix, SYSTEM_CLOCK, limits=(2, 50, 50))
    for rl in limiters:
        rl.backend.reset(SYSTEM_CLOCK)
    assert acquire_all(limiters) is None and acquire_all(limiters) is None
    for _ in range(40):
        assert acquire_all(limiters)[0] is limiters[0]  # type: ignore[index]
    # GCRA 50 per 10 s: 48 left (plus what 200 ms per permit refilled); the sliding window exactly 48
    assert limiters[1].backend.quota()[0] >= 48
    assert limiters[2].backend.quota()[0] == 48
    for rl in limiters:
        rl.backend.reset(SYSTEM_CLOCK)


def test_one_round_trip_when_granted(redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One script run: one write, one reply, granted or refused (the split sent three calls, and a rejection
    added a write for the give-back)."""
    clock = FakeClock()
    limiters = three(redis_url, prefix, clock, limits=(1, 5, 5))
    acquire_all(limiters[1:])  # the scripts are loaded (a first EVALSHA may answer NOSCRIPT)
    events: list[str] = []
    connection = redis.connection.AbstractConnection
    send, read = connection.send_packed_command, connection.read_response

    def sending(self: Any, *args: Any, **kw: Any) -> Any:
        events.append("send")
        return send(self, *args, **kw)

    def reading(self: Any, *args: Any, **kw: Any) -> Any:
        events.append("read")
        return read(self, *args, **kw)

    monkeypatch.setattr(connection, "send_packed_command", sending)
    monkeypatch.setattr(connection, "read_response", reading)
    exchange = rb._exchange  # RedisConnection's own write + read of one command (issue 9)

    def exchanging(conn: Any, packed: bytes) -> Any:
        events.extend(("send", "read"))
        return exchange(conn, packed)

    monkeypatch.setattr(rb, "_exchange", exchanging)
    assert acquire_all(limiters) is None
    assert events == ["send", "read"]
    events.clear()
    assert acquire_all(limiters)[0] is limiters[0]  # type: ignore[index]
    assert events == ["send", "read"]  # the give-back of two groups ran inside the script


def test_async_one_round_trip_when_granted(redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The async twin: one write on one of the loop's connections, one reply, granted or refused."""
    clock = FakeClock()
    limiters = three(redis_url, prefix, clock, limits=(1, 5, 5))
    events: list[str] = []
    connection = redis.asyncio.connection.AbstractConnection
    send, read = connection.send_packed_command, connection.read_response

    async def sending(self: Any, *args: Any, **kw: Any) -> Any:
        events.append("send")
        return await send(self, *args, **kw)

    async def reading(self: Any, *args: Any, **kw: Any) -> Any:
        events.append("read")
        return await read(self, *args, **kw)

    exchange = rb.RedisConnection._aexchange  # the lean path's one write and its replies

    async def exchanging(conn: Any, packed: bytes, count: int) -> Any:
        events.append("send")
        replies = await exchange(conn, packed, count)
        events.extend(["read"] * len(replies))
        return replies

    async def run() -> list[Any]:
        await aacquire_all(limiters[1:])  # the scripts are loaded (a first EVALSHA may answer NOSCRIPT)
        monkeypatch.setattr(connection, "send_packed_command", sending)
        monkeypatch.setattr(connection, "read_response", reading)
        monkeypatch.setattr(rb.RedisConnection, "_aexchange", staticmethod(exchanging))
        first = await aacquire_all(limiters)
        seen = list(events)
        events.clear()
        second = await aacquire_all(limiters)
        return [first, seen, second, list(events)]

    first, seen, second, then = asyncio.run(run())
    assert first is None and seen == ["send", "read"]
    assert second[0] is limiters[0] and then == ["send", "read"]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_server_that_knows_no_script_yet(redis_server: Any, asynchronous: bool) -> None:
    """A fresh server answers the mixed script's EVALSHA with NOSCRIPT (nothing ran): it is sent again with its
    source (EVAL), and the decision is the same."""
    clock = FakeClock()
    limiters = three(redis_server.url, "fresh", clock, limits=(1, 5, 5))

    def decide() -> Any:
        return asyncio.run(aacquire_all(limiters)) if asynchronous else acquire_all(limiters)

    assert decide() is None
    assert decide()[0] is limiters[0]
    assert remaining(limiters) == [0, 4, 4]
    rb.close_connections()


# ------------------------------------------------------------------------------------------ four processes

_CHILD = textwrap.dedent(
    """
    import sys, threading, time
    sys.path.insert(0, {root!r})
    from django_ratelimit_r4.backends.redis import acquire_all_keyed, redis_backend
    from django_ratelimit_r4.backends.redis_gcra import RedisGcraKeyedRateLimiter
    from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
    from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig

    def make(name, algorithm, limit):
        config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period="60s", algorithm=algorithm)
        return RateLimiter(name, config, clock=SYSTEM_CLOCK, backend=redis_backend({url!r}, prefix={prefix!r}))

    cyc = make({name!r} + "-c", "cycle", {limits[0]})
    slide = make({name!r} + "-s", "sliding_window", {limits[2]})
    config = RateLimiterConfig(limit_for_period={limits[1]}, limit_refresh_period="60s", algorithm="gcra")
    per_ip = RedisGcraKeyedRateLimiter({name!r} + "-g", config, clock=SYSTEM_CLOCK, url={url!r}, prefix={prefix!r})
    entries = [(slide, None), (per_ip, "client"), (cyc, None)]
    results = []
    barrier = threading.Barrier(10)

    def worker():
        barrier.wait()
        while time.time() < {start}:
            time.sleep(0.0005)
        got = 0
        for _ in range(4):
            got += acquire_all_keyed(entries) is None
        results.append(got)

    threads = [threading.Thread(target=worker) for _ in range(10)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(sum(results))
    """
)


@pytest.mark.parametrize("limits", [(6, 40, 40), (40, 6, 40), (40, 40, 6), (9, 7, 8)])
def test_exact_across_four_processes(redis_url: str, prefix: str, limits: tuple[int, int, int]) -> None:
    """4 processes x 10 threads x 4 decisions over a cycle, a keyed GCRA and a sliding-window limit per 60 s
    (server time), released together: exactly the smallest limit granted, and the other limits lost nothing
    to the 160 - min rejected decisions (their remaining budgets are exactly limit - granted)."""
    for trial in range(3):
        name = f"mp{trial}"
        start = time.time() + 2.0
        # No reset beforehand: the first decision anchors the cycle limiter, and its give-backs in the same
        # script run see the same instant, so even decisions at a cycle's very start give back exactly (the
        # split refused a give-back when the cycle might have begun after its take).
        code = _CHILD.format(root=str(ROOT), name=name, url=redis_url, prefix=prefix, start=start, limits=limits)
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
        granted = sum(int(p.communicate(timeout=120)[0]) for p in procs)
        assert granted == min(limits), (trial, granted)
        cyc = limiter(redis_url, prefix, f"{name}-c", "cycle", limits[0], "60s", SYSTEM_CLOCK)
        slide = limiter(redis_url, prefix, f"{name}-s", "sliding_window", limits[2], "60s", SYSTEM_CLOCK)
        per_ip = keyed(redis_url, prefix, f"{name}-g", "gcra", limits[1], "60s", SYSTEM_CLOCK)
        assert cyc.backend.quota()[0] == limits[0] - granted
        assert slide.backend.quota()[0] == limits[2] - granted
        # GCRA refills one permit per 60 s / limit (>= 1.5 s): at most one came back during the trial
        assert per_ip.quota("client")[0] in (limits[1] - granted, limits[1] - granted + 1)


def _granted_at_a_barrier(acquire: Any, threads: int) -> int:
    """How many of ``threads`` threads released together at a barrier ``acquire()`` granted."""
    barrier = threading.Barrier(threads)
    results: list[bool] = []
    lock = threading.Lock()

    def work() -> None:
        barrier.wait()
        ok = acquire()
        with lock:
            results.append(ok)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(results)


@pytest.mark.parametrize("algorithm", ["gcra", "sliding_window"])
def test_exact_under_20_threads_on_redis(redis_url: str, prefix: str, algorithm: str, fast_switching: None) -> None:
    """Issue 13's proof on Redis, as for cycle limiters (``test_redis.py::test_seed_000_threads``): 20 threads at a
    barrier (1 us switch interval) on 5 per 60 s, unkeyed and per key: exactly 5 granted every trial, then the
    wait the algorithm gives (GCRA: one permit per 12 s; the sliding window: the oldest leaves in 60 s)."""
    wait_s = 12 if algorithm == "gcra" else 60
    for trial in range(6):
        clock = FakeClock()
        unkeyed = limiter(redis_url, prefix, f"t20-{algorithm}-{trial}", algorithm, 5, "60s", clock)
        per_ip = keyed(redis_url, prefix, f"t20k-{algorithm}-{trial}", algorithm, 5, "60s", clock)
        for acquire in (unkeyed.acquire_permission, lambda per_ip=per_ip: per_ip.acquire_permission("ip")):
            assert _granted_at_a_barrier(acquire, 20) == 5, trial
            assert not acquire()
        assert unkeyed.metrics.nanos_to_wait == wait_s * 1_000_000_000
        assert per_ip.state("ip")[2] == wait_s * 1_000_000_000


# ------------------------------------------------------------------------------------------------ faults

UNREACHABLE = "redis://127.0.0.1:1/14?socket_timeout=0.25"  # nothing listens on port 1


@pytest.mark.parametrize(("policy", "expected"), [("local", [True, True, False]), ("open", [True, True, True]),
                                                  ("closed", [False, False, False])])
def test_fault_policies_decide_a_mixed_decision(policy: str, expected: list[bool]) -> None:
    clock = FakeClock()
    backend = rb.redis_backend(UNREACHABLE, fault_policy=policy)
    limiters = [
        RateLimiter(name, RateLimiterConfig(limit_for_period=limit, limit_refresh_period="10s", algorithm=algorithm),
                    clock=clock, backend=backend)
        for name, algorithm, limit in (("c", "cycle", 5), ("g", "gcra", 2), ("s", "sliding_window", 4))
    ]
    assert [acquire_all(limiters) is None for _ in range(3)] == expected
    if policy == "local":  # in process: the GCRA limit rejected the third, the others gave their permits back
        assert [rl.backend._local.quota()[0] for rl in limiters] == [3, 0, 2]


class _TickingClock(FakeClock):
    """A FakeClock that moves 1 us at every reading: time passes between one member's decision and the next,
    as it does on a real clock (deterministic: each reading is 1 us after the previous one)."""

    __slots__ = ()

    def now_ns(self) -> int:
        return self.advance_ns(1_000)


def _local_state(rl: Any) -> Any:
    local = rl.backend._local
    return local._tat if isinstance(local, GcraBackend) else (list(local._ring), local._head)


@pytest.mark.parametrize("algorithm", ["gcra", "sliding_window"])
def test_local_all_or_nothing_leaves_a_refused_decisions_members_exactly_as_they_were(algorithm: str) -> None:
    """Redis down, fault policy "local": an all-or-nothing decision that a later member refuses takes nothing
    from the earlier ones, whatever time passes between the members' readings. Was: each member took its
    permits in turn and gave them back when a later one refused; GCRA gave back from the clock reading before
    its take, so here 2 us less than it took (one reading per step of the ticking clock), and its theoretical
    arrival time stayed that much later (docs/redis.md, "Fault policy")."""
    clock = _TickingClock()
    backend = rb.redis_backend(UNREACHABLE, fault_policy="local")
    smooth = RateLimiter(
        "x", RateLimiterConfig(limit_for_period=10, limit_refresh_period="1s", algorithm=algorithm),
        clock=clock, backend=backend,
    )
    spent = RateLimiter(
        "c", RateLimiterConfig(limit_for_period=1, limit_refresh_period="1h"), clock=clock, backend=backend
    )
    assert smooth.acquire_permission() and smooth.acquire_permission()  # not full: a grant moves its state on
    assert spent.acquire_permission()  # none left for an hour
    before = _local_state(smooth)
    granted = smooth.backend._local.successful_calls
    for _ in range(3):
        assert acquire_all([smooth, spent]) is not None  # refused by the second member
        assert _local_state(smooth) == before
    assert smooth.backend._local.successful_calls == granted
    assert spent.backend._local.failed_calls == 3
    assert acquire_all([smooth]) is None  # and a decision it alone makes still takes


@pytest.mark.parametrize("algorithm", ["gcra", "sliding_window"])
def test_local_all_or_nothing_of_keyed_members_is_exact_too(algorithm: str) -> None:
    """The same through the keyed in-process stores (per client key): the refused decision leaves the earlier
    key's state as it was."""
    clock = _TickingClock()
    config = RateLimiterConfig(limit_for_period=10, limit_refresh_period="1s", algorithm=algorithm)
    keyed_type = rg.RedisGcraKeyedRateLimiter if algorithm == "gcra" else rs.RedisSlidingKeyedRateLimiter
    per_ip = keyed_type("kx", config, clock=clock, url=UNREACHABLE, fault_policy="local")
    spent = rb.RedisKeyedRateLimiter(
        "kc", RateLimiterConfig(limit_for_period=1, limit_refresh_period="1h"), clock=clock, url=UNREACHABLE,
        fault_policy="local",
    )
    assert per_ip.acquire_permission("ip") and per_ip.acquire_permission("ip")
    assert spent.acquire_permission("ip")
    store = per_ip.store._local

    def state() -> Any:
        return {key: (value if isinstance(value, int) else (list(value.ring), value.head))
                for key, value in store._states.items()}

    before = state()
    for _ in range(3):
        assert acquire_all_keyed([(per_ip, "ip"), (spent, "ip")]) is not None
        assert state() == before


def test_local_all_or_nothing_with_a_member_on_another_policy_refuses_it_as_closed() -> None:
    """A member whose policy is not "local" cannot be decided in process: the decision is refused at it with the
    "closed" wait (1 s), and takes nothing from the "local" members before it."""
    clock = FakeClock()
    local = RateLimiter(
        "p1", RateLimiterConfig(limit_for_period=10, limit_refresh_period="1s", algorithm="gcra"),
        clock=clock, backend=rb.redis_backend(UNREACHABLE, fault_policy="local"),
    )
    closed = RateLimiter(
        "p2", RateLimiterConfig(limit_for_period=10, limit_refresh_period="1s"),
        clock=clock, backend=rb.redis_backend(UNREACHABLE, fault_policy="closed"),
    )
    assert local.acquire_permission()
    before = _local_state(local)
    assert acquire_all([local, closed]) == (closed, 1_000_000_000)
    assert acquire_all([closed, local]) == (closed, 1_000_000_000)  # the first member's policy decides
    assert _local_state(local) == before
    assert local.backend._local.successful_calls == 1


# ------------------------------------------------------------------------------------------------ HTTP


@ratelimit(["m_cycle", "m_gcra_ip", "m_slide"])
def mixed_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["m_cycle", "m_gcra_ip", "m_slide"])
async def mixed_async_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("mixed/", mixed_view), path("mixed-async/", mixed_async_view)]


def _settings(redis_url: str, prefix: str) -> dict[str, Any]:
    # Patient timeouts: at load 7 a 0.25 s socket timeout handed the async view's decisions to the fault policy,
    # which allowed all five requests (the test is about the gate, not about faults).
    return {
        "backends": {
            "default": {
                "BACKEND": "redis",
                "LOCATION": redis_url,
                "OPTIONS": {"key_prefix": prefix, "socket_timeout": "5s", "socket_connect_timeout": "5s"},
            }
        },
        "ratelimiters": {
            "instances": {
                "m_cycle": {"rate": "5/10s"},
                "m_gcra_ip": {"rate": "3/10s", "algorithm": "gcra", "key": "ip"},
                "m_slide": {"rate": "4/10s", "algorithm": "sliding_window"},
            },
        },
    }


@pytest.mark.urls(__name__)
@pytest.mark.django_db(databases=[])
@pytest.mark.parametrize("view", ["/mixed/", "/mixed-async/"])
def test_http_gate_of_three_algorithms(redis_url: str, prefix: str, r4_clock: Any, view: str) -> None:
    with override_settings(RATELIMIT_R4=_settings(redis_url, prefix)):
        client = Client()
        statuses = [client.get(view).status_code for _ in range(5)]
        assert statuses == [200, 200, 200, 429, 429]  # GCRA's 3 per client
        rejected = client.get(view)
        assert rejected["Retry-After"] == "4"  # 10 s / 3 to GCRA's next permit, rounded up
        assert get_rate_limiter("m_cycle").metrics.available_permissions == 2  # 5 - 3: the 429s took nothing
        assert get_rate_limiter("m_slide").metrics.available_permissions == 1
        assert '"m_gcra_ip";r=0;t=4' in rejected["RateLimit"], rejected["RateLimit"]
        assert '"m_cycle";r=2' in rejected["RateLimit"] and '"m_slide";r=1' in rejected["RateLimit"]
        r4_clock.advance(3.4)  # past 10 s / 3: one GCRA permit back
        assert client.get(view).status_code == 200


@pytest.mark.urls(__name__)
@pytest.mark.django_db(databases=[])
def test_drf_throttle_of_three_algorithms(redis_url: str, prefix: str, r4_clock: Any) -> None:
    pytest.importorskip("rest_framework")
    from rest_framework.test import APIRequestFactory
    from rest_framework.views import APIView

    from django_ratelimit_r4.rest_framework import RateLimiterThrottle

    class View(APIView):
        throttle_classes = [RateLimiterThrottle]
        rate_limiter = ["m_cycle", "m_gcra_ip", "m_slide"]

        def get(self, request: Any) -> Any:
            from rest_framework.response import Response

            return Response("ok")

    with override_settings(RATELIMIT_R4=_settings(redis_url, prefix)):
        factory = APIRequestFactory()
        statuses = [View.as_view()(factory.get("/")).status_code for _ in range(5)]
        assert statuses == [200, 200, 200, 429, 429]
        assert get_rate_limiter("m_cycle").metrics.available_permissions == 2
        assert get_rate_limiter("m_slide").metrics.available_permissions == 1


# ------------------------------------------------------------------ the give-back op against the references

_GIVE_OPS = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "take", "take", "give", "give", "advance", "quota"]),
        st.integers(min_value=1, max_value=6),  # permits
        st.integers(min_value=0, max_value=3_000_000_000),  # timeout or advance, ns
    ),
    max_size=40,
)


def _script_call(backend: Any, op: bytes, permits: int, slot: Any = None) -> Any:
    args = backend._script_args(op, permits, 0)
    if slot is not None:
        args[len(args) - 3] = slot  # the deadline slot (then now_s, now_ns of the FakeClock)
    return scripted.call(backend._script, backend._connection(), [backend.state_key], args, False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.integers(min_value=1, max_value=7),
    period=st.sampled_from([1_000_000_000, 999_999_937, 60_000_000_000, 3_000]),
    burst=st.one_of(st.none(), st.integers(min_value=1, max_value=8)),
    start=st.integers(min_value=0, max_value=10**12),
    ops=_GIVE_OPS,
)
def test_gcra_give_back_op_gives_the_references_answers(
    redis_url: str, prefix: str, limit: int, period: int, burst: int | None, start: int, ops: list[Any]
) -> None:
    """Random decisions, all-or-nothing takes and give-backs of the last take on the Redis script (FakeClock
    time) and on gcra_decide / gcra_give_back: the same figures after every step."""
    clock = FakeClock()
    clock.advance_ns(start)
    remote = rg.RedisGcraBackend("give", limit, period, clock, burst=burst, url=redis_url, prefix=prefix)
    b = limit if burst is None else burst
    tat, last = 0, None
    for op, permits, amount in ops:
        now = clock.now_ns()
        if op == "acquire":
            tat, wait, granted = gcra_decide(tat, permits, amount, now, period, limit, b)
            assert remote.acquire(permits, amount) == (wait if granted else -wait)
        elif op == "take":
            tat, wait, granted = gcra_decide(tat, permits, 0, now, period, limit, b)
            reply = _script_call(remote, b"n", permits)  # "m" that names what it wrote
            assert (reply[0] == 0) == granted, reply
            if granted:
                last = (permits, tat, reply[1])
        elif op == "give" and last is not None:
            k, granted_tat, written = last
            tat = gcra_give_back(tat, k, granted_tat, now, period, limit)
            figures = _script_call(remote, b"g", k, written)
            assert tuple(figures) == gcra_quota(tat, now, period, limit, b)
        elif op == "advance":
            clock.advance_ns(amount)
        assert remote.quota() == gcra_quota(tat, clock.now_ns(), period, limit, b), op


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.integers(min_value=1, max_value=7),
    period=st.sampled_from([1_000_000_000, 999_999_937, 60_000_000_000, 3_000]),
    start=st.integers(min_value=0, max_value=10**12),
    ops=_GIVE_OPS,
)
def test_sliding_give_back_op_gives_the_references_answers(
    redis_url: str, prefix: str, limit: int, period: int, start: int, ops: list[Any]
) -> None:
    """The same for the sliding window's script against sliding_decide / sliding_give_back."""
    clock = FakeClock()
    clock.advance_ns(start)
    remote = rs.RedisSlidingBackend("give", limit, period, clock, url=redis_url, prefix=prefix)
    times = tuple(t + clock.now_ns() for t in sliding_initial(limit, period))
    last = None
    for op, permits, amount in ops:
        now = clock.now_ns()
        if op == "acquire":
            times, wait, granted = sliding_decide(times, permits, amount, now, period)
            assert remote.acquire(permits, amount) == (wait if granted else -wait)
        elif op == "take":
            times, wait, granted = sliding_decide(times, permits, 0, now, period)
            reply = _script_call(remote, b"n", permits)  # "m" that names the time it logged
            assert (reply[0] == 0) == granted, reply
            if granted:
                last = (permits, now, b"%d %d" % (reply[1], reply[2]))
        elif op == "give" and last is not None:
            k, granted_at, taken = last
            times = sliding_give_back(times, k, granted_at, now, period)
            figures = _script_call(remote, b"g", k, taken)
            assert tuple(figures) == sliding_quota(times, now, period)
        elif op == "advance":
            clock.advance_ns(amount)
        assert remote.quota() == sliding_quota(times, clock.now_ns(), period), op
