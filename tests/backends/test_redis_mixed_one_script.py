"""All-or-nothing over Redis limits of several algorithms in one slot: ONE script run (issue 13).

``backends/redis_mixed.py`` composes every algorithm's script into one (``lua/mixed.lua`` drives them): the
takes and, when a limit rejects, the give-backs run in one script, so the decision is atomic (no other
decision ever sees a taken-then-given-back state), costs one round trip whether granted or refused, and
gives back exactly. Here: that atomicity across 4 processes (a test the old split, one call per algorithm
and a second round trip for the give-back, fails), one EVALSHA per decision counted with ``INFO
commandstats``, LATE and a frozen server (no ghost charges), the fault policy, and a property test against
the in-memory limiters (themselves checked against the pure references of ``backends/algorithms.py`` and
``backends/base.py``).

Against a real Redis (db 15, a unique key prefix per test; a private ``redis-server`` where a test counts
commands or freezes it).
"""

from __future__ import annotations

import asyncio
import os
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, aacquire_all, acquire_all
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)
from tests.backends.races import run_children

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")
rg = pytest.importorskip("django_ratelimit_r4.backends.redis_gcra")
rs = pytest.importorskip("django_ratelimit_r4.backends.redis_sliding")
mixed = pytest.importorskip("django_ratelimit_r4.backends.redis_mixed")

ROOT = Path(__file__).resolve().parents[2]
S = 1_000_000_000
ALGORITHMS = ("cycle", "gcra", "sliding_window")



def config(algorithm: str, limit: int, period: Any = "10s") -> RateLimiterConfig:
    return RateLimiterConfig(limit_for_period=limit, limit_refresh_period=period, algorithm=algorithm)


def limiter(
    url: str, prefix: str, name: str, algorithm: str, limit: int, clock: Any, period: Any = "10s", **kw: Any
) -> RateLimiter:
    backend = rb.redis_backend(url, prefix=prefix, **kw)
    return RateLimiter(name, config(algorithm, limit, period), clock=clock, backend=backend)


def keyed(url: str, prefix: str, name: str, algorithm: str, limit: int, clock: Any) -> Any:
    cls = {"cycle": rb.RedisKeyedRateLimiter, "gcra": rg.RedisGcraKeyedRateLimiter,
           "sliding_window": rs.RedisSlidingKeyedRateLimiter}[algorithm]
    return cls(name, config(algorithm, limit), clock=clock, url=url, prefix=prefix)


def three(url: str, prefix: str, clock: Any, limits: tuple[int, int, int] = (3, 4, 5), **kw: Any) -> list[RateLimiter]:
    return [limiter(url, prefix, f"m-{a}", a, n, clock, **kw) for a, n in zip(ALGORITHMS, limits, strict=True)]


def remaining(limiters: list[RateLimiter]) -> list[int]:
    return [rl.backend.quota()[0] for rl in limiters]  # type: ignore[attr-defined]


def scripts_run(url: str) -> dict[str, int]:
    """Script calls the server ran since the last call (INFO commandstats, then CONFIG RESETSTAT)."""
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
        client.config_resetstat()
    finally:
        client.close()
    return {cmd: int(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0)) for cmd in ("evalsha", "eval")}


def test_the_script_is_composed_from_the_files_and_loads_like_the_others() -> None:
    text = mixed.MIXED_SCRIPT
    for name in ("fast.lua", "decide.lua", "ratelimiter.lua", "gcra.lua", "sliding_window.lua", "mixed.lua"):
        assert mixed.lua_text(name) in text  # each file's own text, unchanged (composed at import time)
    assert rb.SCRIPT in text  # the cycle script is the same text as its own
    heads = [text.index(f"\nlocal function r4_{a}(KEYS, ARGV, redis)\n") for a in ("gcra", "sliding")]
    assert text.startswith("local function r4_cycle(KEYS, ARGV, redis)\n") and heads == sorted(heads)


