"""Load generator for the demo: open-loop at a target rate from many clients, one table row per second.

    python load.py --rate 100 --clients 20 --seconds 10          # 100 requests/s from 20 client IPs
    python load.py --threads 20 --seconds 10                     # closed loop: 20 threads, as fast as they can
    python load.py --url http://127.0.0.1:8000/authorize-async   # under uvicorn, the async view

Open loop (``--rate``): request i is due at ``start + i / rate`` whether or not earlier ones answered, like
real clients, and its latency is measured from when it was *due*. A slow server therefore shows up as
latency (queueing included) instead of silently lowering the offered rate ("coordinated omission").

``--clients N`` sends ``X-Forwarded-For: 198.18.x.y`` (RFC 2544's benchmarking range), round robin over N
addresses. The demo trusts exactly one proxy (``"trusted_proxies": 1``), so each address is a client with its
own 10 per second; against a server that trusts no proxy the header is ignored and all requests share one
budget.

Columns: ``ok`` = 200 APPROVED, ``declined`` = 200 DECLINED (the "temporarily unavailable" fallback),
``429``/``503``/``5xx``/``err`` (connection errors and timeouts), ``p50``/``p99`` latency in ms, and the largest
``Retry-After`` seen. Rows are by the second a response arrived.
"""

from __future__ import annotations

import argparse
import collections
import ipaddress
import math
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TextIO

#: The outcome columns, in table order.
OUTCOMES = ("ok", "declined", "429", "503", "5xx", "other", "err")
_FIRST_CLIENT = int(ipaddress.IPv4Address("198.18.0.1"))  # RFC 2544 benchmarking range 198.18.0.0/15
_MAX_CLIENTS = 131_000


def client_ip(index: int) -> str:
    """The ``X-Forwarded-For`` address of simulated client ``index`` (0-based)."""
    return str(ipaddress.IPv4Address(_FIRST_CLIENT + index))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of an already sorted, non-empty sequence."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def classify(status: int, body: bytes) -> str:
    """The table column of one response."""
    if status == 200:
        return "declined" if b'"DECLINED"' in body else "ok"
    if status in (429, 503):
        return str(status)
    return "5xx" if status >= 500 else "other"


