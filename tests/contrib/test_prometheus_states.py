"""Multiprocess mode: a circuit breaker's state gauges are pushed at each transition, not only by the syncer.

The syncer here never runs on its own (interval of an hour, thread not started unless a test asks), so
every value seen was pushed by the ``STATE_TRANSITION`` listener. prometheus_client's values live in
this process (no ``PROMETHEUS_MULTIPROC_DIR``); the gunicorn test covers the files.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from prometheus_client import CollectorRegistry

import django_ratelimit_r4 as r4
from django_ratelimit_r4 import registry as r4_registry
from django_ratelimit_r4.contrib import prometheus
from django_ratelimit_r4.core.circuitbreaker import State
from django_ratelimit_r4.core.exceptions import IllegalStateTransition
from django_ratelimit_r4.testing import fake_clock

STATE = "resilience4j_circuitbreaker_state"
LABELS = [s.name.lower() for s in State]


@pytest.fixture
def fresh_instances() -> Iterator[None]:
    """A new registry generation, so every instance is built while the test's exporter is installed."""
    with override_settings(RATELIMIT_R4=copy.deepcopy(settings.RATELIMIT_R4)):
        yield


@pytest.fixture
def mp(fresh_instances: None) -> Iterator[CollectorRegistry]:
    """Multiprocess mode on a private registry; the process's own installation is restored afterwards."""
    before = prometheus.installed_mode()
    prometheus.uninstall()
    registry = CollectorRegistry()
    assert prometheus.install(registry=registry, multiprocess=True, interval=3600) == prometheus.MULTIPROCESS
    try:
        yield registry
    finally:
        prometheus.uninstall()
        if before is not None:
            prometheus.install(multiprocess=before == prometheus.MULTIPROCESS)


def states(registry: CollectorRegistry, name: str = "acquirer") -> dict[str, float | None]:
    return {label: registry.get_sample_value(STATE, {"name": name, "state": label}) for label in LABELS}


def only(label: str) -> dict[str, float]:
    return {other: 1.0 if other == label else 0.0 for other in LABELS}


def test_a_transition_is_exported_at_once_without_a_sync(mp: CollectorRegistry) -> None:
    breaker = r4.get_circuit_breaker("acquirer")
    assert prometheus._syncer is not None and not prometheus._syncer.running
    breaker.transition_to_forced_open_state()
    assert states(mp) == only("forced_open")
    breaker.transition_to_closed_state()
    assert states(mp) == only("closed")
    breaker.reset()  # reset() publishes a transition too when the state changes
    breaker.transition_to_disabled_state()
    breaker.reset()
    assert states(mp) == only("closed")


def test_the_listener_keeps_the_per_call_fast_path(mp: CollectorRegistry) -> None:
    breaker = r4.get_circuit_breaker("acquirer")
    assert breaker.events.wants("STATE_TRANSITION")
    assert breaker.events.wants_calls is False
    assert breaker._fast_ns != -1  # the inlined success path is still taken


def test_automatic_transition_to_half_open_is_exported(mp: CollectorRegistry) -> None:
    with fake_clock() as clock:
        breaker = r4.get_circuit_breaker("acquirer")  # wait_duration_in_open_state 3 s
        breaker.transition_to_open_state()
        assert states(mp) == only("open")
        clock.advance(3.001)
        assert states(mp) == only("open")  # nothing moves until the breaker is asked
        assert breaker.try_acquire_permission()  # the first call after the wait moves to HALF_OPEN
        breaker.release_permission()
        assert states(mp) == only("half_open")


def test_uninstall_removes_the_listeners(mp: CollectorRegistry) -> None:
    breaker = r4.get_circuit_breaker("acquirer")
    assert breaker.events.has_listeners
    prometheus.uninstall()
    assert not breaker.events.has_listeners
    assert prometheus._on_build not in r4_registry.build_callbacks


def test_breakers_built_before_install_are_watched_when_the_syncer_starts(fresh_instances: None) -> None:
    breaker = r4.get_circuit_breaker("acquirer")  # built before install(): no build hook yet
    before = prometheus.installed_mode()
    prometheus.uninstall()
    registry = CollectorRegistry()
    prometheus.install(registry=registry, multiprocess=True, interval=3600)
    try:
        breaker.transition_to_forced_open_state()
        assert states(registry)["forced_open"] is None  # not watched yet, and no sync ran
        prometheus.sync_now()  # starts the thread (as a worker's first request does), which watches
        deadline = time.monotonic() + 5
        while not breaker.events.wants("STATE_TRANSITION"):
            assert time.monotonic() < deadline, "the syncer thread never watched the breaker"
            time.sleep(0.005)
        breaker.transition_to_closed_state()
        assert states(registry) == only("closed")
    finally:
        prometheus.uninstall()
        if before is not None:
            prometheus.install(multiprocess=False)


