"""Prometheus export under a real gunicorn: 2 sync workers, PROMETHEUS_MULTIPROC_DIR, the documented hooks.

The site is ``tests.contrib.gunicorn_settings`` / ``gunicorn_urls``: ``/api/`` is ``@ratelimit("api")``
(10 per second *per worker*), ``/force-open/`` forces this worker's breaker ``payments`` open and
``/metrics`` is django-prometheus' view, which reads every worker's files. The hooks are in
``gunicorn_conf.py``. Every response the test gets is tallied, and the exported counters must equal the
tally exactly: summed over both workers, after the syncer's interval (polled, with a deadline), and
after shutdown (``worker_exit`` flush; ``child_exit`` drops the dead workers' gauges).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gunicorn") is None, reason="gunicorn not installed")

ROOT = Path(__file__).resolve().parents[2]
CALLS = "resilience4j_ratelimiter_calls_total"
STATE = "resilience4j_circuitbreaker_state"
BOOT_TIMEOUT_S = 30.0
SYNC_DEADLINE_S = 10.0  # the syncer pushes every 1 s; this only bounds a broken run


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


class Site:
    """One gunicorn master with two sync workers, on a socket the test bound (no port race)."""

    def __init__(self, directory: Path) -> None:
        self.multiproc_dir = directory / "prometheus"
        self.multiproc_dir.mkdir()
        self.log = directory / "gunicorn.log"
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        #: Status codes of every /api/ response so far, and the worker pids that answered 200.
        self.tally: Counter[int] = Counter()
        self.pids: set[str] = set()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.contrib.gunicorn_settings",
            "PROMETHEUS_MULTIPROC_DIR": str(self.multiproc_dir),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        command = [
            sys.executable,
            "-m",
            "gunicorn",
            "--config",
            str(ROOT / "tests" / "contrib" / "gunicorn_conf.py"),
            "--workers",
            "2",
            "--worker-class",
            "sync",
            "--bind",
            f"fd://{self.sock.fileno()}",
            "--graceful-timeout",
            "10",
            "django.core.wsgi:get_wsgi_application()",
        ]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(self.sock.fileno(),),
                start_new_session=True,  # its own process group: the finally kills master and workers
            )

    def url(self, path: str) -> str:
        return self.base + path

    def wait_until_serving(self) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while True:
            assert self.process.poll() is None, f"gunicorn exited:\n{self.log.read_text()}"
            try:
                if _get(self.url("/metrics"))[0] == 200:
                    return
            except OSError:
                pass  # workers still booting; the listening socket queues the connection meanwhile
            assert time.monotonic() < deadline, f"gunicorn did not serve in time:\n{self.log.read_text()}"
            time.sleep(0.05)

    def fire(self, n: int, threads: int = 4) -> None:
        """``n`` concurrent GET /api/ (several in flight, so both workers answer), tallied."""
        with ThreadPoolExecutor(threads) as pool:
            responses = list(pool.map(lambda _: _get(self.url("/api/")), range(n)))
        for status, headers, _ in responses:
            assert status in (200, 429), status
            self.tally[status] += 1
            if status == 200:
                self.pids.add(headers["X-Worker-Pid"])
            else:
                assert int(headers["Retry-After"]) >= 1  # a real rejection by the limiter

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, _, body = _get(self.url("/metrics"))
        assert status == 200
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
        }

    def stop(self) -> int | None:
        """SIGTERM the master (graceful: workers run ``worker_exit``), SIGKILL the group if it hangs."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        _kill_group(self.process.pid)
        self.sock.close()
        return self.process.returncode


def _kill_group(pgid: int) -> None:
    """No process of the group outlives the test (e.g. a worker orphaned by a crashed master)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], metric: str, /, **labels: str
) -> float:
    """A sample of a scrape (0 when absent, like an untouched counter)."""
    return samples.get((metric, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    server = Site(tmp_path_factory.mktemp("gunicorn"))
    try:
        server.wait_until_serving()
        yield server
    finally:
        server.stop()


def fire_until_both_workers_answered(site: Site, n: int = 40) -> None:
    deadline = time.monotonic() + 10
    site.fire(n)
    while len(site.pids) < 2:
        assert time.monotonic() < deadline, f"only worker(s) {site.pids} answered"
        site.fire(8)


def test_calls_total_summed_over_workers_equals_the_responses(site: Site) -> None:
    fire_until_both_workers_answered(site)
    assert site.tally[200] > 0 and site.tally[429] > 0, site.tally  # 10/s per worker: both kinds happen
    deadline = time.monotonic() + SYNC_DEADLINE_S
    while True:  # the workers' syncers push once a second
        samples = site.scrape()
        successful = value(samples, CALLS, name="api", kind="successful")
        failed = value(samples, CALLS, name="api", kind="failed")
        if successful + failed >= site.tally.total():
            break
        assert time.monotonic() < deadline, (successful, failed, site.tally)
        time.sleep(0.1)
    assert (successful, failed) == (site.tally[200], site.tally[429])
    # liveall gauge: one series per worker that has the limiter.
    per_pid = {
        dict(labels)["pid"]
        for (name, labels) in samples
        if name == "resilience4j_ratelimiter_available_permissions" and dict(labels)["name"] == "api"
    }
    assert per_pid == site.pids


def test_forced_open_breaker_is_exported_by_the_transition_itself(site: Site) -> None:
    deadline = time.monotonic() + SYNC_DEADLINE_S
    while value(site.scrape(), STATE, name="payments", state="closed") != 1.0:  # synced as CLOSED first
        assert time.monotonic() < deadline
        time.sleep(0.1)
    before = site.scrape()
    assert value(before, STATE, name="payments", state="forced_open") == 0.0
    status, _, _ = _get(site.url("/force-open/"))
    assert status == 200
    # The very next scrape: the transition listener wrote the gauge before the response was sent,
    # while the syncer could take up to a second.
    after = site.scrape()
    assert value(after, STATE, name="payments", state="forced_open") == 1.0
    if len(site.pids) == 2:  # both workers served and synced: livemax keeps the other one's CLOSED
        assert value(after, STATE, name="payments", state="closed") == 1.0


def test_shutdown_flushes_the_last_counts_and_drops_dead_workers_gauges(site: Site) -> None:
    site.fire(12)  # then stop at once: these have probably not been synced yet
    assert site.stop() == 0, site.log.read_text()
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(site.multiproc_dir))
    get = registry.get_sample_value
    assert get(CALLS, {"name": "api", "kind": "successful"}) == site.tally[200]
    assert get(CALLS, {"name": "api", "kind": "failed"}) == site.tally[429]
    # child_exit -> mark_process_dead removed every live* gauge file of the two workers.
    names = {sample.name for metric in registry.collect() for sample in metric.samples}
    assert "resilience4j_ratelimiter_available_permissions" not in names
    assert STATE not in names
    assert CALLS in names
