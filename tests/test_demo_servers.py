"""The demo under real servers, started exactly as the Makefile does (``demo_project/serve.py``).

gunicorn (2 gthread workers, PROMETHEUS_MULTIPROC_DIR, the worker_exit/child_exit hooks) and uvicorn
(``demo.asgi:application`` with ``monitor_asgi``) on free ports, each in its own process group that is
killed in ``finally``. Checked over HTTP: 429 with ``Retry-After``, probes that stay 200 while the limiter
is saturated and the partner is down, the "temporarily unavailable" decline, the r4 series on /metrics
(multiprocess under gunicorn), the stall detector under uvicorn, ``load.py --clients`` (trusted proxy),
and, when ``node`` is installed, the dashboard's own JavaScript driven against the live server.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.demo_harness import DEMO, demo_env

START_TIMEOUT_S = 20.0


@dataclass
class Response:
    """What the tests need from one HTTP answer."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        """The body parsed as JSON."""
        return json.loads(self.body)


def request(url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None,
            timeout: float = 5.0) -> Response:
    """One HTTP request; 4xx/5xx are answers, not exceptions."""
    req = urllib.request.Request(url, method=method, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return Response(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())


def free_port() -> int:
    """A port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A running demo: its base URL and its process (a group leader), whose output goes to ``log_path``."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text(errors="replace")


