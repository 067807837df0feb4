"""Property tests: the limiter against a tiny, straightforward model of Resilience4j's arithmetic.

The model is written from the reference text, independently of ``backends.base.decide`` and of the inlined
memory backend: Java's truncating division is done with ``Fraction`` and ``int()``.
"""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.backends.base import decide
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.durations import Nanos
from django_ratelimit_r4.core.exceptions import RequestNotPermitted
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig, most_grantable

SETTINGS = settings(max_examples=150, deadline=None)


def java_div_ceil(x: int, y: int) -> int:
    return int(Fraction(x + y - 1, y))  # int() truncates toward zero, like Java's long division


class Model:
    """AtomicRateLimiter's state machine, as plainly as possible."""

    def __init__(self, limit: int, period: int, timeout: int, start: int) -> None:
        self.limit, self.period, self.timeout, self.start = limit, period, timeout, start
        self.cycle, self.permissions = 0, limit

    def next_state(self, now_abs: int, permits: int, timeout: int) -> tuple[int, int, int, bool]:
        now = now_abs - self.start
        current = now // self.period
        permissions = self.permissions
        if current != self.cycle:
            permissions = min(permissions + (current - self.cycle) * self.limit, self.limit)
        if permissions >= permits:
            wait = 0
        else:
            wait = ((current + 1) * self.period - now) + java_div_ceil(
                permits - (permissions + self.limit), self.limit
            ) * self.period
        reserved = timeout >= wait
        if reserved:
            permissions -= permits
        return current, permissions, wait, reserved

    def take(self, now_abs: int, permits: int) -> tuple[int, bool]:
        self.cycle, self.permissions, wait, reserved = self.next_state(now_abs, permits, self.timeout)
        return wait, reserved

    def peek(self, now_abs: int) -> tuple[int, int, int]:
        cycle, permissions, wait, _ = self.next_state(now_abs, 1, -1)
        return cycle, permissions, wait

    def drain(self, now_abs: int) -> int:
        self.cycle, self.permissions, _, _ = self.next_state(now_abs, 1, -1)
        drained = max(self.permissions, 0)
        self.permissions -= drained
        return drained


periods = st.sampled_from([1, 3, 1_000, 1_000_000_000])
operations = st.lists(
    st.one_of(
        st.tuples(st.just("advance"), st.integers(0, 3)),  # multiples of the period, see below
        st.tuples(st.just("advance_raw"), st.integers(0, 2_500_000_000)),
        st.tuples(st.just("acquire"), st.integers(1, 12)),
        st.tuples(st.just("reserve"), st.integers(1, 12)),
        st.tuples(st.just("or_raise"), st.integers(1, 12)),
        st.tuples(st.just("drain"), st.just(0)),
    ),
    max_size=60,
)


