"""``manage.py r4`` in local mode: status (table, JSON, watch), reset, drain, transition, errors."""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command

from django_ratelimit_r4 import get_bulkhead, get_circuit_breaker, get_rate_limiter, get_retry
from django_ratelimit_r4.management.commands import r4 as r4_command


@pytest.fixture
def fresh(settings: Any, r4_clock: Any) -> Any:
    """Fresh instances of the test settings (plus a keyed limiter) on a fake clock."""
    config = copy.deepcopy(django_settings.RATELIMIT_R4)
    config["ratelimiters"]["instances"]["per_ip"] = {"limit_for_period": 3, "key": "ip"}
    settings.RATELIMIT_R4 = config
    return r4_clock


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("r4", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _by(items: list[dict[str, Any]], type_: str, name: str) -> dict[str, Any]:
    return next(i for i in items if i["type"] == type_ and i["name"] == name)


def test_status_shows_gcra_and_sliding_window_limiters_state(settings: Any, fresh: Any) -> None:
    """Issue 13: ``r4 status`` shows a GCRA and a sliding-window instance like a cycle one, their state from
    their algorithm (available permits, the wait for one) and their config's ``algorithm`` and ``burst``."""
    config = copy.deepcopy(settings.RATELIMIT_R4)
    instances = config["ratelimiters"]["instances"]
    instances["smooth_g"] = {"limit_for_period": 4, "limit_refresh_period": "1s", "algorithm": "gcra", "burst": 2}
    instances["smooth_s"] = {"limit_for_period": 3, "limit_refresh_period": "1s", "algorithm": "sliding_window"}
    settings.RATELIMIT_R4 = config
    assert [get_rate_limiter("smooth_g").acquire_permission() for _ in range(3)] == [True, True, False]
    assert [get_rate_limiter("smooth_s").acquire_permission() for _ in range(4)] == [True] * 3 + [False]
    fresh.advance(0.1)
    items = json.loads(run("status", "--json")[0])
    gcra, sliding = _by(items, "ratelimiter", "smooth_g"), _by(items, "ratelimiter", "smooth_s")
    assert (gcra["config"]["algorithm"], gcra["config"]["burst"]) == ("gcra", 2)
    assert sliding["config"]["algorithm"] == "sliding_window"
    # GCRA: one permit per 250 ms, burst 2, both spent 100 ms ago: the next in 150 ms.
    assert (gcra["state"]["available_permissions"], gcra["state"]["nanos_to_wait"]) == (0, 150_000_000)
    assert (gcra["state"]["successful_calls"], gcra["state"]["failed_calls"]) == (2, 1)
    # The sliding window: 3 in the last second, the oldest leaves it in 900 ms.
    assert (sliding["state"]["available_permissions"], sliding["state"]["nanos_to_wait"]) == (0, 900_000_000)
    assert (sliding["state"]["successful_calls"], sliding["state"]["failed_calls"]) == (3, 1)
    table = run("status")[0]
    assert "smooth_g" in table and "smooth_s" in table


def test_status_json_after_11_calls_shows_zero_available(fresh: Any) -> None:
    for _ in range(11):
        get_rate_limiter("api").acquire_permission()
    out, err = run("status", "--json")
    items = json.loads(out)
    assert out == json.dumps(items, indent=2, sort_keys=True) + "\n"
    api = _by(items, "ratelimiter", "api")
    assert api["state"]["available_permissions"] == 0
    assert api["state"]["nanos_to_wait"] == 1_000_000_000
    assert (api["state"]["successful_calls"], api["state"]["failed_calls"]) == (10, 1)
    assert api["config"] == {
        "algorithm": "cycle",
        "burst": None,
        "limit_for_period": 10,
        "limit_refresh_period": "1s",
        "timeout_duration": "0s",
        "drain_permissions_on_result": None,
        "writable_stack_trace_enabled": True,
        "key": None,
        "max_keys": 100_000,
        "key_idle_timeout": None,
        "backend": "default",
        "on_backend_error": None,
        "lease": None,
    }
    assert "in-memory backend" in err and "--url" in err


def test_status_json_lists_every_type_with_snake_case_state(fresh: Any) -> None:
    items = json.loads(run("status", "--json")[0])
    assert [(i["type"], i["name"]) for i in items] == [
        ("ratelimiter", "api"),
        ("ratelimiter", "slow"),
        ("ratelimiter", "per_ip"),
        ("ratelimiter", "burst"),
        ("ratelimiter", "burst3"),
        ("ratelimiter", "sustained"),
        ("bulkhead", "acquirer"),
        ("circuitbreaker", "acquirer"),
        ("retry", "acquirer"),
        ("timelimiter", "acquirer"),
    ]
    for item in items:
        assert set(item) == {"type", "name", "config", "state"}
        assert all(k == k.lower() and " " not in k for k in (*item["config"], *item["state"]))
    assert _by(items, "bulkhead", "acquirer")["state"]["available_concurrent_calls"] == 2
    assert _by(items, "bulkhead", "acquirer")["config"]["retry_after"] == "1s"
    breaker = _by(items, "circuitbreaker", "acquirer")
    assert breaker["state"]["state"] == "CLOSED" and breaker["config"]["wait_duration_in_open_state"] == "3s"
    assert _by(items, "retry", "acquirer")["config"]["wait_duration"] == "100ms"
    assert _by(items, "ratelimiter", "per_ip")["state"]["keyed"]["live_keys"] == 0
    assert _by(items, "ratelimiter", "api")["state"]["keyed"] is None


def test_status_reflects_live_state(fresh: Any) -> None:
    bulkhead = get_bulkhead("acquirer")
    assert bulkhead.try_acquire_permission()
    breaker = get_circuit_breaker("acquirer")
    breaker.transition_to_open_state()
    fresh.advance(1)
    get_retry("acquirer").call(lambda: "ok")
    get_rate_limiter("per_ip", key="198.51.100.1").acquire_permission()
    items = json.loads(run("status", "--json")[0])
    assert _by(items, "bulkhead", "acquirer")["state"]["concurrent_calls"] == 1
    open_state = _by(items, "circuitbreaker", "acquirer")["state"]
    assert open_state["state"] == "OPEN"
    assert open_state["remaining_open_ns"] == 2_000_000_000 and open_state["remaining_open_seconds"] == 2.0
    assert _by(items, "retry", "acquirer")["state"]["number_of_successful_calls_without_retry_attempt"] == 1
    keyed = _by(items, "ratelimiter", "per_ip")["state"]["keyed"]
    assert keyed["live_keys"] == 1 and "keys" not in keyed
    assert "198.51.100.1" not in run("status", "--json")[0]
    with_keys = json.loads(run("status", "per_ip", "--json", "--keys")[0])
    assert with_keys[0]["state"]["keyed"]["keys"] == {
        "198.51.100.1": {"available_permissions": 2, "nanos_to_wait": 0}
    }
    bulkhead.release_permission()


def test_status_table_escapes_control_characters_of_client_keys(fresh: Any) -> None:
    # A client chooses its key's text (a header or a query parameter a key function reads): printed raw, a
    # newline forged lines of the operator's table and an ESC sequence reached the terminal.
    hostile = "k\n    ip:203.0.113.9: 3 available, wait 0\x1b]0;pwned\x07\x1b[2J\x00\u2028"
    get_rate_limiter("per_ip", key=hostile).acquire_permission()
    get_rate_limiter("per_ip", key="plain key é").acquire_permission()
    out, _ = run("status", "per_ip", "--keys")
    assert not any(c in out for c in "\x1b\x07\x00\u2028"), out
    keys = out[out.index("per_ip: keys") :].splitlines()[1:]
    assert len(keys) == 2, out  # one line per key: no forged line
    assert any(line.startswith("    'k\\n    ip:203.0.113.9") for line in keys), keys
    assert any(line.startswith("    plain key é: 2 available") for line in keys), keys  # printable: as it is
    listed = json.loads(run("status", "per_ip", "--json", "--keys")[0])[0]["state"]["keyed"]["keys"]
    assert hostile in listed  # the JSON keeps the exact key (r4 reset --key takes it)


def test_status_table(fresh: Any) -> None:
    for _ in range(11):
        get_rate_limiter("api").acquire_permission()
    get_circuit_breaker("acquirer").transition_to_open_state()
    out, _ = run("status")
    lines = out.splitlines()
    assert lines[0] == "Rate limiters"
    header = lines[1].split()
    assert header[:3] == ["NAME", "LIMIT", "AVAILABLE"]
    assert lines[2].split()[:5] == ["api", "10/1s", "0", "1s", "0"]
    assert lines[2].split()[5:7] == ["10", "1"]
    for title in ("Bulkheads", "Circuit breakers", "Retries", "Time limiters"):
        assert title in lines
    breaker_row = next(line for line in lines if line.startswith("acquirer") and "OPEN" in line)
    assert breaker_row.split()[1] == "OPEN" and breaker_row.split()[-1] == "3s"


def test_status_filters_by_name_and_type(fresh: Any) -> None:
    items = json.loads(run("status", "api", "circuitbreaker:acquirer", "--json")[0])
    assert [(i["type"], i["name"]) for i in items] == [("ratelimiter", "api"), ("circuitbreaker", "acquirer")]
    assert len(json.loads(run("status", "acquirer", "--json")[0])) == 4  # every type named so
    with pytest.raises(CommandError, match=r"no ratelimiter or bulkhead .* named 'nope'.*api, slow"):
        run("status", "nope")


def test_watch_redraws_until_ctrl_c(fresh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []

    def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt
        get_rate_limiter("api").acquire_permission()  # the next frame must show the change

    monkeypatch.setattr(r4_command, "sleep", fake_sleep)
    out, _ = run("status", "api", "--watch", "0.5")
    frames = out.split(r4_command.CLEAR)[1:]
    assert sleeps == [0.5, 0.5]
    assert len(frames) == 2
    assert "every 0.5s, Ctrl-C to stop" in frames[0]
    assert frames[0].splitlines()[4].split()[2] == "10"
    assert frames[1].splitlines()[4].split()[2] == "9"


def test_watch_refuses_non_positive_intervals(fresh: Any) -> None:
    with pytest.raises(CommandError, match="more than 0 seconds"):
        run("status", "--watch", "0")


@pytest.mark.parametrize("interval", ["inf", "nan", "1e12"])
def test_watch_refuses_intervals_sleep_cannot_take(fresh: Any, interval: str) -> None:
    # time.sleep(inf) / sleep(1e12) raise OverflowError: a traceback after the first frame.
    with pytest.raises(CommandError, match="seconds"):
        run("status", "--watch", interval)


def test_reset_drain_transition(fresh: Any) -> None:
    out, err = run("drain", "slow")
    assert out.strip() == "ratelimiter 'slow': drained 10 permission(s)"
    assert "in-memory" in err
    assert get_rate_limiter("slow").metrics.available_permissions == 0
    assert run("reset", "slow")[0].strip() == "ratelimiter 'slow': reset"
    assert get_rate_limiter("slow").metrics.available_permissions == 10

    assert run("transition", "circuitbreaker:acquirer", "--to", "forced_open")[0].strip() == (
        "circuitbreaker 'acquirer': CLOSED -> FORCED_OPEN"
    )
    assert get_circuit_breaker("acquirer").state.name == "FORCED_OPEN"
    run("reset", "circuitbreaker:acquirer")
    assert get_circuit_breaker("acquirer").state.name == "CLOSED"


def test_reset_and_drain_of_one_key(fresh: Any) -> None:
    a = get_rate_limiter("per_ip", key="a")
    b = get_rate_limiter("per_ip", key="b")
    a.acquire_permission()
    b.acquire_permission()
    out, _ = run("drain", "per_ip", "--key", "b")
    assert out.strip() == "ratelimiter 'per_ip' (one client key): drained 2 permission(s)"
    assert (a.metrics.available_permissions, b.metrics.available_permissions) == (2, 0)
    run("reset", "per_ip", "--key", "b")
    assert (a.metrics.available_permissions, b.metrics.available_permissions) == (2, 3)
    run("reset", "per_ip")
    assert a.metrics.available_permissions == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("reset", "nope"), "no ratelimiter or circuitbreaker or retry or timelimiter named 'nope'"),
        (("reset", "acquirer"), "name one: circuitbreaker:acquirer, retry:acquirer, timelimiter:acquirer"),
        (("reset", "bulkhead:acquirer"), "reset applies to"),
        (("drain", "acquirer"), "drain applies to ratelimiter instances only"),
        (("reset", "circuitbreaker:acquirer", "--key", "k"), "--key applies to rate limiters only"),
        (("transition", "api", "--to", "OPEN"), "transition applies to circuitbreaker"),
        (("transition", "circuitbreaker:acquirer", "--to", "SIDEWAYS"), "invalid choice"),
        (("transition", "circuitbreaker:acquirer"), "--to"),
        ((), "required"),
        (("status", "--url", "ftp://host/ops/r4/", "--token", "t"), "http:// or https://"),
        (("status", "--url", "http://127.0.0.1:9/ops/r4/"), "needs the endpoint's bearer token"),
    ],
)
def test_errors_are_command_errors(
    fresh: Any, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], message: str
) -> None:
    monkeypatch.delenv(r4_command.TOKEN_ENV, raising=False)
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(*args)


