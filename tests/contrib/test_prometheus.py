"""Prometheus export: single process (custom collector on REGISTRY) and multiprocess (real children).

Single-process tests read prometheus_client's default REGISTRY, exactly what django-prometheus's
``/metrics`` view serves, with time frozen by ``testing.fake_clock``. Multiprocess tests run real
child Python processes with a fresh ``PROMETHEUS_MULTIPROC_DIR`` and read the files back with
``MultiProcessCollector`` (and through django-prometheus's view), as a gunicorn deployment does.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import RequestFactory, override_settings
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

import django_ratelimit_r4 as r4
from django_ratelimit_r4 import registry as r4_registry
from django_ratelimit_r4.contrib import prometheus
from django_ratelimit_r4.core.exceptions import CallNotPermitted
from django_ratelimit_r4.testing import FakeClock, fake_clock

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def installed() -> Iterator[None]:
    """Metrics installed in single-process mode on the default registry (left as found afterwards)."""
    before = prometheus.installed_mode()
    assert before in (None, prometheus.SINGLE_PROCESS), "the test process must not run in multiprocess mode"
    assert prometheus.install(multiprocess=False) == prometheus.SINGLE_PROCESS
    yield
    if before is None:
        prometheus.uninstall()


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """Every configured instance on a frozen clock (what the ``r4_clock`` plugin fixture does)."""
    with fake_clock() as frozen:
        yield frozen


def value(metric: str, /, **labels: str) -> float | None:
    """A sample of the default registry, as a scrape of /metrics would show it."""
    return REGISTRY.get_sample_value(metric, labels)


def exposition() -> str:
    return generate_latest(REGISTRY).decode()


def with_instances(**changes: dict[str, Any]) -> dict[str, Any]:
    """tests.settings' RATELIMIT_R4 with some kinds' ``instances`` replaced."""
    setting = copy.deepcopy(settings.RATELIMIT_R4)
    for kind, instances in changes.items():
        setting.setdefault(kind, {})["instances"] = instances
    return setting


# --------------------------------------------------------------------------------------------------
# Single process
# --------------------------------------------------------------------------------------------------


def test_a_metric_file_a_worker_has_not_sized_yet_reads_as_no_samples(tmp_path: Path) -> None:
    """prometheus/client_python#1199 (open in 0.26): a worker's metric file exists at 0 bytes between its
    creation and its sizing, and a scrape that globs it then raised struct.error, so /metrics answered 500
    (for good if the worker died in that window). Our syncer creates those files while workers serve
    (tests/contrib/test_prometheus_gunicorn.py scrapes then, and flaked on it). Multiprocess install reads
    such a file as no samples, and the other workers' samples are still served."""
    import struct

    from prometheus_client.mmap_dict import MmapedDict

    MmapedDict(str(tmp_path / "counter_1.db")).close()  # a worker's file, sized
    (tmp_path / "counter_2.db").write_bytes(b"")  # the other worker's file, not sized yet

    def collect() -> list[Any]:
        reg = CollectorRegistry()
        MultiProcessCollector(reg, path=str(tmp_path))
        return list(reg.collect())

    original = MmapedDict.__dict__["read_all_values_from_file"]
    try:
        before = prometheus.installed_mode()
        assert before in (None, prometheus.SINGLE_PROCESS)
        prometheus.uninstall()
        try:  # through install(), as a worker does
            assert prometheus.install(multiprocess=True, registry=CollectorRegistry()) == prometheus.MULTIPROCESS
        finally:
            prometheus.uninstall()
            if before is not None:
                prometheus.install()
        assert collect() == []
        prometheus._tolerate_empty_metric_files()  # idempotent: one wrapper
        assert collect() == []
    finally:
        MmapedDict.read_all_values_from_file = original  # type: ignore[method-assign]
    with pytest.raises(struct.error):  # what it does without us (so the test above means something)
        collect()


