"""Property test: the COUNT_BASED breaker against a small, obviously-correct reference model."""

from __future__ import annotations

from collections import deque

from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_ratelimit_r4.core.circuitbreaker import CircuitBreaker, CircuitBreakerConfig, State
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import CallNotPermitted

MS = 1_000_000
SLOW_MS = 10
WAIT_MS = 1_000


class Model:
    """Resilience4j's COUNT_BASED rules, written as plainly as possible (times in ms)."""

    def __init__(self, size: int, minimum: int, fthr: float, sthr: float, permitted: int) -> None:
        self.size, self.minimum, self.fthr, self.sthr, self.permitted = size, minimum, fthr, sthr, permitted
        self.now = 0
        self._closed()

    def _closed(self) -> None:
        self.state = State.CLOSED
        self.window: deque[tuple[bool, bool]] = deque(maxlen=self.size)
        self.min_calls = min(self.minimum, self.size)

    def _open(self) -> None:
        self.state = State.OPEN  # keeps the window it came from
        self.deadline = self.now + WAIT_MS

    def _half_open(self) -> None:
        self.state = State.HALF_OPEN
        self.window = deque(maxlen=self.permitted)
        self.min_calls = min(self.minimum, self.permitted)
        self.permits = self.permitted

    def acquire(self) -> bool:
        if self.state is State.OPEN:
            if self.now <= self.deadline:
                return False
            self._half_open()
        if self.state is State.HALF_OPEN:
            if self.permits == 0:
                return False
            self.permits -= 1
        return True

    def rates(self) -> tuple[float, float]:
        n = len(self.window)
        if n == 0 or n < self.min_calls:
            return -1.0, -1.0
        return (
            sum(1 for failed, _ in self.window if failed) * 100.0 / n,
            sum(1 for _, slow in self.window if slow) * 100.0 / n,
        )

    def record(self, failed: bool, duration_ms: int) -> None:
        self.window.append((failed, duration_ms > SLOW_MS))
        if self.state is State.OPEN:
            return
        fr, sr = self.rates()
        if fr < 0:
            return
        exceeded = fr >= self.fthr or sr >= self.sthr
        if self.state is State.CLOSED and exceeded:
            self._open()
        elif self.state is State.HALF_OPEN:
            if exceeded:
                self._open()
            else:
                self._closed()


# Every op is (kind, failed, amount in ms).
op = st.one_of(
    st.tuples(st.just("call"), st.booleans(), st.sampled_from([0, 1, SLOW_MS, SLOW_MS + 1, 2 * SLOW_MS])),
    st.tuples(
        st.just("advance"),
        st.just(False),
        # Exact deadline hits matter (OPEN -> HALF_OPEN only strictly after), so offer them often.
        st.one_of(st.sampled_from([0, 1, WAIT_MS - 1, WAIT_MS, WAIT_MS + 1]), st.integers(0, 2 * WAIT_MS)),
    ),
    st.tuples(st.just("acquire"), st.just(False), st.just(0)),  # a permit whose result never comes
)


@settings(max_examples=250, deadline=None)
@given(
    size=st.integers(1, 8),
    minimum=st.integers(1, 10),
    fthr=st.sampled_from([25.0, 50.0, 75.0, 100.0]),
    sthr=st.sampled_from([50.0, 100.0]),
    permitted=st.integers(1, 4),
    ops=st.lists(op, min_size=30, max_size=150),
)
# Exactly at the deadline (still OPEN), then 1 ms later (HALF_OPEN): pinned, not left to chance.
@example(
    size=1,
    minimum=1,
    fthr=50.0,
    sthr=100.0,
    permitted=2,
    ops=[
        ("call", True, 0),
        ("advance", False, WAIT_MS),
        ("call", False, 0),
        ("advance", False, 1),
        ("call", False, 0),
    ],
)
def test_breaker_matches_the_reference_model(
    size: int, minimum: int, fthr: float, sthr: float, permitted: int, ops: list[tuple[str, bool, int]]
) -> None:
    clock = FakeClock()
    cb = CircuitBreaker(
        "model",
        CircuitBreakerConfig(
            sliding_window_size=size,
            minimum_number_of_calls=minimum,
            failure_rate_threshold=fthr,
            slow_call_rate_threshold=sthr,
            slow_call_duration_threshold=f"{SLOW_MS}ms",
            wait_duration_in_open_state=f"{WAIT_MS}ms",
            permitted_number_of_calls_in_half_open_state=permitted,
        ),
        clock=clock,
    )
    model = Model(size, minimum, fthr, sthr, permitted)

    for kind, flag, amount in ops:
        if kind == "advance":
            clock.advance_ns(amount * MS)
            model.now += amount
        elif kind == "acquire":
            assert cb.try_acquire_permission() == model.acquire()
        else:
            expected_permitted = model.acquire()

            def protected(failed: bool = flag, ms: int = amount) -> str:
                clock.advance_ns(ms * MS)
                if failed:
                    raise ValueError("down")
                return "ok"

            try:
                cb.call(protected)
                outcome = "ok"
            except CallNotPermitted:
                outcome = "rejected"
            except ValueError:
                outcome = "failed"
            if expected_permitted:
                model.now += amount
                model.record(flag, amount)
                assert outcome == ("failed" if flag else "ok")
            else:
                assert outcome == "rejected"
        assert cb.state is model.state
        fr, sr = model.rates()
        assert cb.metrics.failure_rate == fr
        assert cb.metrics.slow_call_rate == sr
        assert cb.metrics.number_of_buffered_calls == len(model.window)
        if model.state is State.OPEN:
            assert cb.remaining_open_ns() == max(0, model.deadline - model.now) * MS