def test_bulkhead_reset_is_refused_with_a_reason(settings: Any) -> None:
    settings.RATELIMIT_R4 = {"bulkheads": {"instances": {"db": {"max_concurrent_calls": 1}}}}
    with pytest.raises(CommandError, match="calls in flight"):
        run("reset", "db")


def test_illegal_transition(fresh: Any) -> None:
    get_circuit_breaker("acquirer").transition_to_metrics_only_state()
    with pytest.raises(CommandError, match="METRICS_ONLY -> HALF_OPEN is not an allowed transition"):
        run("transition", "circuitbreaker:acquirer", "--to", "HALF_OPEN")


def test_misconfigured_instance_is_a_command_error(settings: Any) -> None:
    settings.RATELIMIT_R4 = {"ratelimiters": {"instances": {"bad": {"limit_for_period": 0}}}}
    with pytest.raises(CommandError, match="misconfigured"):
        run("drain", "bad")
    items = json.loads(run("status", "--json")[0])
    assert items == []  # broken instances are skipped; manage.py check reports them


def test_shared_backend_note(settings: Any) -> None:
    pytest.importorskip("redis")
    # Rate limiters all on a redis backend (nothing listens on port 1: the state read is a fault, not an error).
    settings.RATELIMIT_R4 = {
        "backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://127.0.0.1:1/15"}},
        "ratelimiters": {"instances": {"api": {"backend": "shared", "limit_refresh_period": "1s"}}},
    }
    _, err = run("status", "api")
    assert "shared redis state" in err and "in-memory" not in err
    # One of them per process: the note says so.
    settings.RATELIMIT_R4 = {
        **settings.RATELIMIT_R4,
        "ratelimiters": {"instances": {"api": {"backend": "shared"}, "pool": {}}},
    }
    _, err = run("status", "api")
    assert "in-memory backend" in err