# ------------------------------------------------------------------------------------------ one round trip


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("keyed_one", [None, "cycle", "gcra", "sliding_window"])
def test_one_evalsha_per_decision_granted_and_refused(redis_server: Any, asynchronous: bool, keyed_one: Any) -> None:
    """Every decision, granted or refused (with the give-backs), is one script run: one EVALSHA, nothing else."""
    clock = FakeClock()
    url = redis_server.url
    entries: list[tuple[Any, Any]] = []
    for algorithm, limit in zip(ALGORITHMS, (3, 2, 4), strict=True):
        if algorithm == keyed_one:
            entries.append((keyed(url, "x", f"k-{algorithm}", algorithm, limit, clock), "client"))
        else:
            entries.append((limiter(url, "x", f"u-{algorithm}", algorithm, limit, clock), None))

    def decide() -> Any:
        if asynchronous:
            return asyncio.run(rb.aacquire_all_keyed(entries))
        return rb.acquire_all_keyed(entries)

    decide()  # loads the script (EVALSHA answered NOSCRIPT, then EVAL) and learns the anchors
    scripts_run(url)
    outcomes = []
    for _ in range(4):
        outcomes.append(decide())
        assert scripts_run(url) == {"evalsha": 1, "eval": 0}, outcomes
    assert outcomes == [None, (1, 5 * S), (1, 5 * S), (1, 5 * S)]  # GCRA's 2 per 10 s ran out
    for _ in range(3):
        outcome, quotas = rb.acquire_all_quotas(entries)  # the figures come with it: still one run
        assert scripts_run(url) == {"evalsha": 1, "eval": 0}
        assert outcome == (1, 5 * S) and [q[0] for q in quotas] == [1, 0, 2]
    rb.close_connections()


def test_one_write_and_one_read_on_the_connection(redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Granted or refused: one command sent, one reply read (the old split read three, then sent a give-back)."""
    clock = FakeClock()
    limiters = three(redis_url, prefix, clock, limits=(1, 5, 5))
    acquire_all(limiters)  # the script is loaded
    events: list[str] = []
    connection = redis.connection.AbstractConnection
    send, read = connection.send_packed_command, connection.read_response
    monkeypatch.setattr(connection, "send_packed_command", lambda self, *a, **k: (events.append("send"), send(self, *a, **k))[1])
    monkeypatch.setattr(connection, "read_response", lambda self, *a, **k: (events.append("read"), read(self, *a, **k))[1])
    exchange = rb._exchange  # RedisConnection's own write + read of one command (issue 9)
    monkeypatch.setattr(rb, "_exchange", lambda conn, packed: (events.extend(("send", "read")), exchange(conn, packed))[1])
    assert acquire_all(limiters)[0] is limiters[0]  # type: ignore[index]
    assert events == ["send", "read"]
    assert remaining(limiters) == [0, 4, 4]


# ------------------------------------------------------------------------------------------ atomicity

_CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    sys.path.insert(0, {root!r})
    from django_ratelimit_r4.backends import redis as rb
    from django_ratelimit_r4.core.clock import SYSTEM_CLOCK
    from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, acquire_all
    if os.environ.get("R4_FORCE_SPLIT"):  # the old split (one call per algorithm, a give-back round trip)
        rb._one_slot = lambda conn, members, groups: False

    def make(name, algorithm, limit):
        config = RateLimiterConfig(limit_for_period=limit, limit_refresh_period="60s", algorithm=algorithm)
        return RateLimiter(name, config, clock=SYSTEM_CLOCK, backend=rb.redis_backend({url!r}, prefix={prefix!r}))

    spent = make({name!r} + "-spent", "cycle", 1)     # empty: every refuser's decision is refused by it
    big = make({name!r} + "-big", "cycle", 1000)
    gcra = make({name!r} + "-g", "gcra", {budget})
    slide = make({name!r} + "-s", "sliding_window", {budget})
    refusers, observers = {refusers}, {observers}
    barrier = threading.Barrier(refusers + observers)
    lock, started = threading.Lock(), [0]
    busy = threading.Event()  # set once every refuser made its first decisions: observers start then
    done = threading.Event()
    refused, granted = [], []

    def refuser():
        barrier.wait()
        while time.time() < {start}:
            time.sleep(0.0005)
        n = 0
        while (not done.is_set() or n < 20) and time.time() < {start} + 120:  # bounded if an observer died
            refused.append(acquire_all([spent, gcra, slide]) is not None)
            n += 1
            if n == 3:
                with lock:
                    started[0] += 1
                    if started[0] == refusers:
                        busy.set()

    def observer():
        barrier.wait()
        busy.wait(120)
        granted.append(acquire_all([big, gcra, slide]) is None)

    threads = [threading.Thread(target=refuser) for _ in range(refusers)]
    threads += [threading.Thread(target=observer) for _ in range(observers)]
    for t in threads: t.start()
    for t in threads[refusers:]: t.join()
    done.set()
    for t in threads[:refusers]: t.join()
    print(sum(granted), sum(refused), len(refused))
    """
)

BUDGET, OBSERVERS, REFUSERS = 8, 2, 5  # per process: 4 x 2 observers ask for exactly the budget of 8


