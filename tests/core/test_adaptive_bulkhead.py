"""Adaptive concurrency limits on the bulkhead (Netflix Gradient2Limit / AIMDLimit), on the fake clock."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from benchmarks.sim_adaptive import simulate
from django_ratelimit_r4.core.adaptivelimit import (
    AdaptiveLimitConfig,
    AIMDLimit,
    Gradient2Limit,
    VegasLimit,
    make_limit,
)
from django_ratelimit_r4.core.bulkhead import Bulkhead, BulkheadConfig
from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.exceptions import BulkheadFull, ConfigurationError

S = 1_000_000_000
MS = 1_000_000


def test_defaults_are_netflixs() -> None:
    cfg = AdaptiveLimitConfig()
    assert (cfg.algorithm, cfg.min_limit, cfg.max_limit) == ("gradient2", 20, 200)
    assert (cfg.smoothing, cfg.queue_size, cfg.long_window, cfg.rtt_tolerance) == (0.2, 4, 600, 1.5)
    assert (cfg.backoff_ratio, cfg.timeout) == (0.9, 5 * S)
    assert (cfg.windowed, cfg.window_size, cfg.min_window_time, cfg.max_window_time) == (False, 10, S, S)


@pytest.mark.parametrize(
    ("adaptive", "text"),
    [
        ({"algorithm": "bbr"}, "[\"algorithm\"] must be one of 'gradient2', 'aimd', 'vegas', 'littles_law'"),
        ({"min_limt": 5}, "unknown option(s) 'min_limt'"),
        ({"min_limit": 50, "max_limit": 40}, "[\"max_limit\"] must be >= min_limit (50)"),
        ({"backoff_ratio": 1.0}, "[\"backoff_ratio\"] must be < 1"),
        ({"timeout": 5}, "[\"timeout\"] bare number"),
        ("gradient2", "must be None or a dict"),
    ],
)
def test_invalid_adaptive_options_are_named(adaptive: object, text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BulkheadConfig(max_concurrent_calls=25, adaptive=adaptive)
    assert any(e.field == "adaptive" and text in e.message for e in info.value.errors), info.value.errors


def test_the_initial_limit_must_lie_within_min_and_max() -> None:
    with pytest.raises(ConfigurationError) as info:
        BulkheadConfig(max_concurrent_calls=2, adaptive={"min_limit": 5})
    assert [e.field for e in info.value.errors] == ["max_concurrent_calls"]
    assert "5..200" in info.value.errors[0].message


def test_aimd_steps_are_netflixs() -> None:
    limit = AIMDLimit(20, AdaptiveLimitConfig(algorithm="aimd", min_limit=5, max_limit=22, timeout="1s"))
    assert limit.update(10 * MS, inflight=10, dropped=False) == 21  # half used: +1
    assert limit.update(10 * MS, inflight=10, dropped=False) == 21  # 10 of 21: under half, unchanged
    assert limit.update(10 * MS, inflight=11, dropped=False) == 22
    assert limit.update(10 * MS, inflight=22, dropped=False) == 22  # capped at max_limit
    assert limit.update(10 * MS, inflight=5, dropped=False) == 22  # under half used: unchanged
    assert limit.update(10 * MS, inflight=22, dropped=True) == 19  # int(22 * 0.9)
    assert limit.update(2 * S, inflight=22, dropped=False) == 17  # slower than timeout: a drop
    for _ in range(30):
        limit.update(10 * MS, inflight=1, dropped=True)
    assert limit.limit == 5  # floored at min_limit


def test_gradient2_shrinks_on_queueing_and_grows_while_latency_holds() -> None:
    cfg = AdaptiveLimitConfig(min_limit=5, max_limit=100)
    limit = Gradient2Limit(50, cfg)
    for _ in range(20):
        limit.update(50 * MS, inflight=50, dropped=False)
    grown = limit.limit
    assert grown > 50  # gradient 1: + queue_size, smoothed
    limit.update(500 * MS, inflight=50, dropped=False)  # 10x the baseline: gradient clamped at 0.5
    assert limit.limit == int(grown * 0.8 + (grown * 0.5 + 4) * 0.2) or limit.limit < grown
    assert limit.update(50 * MS, inflight=1, dropped=False) == limit.limit  # app-limited: unchanged


def test_vegas_steps_are_netflixs() -> None:
    """Netflix's VegasLimit with smoothing 1: queue = limit x (1 - rtt_noload / rtt); log10(limit) is 1 below 100."""
    limit = VegasLimit(20, AdaptiveLimitConfig(algorithm="vegas", min_limit=1, max_limit=1000, smoothing=1.0))
    assert limit.update(100 * MS, inflight=20, dropped=False) == 20  # the first sample sets rtt_noload
    assert limit.update(100 * MS, inflight=20, dropped=False) == 26  # no queue: + 6 x log10
    assert limit.update(100 * MS, inflight=5, dropped=False) == 26  # under half in flight: unchanged
    assert limit.update(105 * MS, inflight=26, dropped=False) == 27  # queue ceil(26 x 0.048) = 2 < 3: + 1
    assert limit.update(110 * MS, inflight=27, dropped=False) == 27  # queue 3: within 3..6, unchanged
    assert limit.update(200 * MS, inflight=27, dropped=False) == 26  # queue 14 > 6: - 1
    assert limit.update(100 * MS, inflight=1, dropped=True) == 25  # a drop: - 1, whatever is in flight
    assert limit.update(50 * MS, inflight=25, dropped=False) == 25  # a faster call: the new rtt_noload


