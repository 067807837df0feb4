"""The demo's Django-free parts: load.py (open loop, clients, table), the call meter, the shared partner knobs."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from tests.demo_harness import DEMO


def _load(name: str, path: Path) -> ModuleType:
    # By path, under a unique name: the demo's directory never goes on sys.path of the test process.
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


load = _load("demo_load_script", DEMO / "load.py")
meter_mod = _load("demo_cards_meter", DEMO / "cards" / "meter.py")
partner_mod = _load("demo_cards_partner", DEMO / "cards" / "partner.py")
traffic_mod = _load("demo_cards_traffic", DEMO / "cards" / "traffic.py")


# ------------------------------------------------------------------------------------------- load.py


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert load.percentile(values, 50) == 50
    assert load.percentile(values, 99) == 99
    assert load.percentile(values, 100) == 100
    assert load.percentile([7.0], 99) == 7.0
    assert load.percentile([1.0, 2.0], 50) == 1.0 and load.percentile([1.0, 2.0], 51) == 2.0


def test_classify_and_client_addresses() -> None:
    assert load.classify(200, b'{"status": "APPROVED"}') == "ok"
    assert load.classify(200, b'{"status": "DECLINED", "reason": "TEMPORARILY_UNAVAILABLE"}') == "declined"
    assert [load.classify(s, b"") for s in (429, 503, 502, 500, 404)] == ["429", "503", "5xx", "5xx", "other"]
    assert load.client_ip(0) == "198.18.0.1"
    assert load.client_ip(255) == "198.18.1.0"
    assert len({load.client_ip(i) for i in range(1000)}) == 1000


def test_late_response_goes_to_the_next_printed_row() -> None:
    recorder = load.Recorder(start=time.monotonic() - 5)  # "now" is in second 5
    recorder.on_response(time.monotonic(), "ok", None)
    assert recorder.pop_second(5)[1].counts["ok"] == 1
    recorder.pop_second(6)  # printed up to 6: a response computed as second 5 lands in 7
    recorder.on_response(time.monotonic(), "429", "1")
    assert recorder.pop_second(7)[1].counts["429"] == 1


def test_format_row_columns() -> None:
    bucket = load.Bucket()
    for ms in (10.0, 20.0, 30.0):
        bucket.add("ok", ms, None)
    bucket.add("429", 1.0, "2")
    row = load.format_row("3", 4, bucket).split()
    header = load.HEADER.split()
    assert len(row) == len(header) - 2  # "p50 ms" and "p99 ms" are two words each in the header
    assert row[:4] == ["3", "4", "3", "0"] and row[4] == "1" and row[-1] == "2"
    assert row[-3:-1] == ["10.0", "30.0"]  # p50 and p99 over the 4 latencies 1, 10, 20, 30


class _Handler(BaseHTTPRequestHandler):
    """Every other request is a 429 with Retry-After: 2; remembers X-Forwarded-For values."""

    delay_s = 0.0
    seen: list[str] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        time.sleep(self.delay_s)
        with self.lock:
            self.seen.append(self.headers.get("X-Forwarded-For", "-"))
            n = len(self.seen)
        if n % 2:
            body, status = b'{"status": "APPROVED"}', 200
        else:
            body, status = b'{"title": "Too Many Requests"}', 429
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", "2")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"seen": [], "delay_s": 0.0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/authorize", handler
    finally:
        server.shutdown()
        server.server_close()


def test_open_loop_rate_and_clients(http_server: tuple[str, type[_Handler]]) -> None:
    url, handler = http_server
    out = io.StringIO()
    totals = load.run(load.parse_args(["--url", url, "--rate", "40", "--clients", "3", "--seconds", "1"]), out)
    lines = out.getvalue().splitlines()
    assert lines[0] == load.HEADER and lines[-1].split()[:2] == ["all", "40"], lines
    assert sum(totals.counts.values()) == 40 and totals.counts["ok"] == 20 and totals.counts["429"] == 20
    assert totals.max_retry_after == 2
    assert sorted(set(handler.seen)) == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
    assert sorted(handler.seen.count(ip) for ip in set(handler.seen)) == [13, 13, 14]  # round robin


def test_open_loop_keeps_the_rate_and_counts_queueing(http_server: tuple[str, type[_Handler]]) -> None:
    # A slow server must not lower the offered rate (that would be a closed loop): all 20 requests are
    # sent on schedule, and the time they queue behind --max-in-flight shows in the latency.
    url, handler = http_server
    handler.delay_s = 0.2
    out = io.StringIO()
    args = load.parse_args(["--url", url, "--rate", "20", "--seconds", "1", "--max-in-flight", "2"])
    totals = load.run(args, out)
    assert sum(totals.counts.values()) == 20 and handler.seen == ["-"] * 20  # no --clients: no header
    # 20 requests, 2 at a time, 0.2 s each: the last is served about 2 s after start, due at 0.95 s.
    assert load.percentile(sorted(totals.latencies_ms), 99) > 800, totals.latencies_ms
    assert min(totals.latencies_ms) >= 190


def test_closed_loop_without_rate(http_server: tuple[str, type[_Handler]]) -> None:
    url, handler = http_server
    handler.delay_s = 0.05
    totals = load.run(load.parse_args(["--url", url, "--threads", "2", "--seconds", "0.5"]), io.StringIO())
    # Two threads back to back at 50 ms: about 20 requests, and never more than 2 in flight.
    assert 10 <= sum(totals.counts.values()) <= 24


def test_bad_arguments_are_refused() -> None:
    for argv in (["--rate", "-1"], ["--seconds", "0"], ["--clients", "-2"], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            load.parse_args(argv)


# ------------------------------------------------------------------------------------------- meter


class FakeSeconds:
    """A settable clock in seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_meter_rate_and_peak_over_complete_seconds() -> None:
    clock = FakeSeconds()
    meter = meter_mod.CallMeter(seconds=10, clock=clock)
    for second in range(3):
        for _ in range(5 * (second + 1)):  # 5, 10, 15 calls
            meter.enter()
        for _ in range(5 * (second + 1)):
            meter.leave()
        clock.now += 1
    snap = meter.snapshot(window=3)
    assert snap == {"calls_per_s": 10.0, "peak_in_flight": 15, "in_flight": 0, "window_s": 3}
    assert meter.snapshot(window=1)["calls_per_s"] == 15.0