def test_empty_setting(settings: Any) -> None:
    settings.RATELIMIT_R4 = {}
    assert run("status")[0].strip() == "No instances configured in RATELIMIT_R4."
    assert json.loads(run("status", "--json")[0]) == []


@pytest.mark.parametrize(
    ("nanos", "text"),
    [
        (None, "-"),
        (0, "0"),
        (999, "999ns"),
        (1_500, "1.5us"),
        (850_000_000, "850ms"),
        (1_500_000_000, "1.5s"),
        (90_000_000_000, "1.5m"),
        (7_200_000_000_000, "2h"),
    ],
)
def test_human_ns(nanos: int | None, text: str) -> None:
    assert r4_command.human_ns(nanos) == text


def test_status_table_counts_a_keyed_limiters_clients(fresh: Any) -> None:
    """A per-client limiter's row adds up its clients' decisions; 'available' is per client, so not shown."""
    from django_ratelimit_r4.registry import get_keyed_rate_limiter

    keyed = get_keyed_rate_limiter("per_ip")
    outcomes = [keyed.acquire_permission("203.0.113.7") for _ in range(5)]
    assert outcomes == [True, True, True, False, False]
    out, _ = run("status", "per_ip")
    row = next(line.split() for line in out.splitlines() if line.startswith("per_ip"))
    header = next(line.split() for line in out.splitlines() if "GRANTED" in line)
    cells = dict(zip(header, row, strict=True))
    assert (cells["AVAILABLE"], cells["GRANTED"], cells["REJECTED"], cells["KEYS"]) == ("per-key", "3", "2", "1")


