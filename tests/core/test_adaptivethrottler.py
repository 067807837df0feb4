"""Client-side adaptive throttling (Google SRE): reject locally with max(0, (requests - k*accepts)/(requests+1))."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading

import pytest

from django_ratelimit_r4.core.adaptivethrottler import AdaptiveThrottler, AdaptiveThrottlerConfig
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import CallNotPermitted, CallThrottled, ConfigurationError

S = 1_000_000_000


class Overloaded(Exception):
    """The backend refused the call (it is over capacity)."""


class Backend:
    """Accepts at most ``capacity`` calls per fake second and refuses the rest with :class:`Overloaded`."""

    def __init__(self, clock: FakeClock, capacity: int) -> None:
        self.clock = clock
        self.capacity = capacity
        self.received = 0
        self.second = -1
        self.used = 0

    def __call__(self) -> str:
        self.received += 1
        second = self.clock.now_ns() // S
        if second != self.second:
            self.second, self.used = second, 0
        if self.used >= self.capacity:
            raise Overloaded
        self.used += 1
        return "ok"


class Draws:
    """A scripted random source: ``random()`` returns the given values in order."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def drive(throttler: AdaptiveThrottler | None, backend: Backend, clock: FakeClock, rate: int, seconds: int) -> dict[str, int]:
    """Offer ``rate`` calls per fake second for ``seconds``; count what happened."""
    out = {"sent": 0, "ok": 0, "throttled": 0}
    for _ in range(rate * seconds):
        before = backend.received
        try:
            if throttler is None:
                backend()
            else:
                throttler.call(backend)
            out["ok"] += 1
        except CallThrottled:
            out["throttled"] += 1
        except Overloaded:
            pass
        out["sent"] += backend.received - before
        clock.advance(1 / rate)
    return out


def test_defaults_are_the_books() -> None:
    cfg = AdaptiveThrottlerConfig()
    assert (cfg.k, cfg.window) == (2.0, 120 * S)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"k": 0.5}, "k"), ({"k": "2"}, "k"), ({"window": "500ms"}, "window"), ({"window": "2h"}, "window"),
     ({"window": 120}, "window"), ({"reject_exceptions": ["no.such.Error"]}, "reject_exceptions"),
     ({"reject_on_result": 3}, "reject_on_result")],
)
def test_invalid_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        AdaptiveThrottlerConfig(**kwargs)
    assert [e.field for e in info.value.errors] == [field]


def test_the_probability_is_the_books_formula() -> None:
    """10 requests, 3 accepts, k=2: p = (10 - 6) / 11; a draw below p rejects, one above admits."""
    clock = FakeClock()
    throttler = AdaptiveThrottler("t", clock=clock, random=Draws(0.3636, 0.9))  # type: ignore[arg-type]
    for outcome in ["ok"] * 3 + [Overloaded()] * 7:
        throttler.on_accepted() if outcome == "ok" else throttler.on_rejected()
    # on_* alone do not count requests: count them as try_acquire would, while p is 0 (3 accepts, 0 requests)
    throttler._requests[throttler._advance()] += 10
    throttler._total_requests += 10
    assert throttler.metrics.rejection_probability == pytest.approx(4 / 11)
    with pytest.raises(CallThrottled) as info:
        throttler.call(lambda: "never called")
    assert info.value.probability == pytest.approx(4 / 11)
    assert isinstance(info.value, CallNotPermitted) and info.value.name == "t"
    assert "rejected the call locally" in str(info.value)
    # The throttled call counted as a request: 11 requests, 3 accepts -> (11 - 6) / 12.
    assert throttler.metrics.rejection_probability == pytest.approx(5 / 12)
    assert throttler.call(lambda: "sent") == "sent"
    assert throttler.metrics.number_of_throttled_calls == 1


def test_a_healthy_backend_is_never_throttled() -> None:
    clock = FakeClock()
    throttler = AdaptiveThrottler("t", clock=clock, random=random.Random(1))
    out = drive(throttler, Backend(clock, capacity=1000), clock, rate=100, seconds=300)
    assert out["throttled"] == 0 and out["sent"] == out["ok"] == 30_000
    assert throttler.metrics.rejection_probability == 0


def test_an_overloaded_backend_receives_about_k_times_what_it_accepts() -> None:
    """Capacity 10/s, 100 calls/s offered: without the throttle the backend gets 100/s; with k=2, about 20/s."""
    clock = FakeClock()
    unthrottled = drive(None, Backend(clock, capacity=10), clock, rate=100, seconds=180)
    assert unthrottled["sent"] / 180 == 100

    throttler = AdaptiveThrottler("t", AdaptiveThrottlerConfig(k=2), clock=clock, random=random.Random(7))
    backend = Backend(clock, capacity=10)
    drive(throttler, backend, clock, rate=100, seconds=120)  # the first window fills
    steady = drive(throttler, backend, clock, rate=100, seconds=120)
    sent_per_s = steady["sent"] / 120
    assert 17 <= sent_per_s <= 23, sent_per_s
    assert steady["ok"] / 120 == pytest.approx(10, abs=0.5)  # the backend still serves its capacity


def test_a_lower_k_throttles_harder() -> None:
    clock = FakeClock()
    sent = {}
    for k in (1.1, 2.0, 4.0):
        throttler = AdaptiveThrottler("t", AdaptiveThrottlerConfig(k=k), clock=clock, random=random.Random(3))
        backend = Backend(clock, capacity=10)
        drive(throttler, backend, clock, rate=100, seconds=120)
        sent[k] = drive(throttler, backend, clock, rate=100, seconds=60)["sent"] / 60
    assert sent[1.1] < sent[2.0] < sent[4.0]


