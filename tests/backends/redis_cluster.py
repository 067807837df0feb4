"""A throwaway 3-primary Redis Cluster on free loopback ports (the ``redis_cluster`` fixture's engine)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["ClusterUnavailable", "LocalCluster"]


class ClusterUnavailable(RuntimeError):
    """The cluster could not be started (binaries missing, or it never reached cluster_state:ok)."""


def _free_ports(n: int) -> list[int]:
    # Cluster bus ports are port + 10000: both must be free. Sockets stay open until all are chosen.
    socks, ports = [], []
    try:
        while len(ports) < n:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            socks.append(sock)
            if port + 10000 > 65535:
                continue
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            ports.append(port)
    finally:
        for sock in socks:
            sock.close()
    return ports


class LocalCluster:
    """``redis-server --cluster-enabled yes`` x ``size`` + ``redis-cli --cluster create``, on 127.0.0.1."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.workdir = workdir
        self.size = size
        self.ports: list[int] = []
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """A start-node URL (the first node; any node works)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the nodes, create the cluster, wait for ``cluster_state:ok`` on every node."""
        for tool in ("redis-server", "redis-cli"):
            if shutil.which(tool) is None:
                raise ClusterUnavailable(f"{tool} is not installed")
        self.ports = _free_ports(self.size)
        for port in self.ports:
            node_dir = self.workdir / str(port)
            node_dir.mkdir(parents=True, exist_ok=True)
            self.processes.append(
                subprocess.Popen(
                    ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                     "--cluster-config-file", str(node_dir / "nodes.conf"), "--save", "", "--appendonly", "no",
                     "--dir", str(node_dir)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + timeout_s
        for port in self.ports:
            while self._cli(port, "ping") != "PONG":
                self._check(deadline, f"node {port} does not answer PING")
        created = subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )
        if created.returncode != 0:
            raise ClusterUnavailable(f"redis-cli --cluster create failed: {created.stdout}{created.stderr}")
        for port in self.ports:
            while "cluster_state:ok" not in self._cli(port, "cluster", "info"):
                self._check(deadline, f"node {port} never reached cluster_state:ok")

    def _check(self, deadline: float, what: str) -> None:
        for proc in self.processes:
            if proc.poll() is not None:
                raise ClusterUnavailable(f"a redis-server exited ({proc.returncode}): {what}")
        if time.monotonic() > deadline:
            raise ClusterUnavailable(what)
        time.sleep(0.05)

    @staticmethod
    def _cli(port: int, *args: str) -> str:
        try:
            done = subprocess.run(
                ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
                capture_output=True, text=True, timeout=5, check=False,
            )
        except subprocess.TimeoutExpired:
            return ""
        return done.stdout.strip()

    def stop(self) -> None:
        """Kill every node (the working directory is the caller's tmp dir)."""
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
        for proc in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.processes = []