@dataclass
class Bucket:
    """Responses that arrived during one second."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies_ms: list[float] = field(default_factory=list)
    max_retry_after: int | None = None

    def add(self, outcome: str, latency_ms: float, retry_after: str | None) -> None:
        """Record one response."""
        self.counts[outcome] += 1
        self.latencies_ms.append(latency_ms)
        if retry_after is not None and retry_after.isdigit():
            self.max_retry_after = max(self.max_retry_after or 0, int(retry_after))


HEADER = f"{'t':>4} {'sent':>6} " + " ".join(f"{name:>8}" for name in OUTCOMES) + f" {'p50 ms':>8} {'p99 ms':>8} {'R-A':>4}"


def format_row(label: str, sent: int, bucket: Bucket) -> str:
    """One line of the table (``label`` is the second, or "all")."""
    values = sorted(bucket.latencies_ms)
    p50 = f"{percentile(values, 50):8.1f}" if values else f"{'-':>8}"
    p99 = f"{percentile(values, 99):8.1f}" if values else f"{'-':>8}"
    retry = "-" if bucket.max_retry_after is None else str(bucket.max_retry_after)
    cells = " ".join(f"{bucket.counts[name]:>8}" for name in OUTCOMES)
    return f"{label:>4} {sent:>6} {cells} {p50} {p99} {retry:>4}"


class Recorder:
    """Thread-safe per-second buckets, keyed by the second (since start) a response arrived."""

    def __init__(self, start: float) -> None:
        self.start = start
        self._lock = threading.Lock()
        self.buckets: dict[int, Bucket] = collections.defaultdict(Bucket)
        self.sent: collections.Counter[int] = collections.Counter()
        self._printed = 0  # seconds before this one are printed: late arrivals go to the next row

    def on_sent(self, when: float) -> None:
        """A request was (due to be) sent at ``when``."""
        with self._lock:
            self.sent[max(int(when - self.start), self._printed)] += 1

    def on_response(self, due: float, outcome: str, retry_after: str | None) -> None:
        """A response (or error) arrived now for a request due at ``due``."""
        now = time.monotonic()
        with self._lock:
            second = max(int(now - self.start), self._printed)
            self.buckets[second].add(outcome, (now - due) * 1000, retry_after)

    def pop_second(self, second: int) -> tuple[int, Bucket]:
        """Remove and return (requests sent, responses) of one finished second."""
        with self._lock:
            self._printed = max(self._printed, second + 1)
            return self.sent.pop(second, 0), self.buckets.pop(second, Bucket())


def send(url: str, xff: str | None, timeout: float) -> tuple[str, str | None]:
    """POST one authorization; returns (outcome column, Retry-After header or None)."""
    request = urllib.request.Request(url, method="POST", data=b"")
    if xff is not None:
        request.add_header("X-Forwarded-For", xff)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return classify(response.status, response.read()), response.headers.get("Retry-After")
    except urllib.error.HTTPError as exc:
        with exc:
            return classify(exc.code, b""), exc.headers.get("Retry-After")
    except OSError:  # refused, reset, timed out
        return "err", None


def _client_cycle(clients: int) -> Iterable[str | None]:
    if clients <= 0:
        while True:
            yield None
    addresses = [client_ip(i) for i in range(clients)]
    while True:
        yield from addresses


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> Bucket:
    """Generate the load, print the per-second table to ``out``; return the all-seconds totals."""
    start = time.monotonic()
    end = start + args.seconds
    recorder = Recorder(start)
    clients = iter(_client_cycle(args.clients))
    clients_lock = threading.Lock()

    def one(due: float, xff: str | None) -> None:
        outcome, retry_after = send(args.url, xff, args.timeout)
        recorder.on_response(due, outcome, retry_after)

    def closed_loop() -> None:
        while time.monotonic() < end:
            with clients_lock:
                xff = next(clients)
            due = time.monotonic()
            recorder.on_sent(due)
            one(due, xff)

    def open_loop(pool: ThreadPoolExecutor) -> None:
        interval = 1.0 / args.rate
        i = 0
        while True:
            due = start + i * interval
            if due >= end:
                return
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            recorder.on_sent(due)
            pool.submit(one, due, next(clients))
            i += 1

    totals = Bucket()
    total_sent = 0
    print(HEADER, file=out, flush=True)
    pool = ThreadPoolExecutor(max_workers=args.max_in_flight if args.rate else args.threads)
    with pool:
        if args.rate:
            driver = threading.Thread(target=open_loop, args=(pool,), daemon=True)
            driver.start()
        else:
            for _ in range(args.threads):
                pool.submit(closed_loop)
        second = 0

        def flush(upto: int) -> None:
            nonlocal second, total_sent
            while second < upto:
                sent, bucket = recorder.pop_second(second)
                total_sent += sent
                totals.counts.update(bucket.counts)
                totals.latencies_ms.extend(bucket.latencies_ms)
                if bucket.max_retry_after is not None:
                    totals.max_retry_after = max(totals.max_retry_after or 0, bucket.max_retry_after)
                print(format_row(str(second + 1), sent, bucket), file=out, flush=True)
                second += 1

        while time.monotonic() < end:
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))
            flush(int(time.monotonic() - start))
        if args.rate:
            driver.join()
    # Every request has answered (the pool is shut down): the last, partial seconds.
    flush(max([*recorder.buckets, *recorder.sent], default=-1) + 1)
    print(format_row("all", total_sent, totals), file=out, flush=True)
    return totals


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000/authorize")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="target requests per second, open loop (default: closed loop with --threads)")
    parser.add_argument("--clients", type=int, default=0,
                        help="distinct X-Forwarded-For client addresses, round robin (default: none sent)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=20, help="closed loop: threads sending back to back")
    parser.add_argument("--max-in-flight", type=int, default=256,
                        help="open loop: at most this many requests outstanding; later ones queue (and it shows)")
    parser.add_argument("--timeout", type=float, default=5.0, help="per request, seconds")
    args = parser.parse_args(argv)
    if args.rate < 0 or args.seconds <= 0 or args.threads < 1 or args.max_in_flight < 1:
        parser.error("--rate must be >= 0; --seconds, --threads and --max-in-flight must be positive")
    if not 0 <= args.clients <= _MAX_CLIENTS:
        parser.error(f"--clients must be between 0 and {_MAX_CLIENTS}")
    return args


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    run(parse_args(argv))


if __name__ == "__main__":
    main()