# ------------------------------------------------------------- --url: the token goes to --url only


class _Recorder:
    """A real HTTP server in a thread: ``/go/<code>`` answers that redirect to ``/landed/`` on the same
    server (or ``?to=`` elsewhere), ``/landed/`` answers ``[]``; every request's Authorization is kept."""

    def __init__(self) -> None:
        import http.server
        import threading

        seen = self.seen = []  # (method, path, Authorization or None)

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                seen.append((self.command, self.path, self.headers.get("Authorization")))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if self.path.startswith("/go/"):
                    code = int(self.path.split("/")[2])
                    where = (
                        self.path.partition("?to=")[2]
                        or f"http://127.0.0.1:{self.server.server_port}/landed/"
                    )
                    self.send_response(code)
                    self.send_header("Location", where)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b"[]" if self.command == "GET" else b'{"action": "reset", "type": "ratelimiter"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:  # keep the test output clean
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def recorder() -> Any:
    server = _Recorder()
    yield server
    server.close()


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("args", [("status",), ("reset", "api")], ids=["get", "post"])
def test_url_never_follows_a_redirect_with_the_token(
    fresh: Any, recorder: Any, code: int, args: tuple[str, ...]
) -> None:
    url = f"{recorder.url}/go/{code}/"
    with pytest.raises(CommandError) as refused:
        run(*args, "--url", url, "--token", "s3cret-token")
    message = str(refused.value)
    assert f"HTTP {code}" in message and f"{recorder.url}/landed/" in message  # names the Location
    assert "does not follow redirects" in message
    # The server saw exactly the one request to --url; nothing reached the Location, token or not.
    sent = f"/go/{code}/" + ("api/reset" if args[0] == "reset" else "?cluster=1")
    assert [(path, auth) for _, path, auth in recorder.seen] == [(sent, "Bearer s3cret-token")]


