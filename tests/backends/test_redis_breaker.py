"""Cluster-wide circuit breakers (issue 11): transitions and half-open trials shared through Redis.

Against a real Redis (db 15, a unique prefix per test). Two breaker instances in one process stand in for two
workers (each has its own token, listener connection and sender); the multi-process tests fork real
processes. Checked: a transition by failures, a manual one and the end of the open wait reach the other
worker; two workers opening at once make one shared transition; CLOSED makes no round trip; half-open admits
exactly N trials across 4 processes; a late worker starts OPEN with the remaining time (503 + Retry-After
through the decorator); Redis down -> local breaker, degraded in status and metrics, resync after; the async
path never blocks the loop; forked children follow.

Waits are event-driven or hang guards (generous deadlines polled); no wall-clock timing is asserted here:
propagation delays are measured by benchmarks/bench_breaker_propagation.py.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_ratelimit_r4 import registry
from django_ratelimit_r4.backends.redis_breaker import RedisCircuitBreaker
from django_ratelimit_r4.core.circuitbreaker import CircuitBreakerConfig, State
from django_ratelimit_r4.core.exceptions import CallNotPermitted
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)
from tests.noblock import forbid_blocking

redis = pytest.importorskip("redis")

HANG_GUARD_S = 20.0
ROOT = Path(__file__).resolve().parents[2]


def config(**kw: Any) -> CircuitBreakerConfig:
    base: dict[str, Any] = {
        "sliding_window_size": 4,
        "minimum_number_of_calls": 4,
        "wait_duration_in_open_state": "60s",
        "permitted_number_of_calls_in_half_open_state": 3,
    }
    base.update(kw)
    return CircuitBreakerConfig(**base)


@pytest.fixture
def made() -> Iterator[Callable[..., RedisCircuitBreaker]]:
    """Build breakers (workers) on the test's prefix; their threads stop afterwards."""
    built: list[RedisCircuitBreaker] = []

    def make(url: str, prefix: str, name: str = "partner", **kw: Any) -> RedisCircuitBreaker:
        b = RedisCircuitBreaker(name, kw.pop("cfg", None) or config(**kw), url=url, prefix=prefix)
        built.append(b)
        return b

    yield make
    for b in built:
        b.close()


