"""The cycle script's ops "A" and "Q" (issue 9, Redis CPU): what a request asks (one permit, no wait) sent
without the permits and timeout arguments, decided on a straight fast path that rewrites a same-cycle state in
place (SETRANGE: the expiry stays) and answers "Q" with one integer when it can. Against the machine's Redis
(db 15, a unique prefix per test).

What is checked: the ops sent; the state written byte for byte as the general path ("a"/"q", the code of the
scripts before) writes it, with the same expiry behaviour (kept within a cycle, set on a new one); every reply
shape of "Q" (one integer granted / rejected, the table for a large limit x period and for debt) read back to
the figures of decide(); server time, nanosecond and microsecond limiters; and, where this checkout's git
history has it, the script as it was before these ops deciding on the same keys as this one (a rolling
deploy).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.backends import redis as rb
from django_ratelimit_r4.backends.memory import MemoryBackend
from django_ratelimit_r4.core.clock import SYSTEM_CLOCK, FakeClock

redis = pytest.importorskip("redis")

S = 1_000_000_000
ROOT = Path(__file__).resolve().parents[2]
#: main just before the ops "A"/"Q": its cycle script only knows "a"/"q" (10 arguments).
BEFORE = "d0ae089"


def _backend(url: str, prefix: str, limit: int, period: int, clock: Any = None) -> rb.RedisBackend:
    return rb.RedisBackend(
        uuid.uuid4().hex, limit, period, clock if clock is not None else FakeClock(10**12), url=url,
        prefix=prefix, connection_options={"socket_timeout": 5.0},
    )


def _sent(backend: rb.RedisBackend, fn: Any) -> list[Any]:
    """The arguments (keys then ARGV) of the script call ``fn`` makes."""
    seen: list[list[Any]] = []
    real = rb.RedisConnection.call

    def spy(self: Any, numkeys: int, args: list[Any], *more: Any) -> Any:
        seen.append(list(args))
        return real(self, numkeys, args, *more)

    rb.RedisConnection.call = spy  # type: ignore[method-assign]
    try:
        fn()
    finally:
        rb.RedisConnection.call = real  # type: ignore[method-assign]
    assert len(seen) == 1
    return seen[0]


def test_one_permit_without_waiting_is_sent_as_A_and_Q(redis_url: str, prefix: str) -> None:
    red = _backend(redis_url, prefix, 10, S, SYSTEM_CLOCK)
    red.acquire(1, 0)  # learns the anchor and the server time
    args = _sent(red, lambda: red.acquire(1, 0))
    assert args[2] == b"A" and len(args) == 2 + 8  # op, 6 limiter arguments, deadline
    assert _sent(red, lambda: red.acquire_quota(1, 0))[2] == b"Q"
    for permits, timeout in ((2, 0), (1, S)):  # anything else: "a"/"q" with both arguments
        args = _sent(red, lambda: red.acquire(permits, timeout))  # noqa: B023
        assert args[2] == b"a" and args[9:11] == [permits, timeout] and len(args) == 2 + 10
        assert _sent(red, lambda: red.acquire_quota(permits, timeout))[2] == b"q"  # noqa: B023


@pytest.mark.parametrize(
    ("limit", "period", "shape"),
    [(100, 60 * S, int), (10**6, 3600 * S, int), (10**12, 3600 * S, list)],  # 10**6/h: in thousands of units
)
def test_Q_answers_one_integer_where_it_is_exact(redis_url: str, prefix: str, limit, period, shape) -> None:
    red = _backend(redis_url, prefix, limit, period, SYSTEM_CLOCK)
    red.acquire(1, 0)  # learns the anchor and the server time
    replies: list[Any] = []
    real = rb.RedisConnection.call

    def spy(self: Any, *args: Any) -> Any:
        replies.append(real(self, *args))
        return replies[-1]

    rb.RedisConnection.call = spy  # type: ignore[method-assign]
    try:
        wait, remaining, reset = red.acquire_quota(1, 0)
    finally:
        rb.RedisConnection.call = real  # type: ignore[method-assign]
    assert [type(r) for r in replies] == [shape]
    assert (wait, remaining) == (0, limit - 2) and 0 < reset <= period


def test_a_same_cycle_grant_rewrites_the_permissions_in_place(redis_url: str, prefix: str) -> None:
    """Byte for byte the state "cycle permissions anchor"; its expiry untouched (a sentinel TTL survives), also
    when the permissions lose a digit (11 -> 10 -> 9: SET ... KEEPTTL); a new cycle sets the expiry again."""
    clock = FakeClock(10**12)
    red = _backend(redis_url, prefix, 12, S, clock)
    raw = redis.Redis.from_url(redis_url)
    try:
        assert red.acquire(1, 0) == 0  # absent: written with an expiry
        anchor = raw.get(red.anchor_key)
        assert raw.get(red.state_key) == b"0 11 " + anchor
        for left in (10, 9, 8):
            raw.pexpire(red.state_key, 123_456_789)
            assert red.acquire(1, 0) == 0
            assert raw.get(red.state_key) == b"0 %d " % left + anchor
            assert 123_000_000 < raw.pttl(red.state_key) <= 123_456_789
        clock.advance_ns(S)  # the next cycle: refilled, written with an expiry of its own
        assert red.acquire(1, 0) == 0
        assert raw.get(red.state_key) == b"1 11 " + anchor
        assert raw.pttl(red.state_key) < 10_000_000  # the end of this cycle + the client clock's 1 h slack
    finally:
        raw.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.sampled_from([1, 2, 11, 100, 10**9]),
    period=st.sampled_from([7, S, 3600 * S, 30 * 86400 * S]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("one"), st.integers(0, 2)),  # "A", "Q", and "a" of 2 permits
            st.tuples(st.just("reserve"), st.integers(1, 3)),  # "a" with a timeout: debt
            st.tuples(st.just("advance"), st.integers(0, 5)),
        ),
        min_size=1,
        max_size=30,
    ),
)
def test_short_ops_write_what_the_general_path_writes(redis_url: str, prefix: str, limit, period, ops) -> None:
    """Two limiters in step, one sending "A"/"Q", the other forced to "a"/"q" (the general path: the code the
    scripts ran before): the same replies, the same states byte for byte, the same expiries (to the real time between the two writes)."""
    clock = FakeClock(1_700_000_000_123_456_789)
    short, general = _backend(redis_url, prefix, limit, period, clock), _backend(redis_url, prefix, limit, period, clock)
    raw = redis.Redis.from_url(redis_url)
    try:
        for op, a in ops:
            if op == "advance":
                clock.advance_ns(a * period // 3 + 1000)  # (whole µs: periods over ~10.4 days count in µs)
                continue
            got = []
            for red in (short, general):
                if red is general:
                    saved, rb._ONE_OPS = rb._ONE_OPS, {}  # type: ignore[attr-defined]
                try:
                    if op == "reserve":
                        reply: Any = red.acquire(1, a * period)
                    elif a == 2:
                        reply = red.acquire(2, 0) if limit >= 2 else red.acquire(1, 0)
                    else:
                        reply = red.acquire(1, 0) if a == 0 else red.acquire_quota(1, 0)
                finally:
                    if red is general:
                        rb._ONE_OPS = saved  # type: ignore[attr-defined]
                got.append(reply)
            assert got[0] == got[1], (op, a)
            states = [raw.get(r.state_key) for r in (short, general)]
            assert states[0] == states[1]
            ttls = [raw.pttl(r.state_key) for r in (short, general)]
            assert (ttls[0] < 0) == (ttls[1] < 0) and abs(ttls[0] - ttls[1]) <= 2000, ttls  # (real ms between)
        assert short.faults == general.faults == 0
    finally:
        raw.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.sampled_from([1, 3, 10**6, 10**12]),
    period=st.sampled_from([7, 7000, S, 3600 * S, 30 * 86400 * S]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("quota"), st.just(0)),
            st.tuples(st.just("reserve"), st.integers(1, 2)),
            st.tuples(st.just("advance"), st.integers(0, 4)),
        ),
        min_size=1,
        max_size=25,
    ),
)
def test_every_Q_reply_reads_back_to_decide(redis_url: str, prefix: str, limit, period, ops) -> None:
    """"Q"'s one integer (granted, in units or thousands of units; rejected without debt), its table (a limit x
    period too large for one exact integer: 10**12 per hour; a rejection in debt after reservations): acquire
    then quota, as in memory."""
    clock = FakeClock(2**62 + 12_345)
    memory = MemoryBackend("m", limit, period, clock)
    red = _backend(redis_url, prefix, limit, period, clock)
    for op, a in ops:
        if op == "quota":
            assert red.acquire_quota(1, 0) == (memory.acquire(1, 0), *memory.quota())
        elif op == "reserve":
            assert red.acquire(1, a * period) == memory.acquire(1, a * period)
        else:
            clock.advance_ns(a * period // 4 + 1000)
        assert red.quota() == memory.quota()
    assert red.faults == 0


@pytest.mark.parametrize("period", [S, 30 * 86400 * S])  # nanosecond and microsecond limiters
def test_server_time(redis_url: str, prefix: str, period: int) -> None:
    """On Redis TIME (the deadline checked, the base in microseconds): "Q" grants down to 0, then rejects;
    the figures are those quota() reads right after."""
    red = _backend(redis_url, prefix, 3, period, SYSTEM_CLOCK)
    assert red.acquire(1, 0) == 0  # first use: the slow path creates the anchor
    assert red._cache[0] != b""
    for left in (1, 0):
        wait, remaining, reset = red.acquire_quota(1, 0)
        assert (wait, remaining) == (0, left) and 0 < reset <= period
        assert red.quota()[0] == left and 0 < red.quota()[1] <= reset
    wait, remaining, reset = red.acquire_quota(1, 0)
    assert wait < 0 and remaining == 0 and reset == -wait and 0 < reset <= period
    assert red.acquire(1, 0) < 0 and red.faults == 0


def _old_script() -> str | None:
    try:
        return "\n".join(
            subprocess.run(
                ["git", "show", f"{BEFORE}:django_ratelimit_r4/backends/lua/{name}"],
                cwd=ROOT, capture_output=True, text=True, check=True,
            ).stdout
            for name in rb.CYCLE_FILES
        )
    except (OSError, subprocess.CalledProcessError):
        return None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.sampled_from([1, 3, 12, 10**9]),
    period=st.sampled_from([7, S, 3600 * S]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.sampled_from(["new", "old"]), st.sampled_from([0, 1, 2])),
            st.tuples(st.just("advance"), st.integers(0, 5)),
        ),
        min_size=1,
        max_size=30,
    ),
)
def test_a_rolling_deploy_old_and_new_scripts_share_the_keys(
    redis_url: str, prefix: str, limit, period, ops
) -> None:
    """The script before "A"/"Q" (from git: BEFORE) and this one decide on the same keys in turn, as processes
    of two versions do during a rolling deploy: every answer and state is decide()'s (no over-admission, no
    error). Skipped where the checkout has no history (a shallow clone)."""
    old = _old_script()
    if old is None:
        pytest.skip(f"no git history with {BEFORE} here (shallow clone?)")
    clock = FakeClock(1_700_000_000_123_456_789)
    memory = MemoryBackend("m", limit, period, clock)
    red = _backend(redis_url, prefix, limit, period, clock)
    raw = redis.Redis.from_url(redis_url)
    old_sha = raw.script_load(old)
    try:
        for op, a in ops:
            if op == "advance":
                clock.advance_ns(a * period // 3)
                continue
            timeout = a * period // 2
            if op == "new":
                assert red.acquire(1, timeout) == memory.acquire(1, timeout)
            else:  # an old process: the old script, "a" with permits and timeout, the same anchor cache
                saved, rb._ONE_OPS = rb._ONE_OPS, {}  # type: ignore[attr-defined]
                try:
                    args = red._one_args(red.state_key, b"a", 1, timeout)
                finally:
                    rb._ONE_OPS = saved  # type: ignore[attr-defined]
                reply = red._settle(raw.evalsha(old_sha, 2, *args), (red,))
                assert reply == memory.acquire(1, timeout)
            assert red.state() == memory.state()
    finally:
        raw.close()