def free_port_pair() -> int:
    """A port ``p`` such that nothing listens on ``p`` nor ``p + 1`` right now (two demo "hosts")."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


@contextlib.contextmanager
def serve(tmp_path: Path, *args: str, port: int | None = None, **environ: str) -> Iterator[Server]:
    """Start ``serve.py <args>`` on a free port (or ``port``), ``environ`` added; stop its process group at exit."""
    port = free_port() if port is None else port
    log_path = tmp_path / f"server-{port}.log"
    # A 60 s per-client period: how many requests fit in one cycle must not depend on the machine's speed.
    env = demo_env(PYTHONUNBUFFERED="1", DEMO_PER_CLIENT_PERIOD="60s", **environ)
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "serve.py", *args, "--port", str(port)],
            cwd=DEMO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, f"server exited early:\n{server.log()}"
            with contextlib.suppress(OSError):
                if request(server.url + "/healthz/live", timeout=1).status == 200:
                    break
            assert time.monotonic() < deadline, f"server did not start:\n{server.log()}"
            time.sleep(0.1)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)  # serve.py stops the server and removes its temp dir
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=8)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # anything left in the group (a stuck worker)
        process.wait(timeout=5)


def hit_until_429(url: str, headers: dict[str, str] | None = None, limit: int = 200) -> tuple[Response, list[int]]:
    """POST until a 429 comes back; return it and the statuses before it."""
    statuses: list[int] = []
    for _ in range(limit):
        response = request(url, "POST", b"", headers)
        if response.status == 429:
            return response, statuses
        statuses.append(response.status)
    raise AssertionError(f"no 429 after {limit} requests: {statuses[-20:]}")


def worker_pids(url: str, want: int = 2, tries: int = 300) -> set[str]:
    """The worker pids that answer; stops once ``want`` were seen (the kernel may favour one worker)."""
    pids: set[str] = set()
    for _ in range(tries):
        pids.add(request(url + "/dashboard/state.json").headers["x-worker-pid"])
        if len(pids) >= want:
            break
    return pids


def assert_probes_green(url: str) -> None:
    """Liveness and readiness answer 200, whatever the limiters and the breaker say."""
    for path in ("/healthz/live", "/healthz/ready"):
        response = request(url + path)
        assert response.status == 200, (path, response)


def metric_value(text: str, metric: str, **labels: str) -> float:
    """Sum of the samples of ``metric`` whose labels include ``labels`` (any other labels, e.g. pid, allowed)."""
    total, found = 0.0, False
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$", line)
        if not match or match.group(1) != metric:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total, found = total + float(match.group(3)), True
    if not found:
        raise KeyError(f"{metric}{labels} not in /metrics")
    return total


def wait_for_metric(url: str, metric: str, minimum: float, timeout: float = 6.0, **labels: str) -> str:
    """Poll /metrics until ``metric{labels}`` reaches ``minimum`` (the multiprocess syncer lags by up to 1 s)."""
    deadline = time.monotonic() + timeout
    while True:
        text = request(url + "/metrics").body.decode()
        with contextlib.suppress(KeyError):
            if metric_value(text, metric, **labels) >= minimum:
                return text
        if time.monotonic() > deadline:
            raise AssertionError(f"{metric}{labels} never reached {minimum}:\n" +
                                 "\n".join(line for line in text.splitlines() if metric in line))
        time.sleep(0.2)


def _partner_refresh_s() -> float:
    """demo_project/cards/partner.py's REFRESH_S, read from the file (the demo's packages are not importable here)."""
    spec = importlib.util.spec_from_file_location("_demo_partner", DEMO / "cards" / "partner.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return float(module.REFRESH_S)


#: How long a worker may keep its cached copy of the shared partner knobs.
PARTNER_REFRESH_S = _partner_refresh_s()


def set_partner(url: str, *, down: bool, latency_ms: float) -> None:
    """Set the simulated partner for every worker: write the shared knobs, then let every worker's cached copy
    age past REFRESH_S. The cache lives in other processes, so wall time is its clock; once it has passed, the
    next read in each worker sees the change, however loaded the machine is."""
    body = json.dumps({"down": down, "latency_ms": latency_ms}).encode()
    assert request(url + "/partner", "POST", body, {"Content-Type": "application/json"}).status == 200
    time.sleep(2.5 * PARTNER_REFRESH_S)


def open_breakers(url: str, authorize: str) -> list[dict[str, object]]:
    """Partner down, then authorizations (from distinct clients) until every worker's breaker refuses calls.

    Returns the JSON answers; stops once the last 10 were all refused by an open breaker.
    """
    set_partner(url, down=True, latency_ms=0)
    answers: list[dict[str, object]] = []
    for i in range(200):
        response = request(f"{url}{authorize}", "POST", b"", {"X-Forwarded-For": f"198.18.1.{i % 250}"})
        assert response.status == 200, response  # denying is not failing: never a 5xx
        answers.append(response.json())  # type: ignore[arg-type]
        if len(answers) >= 20 and all(a.get("cause") == "CallNotPermitted" for a in answers[-10:]):
            return answers
    raise AssertionError(f"breakers never all opened: {[a.get('cause') for a in answers[-20:]]}")


def exactly_ten_then_429(url: str, headers: dict[str, str] | None = None) -> Response:
    """One client gets exactly 10 in its (60 s) cycle, then a 429 whose Retry-After is the rest of the cycle."""
    rejected, before = hit_until_429(url, headers)
    assert len(before) == 10, f"{len(before)} requests passed before the 429, not 10"
    assert_cycle_retry_after(rejected)
    return rejected


def assert_cycle_retry_after(rejected: Response) -> None:
    """Retry-After is computed from the limiter: the seconds left in the 60 s cycle, rounded up."""
    assert 1 <= int(rejected.headers["retry-after"]) <= 60, rejected.headers


# Runs the dashboard's own script in node against the live server, with just enough DOM to render.
NODE_HARNESS = r"""
const vm = require("vm"), fs = require("fs");
const [base, scriptPath, wantPids] = process.argv.slice(2);
const inputs = {rate: "40", clients: "8", seconds: "15", lambda: "100"};
const elements = {};
const ctx = new Proxy({}, {get: (t, k) => (k in t ? t[k] : () => {}), set: (t, k, v) => { t[k] = v; return true; }});
const el = (id) => elements[id] || (elements[id] = {id, textContent: "", innerHTML: "", style: {}, value: inputs[id] || "",
                                                     width: 520, height: 170, getContext: () => ctx});