def test_meter_forgets_old_seconds_and_carries_running_calls() -> None:
    clock = FakeSeconds()
    meter = meter_mod.CallMeter(seconds=5, clock=clock)
    for _ in range(4):
        meter.enter()  # 4 calls still running
    clock.now += 100  # far more than the window: every slot is stale
    snap = meter.snapshot(window=3)
    assert snap["calls_per_s"] == 0.0 and snap["in_flight"] == 4
    assert snap["peak_in_flight"] == 4  # the running calls were in flight during those seconds too


def test_traffic_counts_each_second_and_forgets_the_window_s_past() -> None:
    clock = FakeSeconds()
    clock.now = 1_000.5
    traffic = traffic_mod.TrafficCounter(seconds=60, clock=clock)
    for _ in range(3):
        traffic.count("approved")
    traffic.count("429", "1")
    clock.now += 1
    traffic.count("429", "1")
    traffic.count("503", "3")
    snap = traffic.snapshot()
    assert snap["now"] == 1_001 and snap["window_s"] == 60
    assert snap["per_second"] == {
        "1000": {"approved": 3, "declined": 0, "429": 1, "503": 0, "other": 0},
        "1001": {"approved": 0, "declined": 0, "429": 1, "503": 1, "other": 0},
    }
    assert snap["retry_after"] == {"1": 2, "3": 1}
    clock.now += 59  # second 1000 is now 60 s old: out of the window, out of the snapshot
    later = traffic.snapshot()
    assert list(later["per_second"]) == ["1001"] and later["retry_after"] == {"1": 1, "3": 1}
    clock.now += 1000
    assert traffic.snapshot()["per_second"] == {} and traffic.snapshot()["retry_after"] == {}
    assert traffic.snapshot()["totals"] == {"approved": 3, "declined": 0, "429": 2, "503": 1, "other": 0}


def test_traffic_counter_loses_no_count_under_threads() -> None:
    traffic = traffic_mod.TrafficCounter()
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        for _ in range(1000):
            traffic.count("approved")

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = traffic.snapshot()
    assert snap["totals"]["approved"] == 8000
    assert sum(c["approved"] for c in snap["per_second"].values()) == 8000