def wait_until(
    predicate: Callable[[], bool], what: str, timeout: float = HANG_GUARD_S, detail: Callable[[], str] = str
) -> None:
    """A hang guard: poll ``predicate`` until true; fail (never a timing assertion) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"hang guard: {what} not seen within {timeout}s {detail()}"
        time.sleep(0.002)


def settled(*workers: RedisCircuitBreaker) -> None:
    """Wait until each worker's sender has nothing queued or in flight: every transition it made locally has
    been written to Redis (or refused by the compare-and-set) and the reply taken in (its epoch).

    A transition made by failures is sent by the worker's sender thread: another worker may hear it (pub/sub,
    from inside the script) before the sender has read the script's reply, so the maker's epoch lags for that
    moment. The outbox is read first: items leave it only under the send lock, which is held until their reply
    is taken in."""
    wait_until(
        lambda: all(not w._outbox and not w._send_lock.locked() for w in workers),
        "every local transition written to Redis",
        detail=lambda: repr(workers),
    )


def fail(b: RedisCircuitBreaker, n: int = 4) -> None:
    def boom() -> None:
        raise ConnectionError("partner down")

    for _ in range(n):
        with pytest.raises((ConnectionError, CallNotPermitted)):
            b.call(boom)


def stored(url: str, prefix: str, name: str = "partner") -> dict[str, int]:
    client = redis.Redis.from_url(url)
    try:
        raw = client.hgetall(f"{prefix}:cb:{{{name}}}:state")
    finally:
        client.close()
    return {k.decode(): int(v) for k, v in raw.items()}


def trials(url: str, prefix: str, name: str = "partner") -> int:
    """Half-open trials in flight cluster-wide (the trials set in Redis)."""
    client = redis.Redis.from_url(url)
    try:
        return int(client.zcard(f"{prefix}:cb:{{{name}}}:trials"))
    finally:
        client.close()


def transitions_seen(b: RedisCircuitBreaker) -> list[tuple[State, State]]:
    seen: list[tuple[State, State]] = []
    b.events.on_state_transition(lambda e: seen.append((e.from_state, e.to_state)))
    return seen


# ----------------------------------------------------------------------------------- two workers, one process


def test_failures_on_one_worker_open_the_breaker_on_the_other(redis_url: str, prefix: str, made: Any) -> None:
    a, b = made(redis_url, prefix), made(redis_url, prefix)
    assert a.wait_listening(HANG_GUARD_S) and b.wait_listening(HANG_GUARD_S)
    assert a.state is State.CLOSED and b.state is State.CLOSED
    heard = threading.Event()
    b.events.on_state_transition(lambda e: heard.set())
    fail(a)
    assert a.state is State.OPEN
    assert heard.wait(HANG_GUARD_S)
    assert b.state is State.OPEN
    assert 55e9 < b.remaining_open_ns() <= 60e9  # the remaining open time travels with the transition
    with pytest.raises(CallNotPermitted) as rejected:
        b.call(lambda: "never")
    assert rejected.value.wait_ns > 55e9
    assert stored(redis_url, prefix)["s"] == State.OPEN.value
    settled(a)  # b heard the transition from inside a's script, maybe before a's sender read its reply
    assert a.epoch == b.epoch == 1
    other = made(redis_url, prefix, name="other")
    assert other.state is State.CLOSED  # another name has its own state


def test_closed_decides_locally_with_no_round_trip(redis_url: str, prefix: str, made: Any, monkeypatch: Any) -> None:
    a = made(redis_url, prefix)
    assert a.state is State.CLOSED
    calls: list[str] = []
    real = a._conn.run_script

    def counting(*args: Any, **kw: Any) -> Any:
        calls.append(args[3][2])  # [state key, trials key, op, ...]
        return real(*args, **kw)

    monkeypatch.setattr(a._conn, "run_script", counting)
    for _ in range(200):
        assert a.call(lambda: "ok") == "ok"
    fail(a, 1)  # a failure under the minimum: still local
    assert calls == []
    with pytest.raises(CallNotPermitted):
        a.transition_to_forced_open_state()  # one round trip (a manual transition)
        a.call(lambda: "never")  # FORCED_OPEN rejects locally
    assert calls == ["set"]


def _open_at_once(a: RedisCircuitBreaker, b: RedisCircuitBreaker) -> None:
    """Both workers one failure short of the threshold, then their last failures released by a barrier."""
    fail(a, 3)
    fail(b, 3)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def last(w: RedisCircuitBreaker) -> None:
        try:
            barrier.wait(HANG_GUARD_S)
            fail(w, 1)
        except BaseException as exc:  # re-raised below: a thread's failure would otherwise be lost
            errors.append(exc)

    threads = [threading.Thread(target=last, args=(w,)) for w in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD_S)
    assert not any(t.is_alive() for t in threads), f"hang guard: the last failures not made within {HANG_GUARD_S}s"
    if errors:
        raise errors[0]


def test_two_workers_opening_at_once_make_one_transition(redis_url: str, prefix: str, made: Any) -> None:
    """20 rounds: both workers cross the threshold at once (a barrier); Redis records one transition per round."""
    for round_ in range(20):
        p = f"{prefix}:{round_}"
        a, b = made(redis_url, p), made(redis_url, p)
        assert a.state is State.CLOSED and b.state is State.CLOSED
        _open_at_once(a, b)
        # Each worker opened by itself (its transition sent by its sender thread, after the join) or heard the
        # other's first; once both senders are idle, every transition either made is in Redis or was refused.
        settled(a, b)
        assert stored(redis_url, p).get("e") == 1, f"round {round_}: not one transition: {stored(redis_url, p)}"
        assert a.epoch == b.epoch == 1, f"round {round_}: {a!r} {b!r}"
        assert a.state is State.OPEN and b.state is State.OPEN
        a.close()
        b.close()


def test_manual_transitions_propagate_both_ways(redis_url: str, prefix: str, made: Any) -> None:
    a, b = made(redis_url, prefix), made(redis_url, prefix)
    assert a.wait_listening(HANG_GUARD_S) and b.wait_listening(HANG_GUARD_S)
    seen = transitions_seen(b)
    a.transition_to_forced_open_state()
    wait_until(lambda: b.state is State.FORCED_OPEN, "FORCED_OPEN on b")
    with pytest.raises(CallNotPermitted):
        b.call(lambda: "never")
    b.transition_to_closed_state()
    wait_until(lambda: a.state is State.CLOSED, "CLOSED on a")
    a.transition_to_open_state_for("30s")
    wait_until(lambda: b.state is State.OPEN, "OPEN on b")
    assert 25e9 < b.remaining_open_ns() <= 30e9
    a.transition_to_disabled_state()
    # The state is installed before its event is published (after the lock): wait for the event itself.
    wait_until(lambda: len(seen) >= 4, "the 4th transition's event on b", detail=lambda: repr(seen))
    assert b.state is State.DISABLED
    assert seen == [
        (State.CLOSED, State.FORCED_OPEN),
        (State.FORCED_OPEN, State.CLOSED),
        (State.CLOSED, State.OPEN),
        (State.OPEN, State.DISABLED),
    ]
    b.reset()  # reset reaches every worker too
    wait_until(lambda: a.state is State.CLOSED, "reset on a")


def test_wait_epoch_is_true_once_the_transition_is_heard_and_false_before(
    redis_url: str, prefix: str, made: Any
) -> None:
    # The control plane's follower of a broadcast transition: the sender made it once, the others wait to hear it.
    a, b = made(redis_url, prefix), made(redis_url, prefix)
    assert a.wait_listening(HANG_GUARD_S) and b.wait_listening(HANG_GUARD_S)
    assert not b.wait_epoch(b.epoch + 1, 0)  # nothing was made: not heard when the (zero) timeout is up
    a.transition_to_forced_open_state()
    assert b.wait_epoch(a.epoch, HANG_GUARD_S)
    assert b.epoch == a.epoch and b.state is State.FORCED_OPEN


def test_an_epoch_is_heard_only_once_its_state_is_installed(redis_url: str, prefix: str, made: Any, monkeypatch: Any) -> None:
    """wait_epoch (the control plane's follower) returns True only when the state of that epoch is in place:
    b's listener is held inside the install of a's transition; meanwhile b has not heard that epoch."""
    a, b = made(redis_url, prefix), made(redis_url, prefix)
    assert a.wait_listening(HANG_GUARD_S) and b.wait_listening(HANG_GUARD_S)
    installing, release = threading.Event(), threading.Event()
    real = RedisCircuitBreaker._install_locked

    def held(self: RedisCircuitBreaker, *args: Any) -> None:
        if self is b:
            installing.set()
            assert release.wait(HANG_GUARD_S)
        real(self, *args)

    monkeypatch.setattr(RedisCircuitBreaker, "_install_locked", held)
    a.transition_to_forced_open_state()
    assert installing.wait(HANG_GUARD_S)
    try:
        assert not b.wait_epoch(a.epoch, 0), f"epoch heard before its state was installed: {b!r}"
    finally:
        release.set()
    assert b.wait_epoch(a.epoch, HANG_GUARD_S) and b.state is State.FORCED_OPEN


def test_the_end_of_the_open_wait_and_the_trials_decide_for_everyone(redis_url: str, prefix: str, made: Any) -> None:
    """OPEN for 1 ms: the first call after it turns the cluster HALF_OPEN; 3 trials in all (both workers),
    then their successes close the breaker everywhere."""
    a, b = made(redis_url, prefix), made(redis_url, prefix)
    assert a.state is State.CLOSED and b.state is State.CLOSED
    a.transition_to_open_state_for("1ms")
    wait_until(lambda: b.epoch == 1, "OPEN on b")
    time.sleep(0.005)  # the 1 ms open wait (server time) must pass
    a.acquire_permission()  # trial 1 (turns the cluster HALF_OPEN)
    wait_until(lambda: b.state is State.HALF_OPEN, "HALF_OPEN on b")
    assert b.try_acquire_permission() and b.try_acquire_permission()  # trials 2 and 3
    assert not a.try_acquire_permission() and not b.try_acquire_permission()  # no 4th anywhere
    assert trials(redis_url, prefix) == 3
    a.on_success(1000)
    b.on_success(1000)
    b.on_success(1000)
    wait_until(lambda: a.state is State.CLOSED and b.state is State.CLOSED, "CLOSED everywhere")
    assert stored(redis_url, prefix)["s"] == State.CLOSED.value


def test_failed_trials_reopen_with_a_longer_wait(redis_url: str, prefix: str, made: Any) -> None:
    kw = {"enable_exponential_backoff": True, "exponential_backoff_multiplier": 2.0, "wait_duration_in_open_state": "10s"}
    a, b = made(redis_url, prefix, **kw), made(redis_url, prefix, **kw)
    assert a.state is State.CLOSED and b.state is State.CLOSED
    a.transition_to_open_state()
    a.transition_to_half_open_state()
    wait_until(lambda: b.state is State.HALF_OPEN, "HALF_OPEN on b")
    fail(b, 2)
    fail(a, 1)  # the third outcome completes the trial window: 100 % failed
    wait_until(lambda: a.state is State.OPEN and b.state is State.OPEN, "OPEN everywhere")
    assert 15e9 < b.remaining_open_ns() <= 20e9  # second opening since CLOSED: 10 s x 2


def test_an_ignored_or_interrupted_trial_is_given_back(redis_url: str, prefix: str, made: Any) -> None:
    a = made(redis_url, prefix, ignore_exceptions=[KeyError], permitted_number_of_calls_in_half_open_state=1)
    assert a.state is State.CLOSED
    a.transition_to_open_state()
    a.transition_to_half_open_state()

    def ignored() -> None:
        raise KeyError("not the partner's fault")

    with pytest.raises(KeyError):
        a.call(ignored)
    wait_until(lambda: trials(redis_url, prefix) == 0, "the ignored trial given back")
    with pytest.raises(KeyboardInterrupt):
        a.call(lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    wait_until(lambda: trials(redis_url, prefix) == 0, "the interrupted trial given back")
    assert a.call(lambda: "ok") == "ok"
    wait_until(lambda: a.state is State.CLOSED, "closed by the one trial")


_TRIAL_HOLDER = textwrap.dedent(
    """
    import sys, threading
    sys.path.insert(0, {root!r})
    from django_ratelimit_r4.backends.redis_breaker import RedisCircuitBreaker
    from django_ratelimit_r4.core.circuitbreaker import CircuitBreakerConfig
    b = RedisCircuitBreaker("partner", CircuitBreakerConfig(permitted_number_of_calls_in_half_open_state=1),
                            url={url!r}, prefix={prefix!r}, trial_ttl={ttl!r})
    assert b.try_acquire_permission()  # the cluster's only trial
    print("trial", flush=True)
    threading.Event().wait()  # mid-call, forever
    """
)


def test_a_trial_of_a_killed_worker_gives_its_place_back_after_the_trial_ttl(
    redis_url: str, prefix: str, made: Any
) -> None:
    """kill -9 during a trial call: its outcome never comes, but the cluster does not stay HALF_OPEN for ever."""
    a = made(redis_url, prefix, cfg=config(permitted_number_of_calls_in_half_open_state=1))
    a.transition_to_open_state()
    a.transition_to_half_open_state()
    # The lease must outlast the child's print, the parent's read and its refused attempt: 2 s, not a 0.4 s
    # bet on the scheduler of a loaded machine (the wait after the kill is that long).
    code = _TRIAL_HOLDER.format(root=str(ROOT), url=redis_url, prefix=prefix, ttl="2s")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "trial"
        assert not a.try_acquire_permission()  # alive (or just killed, within the TTL): its trial holds
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    wait_until(a.try_acquire_permission, "the dead worker's trial place given back")
    a.on_success(1000)
    wait_until(lambda: a.state is State.CLOSED, "closed by the new trial")


def test_a_late_worker_starts_open_with_the_remaining_time(redis_url: str, prefix: str, made: Any) -> None:
    a = made(redis_url, prefix)
    a.transition_to_open_state_for("40s")
    late = made(redis_url, prefix)  # starts after the transition: reads the stored state at first use
    assert late.state is State.OPEN
    assert 35e9 < late.remaining_open_ns() <= 40e9


def test_a_late_worker_answers_503_with_the_remaining_open_time(redis_url: str, prefix: str, made: Any, client: Any) -> None:
    from django.conf import settings

    r4 = dict(settings.RATELIMIT_R4)
    r4["backends"] = {"shared": {"BACKEND": "redis", "LOCATION": redis_url, "OPTIONS": {"key_prefix": prefix}}}
    r4["circuitbreakers"] = {
        "instances": {"acquirer": {**settings.RATELIMIT_R4["circuitbreakers"]["instances"]["acquirer"], "backend": "shared"}}
    }
    other_worker = made(redis_url, prefix, name="acquirer")
    other_worker.transition_to_open_state_for("30s")
    with override_settings(RATELIMIT_R4=r4):
        try:
            breaker = registry.get_circuit_breaker("acquirer")
            assert isinstance(breaker, RedisCircuitBreaker) and breaker.backend == "shared"
            response = client.get("/breaker/")
            assert response.status_code == 503
            assert 25 <= int(response["Retry-After"]) <= 30
            from django_ratelimit_r4 import state as r4_state

            [item] = r4_state.snapshot(["circuitbreaker:acquirer"])
            snap = item["state"]
            assert snap["state"] == "OPEN" and snap["shared"]["backend"] == "shared"
            assert snap["shared"]["degraded"] is False and snap["shared"]["epoch"] == 1
        finally:
            for _, b in registry.instances("circuitbreakers"):
                b.close()


# --------------------------------------------------------------------------------------------- processes


def _follower(url: str, prefix: str, ready: Any, out: Any) -> None:
    b = RedisCircuitBreaker("partner", config(), url=url, prefix=prefix)
    seen = threading.Event()
    at: list[float] = []
    b.events.on_state_transition(lambda e: (at.append(time.time()), seen.set()))
    assert b.wait_listening(HANG_GUARD_S) and b.state is State.CLOSED
    ready.set()
    ok = seen.wait(HANG_GUARD_S)
    out.put((ok, b.state.name, at[0] if at else None, b.remaining_open_ns()))
    b.close()


def test_a_breaker_opened_by_failures_in_one_process_is_open_in_another(redis_url: str, prefix: str, made: Any) -> None:
    ctx = multiprocessing.get_context("fork")
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_follower, args=(redis_url, prefix, ready, out))
    proc.start()
    try:
        assert ready.wait(HANG_GUARD_S)
        a = made(redis_url, prefix)
        assert a.state is State.CLOSED
        fail(a, 3)
        before = time.time()
        fail(a, 1)
        ok, state, heard_at, remaining = out.get(timeout=HANG_GUARD_S)
    finally:
        proc.join(HANG_GUARD_S)
    assert ok and state == "OPEN" and remaining > 55e9
    print(f"propagation delay: {(heard_at - before) * 1000:.2f} ms")  # measured in benchmarks/, not asserted


def _manual_follower(url: str, prefix: str, ready: Any, out: Any) -> None:
    b = RedisCircuitBreaker("partner", config(), url=url, prefix=prefix)
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def on_transition(e: Any) -> None:
        seen.append((e.from_state.name, e.to_state.name))
        if len(seen) == 2:
            done.set()

    b.events.on_state_transition(on_transition)
    assert b.wait_listening(HANG_GUARD_S) and b.state is State.CLOSED
    ready.set()
    out.put((done.wait(HANG_GUARD_S), seen))
    b.close()


def test_manual_transitions_reach_another_process(redis_url: str, prefix: str, made: Any) -> None:
    ctx = multiprocessing.get_context("fork")
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_manual_follower, args=(redis_url, prefix, ready, out))
    proc.start()
    try:
        assert ready.wait(HANG_GUARD_S)
        operator = made(redis_url, prefix)
        operator.transition_to_forced_open_state()
        operator.transition_to_closed_state()
        ok, seen = out.get(timeout=HANG_GUARD_S)
    finally:
        proc.join(HANG_GUARD_S)
    assert ok and seen == [("CLOSED", "FORCED_OPEN"), ("FORCED_OPEN", "CLOSED")]
    assert proc.exitcode == 0


def _attempts(b: RedisCircuitBreaker, threads: int) -> int:
    """``threads`` threads released together each try to take a permission; how many got one."""
    start = threading.Barrier(threads)
    got: list[bool] = []

    def attempt() -> None:
        start.wait(HANG_GUARD_S)
        got.append(b.try_acquire_permission())

    ts = [threading.Thread(target=attempt) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(HANG_GUARD_S)
    return sum(got)


def _trial_worker(url: str, prefix: str, parent: RedisCircuitBreaker, threads: int, rounds: int, barrier: Any, out: Any) -> None:
    # Forked from a parent whose breaker was running: the child's copy starts its own threads at first use.
    b = parent
    granted = 0
    for round_ in range(rounds):
        barrier.wait(HANG_GUARD_S)  # the parent turned it OPEN then HALF_OPEN (epoch 3 * round + 2)
        wait_until(
            lambda r=round_: b.state is State.HALF_OPEN and b.epoch >= 3 * r + 2,
            f"HALF_OPEN in the child (round {round_})",
            detail=lambda: repr((b, b._last_error)),
        )
        got = _attempts(b, threads)
        granted += got
        out.put((round_, got))
        barrier.wait(HANG_GUARD_S)  # every process tried; the parent checks and moves on
    b.close()


def test_half_open_admits_exactly_n_trials_across_4_processes(redis_url: str, prefix: str, made: Any) -> None:
    n, procs, threads, rounds = 3, 4, 4, 8
    parent = made(redis_url, prefix, permitted_number_of_calls_in_half_open_state=n)
    assert parent.state is State.CLOSED  # running (threads, connections) before the fork
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(procs + 1), ctx.Queue()
    workers = [
        ctx.Process(target=_trial_worker, args=(redis_url, prefix, parent, threads, rounds, barrier, out))
        for _ in range(procs)
    ]
    for p in workers:
        p.start()
    try:
        for round_ in range(rounds):
            parent.transition_to_open_state()
            parent.transition_to_half_open_state()  # a fresh set of N trials, cluster-wide
            assert stored(redis_url, prefix)["e"] == 3 * round_ + 2
            barrier.wait(HANG_GUARD_S)
            barrier.wait(HANG_GUARD_S)
            per_process = [out.get(timeout=HANG_GUARD_S) for _ in workers]
            assert sum(g for _, g in per_process) == n, f"round {round_}: {per_process}"
            assert trials(redis_url, prefix) == n
            parent.transition_to_closed_state()
    finally:
        for p in workers:
            p.join(HANG_GUARD_S)
    assert all(p.exitcode == 0 for p in workers)


# ------------------------------------------------------------------------------------------------ faults


def test_redis_down_falls_back_to_a_local_breaker_and_resyncs(redis_server: Any, made: Any) -> None:
    a, b = made(redis_server.url, "r4t"), made(redis_server.url, "r4t")
    assert a.state is State.CLOSED and b.state is State.CLOSED
    redis_server.stop()
    wait_until(lambda: a.degraded and b.degraded, "both workers degraded")
    assert a.shared_health()["degraded"] and a.shared_health()["last_error"]
    fail(a)  # the local breaker still works: it opens by itself
    assert a.state is State.OPEN and b.state is State.CLOSED  # each worker on its own
    with pytest.raises(CallNotPermitted):
        a.call(lambda: "never")
    assert b.call(lambda: "ok") == "ok"
    redis_server.start()
    wait_until(lambda: not a.degraded and not b.degraded, "resync after Redis answers")
    # Redis came back empty: the worker that knew more (OPEN) told the cluster.
    wait_until(lambda: b.state is State.OPEN, "b follows a's OPEN after the resync")
    a.transition_to_closed_state()
    wait_until(lambda: b.state is State.CLOSED, "transitions shared again")


def test_the_state_a_worker_pushes_after_a_fault_is_not_dropped_by_a_cool_down(
    redis_url: str, prefix: str, made: Any, monkeypatch: Any
) -> None:
    """After a fault the listener reads the shared state again; Redis lost it (empty), so the worker pushes the
    OPEN it reached alone. The shared connection may still be in the cool-down of a fault seen by another of
    its users (another breaker's listener) when the sender takes the push: the reply the listener just read
    ends that cool-down before the push is queued, else the sender dropped it and the cluster never heard."""
    a = made(redis_url, prefix)
    assert a.wait_listening(HANG_GUARD_S)
    go = threading.Event()
    real_load, real_resync = RedisCircuitBreaker._load_with, RedisCircuitBreaker._resync_from

    def load(self: RedisCircuitBreaker, client: Any) -> list[int]:
        if self is not a:
            return real_load(self, client)
        assert go.wait(HANG_GUARD_S)
        reply = real_load(self, client)
        self._conn.down_until = time.monotonic() + 60  # another user of the connection faulted meanwhile
        return reply

    def resync(self: RedisCircuitBreaker, snapshot: list[int], force: bool = False) -> None:
        real_resync(self, snapshot, force)
        if self is a:  # the sender takes the push before the listener goes on
            deadline = time.monotonic() + HANG_GUARD_S
            while (self._outbox or self._send_lock.locked()) and time.monotonic() < deadline:
                time.sleep(0.002)

    monkeypatch.setattr(RedisCircuitBreaker, "_load_with", load)
    monkeypatch.setattr(RedisCircuitBreaker, "_resync_from", resync)
    a._fault(ConnectionError("injected"), "test")  # the listener reconnects; its load waits for go
    fail(a)  # degraded: the local breaker opens by itself, nothing is sent
    assert a.state is State.OPEN and a.degraded and stored(redis_url, prefix) == {}
    go.set()
    wait_until(lambda: not a.degraded and a._listening.is_set(), "the listener's resync")
    settled(a)
    assert stored(redis_url, prefix).get("s") == State.OPEN.value, "the resync's push was dropped"


def test_transitions_made_during_another_users_cool_down_are_sent_when_it_ends(
    redis_url: str, prefix: str, made: Any, monkeypatch: Any
) -> None:
    """The URL's connection is shared with the rate limiters of that URL: a fault one of them sees starts a
    cool-down (no call to Redis for FAULT_COOLDOWN_S). A healthy worker's breaker that opens meanwhile (or an
    operator's transition) must reach the cluster once the cool-down is over: the sender used to drop it, so
    this worker stayed OPEN alone and the others never heard. Nothing is sent during the cool-down (it is
    there so that nobody pays a connect timeout), and the sender waits for its end instead of spinning."""
    a, b = made(redis_url, prefix), made(redis_url, prefix)
    assert a.wait_listening(HANG_GUARD_S) and b.wait_listening(HANG_GUARD_S)
    sent_at: list[float] = []
    drains = [0]
    real_send, real_drain = RedisCircuitBreaker._send, RedisCircuitBreaker._drain

    def send(self: RedisCircuitBreaker, item: tuple[Any, ...], expected: int) -> None:
        if self is a:
            sent_at.append(time.monotonic())
        real_send(self, item, expected)

    def drain(self: RedisCircuitBreaker) -> Any:
        if self is a:
            drains[0] += 1
        return real_drain(self)

    monkeypatch.setattr(RedisCircuitBreaker, "_send", send)
    monkeypatch.setattr(RedisCircuitBreaker, "_drain", drain)
    cool_down = 1.0  # longer than the real 0.5 s, so that the transitions below fall inside it on a busy machine

    # 1. By failures (the sender thread sends).
    until = a._conn.down_until = time.monotonic() + cool_down  # another user of the connection faulted
    fail(a)
    assert a.state is State.OPEN and not a.degraded
    wait_until(lambda: b.state is State.OPEN, "b hears the OPEN a reached during the cool-down")
    settled(a)
    assert stored(redis_url, prefix)["s"] == State.OPEN.value
    assert sent_at and sent_at[0] >= until, "sent during the cool-down"
    assert drains[0] < 20, f"the sender spun during the cool-down ({drains[0]} drains)"

    # 2. An operator's transition (sent inline, or by the sender once the cool-down is over).
    sent_at.clear()
    until = a._conn.down_until = time.monotonic() + cool_down
    a.transition_to_closed_state()
    assert a.state is State.CLOSED
    wait_until(lambda: b.state is State.CLOSED, "b hears the operator's CLOSED made during the cool-down")
    settled(a)
    assert stored(redis_url, prefix)["s"] == State.CLOSED.value
    assert sent_at and sent_at[0] >= until, "sent during the cool-down"


def test_degraded_is_a_metric(redis_server: Any, settings: Any) -> None:
    pytest.importorskip("prometheus_client")
    from django_ratelimit_r4.contrib import prometheus

    settings.RATELIMIT_R4 = {
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": redis_server.url}},
        "circuitbreakers": {"instances": {"partner": {"backend": "shared"}}},
    }
    breaker = registry.get_circuit_breaker("partner")
    try:
        assert breaker.state is State.CLOSED

        def degraded_series() -> float:
            reading = prometheus._Reading()
            prometheus._read(reading)
            values = [v for spec, labels, v in reading.gauges if spec is prometheus.CB_BACKEND_DEGRADED]
            assert len(values) == 1
            return values[0]

        assert degraded_series() == 0.0
        redis_server.stop()
        wait_until(lambda: breaker.degraded, "degraded")  # type: ignore[attr-defined]
        assert degraded_series() == 1.0
        from django_ratelimit_r4 import state as r4_state
        from django_ratelimit_r4.management.commands.r4 import render_table

        text = render_table(r4_state.snapshot())
        assert "partner: cluster-wide through backend 'shared' (epoch 0); DEGRADED for " in text
        assert "this worker decides alone (local breaker); last error: listener" in text
    finally:
        breaker.close()  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------- async


async def test_async_trials_never_block_the_loop(redis_url: str, prefix: str, made: Any, monkeypatch: Any) -> None:
    a = made(redis_url, prefix, permitted_number_of_calls_in_half_open_state=2)
    other = made(redis_url, prefix, permitted_number_of_calls_in_half_open_state=2)
    await asyncio.to_thread(other.transition_to_open_state)
    await asyncio.to_thread(other.transition_to_half_open_state)

    release = asyncio.Event()

    async def ok() -> str:
        await release.wait()  # the trials stay in flight until the third call was refused
        return "ok"

    with forbid_blocking(monkeypatch) as blocking:
        first = asyncio.ensure_future(a.acall(ok))  # first use: the state read on redis.asyncio, then a trial
        second = asyncio.ensure_future(a.acall(ok))
        for _ in range(2000):
            if await asyncio.to_thread(trials, redis_url, prefix) == 2:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(CallNotPermitted):
            await a.acall(ok)  # only 2 trials in the cluster
        release.set()
        assert await first == "ok" and await second == "ok"
        for _ in range(int(HANG_GUARD_S / 0.01)):  # a hang guard: the sender thread sends the outcomes
            if a.state is State.CLOSED:
                break
            await asyncio.sleep(0.01)
        assert a.state is State.CLOSED  # the two outcomes (sent by the sender thread) closed it
        assert await a.acall(ok) == "ok"
    assert blocking == [], blocking


def test_the_documented_example_runs(redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str], made: Any) -> None:
    from tests.test_docs_examples import block, run

    source = block("docs/redis.md", "RedisCircuitBreaker(").replace(
        'url="redis://127.0.0.1:6379/15")', f"url={redis_url!r}, prefix={prefix!r})"
    )
    assert f"prefix={prefix!r}" in source
    follower = made(redis_url, prefix, name="partner-doc")
    assert follower.wait_listening(HANG_GUARD_S) and follower.state is State.CLOSED
    seen = transitions_seen(follower)
    run(source, "docs/redis.md")
    assert capsys.readouterr().out == "State.CLOSED\n"
    wait_until(lambda: len(seen) == 2, "the example's two transitions on another worker", detail=lambda: repr((seen, follower)))
    assert seen == [(State.CLOSED, State.FORCED_OPEN), (State.FORCED_OPEN, State.CLOSED)]


# ------------------------------------------------------------------------------------------- Redis Cluster


def test_on_a_3_primary_cluster(redis_cluster: Any) -> None:
    """The same breaker on a real Redis Cluster (OPTIONS cluster): its key is hash-tagged (one slot), the
    transition script's PUBLISH reaches a listener subscribed through another node, trials are cluster-wide."""
    prefix = f"r4c:{uuid.uuid4().hex[:10]}"
    opts = {"cluster": True}
    a = RedisCircuitBreaker("partner", config(), url=redis_cluster.url, prefix=prefix, connection_options=opts)
    b = RedisCircuitBreaker("partner", config(), url=redis_cluster.url, prefix=prefix, connection_options=opts)
    try:
        assert a.wait_listening(HANG_GUARD_S) and b.wait_listening(HANG_GUARD_S)
        assert a._key.startswith(f"{prefix}:cb:{{partner}}")
        fail(a)
        wait_until(lambda: b.state is State.OPEN, "OPEN on b through the cluster")
        assert 55e9 < b.remaining_open_ns() <= 60e9
        a.transition_to_half_open_state()
        wait_until(lambda: b.state is State.HALF_OPEN, "HALF_OPEN on b")
        assert [a.try_acquire_permission(), b.try_acquire_permission(), a.try_acquire_permission()] == [True] * 3
        assert not b.try_acquire_permission() and not a.try_acquire_permission()
        for w in (a, b, a):
            w.on_success(1000)
        wait_until(lambda: a.state is State.CLOSED and b.state is State.CLOSED, "CLOSED everywhere")
        late = RedisCircuitBreaker("partner", config(), url=redis_cluster.url, prefix=prefix, connection_options=opts)
        a.transition_to_forced_open_state()
        assert late.state is State.FORCED_OPEN
        late.close()
    finally:
        a.close()
        b.close()


def _threads_named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def test_a_settings_change_stops_the_threads_of_the_breakers_it_drops(redis_url: str, prefix: str) -> None:
    """The registry dropped a cluster-wide breaker on ``setting_changed`` (``override_settings``, pytest-django's
    ``settings``) without closing it: its listener and sender threads and their connections lived on, one pair
    per changed setting in a user's test suite, and a listener fault after the test deleted its keys wrote the
    shared state back (a key without TTL). Now the registry closes what it drops."""
    r4 = {
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": redis_url, "OPTIONS": {"key_prefix": prefix}}},
        "circuitbreakers": {"instances": {"dropped-on-change": {"backend": "shared"}}},
    }
    with override_settings(RATELIMIT_R4=r4):
        breaker = registry.get_circuit_breaker("dropped-on-change")
        assert breaker.try_acquire_permission()  # first use: the threads start
        wait_until(lambda: len(_threads_named("r4-breaker-dropped-on-change-")) == 2, "both threads started")
    wait_until(lambda: not _threads_named("r4-breaker-dropped-on-change-"), "the dropped breaker's threads ended")
