"""Django signals: transitions and rejections are delivered; a raising receiver never breaks a call;
nothing is subscribed while nobody listens."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings

from django_ratelimit_r4 import get_bulkhead, get_circuit_breaker, get_rate_limiter, registry
from django_ratelimit_r4.core.exceptions import CallNotPermitted
from django_ratelimit_r4.keyed import KeyedRateLimiter
from django_ratelimit_r4.signals import call_rejected, state_transition


@pytest.fixture
def fresh(settings: Any, r4_clock: Any) -> Any:
    config = copy.deepcopy(django_settings.RATELIMIT_R4)
    config["ratelimiters"]["instances"]["per_ip"] = {"limit_for_period": 1, "key": "ip"}
    settings.RATELIMIT_R4 = config
    return r4_clock


class Recorder:
    """A receiver that remembers (sender, kwargs) of every signal it gets."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        kwargs.pop("signal")
        self.calls.append((sender, kwargs))


@pytest.fixture
def transitions() -> Iterator[Recorder]:
    recorder = Recorder()
    state_transition.connect(recorder)
    yield recorder
    state_transition.disconnect(recorder)


@pytest.fixture
def rejections() -> Iterator[Recorder]:
    recorder = Recorder()
    call_rejected.connect(recorder)
    yield recorder
    call_rejected.disconnect(recorder)


def _fail(breaker: Any, times: int) -> None:
    def boom() -> None:
        raise ValueError("down")

    for _ in range(times):
        with pytest.raises(ValueError):
            breaker.call(boom)


def test_transitions_are_delivered(fresh: Any, transitions: Recorder) -> None:
    breaker = get_circuit_breaker("acquirer")
    _fail(breaker, 10)  # minimum_number_of_calls=10, all failed -> OPEN
    fresh.advance(3.001)
    assert breaker.try_acquire_permission()  # first call after the wait -> HALF_OPEN
    breaker.transition_to_forced_open_state()
    assert [(s, k["name"], k["from_state"], k["to_state"]) for s, k in transitions.calls] == [
        (breaker, "acquirer", "CLOSED", "OPEN"),
        (breaker, "acquirer", "OPEN", "HALF_OPEN"),
        (breaker, "acquirer", "HALF_OPEN", "FORCED_OPEN"),
    ]


def test_rejections_are_delivered_for_every_kind(fresh: Any, rejections: Recorder) -> None:
    limiter = get_rate_limiter("api")
    for _ in range(10):
        assert limiter.acquire_permission()
    assert rejections.calls == []  # granted calls send nothing
    fresh.advance(0.25)
    assert not limiter.acquire_permission()
    assert rejections.calls == [(limiter, {"name": "api", "kind": "ratelimiter", "wait_ns": 750_000_000})]

    bulkhead = get_bulkhead("acquirer")
    assert bulkhead.try_acquire_permission() and bulkhead.try_acquire_permission()
    assert not bulkhead.try_acquire_permission()
    bulkhead.release_permission()
    bulkhead.release_permission()
    assert rejections.calls[-1] == (bulkhead, {"name": "acquirer", "kind": "bulkhead", "wait_ns": None})

    breaker = get_circuit_breaker("acquirer")
    breaker.transition_to_open_state()
    fresh.advance(1)
    with pytest.raises(CallNotPermitted):
        breaker.call(lambda: None)
    assert rejections.calls[-1] == (
        breaker,
        {"name": "acquirer", "kind": "circuitbreaker", "wait_ns": 2_000_000_000},
    )

    per_ip = get_rate_limiter("per_ip", key="192.0.2.1")
    assert per_ip.acquire_permission() and not per_ip.acquire_permission()
    sender, kwargs = rejections.calls[-1]
    assert isinstance(sender, KeyedRateLimiter)
    assert kwargs == {"name": "per_ip", "kind": "ratelimiter", "wait_ns": None}  # the key is never sent
    assert len(rejections.calls) == 4