class TestInstall:
    def test_install_is_idempotent_and_registers_one_collector(self, installed: None) -> None:
        assert prometheus.install() == prometheus.SINGLE_PROCESS
        assert prometheus.install(multiprocess=True) == prometheus.SINGLE_PROCESS  # first choice wins
        assert prometheus.installed_mode() == prometheus.SINGLE_PROCESS
        text = exposition()
        assert text.count("# TYPE resilience4j_ratelimiter_available_permissions gauge") == 1

    def test_uninstall_removes_the_series_and_install_restores_them(self, installed: None) -> None:
        assert value("resilience4j_ratelimiter_available_permissions", name="api") is not None
        prometheus.uninstall()
        try:
            assert prometheus.installed_mode() is None
            assert "resilience4j_" not in exposition()
        finally:
            prometheus.install()
        assert value("resilience4j_ratelimiter_available_permissions", name="api") is not None

    def test_describe_reads_no_settings(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def boom(*args: Any) -> Any:
            raise AssertionError("describe() must not build instances")

        for entry in ("instances", "names", "lookup"):
            monkeypatch.setattr(r4_registry, entry, boom)
        names = {family.name for family in prometheus.collector.describe()}
        assert "resilience4j_ratelimiter_available_permissions" in names
        assert "resilience4j_circuitbreaker_calls_seconds" in names
        assert "r4_event_loop_stall_seconds" in names

    def test_a_broken_setting_leaves_r4_out_but_keeps_metrics_page_up(
        self, installed: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        def boom(*args: Any) -> Any:
            raise RuntimeError("settings mid-edit")

        monkeypatch.setattr(r4_registry, "names", boom)  # RATELIMIT_R4 itself cannot be read
        monkeypatch.setattr(r4_registry, "keyed_rate_limiters", boom)
        with caplog.at_level(logging.ERROR, logger="django_ratelimit_r4.prometheus"):
            text = exposition()
        assert "resilience4j_" not in text
        assert "python_info" in text  # the other collectors of the page still answer
        assert "settings mid-edit" in caplog.text

    def test_exporting_adds_no_listener_to_any_primitive(self, installed: None) -> None:
        exposition()
        for kind, name, instance in r4_registry.iter_instances():
            assert instance.events.has_listeners is False, (kind, name)

    def test_django_prometheus_view_shows_the_series(self, installed: None, clock: FakeClock) -> None:
        from django_prometheus.exports import ExportToDjangoView

        r4.get_rate_limiter("api").acquire_permission()
        response = ExportToDjangoView(RequestFactory().get("/metrics"))
        body = response.content.decode()
        assert 'resilience4j_ratelimiter_available_permissions{name="api"} 9.0' in body
        assert 'resilience4j_circuitbreaker_state{name="acquirer",state="closed"} 1.0' in body


class TestRateLimiter:
    def test_eleven_calls_on_ten_per_second(self, installed: None, clock: FakeClock) -> None:
        def calls(kind: str) -> float:
            return value("resilience4j_ratelimiter_calls_total", name="api", kind=kind) or 0.0

        successful, failed = calls("successful"), calls("failed")
        limiter = r4.get_rate_limiter("api")
        results = [limiter.acquire_permission() for _ in range(11)]
        assert results == [True] * 10 + [False]

        text = exposition()
        assert 'resilience4j_ratelimiter_available_permissions{name="api"} 0.0' in text
        assert calls("successful") - successful == 10
        assert calls("failed") - failed == 1
        assert value("resilience4j_ratelimiter_waiting_threads", name="api") == 0.0
        # The limiter refills after its period; the gauge follows at the next scrape, the counters stay.
        clock.advance(1)
        assert value("resilience4j_ratelimiter_available_permissions", name="api") == 10.0
        assert calls("successful") - successful == 10

    def test_every_configured_limiter_has_series_without_being_used(self, installed: None) -> None:
        assert value("resilience4j_ratelimiter_available_permissions", name="slow") == 10.0
        assert value("resilience4j_ratelimiter_calls_total", name="slow", kind="failed") is not None

    def test_keyed_limiter_aggregates_keys_and_never_labels_them(
        self, installed: None, clock: FakeClock
    ) -> None:
        setting = with_instances(ratelimiters={"per_ip": {"limit_for_period": 2, "key": "ip"}})
        with override_settings(RATELIMIT_R4=setting):
            keyed = r4_registry.get_keyed_rate_limiter("per_ip")
            for client in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
                for _ in range(3):
                    keyed.acquire_permission(client)
            text = exposition()
            assert value("resilience4j_ratelimiter_calls_total", name="per_ip", kind="successful") == 6.0
            assert value("resilience4j_ratelimiter_calls_total", name="per_ip", kind="failed") == 3.0
            assert value("resilience4j_ratelimiter_keys", name="per_ip") == 3.0
            # One value per client exists, so none is exported for the name.
            assert value("resilience4j_ratelimiter_available_permissions", name="per_ip") is None
            assert "10.0.0." not in text
            clock.advance(1)  # every key refills: full keys hold no state once swept
            keyed.acquire_permission("10.0.0.9")
            keyed.purge()
            assert value("resilience4j_ratelimiter_keys", name="per_ip") == 1.0

    def test_unkeyed_instance_used_per_key_sums_shared_and_keyed(
        self, installed: None, clock: FakeClock
    ) -> None:
        with override_settings(RATELIMIT_R4=with_instances(ratelimiters={"mixed": {"limit_for_period": 1}})):
            r4.get_rate_limiter("mixed").acquire_permission()
            r4.get_rate_limiter("mixed", key="a").acquire_permission()
            r4.get_rate_limiter("mixed", key="a").acquire_permission()
            assert value("resilience4j_ratelimiter_calls_total", name="mixed", kind="successful") == 2.0
            assert value("resilience4j_ratelimiter_calls_total", name="mixed", kind="failed") == 1.0
            # No key spec: the shared limiter is the instance, so its permissions are exported.
            assert value("resilience4j_ratelimiter_available_permissions", name="mixed") == 0.0
            assert value("resilience4j_ratelimiter_keys", name="mixed") == 1.0

    def test_settings_change_follows_the_new_instances(self, installed: None) -> None:
        with override_settings(RATELIMIT_R4=with_instances(ratelimiters={"other": {"limit_for_period": 3}})):
            assert value("resilience4j_ratelimiter_available_permissions", name="other") == 3.0
            assert value("resilience4j_ratelimiter_available_permissions", name="api") is None
        assert value("resilience4j_ratelimiter_available_permissions", name="other") is None


class TestCircuitBreaker:
    def state(self, state: str) -> float | None:
        return value("resilience4j_circuitbreaker_state", name="acquirer", state=state)

    def test_state_series_flip_on_transition(self, installed: None, clock: FakeClock) -> None:
        cb = r4.get_circuit_breaker("acquirer")
        assert self.state("closed") == 1.0
        assert self.state("open") == 0.0
        cb.transition_to_open_state()
        assert self.state("closed") == 0.0
        assert self.state("open") == 1.0
        states = ("closed", "open", "half_open", "disabled", "forced_open", "metrics_only")
        assert sum(self.state(s) or 0.0 for s in states) == 1.0
        clock.advance(3.001)  # wait_duration_in_open_state passed; the next call attempt moves to HALF_OPEN
        assert self.state("open") == 1.0
        assert cb.try_acquire_permission()
        cb.release_permission()
        assert self.state("open") == 0.0
        assert self.state("half_open") == 1.0
        cb.transition_to_forced_open_state()
        assert self.state("forced_open") == 1.0
        cb.transition_to_metrics_only_state()
        assert self.state("metrics_only") == 1.0
        cb.transition_to_disabled_state()
        assert self.state("disabled") == 1.0

    def test_calls_rates_buffered_and_not_permitted(self, installed: None, clock: FakeClock) -> None:
        cb = r4.get_circuit_breaker("acquirer")

        def succeed() -> None:
            clock.advance(0.25)

        def fail() -> None:
            clock.advance(0.5)
            raise ValueError("down")

        for _ in range(5):
            cb.call(succeed)
        assert value("resilience4j_circuitbreaker_failure_rate", name="acquirer") == -1.0
        for _ in range(5):
            with pytest.raises(ValueError):
                cb.call(fail)

        assert (
            value("resilience4j_circuitbreaker_calls_seconds_count", name="acquirer", kind="successful")
            == 5.0
        )
        assert (
            value("resilience4j_circuitbreaker_calls_seconds_sum", name="acquirer", kind="successful") == 1.25
        )
        assert value("resilience4j_circuitbreaker_calls_seconds_count", name="acquirer", kind="failed") == 5.0
        assert value("resilience4j_circuitbreaker_calls_seconds_sum", name="acquirer", kind="failed") == 2.5
        assert (
            value("resilience4j_circuitbreaker_calls_seconds_count", name="acquirer", kind="ignored") == 0.0
        )
        # 5 of 10 failed = the 50 % threshold: the breaker is OPEN now, with a fresh window.
        assert value("resilience4j_circuitbreaker_state", name="acquirer", state="open") == 1.0
        before = value("resilience4j_circuitbreaker_not_permitted_calls_total", name="acquirer")
        with pytest.raises(CallNotPermitted):
            cb.call(succeed)
        assert (
            value("resilience4j_circuitbreaker_not_permitted_calls_total", name="acquirer")
            == (before or 0) + 1
        )

        cb.transition_to_closed_state()
        cb.call(succeed)
        with pytest.raises(ValueError):
            cb.call(fail)
        assert value("resilience4j_circuitbreaker_buffered_calls", name="acquirer", kind="successful") == 1.0
        assert value("resilience4j_circuitbreaker_buffered_calls", name="acquirer", kind="failed") == 1.0
        # Lifetime totals keep counting across transitions.
        assert (
            value("resilience4j_circuitbreaker_calls_seconds_count", name="acquirer", kind="successful")
            == 6.0
        )

    def test_failure_rate_once_minimum_is_reached(self, installed: None, clock: FakeClock) -> None:
        cb = r4.get_circuit_breaker("acquirer")
        for i in range(10):
            if i < 3:
                cb.on_error(1_000, ValueError())
            else:
                cb.on_success(1_000)
        assert value("resilience4j_circuitbreaker_failure_rate", name="acquirer") == 30.0
        assert value("resilience4j_circuitbreaker_slow_call_rate", name="acquirer") == 0.0


class TestOtherPrimitives:
    def test_bulkhead_gauges_follow_permits(self, installed: None) -> None:
        bh = r4.get_bulkhead("acquirer")
        assert value("resilience4j_bulkhead_max_allowed_concurrent_calls", name="acquirer") == 2.0
        assert value("resilience4j_bulkhead_available_concurrent_calls", name="acquirer") == 2.0
        assert bh.try_acquire_permission()
        assert bh.try_acquire_permission()
        try:
            assert value("resilience4j_bulkhead_available_concurrent_calls", name="acquirer") == 0.0
        finally:
            bh.on_complete()
            bh.on_complete()
        assert value("resilience4j_bulkhead_available_concurrent_calls", name="acquirer") == 2.0

    def test_retry_outcomes(self, installed: None, clock: FakeClock) -> None:
        retry = r4.get_retry("acquirer")
        attempts = {"n": 0}

        def flaky() -> str:
            attempts["n"] += 1
            if attempts["n"] % 2:
                raise ConnectionError("blip")
            return "ok"

        def broken() -> None:
            raise ConnectionError("down")

        assert retry.call(lambda: "ok") == "ok"
        assert retry.call(flaky) == "ok"
        with pytest.raises(ConnectionError):
            retry.call(broken)

        def kind(k: str) -> float | None:
            return value("resilience4j_retry_calls_total", name="acquirer", kind=k)

        assert kind("successful_without_retry") == 1.0
        assert kind("successful_with_retry") == 1.0
        assert kind("failed_with_retry") == 1.0
        assert kind("failed_without_retry") == 0.0

    async def test_time_limiter_outcomes(self, installed: None) -> None:
        setting = with_instances(timelimiters={"quick": {"timeout_duration": "20ms"}})
        with override_settings(RATELIMIT_R4=setting):
            tl = r4.get_time_limiter("quick")

            async def fast() -> int:
                return 1

            async def failing() -> None:
                raise ValueError("bad")

            async def hanging() -> None:
                await asyncio.sleep(5)

            assert await tl.acall(fast) == 1
            with pytest.raises(ValueError):
                await tl.acall(failing)
            with pytest.raises(Exception):  # noqa: B017 - the timeout exception type is the core's business
                await tl.acall(hanging)

            def kind(k: str) -> float | None:
                return value("resilience4j_timelimiter_calls_total", name="quick", kind=k)

            assert (kind("successful"), kind("failed"), kind("timeout")) == (1.0, 1.0, 1.0)


class TestStalls:
    def test_running_detectors_are_exported(self, installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
        from django_ratelimit_r4 import stall

        detector = stall.StallDetector(name="asgi")
        with detector._counters_lock:  # as the watchdog's _record would, without blocking for real
            detector.stalls_total = 3
            detector.stall_seconds_total = 0.5
            detector.bucket_counts[0] = 1  # <= 0.02
            detector.bucket_counts[2] = 2  # <= 0.1
        monkeypatch.setattr(stall, "get_detectors", lambda: [detector])
        assert value("r4_event_loop_stalls_total", name="asgi") == 3.0
        assert value("r4_event_loop_stall_seconds_count", name="asgi") == 3.0
        assert value("r4_event_loop_stall_seconds_sum", name="asgi") == 0.5
        assert value("r4_event_loop_stall_seconds_bucket", name="asgi", le="0.02") == 1.0
        assert value("r4_event_loop_stall_seconds_bucket", name="asgi", le="0.05") == 1.0
        assert value("r4_event_loop_stall_seconds_bucket", name="asgi", le="0.1") == 3.0
        assert value("r4_event_loop_stall_seconds_bucket", name="asgi", le="+Inf") == 3.0

    def test_no_detector_no_series(self, installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
        from django_ratelimit_r4 import stall

        monkeypatch.setattr(stall, "get_detectors", lambda: [])
        assert "r4_event_loop" not in exposition()


# --------------------------------------------------------------------------------------------------
# The syncer's delta logic, in this process (plain prometheus_client values, a private registry)
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def syncer() -> prometheus._Syncer:
    return prometheus._Syncer(CollectorRegistry(), interval=3600)


def synced(syncer: prometheus._Syncer, metric: str, /, **labels: str) -> float | None:
    assert syncer.registry is not None
    return syncer.registry.get_sample_value(metric, labels)


class TestSyncer:
    def test_counters_follow_resets_and_rebuilds_without_going_back(
        self, syncer: prometheus._Syncer, clock: FakeClock
    ) -> None:
        limiter = r4.get_rate_limiter("slow")
        for _ in range(12):
            limiter.acquire_permission()
        syncer.sync()
        syncer.sync()
        assert synced(syncer, "resilience4j_ratelimiter_calls_total", name="slow", kind="successful") == 10.0
        assert synced(syncer, "resilience4j_ratelimiter_calls_total", name="slow", kind="failed") == 2.0
        assert synced(syncer, "resilience4j_ratelimiter_available_permissions", name="slow") == 0.0

        limiter.reset()  # the limiter's own counters restart at 0
        limiter.acquire_permission()
        syncer.sync()
        assert synced(syncer, "resilience4j_ratelimiter_calls_total", name="slow", kind="successful") == 11.0

        with override_settings(RATELIMIT_R4=copy.deepcopy(settings.RATELIMIT_R4)):  # a new instance
            rebuilt = r4.get_rate_limiter("slow")
            assert rebuilt is not limiter
            rebuilt.acquire_permission()
            rebuilt.acquire_permission()
            syncer.sync()
        assert synced(syncer, "resilience4j_ratelimiter_calls_total", name="slow", kind="successful") == 13.0

    def test_summary_gets_count_and_sum_deltas(self, syncer: prometheus._Syncer, clock: FakeClock) -> None:
        cb = r4.get_circuit_breaker("acquirer")
        cb.on_success(250_000_000)
        syncer.sync()
        cb.on_success(500_000_000)
        syncer.sync()
        labels = {"name": "acquirer", "kind": "successful"}
        assert synced(syncer, "resilience4j_circuitbreaker_calls_seconds_count", **labels) == 2.0
        assert synced(syncer, "resilience4j_circuitbreaker_calls_seconds_sum", **labels) == 0.75
        cb.transition_to_open_state()
        syncer.sync()
        assert synced(syncer, "resilience4j_circuitbreaker_state", name="acquirer", state="open") == 1.0
        assert synced(syncer, "resilience4j_circuitbreaker_state", name="acquirer", state="closed") == 0.0

    def test_concurrent_syncs_never_double_count(self, syncer: prometheus._Syncer, fast_switching: None) -> None:
        # fast_switching (a 1 µs switch interval), so an unlocked read-modify-write shows
        self._concurrent_syncs(syncer)

    def _concurrent_syncs(self, syncer: prometheus._Syncer) -> None:
        limiter = r4.get_rate_limiter("slow")
        threads, rounds = 4, 200
        for _trial in range(5):
            limiter.reset()
            expected = (
                synced(syncer, "resilience4j_ratelimiter_calls_total", name="slow", kind="failed") or 0.0
            )
            barrier = threading.Barrier(threads)

            def work(barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                for _ in range(rounds):
                    limiter.acquire_permission()
                    syncer.sync()

            pool = [threading.Thread(target=work) for _ in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
            syncer.sync()
            got = synced(syncer, "resilience4j_ratelimiter_calls_total", name="slow", kind="failed")
            assert got == expected + limiter.metrics.failed_calls == expected + threads * rounds - 10

    def test_sync_now_is_a_no_op_in_single_process_mode(self, installed: None) -> None:
        prometheus.sync_now()
        assert prometheus._syncer is None

    def test_mode_follows_the_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
        monkeypatch.delenv("prometheus_multiproc_dir", raising=False)
        assert prometheus.multiprocess_requested() is False
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/tmp/somewhere")
        assert prometheus.multiprocess_requested() is True


# --------------------------------------------------------------------------------------------------
# Multiprocess: real child processes writing PROMETHEUS_MULTIPROC_DIR
# --------------------------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import asyncio, os, sys, time
    import django
    django.setup()
    from django.core.signals import request_started
    from django_ratelimit_r4.contrib import prometheus
    import django_ratelimit_r4 as r4

    role = sys.argv[1]
    assert prometheus.install() == prometheus.MULTIPROCESS
    assert not prometheus._syncer.running, "install() must not start a thread (gunicorn master)"

    def worker(role):
        limiter = r4.get_rate_limiter("slow")         # 10 per 60 s: no refill during the test
        bulkhead = r4.get_bulkhead("acquirer")
        breaker = r4.get_circuit_breaker("acquirer")
        retry = r4.get_retry("acquirer")
        timelimiter = r4.get_time_limiter("acquirer")

        async def ok():
            return 1
        asyncio.run(timelimiter.acall(ok))
        retry.call(lambda: 1)
        breaker.call(lambda: 1)
        assert bulkhead.try_acquire_permission()      # held until exit: 1 of 2 available

        if role == "explicit":
            for _ in range(6):
                limiter.acquire_permission()
            prometheus.sync_now()
            assert prometheus._syncer.running
            for _ in range(5):                        # 4 more granted, 1 rejected
                limiter.acquire_permission()
            prometheus.sync_now()
            prometheus.sync_now()                     # nothing new: must push nothing
            breaker.transition_to_open_state()
            try:
                breaker.call(lambda: 1)
            except Exception:
                pass
            prometheus.sync_now()
            from django_ratelimit_r4.stall import StallDetector

            async def stall():
                async with StallDetector(threshold=0.02, name="asgi") as detector:
                    await asyncio.sleep(0.05)
                    time.sleep(0.2)                   # blocks the loop: one stall
                    for _ in range(100):
                        await asyncio.sleep(0.02)
                        if detector.stalls_total:
                            break
                    return detector.stalls_total
            assert asyncio.run(stall()) >= 1
        else:
            request_started.send(sender=None)         # the worker's first request starts the syncer
            assert prometheus._syncer.running
            for _ in range(4):
                limiter.acquire_permission()
            # no sync_now(): the atexit flush must push these

    if role == "fork":
        # Like a preloading gunicorn master: install in the parent, work only in a forked worker.
        pid = os.fork()
        if pid == 0:
            try:
                worker("atexit")
            except BaseException:
                import traceback; traceback.print_exc(); os._exit(1)
            sys.exit(0)                               # normal exit: atexit handlers run
        _, status = os.waitpid(pid, 0)
        assert status == 0, status
        assert not prometheus._syncer.running
        print(pid)
    else:
        worker(role)
        print(os.getpid())
    """
)


def run_child(role: str, multiproc_dir: Path) -> int:
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, role], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def multiproc_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two workers ran their decisions into one fresh directory: one syncing explicitly, one forked."""
    directory = tmp_path_factory.mktemp("prometheus_multiproc")
    pids = {role: run_child(role, directory) for role in ("explicit", "fork")}
    (directory / "pids").write_text(f"{pids['explicit']} {pids['fork']}")
    return directory


class TestMultiprocess:
    def collect(self, directory: Path) -> CollectorRegistry:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(directory))
        return registry

    def pids(self, directory: Path) -> tuple[str, str]:
        explicit, forked = (directory / "pids").read_text().split()
        return explicit, forked

    def test_counters_are_summed_over_workers_without_double_counting(self, multiproc_dir: Path) -> None:
        reg = self.collect(multiproc_dir)
        get = reg.get_sample_value
        # explicit: 10 granted + 1 rejected, synced three times; forked: 4 granted, flushed at exit.
        assert get("resilience4j_ratelimiter_calls_total", {"name": "slow", "kind": "successful"}) == 14.0
        assert get("resilience4j_ratelimiter_calls_total", {"name": "slow", "kind": "failed"}) == 1.0
        assert (
            get("resilience4j_retry_calls_total", {"name": "acquirer", "kind": "successful_without_retry"})
            == 2.0
        )
        assert get("resilience4j_timelimiter_calls_total", {"name": "acquirer", "kind": "successful"}) == 2.0
        assert (
            get("resilience4j_circuitbreaker_calls_seconds_count", {"name": "acquirer", "kind": "successful"})
            == 2.0
        )
        assert (
            get("resilience4j_circuitbreaker_calls_seconds_sum", {"name": "acquirer", "kind": "successful"})
            >= 0.0
        )
        assert get("resilience4j_circuitbreaker_not_permitted_calls_total", {"name": "acquirer"}) == 1.0

    def test_gauges_use_their_multiprocess_modes(self, multiproc_dir: Path) -> None:
        get = self.collect(multiproc_dir).get_sample_value
        explicit, forked = self.pids(multiproc_dir)
        # liveall: one series per worker.
        avail = "resilience4j_ratelimiter_available_permissions"
        assert get(avail, {"name": "slow", "pid": explicit}) == 0.0
        assert get(avail, {"name": "slow", "pid": forked}) == 6.0
        bulkhead = "resilience4j_bulkhead_available_concurrent_calls"
        assert get(bulkhead, {"name": "acquirer", "pid": explicit}) == 1.0
        assert get(bulkhead, {"name": "acquirer", "pid": forked}) == 1.0
        # livesum: summed capacity; livemax: "open in any worker", and the other worker is closed.
        assert get("resilience4j_bulkhead_max_allowed_concurrent_calls", {"name": "acquirer"}) == 4.0
        assert get("resilience4j_ratelimiter_waiting_threads", {"name": "slow"}) == 0.0
        state = "resilience4j_circuitbreaker_state"
        assert get(state, {"name": "acquirer", "state": "open"}) == 1.0
        assert get(state, {"name": "acquirer", "state": "closed"}) == 1.0
        assert get(state, {"name": "acquirer", "state": "half_open"}) == 0.0

    def test_stalls_are_observed_in_a_histogram(self, multiproc_dir: Path) -> None:
        get = self.collect(multiproc_dir).get_sample_value
        assert (get("r4_event_loop_stalls_total", {"name": "asgi"}) or 0) >= 1
        assert (get("r4_event_loop_stall_seconds_count", {"name": "asgi"}) or 0) >= 1
        assert (get("r4_event_loop_stall_seconds_sum", {"name": "asgi"}) or 0) >= 0.1
        assert get("r4_event_loop_stall_seconds_bucket", {"name": "asgi", "le": "0.02"}) == 0.0

    def test_django_prometheus_view_reads_the_directory(
        self, multiproc_dir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from django_prometheus.exports import ExportToDjangoView

        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(multiproc_dir))
        body = ExportToDjangoView(RequestFactory().get("/metrics")).content.decode()
        assert 'resilience4j_ratelimiter_calls_total{kind="successful",name="slow"} 14.0' in body
        assert "resilience4j_ratelimiter_available_permissions{" in body


def test_gcra_and_sliding_window_limiters_export_their_state(installed: None, r4_clock: Any) -> None:
    """The smooth algorithms answer the same metrics: available permissions now, calls, wait for one permit."""

    from tests import views

    setting = views.r4_settings()
    setting["ratelimiters"]["instances"]["api"].update({"algorithm": "gcra", "burst": 2})
    setting["ratelimiters"]["instances"]["slow"].update({"algorithm": "sliding_window"})
    with override_settings(RATELIMIT_R4=setting):
        for name in ("api", "slow"):
            limiter = r4.get_rate_limiter(name)
            for _ in range(3):
                limiter.acquire_permission()
        assert value("resilience4j_ratelimiter_available_permissions", name="api") == 0
        assert value("resilience4j_ratelimiter_available_permissions", name="slow") == 7
        assert "resilience4j_ratelimiter" in exposition()


class _UnbuildableStore:
    """A third-party backend (``BACKEND`` by dotted path) whose store cannot be built: its server is away."""

    def __init__(self, alias: str, location: str | None, options: Any) -> None:
        raise ConnectionError("the cluster's seed nodes do not answer")


class _UnreadableBackend:
    """A rate-limiter backend (``backend_factory``'s product) that decides but cannot report its state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from django_ratelimit_r4.backends.memory import MemoryBackend

        self._inner = MemoryBackend(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("state", "available_permissions", "metrics"):
            raise RuntimeError("this backend cannot report its state")
        return getattr(self._inner, name)


class _UnreadableStore:
    def __init__(self, alias: str, location: str | None, options: Any) -> None:
        from django_ratelimit_r4.backends.memory import MemoryStore

        self._inner = MemoryStore(alias, location, options)

    def backend_factory(self, on_error: str | None) -> Any:
        return _UnreadableBackend

    def keyed_store(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.keyed_store(*args, **kwargs)


@pytest.mark.parametrize("broken", ["unbuildable", "unreadable"])
def test_an_instance_that_cannot_be_built_or_read_does_not_hide_the_others(
    installed: None, broken: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One rate limiter whose backend cannot be built (or read) is left out of the scrape, with a warning that
    names it; every other instance's series are still exported (failed before: a scrape had no r4 series)."""
    store = {"unbuildable": "_UnbuildableStore", "unreadable": "_UnreadableStore"}[broken]
    setting = {
        "backends": {"away": {"BACKEND": f"{__name__}.{store}"}},
        "ratelimiters": {
            "instances": {
                "before": {"limit_for_period": 3, "limit_refresh_period": "1h"},
                "broken": {"limit_for_period": 3, "limit_refresh_period": "1h", "backend": "away"},
                "broken_ip": {"limit_for_period": 3, "limit_refresh_period": "1h", "backend": "away", "key": "ip"},
                "after": {"limit_for_period": 4, "limit_refresh_period": "1h"},
            }
        },
        "bulkheads": {"instances": {"db": {"max_concurrent_calls": 2}}},
    }
    with override_settings(RATELIMIT_R4=setting), caplog.at_level(logging.WARNING):
        assert r4.get_rate_limiter("before").acquire_permission()
        assert value("resilience4j_ratelimiter_available_permissions", name="before") == 2
        assert value("resilience4j_ratelimiter_available_permissions", name="after") == 4
        assert value("resilience4j_bulkhead_max_allowed_concurrent_calls", name="db") == 2
        assert value("resilience4j_ratelimiter_available_permissions", name="broken") is None
    assert any("'broken'" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
