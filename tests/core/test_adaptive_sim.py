"""Issue 12's proof, short form: the harness of benchmarks/sim_adaptive.py (fake clock, deterministic) meets the
targets: the adaptive limit settles within 20 % of the Little's-law value within 10 s of each step of the
partner's latency, and a retry budget keeps an outage's load amplification at or under 1.1x."""

from __future__ import annotations

import pytest

from benchmarks.sim_adaptive import (
    RETRY_VARIANTS,
    TOLERANCE,
    littles_law_value,
    retry_amplification,
    run_variant,
    simulate,
)
from django_ratelimit_r4.core.bulkhead import BulkheadConfig
from django_ratelimit_r4.core.retrybudget import RetryBudgetConfig

LITTLES_LAW = {"algorithm": "littles_law", "min_limit": 5, "max_limit": 500}


def test_the_littles_law_values_of_the_model() -> None:
    assert littles_law_value(0.05) == pytest.approx(10)  # 200/s x 50 ms
    assert littles_law_value(0.5) == pytest.approx(20)  # the partner's 40/s x 500 ms


def test_the_adaptive_limit_settles_within_20_percent_within_10_s_of_each_step() -> None:
    healthy, slow, back = run_variant(20, LITTLES_LAW)
    for phase in (healthy, slow, back):
        settled = phase.convergence_s(TOLERANCE)
        assert settled is not None and settled <= 10, (phase.littles_law, settled, phase.limits)
    # ... and what that buys: nothing refused while healthy, the slow partner's capacity (40/s) used, admitted
    # calls not queued behind it (a bulkhead sized by Little's law on the offered load waits 2.5 s per call).
    assert healthy.rejected_at == [] and back.rejected_at == []
    assert slow.goodput >= 0.95 * 40
    assert slow.latency(0.5) <= 0.55 and slow.latency(0.99) <= 1.0
    _, fixed_slow, _ = run_variant(100, None)
    assert fixed_slow.latency(0.5) == pytest.approx(2.5)


def test_the_limit_settles_from_a_bad_initial_value_too() -> None:
    healthy, _, _ = simulate(BulkheadConfig(max_concurrent_calls=200, adaptive=LITTLES_LAW))
    settled = healthy.convergence_s()
    assert settled is not None and settled <= 10


def test_fixed_bulkheads_are_right_in_one_phase_only() -> None:
    healthy_sized = run_variant(10, None)
    assert healthy_sized[1].goodput == pytest.approx(20)  # half the slow partner's capacity wasted
    slow_sized = run_variant(100, None)
    assert slow_sized[1].convergence_s() is None and slow_sized[0].convergence_s() is None


def test_the_simulation_is_deterministic() -> None:
    first, second = run_variant(20, LITTLES_LAW), run_variant(20, LITTLES_LAW)
    assert [p.limits for p in first] == [p.limits for p in second]


@pytest.mark.parametrize(("name", "budget"), RETRY_VARIANTS, ids=[n for n, _ in RETRY_VARIANTS])
def test_retry_load_amplification_during_an_outage(name: str, budget: RetryBudgetConfig | None) -> None:
    amplification = retry_amplification(budget)
    if budget is None:
        assert amplification == 3.0
    elif budget.min_retries_per_second == 0:
        assert amplification <= 1.1  # the target
    else:
        assert amplification <= 1 + budget.percent_can_retry + 0.1  # the floor of 10/s on 100/s adds 0.1


def test_with_jittered_latencies_the_limit_still_tracks_the_partner() -> None:
    """Service times ± 40 % (seeded): looser than the deterministic targets (docs/configuration.md says by how
    much), but the slow partner's admitted calls are still not queued and the limit settles within 20 s."""
    healthy, slow, back = run_variant(20, LITTLES_LAW, jitter=0.4)
    assert healthy.goodput >= 0.99 * 200 and back.goodput >= 0.99 * 200
    assert slow.goodput >= 0.75 * 40 and slow.latency(0.5) <= 0.6
    settled = slow.convergence_s()
    assert settled is not None and settled <= 20
    assert max(back.limits[100:]) <= 2 * 10  # the recovered partner: the peak in flight + 10 %, not 2x
