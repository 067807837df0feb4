"""The control plane across processes: two gunicorn servers (two "hosts" on two ports) x 2 sync workers, one Redis.

The site is ``tests/cluster`` (settings, urls, gunicorn_conf.py with the documented ``post_worker_init`` hook);
``/pay/`` is guarded by breaker ``payments``. The test process is not a worker: it runs ``manage.py r4`` with the
same settings, locally and through ``--url``. Shown: ``r4 status`` lists the 4 workers, ``r4 transition`` reaches
all 4 (and says so) so that every worker answers 503, a ``kill -9``-ed worker disappears after its heartbeat's
TTL while its replacement applies the forced-open state, and a clean stop leaves the list at once.
Waits are polls with a generous deadline (hang guards), never timing assertions.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from tests.redis_prefix import close_and_delete

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gunicorn") is None, reason="gunicorn not installed")

ROOT = Path(__file__).resolve().parents[1]
HANG_GUARD_S = 30.0
TOKEN = "cluster-test-token-" + "x" * 32


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _until(predicate: Any, what: str, logs: list[Path] | None = None) -> Any:
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = "".join(f"\n--- {log}:\n{log.read_text()[-3000:]}" for log in logs or [])
            pytest.fail(f"not in {HANG_GUARD_S}s: {what}{detail}")
        time.sleep(0.05)


class Host:
    """One gunicorn master with two sync workers on a socket the test bound (no port race)."""

    def __init__(self, directory: Path, name: str, redis_url: str, prefix: str) -> None:
        self.log = directory / f"{name}.log"
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.cluster.settings",
            "R4_CONTROL_REDIS_URL": redis_url,
            "R4_CONTROL_PREFIX": prefix,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        command = [
            sys.executable,
            "-m",
            "gunicorn",
            "--config",
            str(ROOT / "tests" / "cluster" / "gunicorn_conf.py"),
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
                start_new_session=True,
            )

    def fire(self, path: str, n: int) -> list[int]:
        """``n`` GETs of ``path``, 4 in flight (so both workers answer)."""
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda _: _get(self.base + path), range(n)))

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.sock.close()


@pytest.fixture
def hosts(tmp_path: Path, redis_url: str, settings: Any) -> Iterator[tuple[Host, Host, str]]:
    prefix = f"r4test:{uuid.uuid4().hex[:12]}"
    # The command's own settings: the same backend and control plane as the servers'.
    settings.RATELIMIT_R4 = {
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": redis_url, "OPTIONS": {"key_prefix": prefix}}},
        "control": {"backend": "shared", "heartbeat_interval": "200ms"},
        "state_endpoint_token": TOKEN,
        "circuitbreakers": {"instances": {"payments": {"wait_duration_in_open_state": "60s"}}},
        "bulkheads": {"instances": {"partner": {"max_concurrent_calls": 3, "backend": "shared", "lease_ttl": "2s"}}},
        "ratelimiters": {"instances": {"api": {"limit_for_period": 1000}}},
    }
    a = Host(tmp_path, "host-a", redis_url, prefix)
    b = Host(tmp_path, "host-b", redis_url, prefix)
    try:
        yield a, b, prefix
    finally:
        a.stop()
        b.stop()
        close_and_delete(redis_url, prefix)  # this process's own cluster-wide instances too (the command's)


def r4(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("r4", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _status(*extra: str) -> dict[str, Any]:
    view = json.loads(r4("status", "--json", *extra)[0])
    assert view["scope"] == "cluster"
    return view


def _breaker_total(view: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in view["totals"] if t["type"] == "circuitbreaker" and t["name"] == "payments")


def test_status_transition_and_a_dead_worker_across_two_hosts(hosts: tuple[Host, Host, str]) -> None:
    a, b, _ = hosts
    logs = [a.log, b.log]
    _until(lambda: len(_status()["workers"]) == 4, "4 workers listed by r4 status", logs)
    workers = _status()["workers"]
    pids = {w["pid"] for w in workers}
    assert len(pids) == 4 and os.getpid() not in pids  # the command itself is no worker
    assert a.fire("/pay/", 8) == [200] * 8 and b.fire("/pay/", 8) == [200] * 8

    # --timeout: the command returns once all 4 acknowledged; a shorter one is a bet on a loaded machine.
    out, _ = r4("transition", "payments", "--to", "FORCED_OPEN", "--timeout", f"{HANG_GUARD_S:g}")
    assert "acknowledged by 4 of 4 live worker(s)" in out, out
    acked = {int(line.split(" pid ")[1].split(":")[0]) for line in out.splitlines()[1:]}
    assert acked == pids
    assert out.count("CLOSED -> FORCED_OPEN") == 4
    # Every worker acknowledged after applying it: all four answer 503 now, on both hosts.
    assert a.fire("/pay/", 12) == [503] * 12 and b.fire("/pay/", 12) == [503] * 12

    # Through either host's state endpoint: the same cluster view.
    remote = _status("--url", b.base + "/ops/r4/", "--token", TOKEN)
    assert {w["pid"] for w in remote["workers"]} == pids
    _until(lambda: _breaker_total(_status())["state"]["states"] == {"FORCED_OPEN": 4}, "the heartbeats after it")

    # kill -9 one worker: gunicorn starts a replacement, which applies the stored FORCED_OPEN when its control
    # plane starts; the dead one drops out of the list once its heartbeat expires (3 x 200 ms).
    victim = sorted(pids)[0]
    os.kill(victim, signal.SIGKILL)
    _until(
        lambda: (lambda v: victim not in {w["pid"] for w in v["workers"]} and len(v["workers"]) == 4)(_status()),
        "the killed worker to disappear and its replacement to appear",
        logs,
    )
    _until(lambda: _breaker_total(_status())["state"]["states"] == {"FORCED_OPEN": 4}, "the replacement's state")
    assert a.fire("/pay/", 12) == [503] * 12 and b.fire("/pay/", 12) == [503] * 12

    out, _ = r4(
        "transition", "payments", "--to", "CLOSED", "--timeout", f"{HANG_GUARD_S:g}", "--url", a.base + "/ops/r4/",
        "--token", TOKEN,
    )
    assert "acknowledged by 4 of 4 live worker(s)" in out, out
    assert a.fire("/pay/", 8) == [200] * 8 and b.fire("/pay/", 8) == [200] * 8

    # A clean stop (worker_exit hook) leaves the list at once, without waiting for the TTL.
    a.stop()
    _until(lambda: len(_status()["workers"]) == 2, "host a's workers to leave", logs)
