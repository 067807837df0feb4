"""Sentinel-managed primaries and TLS (issue 11), against real servers: a primary, a replica and a Sentinel
on free loopback ports (a forced failover moves the budget to the new primary), and a ``redis-server`` with
``--tls-port`` and a throwaway CA made by ``openssl``. Plus the system check E034 for options that cannot
work together."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig  # noqa: E402

from .conftest import _free_port, require_tool  # noqa: E402

CONFIG = RateLimiterConfig(limit_for_period=5, limit_refresh_period="60s", timeout_duration=0)


def _start(args: list[str], port: int, tls: dict[str, Any] | None = None) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_connect_timeout=0.5, **(tls or {}))
    deadline = time.monotonic() + 15
    try:
        while True:
            try:
                client.ping()
                return proc
            except redis.RedisError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(f"{args[0]} on port {port} did not start") from None
                time.sleep(0.02)
    finally:
        client.close()


class SentinelSetup:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.primary, self.replica, self.sentinel = _free_port(), _free_port(), _free_port()
        self.service = f"r4-{uuid.uuid4().hex[:6]}"

    def start(self) -> None:
        base = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        self.procs.append(
            _start(["redis-server", "--port", str(self.primary), "--repl-diskless-sync-delay", "0", *base], self.primary)
        )
        self.procs.append(
            _start(["redis-server", "--port", str(self.replica), "--replicaof", "127.0.0.1", str(self.primary), *base],
                   self.replica)
        )
        self.wait(self.replica_in_sync, "the replica to sync")
        conf = self.workdir / "sentinel.conf"
        conf.write_text(
            f"port {self.sentinel}\nbind 127.0.0.1\ndir {self.workdir}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.primary} 1\n"
            f"sentinel down-after-milliseconds {self.service} 2000\n"
            f"sentinel failover-timeout {self.service} 5000\n"
        )
        self.procs.append(_start(["redis-server", str(conf), "--sentinel"], self.sentinel))
        # The Sentinel must know the replica before a failover can pick it.
        self.wait(lambda: self.sentinel_cmd("SENTINEL", "REPLICAS", self.service), "the Sentinel to see the replica")

    def replica_in_sync(self) -> bool:
        client = redis.Redis(port=self.replica, socket_timeout=2)
        try:
            return bool(client.info("replication").get("master_link_status") == "up")
        finally:
            client.close()

    def sentinel_cmd(self, *args: Any) -> Any:
        client = redis.Redis(port=self.sentinel, socket_timeout=2)
        try:
            return client.execute_command(*args)
        finally:
            client.close()

    @staticmethod
    def wait(condition: Any, what: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout  # a hang guard: each check is an event, not a timing claim
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait(10)


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[SentinelSetup]:
    require_tool("redis-server")
    setup = SentinelSetup(tmp_path)
    try:
        setup.start()
    except (RuntimeError, AssertionError, OSError) as exc:
        setup.stop()
        pytest.fail(f"a Sentinel setup could not start: {exc}")
    try:
        yield setup
    finally:
        setup.stop()


def test_a_sentinel_managed_primary_decides_and_follows_a_failover(sentinel: SentinelSetup) -> None:
    options = {"sentinel": [f"127.0.0.1:{sentinel.sentinel}"], "socket_timeout": 1.0}
    url = f"redis://{sentinel.service}/0"
    prefix = f"r4s:{uuid.uuid4().hex[:8]}"
    rl = RateLimiter("api", CONFIG, backend=rb.redis_backend(url, prefix=prefix, connection_options=options))
    assert [rl.acquire_permission() for _ in range(3)] == [True] * 3
    conn = rl.backend._connection()
    assert conn.sync.connection_pool.get_master_address() == ("127.0.0.1", sentinel.primary)

    async def async_two() -> list[bool]:
        return [await rl.aacquire_permission() for _ in range(2)]

    assert asyncio.run(async_two()) == [True, True]
    # The replica has the state; a forced failover promotes it and the budget stays spent.
    primary = redis.Redis(port=sentinel.primary)
    assert primary.execute_command("WAIT", 1, 10_000) == 1
    primary.close()
    def failover_started() -> bool:
        try:
            sentinel.sentinel_cmd("SENTINEL", "FAILOVER", sentinel.service)
            return True
        except redis.ResponseError as exc:  # NOGOODSLAVE until the Sentinel has the replica's INFO
            assert "NOGOODSLAVE" in str(exc)
            return False

    sentinel.wait(failover_started, "the Sentinel to accept a failover")
    sentinel.wait(
        lambda: sentinel.sentinel_cmd("SENTINEL", "GET-MASTER-ADDR-BY-NAME", sentinel.service)[1] == str(sentinel.replica).encode(),
        "the Sentinel to name the replica primary",
    )

    def answered_by_new_primary() -> bool:
        rb.close_connections()  # connections to the old primary are dropped (clients reconnect through Sentinel)
        return bool(rl.backend._connection().sync.connection_pool.get_master_address() == ("127.0.0.1", sentinel.replica)
                    and rl.backend.state()[1] == 0 and rl.backend.faults == 0)

    sentinel.wait(answered_by_new_primary, "decisions on the new primary")
    assert not rl.acquire_permission()  # 5 of 5 spent before the failover


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_pooled_async_connection_the_primary_closed_is_reopened_not_a_fault(
    sentinel: SentinelSetup, protocol: int
) -> None:
    """As tests/backends/test_redis_server_closed.py, on a Sentinel-managed pool (whose connections redis-py 8.1
    already reopens: the plain pool's fix is not needed here, this pins it)."""
    options = {"sentinel": [f"127.0.0.1:{sentinel.sentinel}"], "socket_timeout": 5.0, "protocol": protocol}
    url = f"redis://{sentinel.service}/0"
    prefix = f"r4s:{uuid.uuid4().hex[:8]}"
    backend = rb.redis_backend(url, prefix=prefix, fault_policy="closed", connection_options=options)
    rl = RateLimiter("closed-by-primary", CONFIG, backend=backend)

    def kill_ours() -> None:
        admin = redis.Redis(port=sentinel.primary)
        try:
            own = str(admin.client_id())
            for client in admin.client_list():
                if client["id"] != own and not client["name"].startswith("sentinel"):
                    admin.client_kill_filter(_id=client["id"])
        finally:
            admin.close()

    async def main() -> None:
        assert await rl.aacquire_permission()
        conn = rl.backend._connection()
        (ours,) = conn.aio().connection_pool._available_connections
        await asyncio.to_thread(kill_ours)
        for _ in range(2000):  # bounded: until the loop has seen the primary's close
            if ours._reader is None or ours._reader.at_eof():
                break
            await asyncio.sleep(0.005)
        assert await rl.aacquire_permission()  # fault policy "closed": True is Redis's answer
        assert rl.backend.faults == 0 and conn.server_faults == 0

    asyncio.run(main())


# -------------------------------------------------------------------------------------------------- TLS


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    require_tool("redis-server")
    require_tool("openssl")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True, timeout=60)

    # The extensions Python 3.13's VERIFY_X509_STRICT (its default) requires of a CA and a server certificate.
    (tmp_path / "ca.cnf").write_text(
        "[req]\ndistinguished_name = dn\nx509_extensions = v3_ca\nprompt = no\n[dn]\nCN = r4-test-ca\n"
        "[v3_ca]\nbasicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\n"
        "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid:always\n"
    )
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-config", "ca.cnf")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (tmp_path / "ext.cnf").write_text(
        "subjectAltName = DNS:localhost, IP:127.0.0.1\nbasicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\nextendedKeyUsage = serverAuth\n"
        "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid, issuer\n"
    )
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "server.crt", "-days", "2", "-extfile", "ext.cnf")
    port = _free_port()
    ca = tmp_path / "ca.crt"
    try:
        proc = _start(
            ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--tls-cert-file",
             str(tmp_path / "server.crt"), "--tls-key-file", str(tmp_path / "server.key"), "--tls-ca-cert-file",
             str(ca), "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
            port,
            {"ssl": True, "ssl_ca_certs": str(ca)},
        )
    except RuntimeError as exc:
        pytest.fail(f"redis-server with --tls-port could not start: {exc}")
    try:
        yield f"rediss://127.0.0.1:{port}/0", ca
    finally:
        proc.kill()
        proc.wait(10)