def test_a_replaced_settings_breaker_does_not_overwrite_the_current_one(mp: CollectorRegistry) -> None:
    old = r4.get_circuit_breaker("acquirer")
    with override_settings(RATELIMIT_R4=copy.deepcopy(settings.RATELIMIT_R4)):
        current = r4.get_circuit_breaker("acquirer")
        assert current is not old
        current.transition_to_open_state()
        old.transition_to_forced_open_state()
        assert states(mp) == only("open")


def test_a_transition_during_a_sync_neither_waits_nor_loses_to_the_older_reading(
    mp: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncer = prometheus._syncer
    assert syncer is not None
    breaker = r4.get_circuit_breaker("acquirer")
    read_done, go_on = threading.Event(), threading.Event()
    real_read = prometheus._read

    def slow_read(out: Any) -> None:
        real_read(out)  # reads CLOSED
        read_done.set()
        assert go_on.wait(5)

    monkeypatch.setattr(prometheus, "_read", slow_read)
    sync = threading.Thread(target=syncer.sync)
    sync.start()
    try:
        assert read_done.wait(5)
        started = time.monotonic()
        breaker.transition_to_forced_open_state()  # while the sync holds its lock
        assert time.monotonic() - started < 2, "a transition waited for the syncer"  # the sync holds 5 s
    finally:
        go_on.set()
        sync.join(5)
    assert states(mp) == only("forced_open")  # pushed after the stale CLOSED reading


def test_a_transition_queued_while_another_pushes_is_pushed_by_that_one(
    mp: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncer = prometheus._syncer
    assert syncer is not None
    breaker = r4.get_circuit_breaker("acquirer")
    real_push = syncer._push_states_locked
    calls: list[int] = []

    def push_then_transition_elsewhere() -> None:
        real_push()
        calls.append(1)
        if len(calls) == 1:  # the first pusher still holds the lock: the second transition only queues
            other = threading.Thread(target=breaker.transition_to_closed_state)
            other.start()
            other.join(5)
            assert not other.is_alive()

    monkeypatch.setattr(syncer, "_push_states_locked", push_then_transition_elsewhere)
    breaker.transition_to_forced_open_state()
    assert breaker.state is State.CLOSED
    assert states(mp) == only("closed") and len(calls) == 2  # the holder looked again after releasing


def test_a_late_event_does_not_overwrite_the_true_state(mp: CollectorRegistry) -> None:
    from django_ratelimit_r4.core.circuitbreaker import CircuitBreakerOnStateTransitionEvent

    syncer = prometheus._syncer
    assert syncer is not None
    breaker = r4.get_circuit_breaker("acquirer")
    breaker.transition_to_forced_open_state()
    breaker.transition_to_closed_state()
    # Two racing transitions publish outside the breaker's lock, so their events can arrive swapped.
    stale = CircuitBreakerOnStateTransitionEvent(
        "STATE_TRANSITION", "acquirer", from_state=State.CLOSED, to_state=State.FORCED_OPEN
    )
    syncer._watched[breaker](stale)
    assert states(mp) == only("closed")


def test_racing_transitions_and_syncs_end_on_the_true_state(
    mp: CollectorRegistry, monkeypatch: pytest.MonkeyPatch, fast_switching: None
) -> None:
    syncer = prometheus._syncer
    assert syncer is not None
    real_set = syncer._set_gauge_locked

    def slow_set(*args: Any) -> None:
        time.sleep(0.0002)  # widen the windows where a push holds the lock while others queue
        real_set(*args)

    monkeypatch.setattr(syncer, "_set_gauge_locked", slow_set)
    breaker = r4.get_circuit_breaker("acquirer")
    moves = (
        breaker.transition_to_forced_open_state,
        breaker.transition_to_closed_state,
        breaker.transition_to_disabled_state,
        breaker.transition_to_open_state,
    )
    # fast_switching (a 1 µs switch interval), so an unordered push shows
    for trial in range(30):
        barrier = threading.Barrier(len(moves) + 1)

        def flip(move: Any, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            for _ in range(20):
                with contextlib.suppress(IllegalStateTransition):  # every pair used is legal
                    move()

        def syncs(barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            for _ in range(10):
                syncer.sync()

        threads = [threading.Thread(target=flip, args=(m,)) for m in moves]
        threads.append(threading.Thread(target=syncs))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # No sync after the threads: the last transition's own push must have left the truth.
        assert states(mp) == only(breaker.state.name.lower()), trial