def atomic_trial(url: str, prefix: str, name: str, env: dict[str, str] | None = None) -> tuple[int, int, int]:
    """4 processes: 5 refusers each loop decisions over [empty cycle, GCRA 8, sliding 8] (always refused),
    2 observers each ask once for [cycle 1000, GCRA 8, sliding 8], released while the refusers run. Returns
    (observers granted, refusers granted, refused decisions)."""
    limiter(url, prefix, f"{name}-spent", "cycle", 1, SYSTEM_CLOCK, "60s").acquire_permission()
    start = time.time() + 1.5
    code = _CHILD.format(root=str(ROOT), name=name, url=url, prefix=prefix, start=start, budget=BUDGET,
                         refusers=REFUSERS, observers=OBSERVERS)
    totals = [0, 0, 0]
    for text in run_children(code, 4, 180, env):
        out = text.split()
        assert len(out) == 3, out
        for k in range(3):
            totals[k] += int(out[k])
    observers, refused_true, decisions = totals
    return observers, decisions - refused_true, decisions


@pytest.mark.parametrize("trial", range(4))
def test_no_decision_sees_a_taken_then_given_back_state(redis_url: str, prefix: str, trial: int) -> None:
    """The 8 observer decisions ask for exactly the 8 permits of GCRA and the sliding window while 20 threads
    run refused decisions over them: every observer is granted (no refused decision's take was ever visible),
    no refuser is, and every limit keeps exactly its budget minus the 8 grants. The old split fails this:
    between its two round trips a refused decision holds permits that others are refused for."""
    observers, refusers_granted, decisions = atomic_trial(redis_url, prefix, f"at{trial}")
    assert (observers, refusers_granted) == (4 * OBSERVERS, 0), decisions
    assert decisions >= 4 * REFUSERS * 20
    big = limiter(redis_url, prefix, f"at{trial}-big", "cycle", 1000, SYSTEM_CLOCK, "60s")
    slide = limiter(redis_url, prefix, f"at{trial}-s", "sliding_window", BUDGET, SYSTEM_CLOCK, "60s")
    gcra = limiter(redis_url, prefix, f"at{trial}-g", "gcra", BUDGET, SYSTEM_CLOCK, "60s")
    assert big.backend.quota()[0] == 1000 - 4 * OBSERVERS  # type: ignore[attr-defined]
    assert slide.backend.quota()[0] == 0  # type: ignore[attr-defined]
    assert gcra.backend.quota()[0] in (0, 1)  # type: ignore[attr-defined]  # one refill per 7.5 s at most


@pytest.mark.skipif(not os.environ.get("R4_SHOW_SPLIT_FAILS"), reason="a demonstration of the old split (set R4_SHOW_SPLIT_FAILS=1)")
def test_the_old_split_fails_the_atomicity_test(redis_url: str, prefix: str) -> None:
    """The same trial with the split forced: observers are refused while refused decisions hold permits."""
    failed = 0
    for trial in range(4):
        observers, _, _ = atomic_trial(redis_url, prefix, f"split{trial}", env={**os.environ, "R4_FORCE_SPLIT": "1"})
        failed += observers < 4 * OBSERVERS
    assert failed > 0


# ------------------------------------------------------------------------------------------ LATE and faults


