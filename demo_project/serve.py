"""Run the demo under a production server: ``make demo-gunicorn``, ``make demo-uvicorn``, ``make demo-redis``,
``make demo-cluster``.

    python serve.py gunicorn [--workers 4] [--threads 8] [--port 8000] [--backend memory|redis] [--migrate]
                             [--hosts N] [--control]
    python serve.py uvicorn [--port 8000] [--migrate]

What it sets up, so the servers behave like docs/operations.md says they should:

* a fresh temporary directory, removed at exit, holding ``PROMETHEUS_MULTIPROC_DIR`` (gunicorn only: empty
  at every start, as prometheus_client requires) and ``DEMO_STATE_DIR`` (the simulated partner's knobs,
  shared by the workers, because "partner down" must mean down for all of them);
* gunicorn with ``gunicorn.conf.py`` (the ``worker_exit`` / ``child_exit`` hooks), gthread workers;
* uvicorn ``demo.asgi:application`` (one worker: the stall detector from ``monitor_asgi`` watches its loop);
* ``--backend redis``: ``DEMO_BACKEND=redis``; if nothing answers at ``--redis-url`` and ``redis-server``
  is installed, a throwaway one (no persistence) is started on that port and stopped at exit.
* ``--hosts N`` (gunicorn): N gunicorn masters on ports ``--port`` .. ``--port + N - 1``, standing for N hosts
  (each its own ``PROMETHEUS_MULTIPROC_DIR``, so each is its own scrape target); ``--control`` (with
  ``--backend redis``): ``DEMO_CONTROL=1``, the control plane on the Redis backend, so ``manage.py r4`` sees and
  steers every worker of every "host".

Ctrl-C (or SIGTERM) stops the server, then the throwaway Redis, then removes the directory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("server", choices=["gunicorn", "uvicorn"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn worker processes (default 4)")
    parser.add_argument("--threads", type=int, default=8, help="threads per gunicorn worker (default 8)")
    parser.add_argument("--backend", choices=["memory", "redis"], default="memory")
    parser.add_argument("--redis-url", default=os.environ.get("DEMO_REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--migrate", action="store_true", help="run manage.py migrate first")
    parser.add_argument("--hosts", type=int, default=1, help="gunicorn servers on consecutive ports (default 1)")
    parser.add_argument("--control", action="store_true", help="the control plane on Redis (needs --backend redis)")
    args = parser.parse_args(argv)
    if args.hosts < 1 or (args.hosts > 1 and args.server != "gunicorn"):
        parser.error("--hosts takes a number >= 1, and more than 1 only with gunicorn")
    if args.control and args.backend != "redis":
        parser.error("--control needs --backend redis (the control plane lives in Redis)")
    return args


def server_command(args: argparse.Namespace, port: int | None = None) -> list[str]:
    """The gunicorn or uvicorn command line (on ``port``, by default ``--port``)."""
    bind = f"{args.host}:{args.port if port is None else port}"
    if args.server == "gunicorn":
        return [sys.executable, "-m", "gunicorn", "demo.wsgi:application", "--config", str(HERE / "gunicorn.conf.py"),
                "--bind", bind, "--workers", str(args.workers), "--worker-class", "gthread",
                "--threads", str(args.threads), "--graceful-timeout", "5"]
    return [sys.executable, "-m", "uvicorn", "demo.asgi:application", "--host", args.host, "--port", str(args.port),
            "--lifespan", "off", "--timeout-graceful-shutdown", "5", "--no-access-log"]


def redis_answers(url: str, timeout: float = 0.5) -> bool:
    """True when something at ``url`` answers PING."""
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout).ping())
    except (redis.RedisError, OSError):
        return False


def start_redis(url: str) -> subprocess.Popen[bytes] | None:
    """Start a throwaway redis-server for ``url`` unless one answers already; None if nothing was started."""
    if redis_answers(url):
        return None
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    binary = shutil.which("redis-server")
    if host not in ("127.0.0.1", "localhost") or binary is None:
        sys.exit(f"serve.py: nothing answers at {url}; start Redis there (or pass --redis-url)")
    process = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                                "--appendonly", "no"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not redis_answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            sys.exit(f"serve.py: could not start redis-server on port {port}")
        time.sleep(0.05)
    print(f"serve.py: started a throwaway redis-server on {host}:{port} (stopped at exit)", flush=True)
    return process


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port yet (a clear message beats gunicorn's retry loop)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((host, port)) != 0


def server_environment(args: argparse.Namespace, tmp: Path) -> dict[str, str]:
    """The server's environment: the demo's settings, its backend, a state dir under ``tmp``."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "demo.settings", "DEMO_BACKEND": args.backend,
           "DEMO_REDIS_URL": args.redis_url, "DEMO_STATE_DIR": str(tmp / "state"),
           "DEMO_CONTROL": "1" if getattr(args, "control", False) else "0",
           # Django exports settings.TIME_ZONE as $TZ in the processes that load it (gunicorn's workers,
           # not its master): give the master the same zone, so every log line shows one time zone.
           "TZ": "UTC"}
    # The demo and the checkout's package, importable without installing (like manage.py does).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), str(HERE.parent), env.get("PYTHONPATH")) if p)
    return env


def main(argv: list[str] | None = None) -> int:
    """Set the environment up, run the server until it exits or we are told to stop, clean up."""
    args = parse_args(argv)
    ports = [args.port + i for i in range(args.hosts)]
    for port in ports:
        if not port_is_free(args.host, port):
            print(f"serve.py: {args.host}:{port} is in use (another demo running?); use --port", file=sys.stderr)
            return 2
    tmp = Path(tempfile.mkdtemp(prefix="r4-demo-"))
    env = server_environment(args, tmp)
    (tmp / "state").mkdir()
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    redis_process: subprocess.Popen[bytes] | None = None
    servers: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for each in servers:
            if each.poll() is None:
                each.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        if args.backend == "redis":
            redis_process = start_redis(args.redis_url)
        if args.migrate:
            subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=HERE, env=env,
                           check=True)
        if stopping:
            return 0
        extra = f", {args.workers} workers, {args.backend} backend" if args.server == "gunicorn" else ""
        extra += ", control plane on Redis" if args.control else ""
        for index, port in enumerate(ports):
            host_env = dict(env)
            if args.server == "gunicorn":  # each "host" is its own scrape target: a directory of its own
                directory = tmp / ("prometheus" if len(ports) == 1 else f"prometheus-{index}")
                directory.mkdir()  # fresh and empty at every start
                host_env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
            name = "" if len(ports) == 1 else f" (host {index + 1} of {len(ports)})"
            print(f"serve.py: {args.server}{extra} on http://{args.host}:{port}/{name}  (Ctrl-C stops)", flush=True)
            servers.append(subprocess.Popen(server_command(args, port), cwd=HERE, env=host_env))
        while True:
            try:
                codes = [each.wait(timeout=15) if not stopping else each.wait(timeout=10) for each in servers]
                return max(codes)
            except subprocess.TimeoutExpired:
                if stopping:
                    for each in servers:
                        each.kill()
    finally:
        for each in servers:
            if each.poll() is None:
                each.kill()
                each.wait()
        if redis_process is not None:
            redis_process.terminate()
            redis_process.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