@pytest.mark.parametrize(("capacity", "windows"), [(0, 5), (5, 2)])
def test_after_the_backend_recovers_throttling_stops_within_a_few_windows(capacity: int, windows: int) -> None:
    """Locally rejected calls count as requests, so p falls about as p -> 2p - 1 per window once the backend
    accepts everything: after a total outage (p near 1) that takes ~4 windows, after a partial overload ~1."""
    clock = FakeClock()
    throttler = AdaptiveThrottler("t", AdaptiveThrottlerConfig(window="10s"), clock=clock, random=random.Random(5))
    drive(throttler, Backend(clock, capacity=capacity), clock, rate=100, seconds=30)
    assert throttler.metrics.rejection_probability > (0.99 if capacity == 0 else 0.5)
    healthy = Backend(clock, capacity=1000)
    throttled = [drive(throttler, healthy, clock, rate=100, seconds=10)["throttled"] for _ in range(windows + 3)]
    assert throttled == sorted(throttled, reverse=True) and throttled[0] > 0, throttled
    assert throttled[windows:] == [0, 0, 0], throttled
    assert throttler.metrics.rejection_probability == 0


def test_which_outcomes_are_rejections() -> None:
    clock = FakeClock()
    cfg = AdaptiveThrottlerConfig(reject_exceptions=[Overloaded], reject_on_result=lambda r: r == 503)
    throttler = AdaptiveThrottler("t", cfg, clock=clock, random=random.Random(0))
    with pytest.raises(KeyError):  # the backend answered: an application error is an accept
        throttler.call(lambda: {}["missing"])
    assert throttler.call(lambda: 503) == 503
    with pytest.raises(Overloaded):
        throttler.call(Backend(clock, capacity=0))
    m = throttler.metrics
    assert (m.number_of_accepted_calls, m.number_of_rejected_calls, m.requests, m.accepts) == (1, 2, 3, 1)


def test_a_predicate_alone_limits_rejections_to_what_it_accepts() -> None:
    clock = FakeClock()
    cfg = AdaptiveThrottlerConfig(reject_on_exception=lambda e: isinstance(e, Overloaded))
    throttler = AdaptiveThrottler("t", cfg, clock=clock)
    with pytest.raises(ValueError):
        throttler.call(lambda: int("x"))
    assert throttler.metrics.number_of_accepted_calls == 1


def test_async_calls_share_the_window() -> None:
    clock = FakeClock()
    throttler = AdaptiveThrottler("t", clock=clock, random=random.Random(7))
    backend = Backend(clock, capacity=10)

    async def call() -> str:
        return backend()

    async def main() -> int:
        throttled = 0
        for _ in range(100 * 100):  # shorter than the 2-minute window: its counts equal the totals
            try:
                await throttler.acall(call)
            except CallThrottled:
                throttled += 1
            except Overloaded:
                pass
            clock.advance(0.01)
        return throttled

    throttled = asyncio.run(main())
    assert throttled > 100 * 100 * 0.5
    assert throttler.metrics.requests == throttler.metrics.number_of_accepted_calls + throttler.metrics.number_of_rejected_calls + throttled


def test_cancellation_counts_neither_accept_nor_rejection() -> None:
    clock = FakeClock()
    throttler = AdaptiveThrottler("t", clock=clock)

    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(throttler.acall(cancelled))
    m = throttler.metrics
    assert (m.requests, m.accepts, m.number_of_rejected_calls) == (1, 0, 0)


def test_threads_keep_the_counts_exact() -> None:
    for _ in range(10):
        clock = FakeClock()
        throttler = AdaptiveThrottler("t", clock=clock, random=random.Random(11))
        barrier = threading.Barrier(8)

        def work(i: int, throttler: AdaptiveThrottler, barrier: threading.Barrier) -> None:
            barrier.wait()
            for j in range(200):
                with contextlib.suppress(CallThrottled, Overloaded):
                    throttler.call(lambda j=j: j % 3 and (_ for _ in ()).throw(Overloaded()))

        threads = [threading.Thread(target=work, args=(i, throttler, barrier)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        m = throttler.metrics
        assert m.requests == 1600
        assert m.number_of_accepted_calls + m.number_of_rejected_calls + m.number_of_throttled_calls == 1600
        assert m.accepts == m.number_of_accepted_calls


def test_try_acquire_for_code_that_calls_the_backend_itself() -> None:
    clock = FakeClock()
    throttler = AdaptiveThrottler("t", clock=clock, random=Draws(0.0))  # type: ignore[arg-type]
    assert throttler.try_acquire()
    throttler.on_rejected()
    assert not throttler.try_acquire()  # p = (1 - 0) / 2 and the draw is 0.0
    assert throttler.metrics.number_of_throttled_calls == 1


def test_reset_and_set_clock() -> None:
    clock = FakeClock()
    throttler = AdaptiveThrottler("t", clock=clock)
    throttler.try_acquire()
    throttler.on_rejected()
    throttler.reset()
    assert throttler.metrics.requests == 0 and throttler.metrics.number_of_rejected_calls == 0
    throttler.try_acquire()
    throttler.set_clock(FakeClock(start_ns=7 * S))
    assert throttler.metrics.requests == 0