def test_vegas_probes_a_new_no_load_latency() -> None:
    limit = VegasLimit(10, AdaptiveLimitConfig(algorithm="vegas", min_limit=1, max_limit=10, probe_multiplier=1))
    limit.update(10 * MS, inflight=10, dropped=False)
    for _ in range(12):  # within 10 samples (multiplier 1 x limit 10 x jitter <= 1) one of them is the probe
        limit.update(500 * MS, inflight=10, dropped=False)
    assert limit._rtt_noload == 500 * MS


def test_littles_law_follows_demand_when_the_limit_is_not_reached() -> None:
    """App-limited: 100 calls/s at 50 ms is 5 in flight; the limit becomes ceil(5 x 1.1) = 6 in one window."""
    limit = make_limit(AdaptiveLimitConfig(algorithm="littles_law", min_limit=1, max_limit=100), 20)
    end = 0
    for _ in range(250):
        end += 10 * MS
        limit.update(50 * MS, 5, False, end)
    assert limit.limit == 6


def test_littles_law_doubles_a_limit_that_held_calls_back_without_a_queue() -> None:
    limit = make_limit(AdaptiveLimitConfig(algorithm="littles_law", min_limit=1, max_limit=100), 4)
    end = 0
    for _ in range(150):  # 4 in flight at 50 ms: 80 calls/s, every call at the no-load latency
        end += 12_500_000
        limit.update(50 * MS, 4, False, end)
    assert limit.limit == 8


def test_littles_law_probes_when_the_partner_slows_down() -> None:
    """Every latency 10x the no-load one for two windows: the limit halves for a probe, whose calls' latency
    becomes the new no-load latency."""
    cfg = AdaptiveLimitConfig(algorithm="littles_law", min_limit=1, max_limit=100)
    limit = make_limit(cfg, 10)
    end = 0
    for _ in range(400):  # healthy for 2 s: 9 in flight, 50 ms
        end += 5 * MS
        limit.update(50 * MS, 9, False, end)
    assert limit.no_load_latency_ns == 50 * MS and limit.limit == 11  # ceil(200/s x 50 ms x 1.1)
    for _ in range(200):  # 500 ms from now on (5 s at most)
        before = limit.limit
        end += 25 * MS
        limit.update(500 * MS, limit.limit, False, end)
        if limit.probing:
            break
    assert limit.probing and limit.limit == before // 2
    for _ in range(80):
        end += 50 * MS
        limit.update(500 * MS, limit.limit, False, end)
    assert not limit.probing and limit.no_load_latency_ns == 500 * MS


def _run(config: BulkheadConfig) -> list[dict]:
    """The harness's simulation (benchmarks/sim_adaptive.py) as the dicts these tests read."""
    return [
        {"latencies": p.latencies, "rejected_at": p.rejected_at, "completed": p.completed, "limits": p.limits}
        for p in simulate(config)
    ]


@pytest.mark.parametrize(
    "adaptive",
    [
        {"algorithm": "gradient2", "min_limit": 5, "max_limit": 500},
        {"algorithm": "aimd", "min_limit": 5, "max_limit": 500, "timeout": "750ms"},
    ],
    ids=["gradient2", "aimd"],
)
def test_simulated_step_in_partner_latency(adaptive: dict) -> None:
    """Healthy: Little's law says 200/s x 50 ms = 10 in flight. Sick: the partner does 40/s, so 20 in flight is
    all it can use (40/s x 500 ms) and more only queues. A fixed bulkhead sized for the sick case by Little's law
    on the offered load (200/s x 500 ms = 100) queues every admitted call behind 80 others."""
    healthy, sick, back = _run(BulkheadConfig(max_concurrent_calls=20, adaptive=adaptive))
    _, fixed_sick, _ = _run(BulkheadConfig(max_concurrent_calls=100))
    # Healthy before and after: nothing turned away, the limit stays above the 10 calls in flight.
    assert healthy["rejected_at"] == [] and min(healthy["limits"]) >= 10
    # Back to 50 ms: refusals only while the sick phase's calls drain (under 5 s), then the healthy load passes.
    assert max(back["rejected_at"], default=0) < 5 and min(back["limits"][50:]) >= 10
    # Sick: most of the partner's capacity is used (40/s) while admitted calls wait far less than behind the
    # fixed bulkhead sized for the sick case, whose limit the adaptive one stays well below.
    assert sick["completed"] >= 0.8 * 40 * 30
    assert statistics.median(sick["latencies"]) <= 0.5 * statistics.median(fixed_sick["latencies"])
    assert statistics.median(sick["limits"][100:]) <= 50