def test_a_raising_receiver_never_breaks_the_protected_call(
    fresh: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    after = Recorder()  # connected after the broken one: must still hear everything
    for signal in (call_rejected, state_transition):
        signal.connect(broken)
        signal.connect(after)
    try:
        with caplog.at_level(logging.ERROR):
            limiter = get_rate_limiter("slow")
            results = [limiter.acquire_permission() for _ in range(11)]
            assert results == [True] * 10 + [False]
            breaker = get_circuit_breaker("acquirer")
            _fail(breaker, 10)  # the CLOSED -> OPEN transition reaches the broken receiver
            assert breaker.state.name == "OPEN"
            with pytest.raises(CallNotPermitted):  # the rejection, not the receiver's RuntimeError
                breaker.call(lambda: None)
            assert breaker.metrics.total_not_permitted_calls == 1
    finally:
        for signal in (call_rejected, state_transition):
            signal.disconnect(broken)
            signal.disconnect(after)
    assert [k.get("kind", "transition") for _, k in after.calls] == [
        "ratelimiter",
        "transition",
        "circuitbreaker",
    ]
    # Logged with the traceback by send_robust (django.dispatch), not left to escape the signal layer.
    logged = [r for r in caplog.records if r.name == "django.dispatch" and r.exc_info]
    assert [str(r.exc_info[1]) for r in logged] == ["receiver bug"] * 3  # type: ignore[index]


async def test_an_async_receiver_on_the_event_loop_cannot_break_the_call(
    fresh: Any, caplog: pytest.LogCaptureFixture
) -> None:
    received: list[str] = []

    async def async_receiver(sender: Any, **kwargs: Any) -> None:
        received.append(kwargs["name"])

    call_rejected.connect(async_receiver)
    try:
        limiter = get_rate_limiter("api")
        results = [await limiter.aacquire_permission() for _ in range(11)]
    finally:
        call_rejected.disconnect(async_receiver)
    # Inside a running loop Django cannot run an async receiver synchronously; the call still answers.
    assert results == [True] * 10 + [False]
    assert received == [] and any(r.name == "django_ratelimit_r4.signals" for r in caplog.records)


def test_nothing_is_subscribed_while_nobody_listens(fresh: Any) -> None:
    breaker = get_circuit_breaker("acquirer")
    bulkhead = get_bulkhead("acquirer")
    limiter = get_rate_limiter("api")
    assert not (breaker.events.has_listeners or bulkhead.events.has_listeners or limiter.events.has_listeners)

    recorder = Recorder()
    call_rejected.connect(recorder)
    try:
        assert breaker.events.wants("NOT_PERMITTED") and not breaker.events.wants("STATE_TRANSITION")
        assert bulkhead.events.wants("CALL_REJECTED")
        # Rate limiters: only the failed-acquire flag flips, so granted calls pay nothing.
        assert limiter.events.wants_failed and not limiter.events.wants_successful
    finally:
        call_rejected.disconnect(recorder)
    assert not (breaker.events.has_listeners or bulkhead.events.has_listeners or limiter.events.has_listeners)


def test_connecting_twice_delivers_once(fresh: Any, rejections: Recorder) -> None:
    call_rejected.connect(rejections)  # same receiver again: Django dedupes, and so do the subscriptions
    limiter = get_rate_limiter("slow")
    while limiter.acquire_permission():
        pass
    assert len(rejections.calls) == 1


def test_instances_built_later_and_after_a_settings_change_are_wired(
    settings: Any, r4_clock: Any, rejections: Recorder, transitions: Recorder
) -> None:
    settings.RATELIMIT_R4 = {
        "ratelimiters": {"instances": {"late": {"limit_for_period": 1, "limit_refresh_period": "1s"}}},
        "circuitbreakers": {"instances": {"late": {}}},
    }
    limiter = get_rate_limiter("late")  # built after the receivers connected
    assert limiter.acquire_permission() and not limiter.acquire_permission()
    get_circuit_breaker("late").transition_to_disabled_state()
    assert [k["name"] for _, k in rejections.calls] == ["late"]
    assert [(k["from_state"], k["to_state"]) for _, k in transitions.calls] == [("CLOSED", "DISABLED")]
    old = limiter
    settings.RATELIMIT_R4 = {"ratelimiters": {"instances": {"late": {"limit_for_period": 1}}}}
    assert get_rate_limiter("late") is not old
    assert not old.events.has_listeners  # the replaced generation's instance is no longer relayed
    from django_ratelimit_r4 import signals

    assert registry.build_callbacks.count(signals._track) == 1
