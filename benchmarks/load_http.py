"""A real HTTP load test of the demo: wrk against gunicorn (4 workers), in-memory backend vs Redis.

What it measures, per backend, on the demo's ``POST /authorize`` (per-client 10/s + global 200/s, one client,
so nearly every request is a 429: the denied path), with 32 connections for ``--seconds``:

* requests/s and wrk's latency percentiles (p50, p90, p99);
* the latency of ``GET /metrics`` scraped every 0.25 s *while the load runs* (and idle, before it), since a
  scrape that stalls under load hides the very incident it should show;
* a control row, ``GET /healthz/live`` (no limiter at all) under the same load, which tells the scrape's
  share of plain CPU contention from anything the limiters hold.

Run: ``python benchmarks/load_http.py [--seconds 10] [--connections 32] [--workers 4]`` (needs ``wrk`` from
Debian's packages, gunicorn from the ``demo`` extra, and Redis on 127.0.0.1:6379 for the redis row: db 14).
The load generator shares the machine with the server, as on a laptop: compare rows of one run, not
figures across machines. benchmarks/README.md keeps the latest table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "demo_project"
POST_LUA = 'wrk.method = "POST"\nwrk.body = ""\n'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> float:
    """Seconds one GET took (body read)."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        resp.read()
    return time.perf_counter() - started


@contextlib.contextmanager
def demo(backend: str, workers: int, log: Path) -> Iterator[str]:
    """The demo under gunicorn (serve.py, as `make demo-gunicorn` / `make demo-redis`), stopped at exit."""
    port = free_port()
    env = {**os.environ, "DEMO_DB": ":memory:", "PYTHONUNBUFFERED": "1"}
    for name in ("PROMETHEUS_MULTIPROC_DIR", "DEMO_STATE_DIR", "DEMO_BACKEND", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)
    command = [sys.executable, "serve.py", "gunicorn", "--workers", str(workers), "--port", str(port),
               "--backend", backend, "--redis-url", "redis://127.0.0.1:6379/14"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=DEMO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise SystemExit(f"the demo exited early:\n{log.read_text()}")
            with contextlib.suppress(OSError):
                get(url + "/healthz/live", timeout=1)
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the demo did not start:\n{log.read_text()}")
            time.sleep(0.1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def scrape_while(url: str, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError):
            out.append(get(url + "/metrics"))
        stop.wait(0.25)


def parse_wrk(text: str) -> dict[str, float]:
    """requests/s and latency percentiles (ms) from `wrk --latency` output."""
    units = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    row = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))}  # type: ignore[union-attr]
    for pct in ("50", "90", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        row[f"p{pct}"] = float(m.group(1)) * units[m.group(2)] if m else float("nan")
    statuses = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    total = re.search(r"(\d+) requests in", text)
    row["denied_share"] = int(statuses.group(1)) / int(total.group(1)) if statuses and total else 0.0
    return row


def run(backend: str, path: str, method: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    with demo(backend, args.workers, tmp / f"{backend}.log") as url:
        idle = [get(url + "/metrics") for _ in range(5)]
        for _ in range(50):  # warm every worker (imports, connections, first scrape)
            with contextlib.suppress(OSError):
                get(url + "/healthz/live")
        script = tmp / "method.lua"
        script.write_text(POST_LUA if method == "POST" else 'wrk.method = "GET"\n')
        stop, busy = threading.Event(), []
        scraper = threading.Thread(target=scrape_while, args=(url, stop, busy))
        scraper.start()
        try:
            result = subprocess.run(
                ["wrk", "-t", "2", "-c", str(args.connections), "-d", f"{args.seconds}s", "--latency",
                 "-s", str(script), url + path],
                capture_output=True, text=True, check=True,
            )
        finally:
            stop.set()
            scraper.join()
        row = parse_wrk(result.stdout)
        row["scrape_idle_ms"] = statistics.median(idle) * 1000
        row["scrape_load_p50_ms"] = statistics.median(busy) * 1000 if busy else float("nan")
        row["scrape_load_max_ms"] = max(busy) * 1000 if busy else float("nan")
        return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--backends", default="memory,redis")
    parser.add_argument("--no-control", action="store_true", help="skip the GET /healthz/live control row")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("load_http.py needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    print(f"wrk -c {args.connections} -d {args.seconds}s POST /authorize, gunicorn {args.workers} workers "
          f"(gthread, 8 threads), one client: nearly every answer is a 429")
    print(f"{'row':28} {'req/s':>8} {'non-2xx':>8} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} "
          f"{'scrape idle':>11} {'scrape load p50':>15} {'max':>6}")
    rows = [(b, "POST", "/authorize") for b in args.backends.split(",")]
    if not args.no_control:
        rows.append(("memory", "GET", "/healthz/live"))
    with tempfile.TemporaryDirectory(prefix="r4-load-") as tmp:
        for backend, method, path in rows:
            r = run(backend, path, method, args, Path(tmp))
            label = f"{backend} {method} {path}"
            print(f"{label:28} {r['rps']:8.0f} {r['denied_share']:8.1%} {r['p50']:7.1f} {r['p90']:7.1f} "
                  f"{r['p99']:7.1f} {r['scrape_idle_ms']:9.1f}ms {r['scrape_load_p50_ms']:13.1f}ms "
                  f"{r['scrape_load_max_ms']:4.0f}ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