def test_a_late_decision_changes_nothing(redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deadline in the past (server time): the script answers LATE before any take, the client tries once
    more, then the fault policy decides; no limit lost anything."""
    limiters = three(redis_url, prefix, SYSTEM_CLOCK, limits=(5, 5, 5), fault_policy="closed")
    for rl in limiters:
        rl.reset()
    assert acquire_all(limiters) is None  # the server time is learned
    before = remaining(limiters)
    calls: list[int] = []

    def late(self: Any, started_ns: int) -> bytes:
        calls.append(1)
        return b"1"  # 1 µs after the epoch: long past

    monkeypatch.setattr(rb.RedisConnection, "deadline", late)
    monkeypatch.setattr(rb.RedisConnection, "was_late", lambda self, started_ns: True)
    assert acquire_all(limiters) is not None  # late twice: the "closed" policy refuses
    assert len(calls) == 2
    monkeypatch.undo()
    assert remaining(limiters) == before == [4, 4, 4]
    assert limiters[0].backend.faults == 1  # type: ignore[attr-defined]  # the leader's policy decided, once


def _open(pool: Any, n: int) -> None:
    held = [pool.get_connection(*rb._GET_ARGS) for _ in range(n)]
    for connection in held:
        pool.release(connection)


def test_decisions_that_time_out_while_redis_is_frozen_charge_nothing(redis_server: Any) -> None:
    """8 mixed decisions reach a frozen server and time out (the "closed" policy refuses them); when it resumes
    they run, find their deadline passed and change nothing."""
    url = f"{redis_server.url}?socket_timeout=0.2"
    limiters = three(url, "frozen", SYSTEM_CLOCK, limits=(5, 5, 5), fault_policy="closed")
    for rl in limiters:
        rl.reset()
    assert acquire_all(limiters) is None  # 4 left each; the server time is known
    conn = rb.connection(url)
    _open(conn.sync.connection_pool, 8)
    scripts_run(redis_server.url)
    barrier = threading.Barrier(8)
    results: list[Any] = []

    def work() -> None:
        barrier.wait()
        results.append(acquire_all(limiters))

    redis_server.pause()
    try:
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        redis_server.resume()
    assert len(results) == 8 and all(r is not None for r in results)
    deadline = time.monotonic() + 20
    ran = 0
    while ran < 8 and time.monotonic() < deadline:  # the queued decisions run once it resumes
        ran += sum(scripts_run(redis_server.url).values())
        time.sleep(0.02)
    assert ran >= 8
    conn.answered()
    assert remaining(limiters) == [4, 4, 4]  # the budget is intact
    rb.close_connections()


@pytest.mark.parametrize(("policy", "expected"), [("local", [True, True, False]), ("open", [True, True, True]),
                                                  ("closed", [False, False, False])])
def test_the_fault_policy_decides_while_redis_is_down(policy: str, expected: list[bool]) -> None:
    clock = FakeClock()
    limiters = three("redis://127.0.0.1:1/14?socket_timeout=0.25", "down", clock, limits=(5, 2, 4), fault_policy=policy)
    assert [acquire_all(limiters) is None for _ in range(3)] == expected
    assert [asyncio.run(aacquire_all(limiters)) is None for _ in range(1)] == expected[2:]


# ------------------------------------------------------------------------------------------ property


@st.composite
def programs(draw: Any) -> Any:
    limits = draw(st.tuples(*(st.integers(1, 6) for _ in ALGORITHMS)))
    ops = draw(st.lists(st.one_of(
        st.tuples(st.just("advance"), st.integers(0, 12_000)),  # ms
        st.tuples(st.just("acquire"), st.permutations(range(3)).flatmap(
            lambda order: st.integers(2, 3).map(lambda k: order[:k])), st.integers(1, 3)),
    ), min_size=1, max_size=25))
    return limits, ops


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=programs())
def test_decisions_and_figures_match_the_memory_limiters(redis_url: str, prefix: str, program: Any) -> None:
    """Random all-or-nothing decisions (2 or 3 algorithms, any order, 1-3 permits) and clock steps: the one-script
    Redis decision answers as the in-memory limiters do (who rejects, the largest wait) and leaves the same
    RateLimit figures on every limit."""
    limits, ops = program
    clock = FakeClock()
    run = os.urandom(4).hex()
    remote = [limiter(redis_url, prefix, f"p{run}-{a}", a, n, clock) for a, n in zip(ALGORITHMS, limits, strict=True)]
    local = [RateLimiter(f"p{run}-{a}", config(a, n), clock=clock) for a, n in zip(ALGORITHMS, limits, strict=True)]
    for op in ops:
        if op[0] == "advance":
            clock.advance(op[1] / 1000)
            continue
        _, order, permits = op
        permits = min(permits, *(limits[i] for i in order))  # (more than a limit allows: a ValueError, both)
        got = acquire_all([remote[i] for i in order], permits=permits)
        want = acquire_all([local[i] for i in order], permits=permits)
        assert (got is None) == (want is None), (op, got, want)
        if got is not None and want is not None:
            assert (remote.index(got[0]), got[1]) == (local.index(want[0]), want[1]), op
        assert [rl.backend.quota() for rl in remote] == [rl.backend.quota() for rl in local], op  # type: ignore[attr-defined]


@pytest.mark.parametrize("clocked", [False, True], ids=["server-time", "caller-clock"])
def test_a_group_of_over_1000_limits_decides_like_a_small_one(redis_url: str, prefix: str, clocked: bool) -> None:
    """mixed.lua copies a group of more than 1 000 limits element by element (unpack's C-stack bound), a
    smaller one with one constructor: both place the deadline slot and a caller's clock where its script reads
    them. 1 001 GCRA limits beside a cycle and a sliding-window limit: granted, then refused by the cycle
    limit with every other limit given back."""
    clock: Any = FakeClock() if clocked else SYSTEM_CLOCK
    many = [limiter(redis_url, prefix, f"big-g{i}", "gcra", 2, clock) for i in range(1001)]
    cycle = limiter(redis_url, prefix, "big-c", "cycle", 1, clock)
    sliding = limiter(redis_url, prefix, "big-s", "sliding_window", 2, clock)
    everything = [cycle, *many, sliding]
    for rl in everything:
        rl.reset()
    assert acquire_all(everything) is None
    assert remaining([cycle, many[0], many[-1], sliding]) == [0, 1, 1, 1]
    refused = acquire_all(everything)
    assert refused is not None and refused[0] is cycle
    assert remaining([cycle, many[0], many[500], many[-1], sliding]) == [0, 1, 1, 1, 1]
