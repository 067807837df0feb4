"""Fixtures of the Redis backend tests (the `redis_url` fixture is in tests/conftest.py).

Nothing a test does in Redis reaches the next test: its keys live under its own prefix and are deleted
afterwards, and every connection (with its fault cool-down) is closed after each test.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.redis_prefix import close_and_delete

from .redis_cluster import ClusterUnavailable, LocalCluster

_PREFIXES: list[tuple[str, str]] = []  # (redis_url, prefix) handed out in this session


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test only; its keys are deleted afterwards.

    Request it before ``r4_clock`` (or a fixture using it): ``r4_clock``'s teardown resets the limiters, which
    writes their anchors again, and fixtures are torn down in reverse order. A session-end sweep deletes
    whatever a teardown wrote after this one anyway.
    """
    value = f"r4test:{uuid.uuid4().hex[:12]}"
    _PREFIXES.append((redis_url, value))
    yield value
    # The threads of the test's breakers and bulkheads first: one would write under the prefix after the delete.
    close_and_delete(redis_url, value)


@pytest.fixture(scope="session", autouse=True)
def _sweep_prefixes() -> Iterator[None]:
    yield
    for url, value in _PREFIXES:
        close_and_delete(url, value)


@pytest.fixture(autouse=True)
def _fresh_connections() -> Iterator[None]:
    yield
    from django_ratelimit_r4.backends import redis as rb

    rb.close_connections()


class RedisServer:
    """A throwaway ``redis-server`` on a free loopback port that a test may stop, restart, pause and resume."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start (or restart) the server and wait until it answers PING."""
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)
            finally:
                client.close()

    def stop(self) -> None:
        """Kill the server: connections are refused until :meth:`start`."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel but nothing answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A dedicated redis-server of this test (skips without the binary unless R4_REQUIRE_REDIS=1)."""
    if shutil.which("redis-server") is None:
        if os.environ.get("R4_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server is required (R4_REQUIRE_REDIS=1) but not installed")
        pytest.skip("redis-server not installed")
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.process is not None:
            server.resume()
        server.stop()


def require_tool(name: str) -> None:
    """Fail (``R4_REQUIRE_REDIS=1``) or skip when the command ``name`` is not installed."""
    if shutil.which(name) is None:
        if os.environ.get("R4_REQUIRE_REDIS") == "1":
            pytest.fail(f"{name} is required (R4_REQUIRE_REDIS=1) but not installed")
        pytest.skip(f"{name} not installed")


def start_cluster_or_fail(workdir: Path) -> LocalCluster:
    """A started :class:`LocalCluster`; when it cannot start, a failure under ``R4_REQUIRE_REDIS=1`` (CI must
    not skip the cluster tests), else a skip."""
    cluster = LocalCluster(workdir)
    try:
        cluster.start()
    except (ClusterUnavailable, OSError, subprocess.SubprocessError) as exc:
        cluster.stop()
        if os.environ.get("R4_REQUIRE_REDIS") == "1":
            pytest.fail(f"a Redis Cluster is required (R4_REQUIRE_REDIS=1) but could not start: {exc}")
        pytest.skip(f"no Redis Cluster: {exc}")
    return cluster


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real 3-primary Redis Cluster on free loopback ports for the whole session (about 3 s to start),
    stopped at its end."""
    cluster = start_cluster_or_fail(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()