global.document = {getElementById: el, querySelector: el};
const realFetch = fetch;
global.fetch = (url, options) => realFetch(base + url, options);
vm.runInThisContext(fs.readFileSync(scriptPath, "utf8"));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
(async () => {
  await refresh();
  for (let tries = 0; tries < 3 && !retryAfter.size; tries++) { burst(30, true); await sleep(1200); }
  // Every worker: with keepalive 0 any of them may answer a refresh, but a loaded kernel may favour one for a while.
  for (let i = 0; i < 6 || (pids.size < +wantPids && i < 300); i++) { await refresh(); await sleep(i < 6 ? 100 : 20); }
  renderChart(); renderTimeline();
  let totals = {ok: 0, declined: 0, "429": 0, "503": 0, other: 0};
  for (const v of perSecond.values()) for (const k in totals) totals[k] += v[k];
  console.log(JSON.stringify({pids: [...pids], totals, retry: [...retryAfter.keys()], server, backend,
    banner: [el("banner").style.display, el("banner").innerHTML], little: el("verdict").innerHTML + el("observed").innerHTML + el("adaptive").innerHTML,
    workers: el("#workers tbody").innerHTML, who: el("who").innerHTML, log: el("log").textContent,
    cluster: el("cluster").innerHTML}));
  process.exit(0);
})().catch((e) => { console.error(e); process.exit(1); });
"""


def run_dashboard_script(tmp_path: Path, url: str, workers: int = 1) -> dict[str, object]:
    """Extract the dashboard's <script>, run it in node against ``url``; return what it rendered once its
    refreshes have reached ``workers`` worker pids (up to 300 refreshes: the kernel may favour one worker)."""
    html = request(url + "/").body.decode()
    script = re.search(r"<script>(.*)</script>", html, re.S)
    assert script, "dashboard has no inline script"
    (tmp_path / "dashboard.js").write_text(script.group(1))
    (tmp_path / "harness.js").write_text(NODE_HARNESS)
    result = subprocess.run(["node", str(tmp_path / "harness.js"), url, str(tmp_path / "dashboard.js"), str(workers)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# The servers come with the "demo" extra (make test installs it); a bare `pip install -e .[test]` skips these.
needs_gunicorn = pytest.mark.skipif(importlib.util.find_spec("gunicorn") is None, reason="gunicorn not installed")
needs_uvicorn = pytest.mark.skipif(importlib.util.find_spec("uvicorn") is None, reason="uvicorn not installed")


@needs_gunicorn
def test_gunicorn_two_workers(tmp_path: Path) -> None:
    with serve(tmp_path, "gunicorn", "--workers", "2", "--threads", "4") as server:
        url = server.url
        first = request(url + "/authorize", "POST", b"")
        assert first.status == 200 and "x-worker-pid" in first.headers

        # 10 per second per client, per worker (memory backend): a 429 with a computed Retry-After comes.
        rejected, before = hit_until_429(url + "/authorize")
        assert_cycle_retry_after(rejected)
        assert rejected.headers["content-type"] == "application/problem+json"
        # One budget per worker: 10 to 20 pass (the first request above counts too) before a 429.
        assert 9 <= len(before) <= 19 and set(before) == {200}, before
        assert_probes_green(url)

        # The partner is one system for all workers (shared through DEMO_STATE_DIR): every worker's breaker
        # opens from its own failures, and callers get a decline, never an error.
        answers = open_breakers(url, "/authorize")
        causes = [a.get("cause") for a in answers]
        assert all(a["reason"] == "TEMPORARILY_UNAVAILABLE" for a in answers), answers[:3]
        assert "AcquirerError" in causes and causes[-1] == "CallNotPermitted", causes
        assert_probes_green(url)
        # Without the fallback an open breaker is a 503 with the remaining open time as Retry-After.
        # (A worker that saw fewer than 10 failures still lets the call fail at the partner: a 502.)
        stricts = [request(url + "/authorize?fallback=0", "POST", b"", {"X-Forwarded-For": f"198.18.2.{i}"})
                   for i in range(6)]
        assert {r.status for r in stricts} <= {502, 503} and 503 in {r.status for r in stricts}, stricts
        assert all(r.headers["retry-after"] in ("1", "2", "3") for r in stricts if r.status == 503), stricts

        # Multiprocess metrics: counters summed over workers, gauges per pid, the breaker's state at once.
        text = wait_for_metric(url, "resilience4j_ratelimiter_calls_total", 1, kind="failed", name="per-client")
        assert re.search(r'resilience4j_bulkhead_available_concurrent_calls\{name="acquirer",pid="\d+"\}', text), text
        wait_for_metric(url, "resilience4j_circuitbreaker_state", 1, name="acquirer", state="open")
        wait_for_metric(url, "resilience4j_circuitbreaker_not_permitted_calls_total", 10, name="acquirer")

        assert len(worker_pids(url)) == 2  # keepalive 0: the dashboard sees every worker

        if shutil.which("node"):
            set_partner(url, down=False, latency_ms=20)
            seen = run_dashboard_script(tmp_path, url, workers=2)
            assert seen["server"] == "wsgi" and seen["backend"] == "memory"
            assert len(seen["pids"]) == 2, seen["pids"]  # type: ignore[arg-type]
            assert seen["banner"][0] == "block" and "its own limiters" in seen["banner"][1]  # type: ignore[index]
            assert seen["totals"]["429"] >= 1 and all(r.isdigit() for r in seen["retry"]), seen  # type: ignore[index,union-attr,attr-defined]
            assert "Fits" in seen["little"] and "Measured on pid" in seen["little"], seen["little"]  # type: ignore[operator]
            assert "Adaptive limit (littles_law)" in seen["little"], seen["little"]  # type: ignore[operator]
            assert seen["workers"].count("<tr>") == 2, seen["workers"]  # type: ignore[union-attr]
    assert "Traceback" not in server.log(), server.log()
    # In-memory limiters under 2 workers: each worker that built one said so once, in the server's log.
    warned = re.findall(r"WARNING django_ratelimit_r4 rate limiters .* \(pid (\d+)\), but the server looks "
                        r"multi-process \(--workers 2 on the command line\)", server.log())
    assert 1 <= len(warned) == len(set(warned)) <= 2, server.log()


@needs_uvicorn
def test_uvicorn_stall_detector_and_load_clients(tmp_path: Path) -> None:
    with serve(tmp_path, "uvicorn") as server:
        url = server.url
        assert request(url + "/partner", "POST", b'{"latency_ms": 0}').status == 200
        exactly_ten_then_429(url + "/authorize-async")
        assert_probes_green(url)
        answers = open_breakers(url, "/authorize-async")
        assert [a["cause"] for a in answers[:10]] == ["AcquirerError"] * 10
        assert answers[-1]["cause"] == "CallNotPermitted"
        assert_probes_green(url)

        # The deliberate blocking call: the detector counts it, and logs the line that blocked.
        blocked = request(url + "/block?ms=150")
        assert blocked.status == 200
        text = wait_for_metric(url, "r4_event_loop_stalls_total", 1, timeout=3, name="asgi")
        # A recorded stall lasted at least the 20 ms threshold; how much of the 150 ms block it saw depends on
        # when the watchdog thread got the CPU (26 ms at load 7 on 2 cores), so no tighter bound holds.
        assert metric_value(text, "r4_event_loop_stall_seconds_sum", name="asgi") >= 0.02
        assert 'resilience4j_circuitbreaker_state{name="acquirer",state="open"} 1.0' in text
        assert "resilience4j_ratelimiter_calls_total" in text
        deadline = time.monotonic() + 3
        while "time.sleep(ms / 1000)" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "event loop 'asgi' blocked for" in server.log() and "time.sleep(ms / 1000)" in server.log()
        state = request(url + "/dashboard/state.json").json()
        assert state["server"] == "asgi" and state["stalls"]["stalls_total"] >= 1  # type: ignore[index]

        # load.py: 4 clients (X-Forwarded-For, trusted proxy) at 80/s for 2 s against one process.
        assert request(url + "/partner", "POST", b'{"down": false, "latency_ms": 5}').status == 200
        time.sleep(3.1)  # the breaker's 3 s open state ends; the next calls are its half-open trials
        result = subprocess.run(
            [sys.executable, "load.py", "--url", url + "/authorize-async", "--rate", "80", "--clients", "4",
             "--seconds", "2"], cwd=DEMO, capture_output=True, text=True, timeout=20,
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].split()[:3] == ["t", "sent", "ok"], lines
        total = dict(zip(lines[0].split()[:9], lines[-1].split()[:9], strict=True))
        assert total["t"] == "all" and total["sent"] == "160", lines
        # Each address has its own budget (10 in its 60 s cycle): exactly 4 x 10 pass, whatever the speed.
        passed = int(total["ok"]) + int(total["declined"])
        assert passed == 40 and int(total["429"]) == 120, lines
        # The server counted load.py's answers (every client), for the dashboard: counts, never addresses.
        state = request(url + "/dashboard/state.json")
        assert state.json()["traffic"]["totals"]["429"] >= 121, state.json()  # type: ignore[index]
        assert b"198.18." not in state.body

        if shutil.which("node"):  # the dashboard notices ASGI and uses the async view; one process, no banner
            seen = run_dashboard_script(tmp_path, url)
            assert seen["server"] == "asgi" and len(seen["pids"]) == 1, seen  # type: ignore[arg-type]
            assert seen["banner"][0] == "none" and "/authorize-async" in seen["who"], seen  # type: ignore[index,operator]
            # The chart is what the server answered in the last minute, not the page's own requests:
            # load.py's 120 refusals above are on it although this page sent none of them.
            assert seen["totals"]["429"] >= 120, seen["totals"]  # type: ignore[index]
    assert "Traceback" not in server.log().replace("the loop thread was running", ""), server.log()


@needs_gunicorn
@pytest.mark.skipif(
    shutil.which("redis-server") is None and os.environ.get("R4_REQUIRE_REDIS") != "1",
    reason="redis-server not installed (R4_REQUIRE_REDIS=1 makes it a failure)",
)
def test_gunicorn_redis_backend_makes_per_client_global(tmp_path: Path) -> None:
    redis_port = free_port()
    with serve(tmp_path, "gunicorn", "--workers", "2", "--threads", "4", "--backend", "redis",
               "--redis-url", f"redis://127.0.0.1:{redis_port}/0") as server:
        assert "throwaway redis-server" in server.log()
        # Same client, two workers, one budget in Redis: exactly 10 per second, never 2 x 10.
        exactly_ten_then_429(server.url + "/authorize", {"X-Forwarded-For": "198.18.3.1"})
        assert len(worker_pids(server.url)) == 2
        assert request(server.url + "/dashboard/state.json").json()["backend"] == "redis"  # type: ignore[index]
        assert_probes_green(server.url)
        assert "multi-process" not in server.log()  # one budget in Redis: nothing to warn about


DEMO_TOKEN = "demo-token-for-local-use-only-0123456789"  # demo/settings.py's state_endpoint_token


def test_gunicorn_cluster_two_hosts_one_control_plane(tmp_path: Path) -> None:
    """make demo-cluster: two gunicorn "hosts" x 2 workers on one Redis, with the control plane. The state
    endpoint of either host lists all four workers; a partner contract of 4 concurrent calls holds under load
    from both hosts (the partner's own count in Redis never passes 4, while calls were turned away); a forced
    open sent to one host is acknowledged by all four, so every worker of both hosts refuses at once (503
    without the fallback), and closing it reaches all four; failures on one host open the shared breaker on
    both (the second host's workers read OPEN and refuse without having made a call)."""
    redis_port, port = free_port(), free_port_pair()
    hosts = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
    auth = {"Authorization": f"Bearer {DEMO_TOKEN}", "Content-Type": "application/json"}
    with serve(tmp_path, "gunicorn", "--hosts", "2", "--workers", "2", "--threads", "4", "--backend", "redis",
               "--control", "--redis-url", f"redis://127.0.0.1:{redis_port}/0", port=port,
               DEMO_PARTNER_CONTRACT="4", DEMO_BREAKER_OPEN_WAIT="60s") as server:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the first host answers (serve() waited for it); wait for the second and the 4 heartbeats
            with contextlib.suppress(OSError, ValueError):
                view = request(hosts[1] + "/r4/?cluster=1", headers=auth).json()
                if isinstance(view, dict) and len(view.get("workers", [])) == 4:
                    break
            assert time.monotonic() < deadline, f"4 workers not listed:\n{server.log()}"
            time.sleep(0.1)
        assert view["scope"] == "cluster"  # type: ignore[index]

        # The partner contract: 16 request threads on two hosts, a partner answering in 300 ms, 4 slots.
        set_partner(hosts[0], down=False, latency_ms=300)

        def authorize(i: int) -> dict[str, object]:
            answer = request(f"{hosts[i % 2]}/authorize", "POST", b"", {"X-Forwarded-For": f"198.18.7.{i}"},
                             timeout=20)
            assert answer.status == 200, answer  # denying is not failing
            return answer.json()  # type: ignore[return-value]

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(authorize, range(48)))
        causes = [a.get("cause") for a in answers]
        assert "BulkheadFull" in causes and None in causes, causes  # pressed past the contract, and served
        seen = request(hosts[1] + "/dashboard/state.json").json()["partner_cluster"]  # type: ignore[index]
        assert 1 <= seen["peak"] <= 4, seen  # never more than 4 at the partner, from all 4 workers together

        def transition(to: str, host: str) -> dict[str, object]:
            body = json.dumps({"to": to, "timeout": 10}).encode()
            answer = request(host + "/r4/acquirer/transition", "POST", body, auth, timeout=20)
            assert answer.status == 200, answer
            result = answer.json()
            assert isinstance(result, dict) and result["missing"] == [], result
            assert len(result["acks"]) == 4 and all(a["ok"] for a in result["acks"]), result
            return result

        transition("FORCED_OPEN", hosts[0])
        for h, host in enumerate(hosts):  # each of the 4 workers acknowledged after applying it: no waiting
            statuses = [
                request(f"{host}/authorize?fallback=0", "POST", b"", {"X-Forwarded-For": f"198.18.9.{10 * h + i}"}).status
                for i in range(8)
            ]
            assert statuses == [503] * 8, (host, statuses)
        transition("CLOSED", hosts[1])
        assert request(f"{hosts[0]}/authorize", "POST", b"", {"X-Forwarded-For": "198.18.9.99"}).status == 200

        # The shared breaker: failures on the first host open it; the second host, which served none of those
        # calls, refuses too. The partner is down for both, so a worker still CLOSED would answer 502, not 503.
        set_partner(hosts[0], down=True, latency_ms=0)
        failing: list[int] = []
        for i in range(60):  # 10 calls with >= 50 % failures on one worker open it (demo settings)
            failing.append(request(f"{hosts[0]}/authorize?fallback=0", "POST", b"",
                                   {"X-Forwarded-For": f"198.18.10.{i}"}).status)
            if failing[-1] == 503:
                break
        assert failing[-1] == 503 and set(failing[:-1]) == {502}, failing
        open_on: set[str] = set()
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(open_on) < 2:  # both workers of the second host read OPEN (state only: no calls made)
            answer = request(hosts[1] + "/r4/", headers=auth)
            items = answer.json()
            assert isinstance(items, list), items
            breaker = next(x for x in items if x["type"] == "circuitbreaker" and x["name"] == "acquirer")
            if breaker["state"]["state"] == "OPEN":
                open_on.add(answer.headers["x-r4-worker-pid"])
            assert time.monotonic() < deadline, (open_on, breaker, server.log())
        statuses = [
            request(f"{hosts[1]}/authorize?fallback=0", "POST", b"", {"X-Forwarded-For": f"198.18.11.{i}"}).status
            for i in range(8)
        ]
        assert statuses == [503] * 8, statuses

        if shutil.which("node"):  # the dashboard draws the cluster: the partner's count and the shared breaker
            seen = run_dashboard_script(tmp_path, hosts[1])
            assert "calls in flight from every worker of every host" in seen["cluster"], seen  # type: ignore[operator]
            assert "against a contract of <b>4</b>" in seen["cluster"], seen  # type: ignore[operator]
            assert 'the breaker is cluster-wide: <b class="OPEN">OPEN</b>' in seen["cluster"], seen  # type: ignore[operator]