@SETTINGS
@given(
    limit=st.integers(1, 5),
    period=periods,
    timeout_periods=st.sampled_from([0, 0, 1, 3]),
    start=st.integers(0, 10**13),
    ops=operations,
)
def test_limiter_matches_the_model(
    limit: int, period: int, timeout_periods: int, start: int, ops: list[tuple[str, int]]
) -> None:
    timeout = timeout_periods * period
    clock = FakeClock(start_ns=start)
    config = RateLimiterConfig(
        limit_for_period=limit, limit_refresh_period=Nanos(period), timeout_duration=Nanos(timeout)
    )
    limiter = RateLimiter("prop", config, clock=clock)
    model = Model(limit, period, timeout, start)
    granted_in_cycle: dict[int, int] = defaultdict(int)
    end_permissions: dict[int, int] = {}
    usage: list[tuple[int, int]] = []  # (cycle in which the permits may be used, permits)

    for op, arg in ops:
        now = clock.now_ns()
        if op == "advance":
            clock.advance_ns(arg * period)
        elif op == "advance_raw":
            clock.advance_ns(arg % (4 * period + 1))
        elif op in ("acquire", "reserve", "or_raise"):
            wait, reserved = model.take(now, arg)
            if not reserved and arg > most_grantable(config, timeout):
                # No state could ever grant this many: a clear error instead of a rejection whose wait lies.
                call = {"acquire": limiter.acquire_permission, "reserve": limiter.reserve_permission}
                with pytest.raises(ValueError, match="can never grant"):
                    call.get(op, limiter.acquire_or_raise)(arg)
            elif op == "acquire":
                assert limiter.acquire_permission(arg) is reserved
                assert clock.now_ns() - now == (wait if reserved else 0)
            elif op == "or_raise":
                try:
                    limiter.acquire_or_raise(arg)
                except RequestNotPermitted as exc:
                    assert not reserved and exc.wait_ns == wait
                else:
                    assert reserved and clock.now_ns() - now == wait
            else:
                assert limiter.reserve_permission(arg) == (wait if reserved else -1)
            if reserved:
                granted_in_cycle[model.cycle] += arg
                usage.append(((now + wait - start) // period, arg))
            end_permissions[model.cycle] = model.permissions
        else:
            assert limiter.drain_permissions() == model.drain(now)
            end_permissions[model.cycle] = model.permissions
        cycle, available, wait = model.peek(clock.now_ns())
        assert limiter.metrics.available_permissions == available
        assert limiter.metrics.nanos_to_wait == wait
        assert limiter.metrics.cycle == cycle

    # Debt rule: within a cycle, permits granted + what is left at its end never exceed the limit.
    for cycle, granted in granted_in_cycle.items():
        assert granted + end_permissions[cycle] <= limit
        if timeout == 0:
            assert granted <= limit  # without reservations, a cycle never grants more than the limit
    # Supply rule: permits usable by the end of cycle c never exceed (c + 1) * limit.
    for horizon in {c for c, _ in usage}:
        assert sum(k for c, k in usage if c <= horizon) <= (horizon + 1) * limit
    assert limiter.metrics.successful_calls == len(usage)
    assert limiter.metrics.failed_calls == sum(
        1 for op, _ in ops if op in ("acquire", "reserve", "or_raise")
    ) - len(usage)


@SETTINGS
@given(
    cycle=st.integers(0, 50),
    permissions=st.integers(-40, 10),
    permits=st.integers(1, 30),
    timeout=st.integers(-1, 40),
    elapsed=st.integers(0, 40),
    limit=st.integers(1, 10),
    period=st.integers(1, 7),
)
def test_pure_decide_matches_the_model(
    cycle: int, permissions: int, permits: int, timeout: int, elapsed: int, limit: int, period: int
) -> None:
    permissions = min(permissions, limit)
    model = Model(limit, period, timeout, start=0)
    model.cycle, model.permissions = cycle, permissions
    now = cycle * period + elapsed  # never before the stored cycle: a monotonic clock
    assert decide(cycle, permissions, permits, timeout, now, period, limit) == model.next_state(
        now, permits, timeout
    )


def _outcome(call: object, permits: int) -> object:
    """The call's result, or "never" for a request no state could grant (a ValueError)."""
    try:
        return call(permits)  # type: ignore[operator]
    except ValueError:
        return "never"


@SETTINGS
@given(limit=st.integers(1, 5), period=periods, ops=operations)
def test_reading_metrics_never_changes_decisions(limit: int, period: int, ops: list[tuple[str, int]]) -> None:
    config = RateLimiterConfig(
        limit_for_period=limit, limit_refresh_period=Nanos(period), timeout_duration=Nanos(period)
    )
    a = RateLimiter("a", config, clock=FakeClock())
    b = RateLimiter("b", config, clock=FakeClock())
    for op, arg in ops:
        _ = b.metrics.available_permissions, b.metrics.nanos_to_wait, b.metrics.cycle
        if op.startswith("advance"):
            a.clock.advance_ns(arg % (3 * period + 1))
            b.clock.advance_ns(arg % (3 * period + 1))
        elif op == "acquire":
            assert _outcome(a.acquire_permission, arg) == _outcome(b.acquire_permission, arg)
        elif op == "reserve":
            assert _outcome(a.reserve_permission, arg) == _outcome(b.reserve_permission, arg)
        else:
            assert a.drain_permissions() == b.drain_permissions()
        assert a.clock.now_ns() - b.clock.now_ns() == 0