def test_the_test_certificates_pass_strict_x509_verification(tls_server: tuple[str, Path]) -> None:
    """Python 3.13's default context sets VERIFY_X509_STRICT: a CA without keyUsage (or a non-critical
    basicConstraints) and a server certificate without keyUsage / extendedKeyUsage / authorityKeyIdentifier are
    refused there. Checked on every Python by setting the flag, as 3.13 does."""
    url, ca = tls_server
    context = ssl.create_default_context(cafile=str(ca))
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        assert tls.version() is not None


def test_tls_decisions_sync_and_async(tls_server: tuple[str, Path]) -> None:
    url, ca = tls_server
    options = {"ssl_ca_certs": str(ca)}
    prefix = f"r4t:{uuid.uuid4().hex[:8]}"
    rl = RateLimiter("api", CONFIG, backend=rb.redis_backend(url, prefix=prefix, connection_options=options))
    assert [rl.acquire_permission() for _ in range(3)] == [True] * 3

    async def async_three() -> list[bool]:
        return [await rl.aacquire_permission() for _ in range(3)]

    assert asyncio.run(async_three()) == [True, True, False]
    assert rl.backend.faults == 0
    # Without the CA the certificate is refused: a fault, decided by the fault policy, never a hang.
    rb.close_connections()
    untrusted = RateLimiter(
        "other", CONFIG, backend=rb.redis_backend(url, prefix=prefix, fault_policy="closed")
    )
    assert not untrusted.acquire_permission() and untrusted.backend.faults == 1