def test_windowed_aimd_settles_near_the_littles_law_value() -> None:
    """Netflix's WindowedLimit around AIMD (one sample per second): in the slow phase the limit stays between 1x and
    1.6x the 20 calls the partner can use, the partner's capacity is used in full, no admitted call waits 1 s,
    and within 1 s of the partner's recovery the healthy load passes again."""
    adaptive = {"algorithm": "aimd", "min_limit": 5, "max_limit": 500, "timeout": "750ms", "windowed": True}
    healthy, sick, back = _run(BulkheadConfig(max_concurrent_calls=20, adaptive=adaptive))
    assert healthy["rejected_at"] == []
    assert min(sick["limits"][100:]) >= 20 and max(sick["limits"][100:]) <= 32, sick["limits"]
    assert sick["completed"] >= 0.98 * 40 * 30
    assert sorted(sick["latencies"])[int(0.99 * len(sick["latencies"]))] < 1.0
    assert max(back["rejected_at"], default=0) < 1


def test_windowed_limit_feeds_one_sample_per_window() -> None:
    from django_ratelimit_r4.core.adaptivelimit import make_limit

    limit = make_limit(AdaptiveLimitConfig(algorithm="aimd", min_limit=5, max_limit=100, windowed=True), 20)
    end = 0
    for _ in range(9):  # the first call closes the (empty) first window; then 9 calls: too few
        end += 10 * MS
        limit.update(10 * MS, 20, False, end)
    assert limit.limit == 20
    for _ in range(120):  # 1.2 s of calls: windows of 1 s (2 x 10 ms is below min_window_time)
        end += 10 * MS
        limit.update(10 * MS, 20, False, end)
    assert limit.limit == 21  # exactly one window closed with enough samples
    assert limit.update(50_000, 20, True, end + S) == 21  # faster than 100 µs: ignored, as in Netflix's


def test_no_permit_leaks_on_exceptions_or_cancellation() -> None:
    clock = FakeClock()
    bulkhead = Bulkhead("b", BulkheadConfig(max_concurrent_calls=5, adaptive={"min_limit": 1}), clock=clock)

    def boom() -> None:
        raise ValueError("boom")

    for _ in range(20):
        with pytest.raises(ValueError):
            bulkhead.call(boom)

    async def main() -> None:
        async def slow() -> None:
            await asyncio.sleep(3600)

        tasks = [asyncio.ensure_future(bulkhead.acall(slow)) for _ in range(3)]
        await asyncio.sleep(0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    assert bulkhead.metrics.concurrent_calls == 0
    assert bulkhead.metrics.available_concurrent_calls == bulkhead.metrics.max_allowed_concurrent_calls


def test_a_grown_limit_hands_slots_to_waiters_in_fifo_order() -> None:
    clock = FakeClock()
    config = BulkheadConfig(
        max_concurrent_calls=2, max_wait_duration="10s", adaptive={"algorithm": "aimd", "min_limit": 1, "max_limit": 4}
    )
    bulkhead = Bulkhead("b", config, clock=clock)
    order: list[int] = []

    async def main() -> None:
        assert await bulkhead.atry_acquire_permission() and await bulkhead.atry_acquire_permission()
        start = clock.now_ns()

        async def wait(i: int) -> None:
            await bulkhead.aacquire_permission()
            order.append(i)

        waiters = [asyncio.ensure_future(wait(i)) for i in range(3)]
        await asyncio.sleep(0)
        bulkhead.on_complete(start_ns=start)  # a sample at 2 in flight: the limit grows 2 -> 3
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert bulkhead.metrics.max_allowed_concurrent_calls == 3
        assert order == [0, 1]  # the released slot and the new one, oldest first
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)

    asyncio.run(main())


def test_without_samples_an_adaptive_bulkhead_behaves_like_a_fixed_one() -> None:
    clock = FakeClock()
    bulkhead = Bulkhead("b", BulkheadConfig(max_concurrent_calls=2, adaptive={"min_limit": 1}), clock=clock)
    with bulkhead, bulkhead, pytest.raises(BulkheadFull):
        bulkhead.acquire_permission()
    assert bulkhead.metrics.max_allowed_concurrent_calls == 2
    bulkhead.reset()
    assert bulkhead.metrics.max_allowed_concurrent_calls == 2