def test_url_redirect_to_another_host_is_named_and_not_followed(fresh: Any, recorder: Any) -> None:
    with pytest.raises(CommandError, match=r"redirecting to https://collector\.example/steal"):
        run("status", "--url", f"{recorder.url}/go/302/?to=https://collector.example/steal", "--token", "t")
    assert len(recorder.seen) == 1


def test_url_without_a_redirect_still_works(fresh: Any, recorder: Any) -> None:
    out, _ = run("status", "--json", "--url", f"{recorder.url}/landed/", "--token", "t")
    assert json.loads(out) == []
    assert recorder.seen == [("GET", "/landed/?cluster=1", "Bearer t")]  # a cluster view if the server has one


@pytest.mark.parametrize(
    "url",
    [
        "http://r4.example.com/ops/r4/",
        "http://192.0.2.10/ops/r4/",
        "http://[2001:db8::1]/ops/r4/",
        "http://localhost.example.com/ops/r4/",
        "http://128.0.0.1/ops/r4/",
    ],
)
def test_plain_http_to_a_remote_host_is_refused(
    fresh: Any, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    sent: list[str] = []
    monkeypatch.setattr(r4_command.Remote, "_request", lambda self, u, body: sent.append(u) or [])
    with pytest.raises(
        CommandError, match=r"refusing to send the bearer token over plain http://.*--allow-insecure-http"
    ):
        run("status", "--url", url, "--token", "t")
    assert sent == []  # refused before any connection
    run("status", "--url", url, "--token", "t", "--allow-insecure-http")  # the operator's explicit choice
    run("status", "--url", url.replace("http://", "https://"), "--token", "t")  # https needs no flag
    assert len(sent) == 2


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/r4/",
        "http://127.1.2.3/r4/",
        "http://localhost:8000/r4/",
        "http://LOCALHOST/r4/",
        "http://[::1]:8000/r4/",
        "http://[::ffff:127.0.0.1]/r4/",
    ],
)
def test_plain_http_to_loopback_needs_no_flag(fresh: Any, monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    sent: list[str] = []
    monkeypatch.setattr(r4_command.Remote, "_request", lambda self, u, body: sent.append(u) or [])
    run("status", "--url", url, "--token", "t")
    assert len(sent) == 1


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (("--url", "http://[::1/r4/", "--token", "t"), None, "not a valid URL"),
        (("--url", "http://127.0.0.1:99999/r4/", "--token", "t"), None, "not a valid URL"),
        (("--url", "http://127.0.0.1:8000/r4 x/", "--token", "t"), None, "whitespace or a control character"),
        (("--url", "http://ops:s3cret-pw@127.0.0.1:8000/r4/", "--token", "t"), None, "user:password@"),
        (("--url", "http://127.0.0.1:8000/r4/", "--token", "s3cret-token\r\nX-Injected: 1"), None, "token"),
        (("--url", "http://127.0.0.1:8000/r4/"), "s3cret-token\x1b[2J-from-a-file", "R4_STATE_ENDPOINT_TOKEN"),
        (("--url", "http://127.0.0.1:8000/r4/", "--token", "s3cret-t\u20acken"), None, "token"),
    ],
    ids=["ipv6-bracket", "port", "space", "userinfo", "crlf-token", "env-token-escape", "non-latin1-token"],
)
def test_url_mode_refuses_a_bad_url_or_token_with_a_command_error_that_shows_no_secret(
    fresh: Any, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], env: str | None, says: str
) -> None:
    # Each was a traceback (ValueError, InvalidURL, UnicodeEncodeError), the token's printed in urllib's
    # "Invalid header value b'Bearer ...'"; a user:password@ URL was echoed in the error, password and all.
    if env is not None:
        monkeypatch.setenv(r4_command.TOKEN_ENV, env)
    sent: list[str] = []
    monkeypatch.setattr(r4_command.Remote, "_request", lambda self, u, body: sent.append(u) or [])
    for command in (("status",), ("reset", "api")):
        with pytest.raises(CommandError) as refused:
            run(*command, *args)
        assert says in str(refused.value)
        assert "s3cret" not in str(refused.value)
    assert sent == []  # refused before any connection