# ------------------------------------------------------------------------------------------- E034 check


def _problems(entry: dict[str, Any]) -> list[tuple[str, str]]:
    from django_ratelimit_r4 import conf

    problems: list[Any] = []
    conf._parse_backend_entry("shared", entry, problems)
    return [(p.code.check_id, p.path) for p in problems]


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        ({"LOCATION": "redis://a:7000/0", "OPTIONS": {"cluster": "yes"}}, '["cluster"]'),
        ({"LOCATION": "redis://a:7000/3", "OPTIONS": {"cluster": True}}, '["cluster"]'),
        ({"LOCATION": "unix:///tmp/r.sock", "OPTIONS": {"cluster": True}}, '["cluster"]'),
        ({"LOCATION": "redis://m/0", "OPTIONS": {"cluster": True, "sentinel": ["s:26379"]}}, '["sentinel"]'),
        ({"LOCATION": "redis://m/0", "OPTIONS": {"sentinel": "s:26379"}}, '["sentinel"]'),
        ({"LOCATION": "redis://m/0", "OPTIONS": {"sentinel": ["s"]}}, '["sentinel"]'),
        ({"LOCATION": "unix:///tmp/r.sock", "OPTIONS": {"sentinel": ["s:1"]}}, '["sentinel"]'),
        ({"LOCATION": "redis://a:6379/0", "OPTIONS": {"ssl_ca_certs": __file__}}, '["ssl_ca_certs"]'),
        ({"LOCATION": "rediss://a:6379/0", "OPTIONS": {"ssl_ca_certs": "/nonexistent.pem"}}, '["ssl_ca_certs"]'),
        ({"LOCATION": "rediss://a:6379/0", "OPTIONS": {"ssl_cert_reqs": "always"}}, '["ssl_cert_reqs"]'),
        ({"LOCATION": "rediss://a:6379/0", "OPTIONS": {"ssl_check_hostname": 1}}, '["ssl_check_hostname"]'),
    ],
)
def test_bad_cluster_sentinel_tls_combinations_are_e034(entry: dict[str, Any], where: str) -> None:
    problems = _problems({"BACKEND": "redis", **entry})
    assert problems == [("ratelimit_r4.E034", f'RATELIMIT_R4["backends"]["shared"]["OPTIONS"]{where}')], problems


@pytest.mark.parametrize(
    "entry",
    [
        {"LOCATION": "redis://a:7000/0", "OPTIONS": {"cluster": True}},
        {"LOCATION": "rediss://a:7000", "OPTIONS": {"cluster": True, "ssl_ca_certs": __file__}},
        {"LOCATION": "redis://:pw@mymaster/2", "OPTIONS": {"sentinel": ["10.0.0.1:26379", ("10.0.0.2", 26379)]}},
        {"LOCATION": "rediss://a:6379/0", "OPTIONS": {"ssl_cert_reqs": "none", "ssl_check_hostname": False}},
    ],
)
def test_good_combinations_pass(entry: dict[str, Any]) -> None:
    assert _problems({"BACKEND": "redis", **entry}) == []


def test_sentinel_settings_read_the_location() -> None:
    settings = rb.sentinel_settings("rediss://u:p%40ss@mymaster/3", ["h1:1", "[::1]:2"])
    assert settings == {
        "sentinels": [("h1", 1), ("::1", 2)], "service_name": "mymaster", "db": 3, "username": "u",
        "password": "p@ss", "ssl": True,
    }
    assert rb.sentinel_settings("redis://m/0", None) is None