def test_meter_concurrent_enter_leave() -> None:
    clock = FakeSeconds()
    for _trial in range(20):
        meter = meter_mod.CallMeter(seconds=10, clock=clock)
        barrier = threading.Barrier(8)

        def work(meter: object = meter, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            for _ in range(200):
                meter.enter()  # type: ignore[attr-defined]
                meter.leave()  # type: ignore[attr-defined]

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        clock.now += 1
        snap = meter.snapshot(window=1)
        assert snap["calls_per_s"] == 1600 and snap["in_flight"] == 0 and 1 <= snap["peak_in_flight"] <= 8


# ------------------------------------------------------------------------------------------- partner


def test_partner_without_a_file_is_process_local(tmp_path: Path) -> None:
    partner = partner_mod.PartnerState()
    partner.down = True
    partner.latency_s = 99
    assert partner.down is True and partner.latency_s == partner_mod.MAX_LATENCY_S
    partner.latency_s = -1
    assert partner.as_dict() == {"down": True, "latency_ms": 0.0}
    assert list(tmp_path.iterdir()) == []


def test_partner_change_reaches_another_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "partner.json"
    a, b = partner_mod.PartnerState(path), partner_mod.PartnerState(path)  # two workers' views
    assert b.down is False and b.latency_s == partner_mod.DEFAULT_LATENCY_S  # no file yet: defaults
    a.down = True
    a.latency_s = 0.3
    assert a.down is True and a.latency_s == 0.3
    # b looked less than REFRESH_S ago: it may still answer the old values; after that it must not.
    monkeypatch.setattr(partner_mod, "REFRESH_S", 0.0)
    assert b.down is True and b.latency_s == 0.3
    b.down = False  # a write keeps the other knob as the file has it
    assert a.as_dict() == {"down": False, "latency_ms": 300.0}
    assert json.loads(path.read_text()) == {"down": False, "latency_s": 0.3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partner.json"]  # no temp files left


def test_partner_ignores_a_corrupt_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partner_mod, "REFRESH_S", 0.0)
    path = tmp_path / "partner.json"
    partner = partner_mod.PartnerState(path)
    partner.latency_s = 0.2
    path.write_text("{not json")
    assert partner.latency_s == 0.2  # the last good values


def test_partner_readers_never_see_a_half_written_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partner_mod, "REFRESH_S", 0.0)
    path = tmp_path / "partner.json"
    writers = [partner_mod.PartnerState(path) for _ in range(3)]
    reader = partner_mod.PartnerState(path)
    allowed = {partner_mod.DEFAULT_LATENCY_S, 0.1, 0.2, 0.3}
    barrier = threading.Barrier(5)
    seen: set[float] = set()
    torn: list[str] = []

    def write(w: object, value: float) -> None:
        barrier.wait()
        for _ in range(200):
            w.latency_s = value  # type: ignore[attr-defined]

    def read() -> None:
        barrier.wait()
        for _ in range(600):
            seen.add(reader.latency_s)

    def read_raw() -> None:  # what any worker would read straight from the file
        barrier.wait()
        for _ in range(600):
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue  # before the first write
            try:
                json.loads(text)
            except ValueError:
                torn.append(text)

    threads = [threading.Thread(target=write, args=(w, v)) for w, v in zip(writers, (0.1, 0.2, 0.3), strict=True)]
    threads += [threading.Thread(target=read), threading.Thread(target=read_raw)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen <= allowed, seen
    assert torn == []
    assert json.loads(path.read_text())["latency_s"] in (0.1, 0.2, 0.3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partner.json"]


def test_the_server_and_its_workers_log_in_one_time_zone(tmp_path: Path) -> None:
    """Django sets $TZ from TIME_ZONE in each worker (its master never loads Django): serve.py aligns them."""
    serve = _load("demo_serve_script", DEMO / "serve.py")
    demo_settings = _load("demo_settings_module", DEMO / "demo" / "settings.py")
    env = serve.server_environment(serve.parse_args(["gunicorn"]), tmp_path)
    assert env["TZ"] == demo_settings.TIME_ZONE


# ------------------------------------------------------------------------------- the adaptive acquirer


def test_slowing_the_partner_moves_the_demos_adaptive_limit() -> None:
    """The demo's acquirer bulkhead (its settings, read from demo/settings.py) through the fake-clock harness:
    100 calls/s to a partner of 100 workers at 50 ms, then at the dashboard's "slow" 300 ms. Little's law says
    5 in flight (the limit stays at min_limit 10), then 30: the limit follows within 10 s to within 20 %."""
    from benchmarks.sim_adaptive import simulate
    from django_ratelimit_r4.core.bulkhead import BulkheadConfig

    demo_settings = _load("demo_settings_for_adaptive", DEMO / "demo" / "settings.py")
    options = demo_settings.RATELIMIT_R4["bulkheads"]["instances"]["acquirer"]
    assert options["adaptive"]["algorithm"] == "littles_law"
    fast, slow = simulate(BulkheadConfig(**options), rate=100, workers=100, phases=[(20, 0.05), (20, 0.3)])
    assert fast.limits[-1] == 10 and fast.rejected_at == []
    assert slow.littles_law == pytest.approx(30)
    settled = slow.convergence_s()
    assert settled is not None and settled <= 10, slow.limits
    assert slow.rejected_at == [] or max(slow.rejected_at) < 10