@pytest.mark.parametrize(
    "answer",
    [
        [1],
        [{"id": 1, "title": "not a state entry"}],
        {"count": 0, "results": []},  # a paginated API: was shown as "No instances configured"
        {"scope": "worker", "instances": [{"type": "ratelimiter", "name": "a", "config": {}, "state": {}}]},
        {"scope": "cluster", "workers": [1]},
    ],
    ids=["list-of-ints", "list-of-other-objects", "another-api", "entries-without-fields", "cluster-of-ints"],
)
def test_url_answering_json_that_is_no_state_is_a_command_error(
    fresh: Any, monkeypatch: pytest.MonkeyPatch, answer: Any
) -> None:
    # --url pointing at another JSON API (or a server of another shape) died in the table code with a
    # KeyError / TypeError / AttributeError traceback, or printed a wrong "No instances configured".
    monkeypatch.setattr(r4_command.Remote, "_request", lambda self, u, body: answer)
    with pytest.raises(CommandError, match="is --url the state endpoint"):
        run("status", "--url", "https://r4.example.com/ops/r4/", "--token", "t")


@pytest.mark.parametrize("interval", ["0.001", "1e-300"])
def test_watch_refuses_an_interval_that_would_redraw_in_a_busy_loop(
    fresh: Any, monkeypatch: pytest.MonkeyPatch, interval: str
) -> None:
    # --watch 1e-300 redrew without pausing: a core spent on the terminal, and with --url thousands of
    # requests a second to the server's state endpoint.
    monkeypatch.setattr(r4_command, "sleep", lambda seconds: pytest.fail("must be refused before the first frame"))
    with pytest.raises(CommandError, match=r"at least 0\.1 seconds"):
        run("status", "--watch", interval)


def test_a_client_key_given_in_code_as_a_number_is_listed_reset_and_shared_as_its_text(fresh: Any) -> None:
    # get_rate_limiter("per_user", key=user.pk) in a service function: the int key crashed r4 status --keys
    # (AttributeError), --json --keys and the endpoint's ?keys=1 (TypeError sorting int and str keys: a 500),
    # and `r4 reset --key 42` could not name it; on Redis (which hashes str(key)) 42 and "42" were already one.
    get_rate_limiter("per_ip", key=42).acquire_permission()
    get_rate_limiter("per_ip", key="42").acquire_permission()  # the same client
    get_rate_limiter("per_ip", key="ip:203.0.113.7").acquire_permission()
    assert get_rate_limiter("per_ip", key=42).metrics.available_permissions == 1
    out, _ = run("status", "per_ip", "--keys")
    assert "    42: 1 available" in out
    data = json.loads(run("status", "per_ip", "--json", "--keys")[0])
    assert sorted(_by(data, "ratelimiter", "per_ip")["state"]["keyed"]["keys"]) == ["42", "ip:203.0.113.7"]
    run("reset", "per_ip", "--key", "42")
    assert get_rate_limiter("per_ip", key=42).metrics.available_permissions == 3


def test_url_mode_sends_a_token_from_an_env_file_without_its_line_ending(
    fresh: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The endpoint strips the credentials it is sent, so the line ending is no part of the token (urllib refused
    # to send it: a traceback printing the token).
    monkeypatch.setenv(r4_command.TOKEN_ENV, "token-from-an-env-file\r\n")
    sent: list[str] = []
    monkeypatch.setattr(r4_command.Remote, "_request", lambda self, u, body: sent.append(self.token) or [])
    run("status", "--url", "http://127.0.0.1:8000/r4/")
    assert sent == ["token-from-an-env-file"]
