"""One control plane (issue 11): which worker answered without one; heartbeats, cluster status and broadcast
actions with one, against real Redis; the cluster-wide bulkhead's figures in r4 status and Prometheus.

Several processes on two gunicorn "hosts" are in test_control_cluster.py; here the test process itself is the
worker (its control thread runs), and fake heartbeats stand for other workers where that is enough.
"""

from __future__ import annotations

import copy
import io
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.test import Client

from django_ratelimit_r4 import conf, control, get_bulkhead, get_circuit_breaker, get_rate_limiter
from django_ratelimit_r4.management.commands import r4 as r4_command
from tests.backends.patient import patient_redis_url  # noqa: F401  (exactness tests: patient timeouts)
from tests.redis_prefix import close_and_delete

TOKEN = "t0ken-" + "x" * 40
BASE = "/ops/r4/"
HANG_GUARD_S = 30.0  # only bounds a broken run
# An action's --timeout: the command returns as soon as every live worker acknowledged, so only a broken run
# waits this long; the default (2 s) is a wall-clock bet that this worker's thread answers in time under load.
ACK_WAIT = ["--timeout", f"{HANG_GUARD_S:g}"]


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("r4", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _bearer() -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}


def _until(predicate: Any, what: str) -> Any:
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"not in {HANG_GUARD_S}s: {what}"
        time.sleep(0.02)


# ------------------------------------------------------------------ without a control plane: one worker, named


@pytest.fixture
def ops(settings: Any, r4_clock: Any) -> Any:
    config = copy.deepcopy(django_settings.RATELIMIT_R4)
    config["state_endpoint_token"] = TOKEN
    settings.RATELIMIT_R4 = config
    settings.ROOT_URLCONF = "tests.state_urls"
    return r4_clock


def test_the_endpoint_names_the_worker_and_the_scope_of_an_action(ops: Any, client: Client) -> None:
    response = client.post(BASE + "acquirer/transition", {"to": "FORCED_OPEN"}, **_bearer())
    assert response.status_code == 200
    body = response.json()
    assert body["scope"] == "worker"
    assert body["worker"]["pid"] == int(response["X-R4-Worker-Pid"])
    assert body["worker"]["host"] == response["X-R4-Worker-Host"] == control.worker()["host"]
    assert (body["from_state"], body["to_state"]) == ("CLOSED", "FORCED_OPEN")
    view = client.get(BASE + "?cluster=1", **_bearer()).json()
    assert view["scope"] == "worker" and view["worker"]["pid"] == body["worker"]["pid"]
    assert any(i["name"] == "acquirer" and i["type"] == "circuitbreaker" for i in view["instances"])
    assert isinstance(client.get(BASE, **_bearer()).json(), list)  # a plain GET keeps its list


@pytest.mark.parametrize(
    "body",
    [
        '{"timeout": "soon"}',
        '{"timeout": -1}',
        '{"timeout": NaN}',
        '{"timeout": Infinity}',
        '{"timeout": true}',
        '{"timeout": [1]}',
        '{"timeout": 1' + "0" * 400 + "}",  # an int too large for a float: OverflowError, a 500 before
        '{"timeout": "1' + "0" * 400 + '"}',
    ],
)
def test_timeout_field_is_validated(ops: Any, client: Client, body: str) -> None:
    response = client.post(BASE + "slow/drain", body, content_type="application/json", **_bearer())
    assert response.status_code == 400 and "'timeout' must be a number" in response.json()["error"]


class _Worker:
    """Stands for the state endpoint of one worker: answers like views.py does, with its headers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, host: str, pid: int, body: Any) -> None:
        self.sent: list[tuple[str, Any]] = []

        def fake(remote: r4_command.Remote, url: str, data: bytes | None) -> Any:
            self.sent.append((url, data))
            remote.last_worker = {"host": host, "pid": pid}
            return body(url, data)

        monkeypatch.setattr(r4_command.Remote, "_request", fake)


def test_a_remote_action_says_which_worker_changed_and_that_only_it_did(
    ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = {
        "action": "transition",
        "type": "circuitbreaker",
        "name": "acquirer",
        "from_state": "CLOSED",
        "to_state": "FORCED_OPEN",
        "scope": "worker",
        "worker": {"host": "web-2", "pid": 4242},
    }
    _Worker(monkeypatch, "web-2", 4242, lambda url, data: result)
    out, _ = run("transition", "acquirer", "--to", "FORCED_OPEN", "--url", "http://127.0.0.1:9/ops/r4/", "--token", "t")
    assert out.strip() == (
        "circuitbreaker 'acquirer': CLOSED -> FORCED_OPEN on worker web-2 pid 4242 only: without a control plane "
        'the other workers keep their own state (set RATELIMIT_R4["control"] to reach every worker)'
    )


def test_a_remote_status_names_the_worker_that_answered(ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A server older than the control plane ignores ?cluster=1 and answers the list: the headers name it.
    _Worker(monkeypatch, "web-1", 77, lambda url, data: [])
    out, err = run("status", "--json", "--url", "http://127.0.0.1:9/ops/r4/", "--token", "t")
    assert json.loads(out) == []
    assert "answered by worker web-1 pid 77" in err and "that worker's own" in err


def test_a_live_server_names_itself(ops: Any, live_server: Any, settings: Any) -> None:
    settings.STATIC_URL = "/static/"
    out, err = run("transition", "acquirer", "--to", "OPEN", "--url", live_server.url + BASE, "--token", TOKEN)
    assert f"on worker {control.worker()['host']} pid {control.worker()['pid']} only" in out
    out, err = run("status", "acquirer", "--url", live_server.url + BASE, "--token", TOKEN)
    assert f"answered by worker {control.worker()['host']} pid {control.worker()['pid']}" in err


# ----------------------------------------------------------------------- with a control plane on real Redis


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test only; every key under it is deleted afterwards, once the threads of every
    cluster-wide breaker and bulkhead are closed (the registry forgets them without closing them, and a
    forgotten breaker's listener wrote its state back under the deleted prefix after a fault: a key for ever)."""
    value = f"r4test:{uuid.uuid4().hex[:12]}"
    yield value
    close_and_delete(redis_url, value)


@pytest.fixture
def cluster(settings: Any, redis_url: str, prefix: str, r4_clock: Any) -> Iterator[control.ControlPlane]:
    """Test settings with a shared redis backend and the control plane on it; this process is a worker."""
    config = copy.deepcopy(django_settings.RATELIMIT_R4)
    config["backends"] = {"shared": {"BACKEND": "redis", "LOCATION": redis_url, "OPTIONS": {"key_prefix": prefix}}}
    config["control"] = {"backend": "shared", "heartbeat_interval": "100ms"}
    config["state_endpoint_token"] = TOKEN
    config["bulkheads"]["instances"]["partner"] = {"max_concurrent_calls": 3, "backend": "shared"}
    settings.RATELIMIT_R4 = config
    settings.ROOT_URLCONF = "tests.state_urls"
    plane = control.start()
    assert plane is not None
    _until(lambda: plane.subscribed.is_set() and plane.workers(), "this worker's first heartbeat")
    yield plane
    control.stop()
    # stop() waits a bounded time: a thread still running could write after the prefix's keys are deleted.
    _until(lambda: not plane.running, "this worker's control thread to end")


def _fake_worker(plane: control.ControlPlane, host: str, pid: int, instances: list[dict[str, Any]], ttl_ms: int) -> None:
    """A heartbeat as another worker writes it (no thread behind it: it never acknowledges)."""
    payload = {"host": host, "pid": pid, "started": time.time(), "beat_ms": plane._server_ms(), "instances": instances}
    plane._run("beat", f"{host}:{pid}:0", json.dumps(payload), ttl_ms)


def test_control_options_and_their_checks() -> None:
    analysis = conf.analyse(
        {
            "backends": {"shared": {"BACKEND": "redis", "LOCATION": "redis://r:6379/0"}},
            "control": {"backend": "shared"},
        }
    )
    assert analysis.problems == []
    assert analysis.control == conf.ControlOptions("shared", 5_000_000_000)
    assert analysis.control.heartbeat_ttl_ns == 15_000_000_000
    assert conf.analyse({}).control is None  # off unless written
    broken = conf.analyse({"control": {"backend": "shared", "heartbaet_interval": "1s"}})
    assert broken.control is None  # a broken control setting turns only the control plane off
    assert {p.code for p in broken.problems} == {conf.Code.UNKNOWN_KEY, conf.Code.INVALID_CONTROL}


def test_status_lists_this_worker_with_its_instances(cluster: control.ControlPlane) -> None:
    get_rate_limiter("api").acquire_permission()
    out, err = run("status", "--json")
    assert err == ""  # no "this process only" caveat: the control plane reaches every worker
    view = json.loads(out)
    assert view["scope"] == "cluster" and view["backend"] == "shared"
    me = control.worker()
    listed = [(w["host"], w["pid"]) for w in view["workers"]]
    assert (me["host"], me["pid"]) in listed
    table, _ = run("status")
    assert table.startswith("Workers: ")
    assert f"{me['host']}" in table and str(me["pid"]) in table


def test_totals_add_up_counters_and_count_breaker_states(cluster: control.ControlPlane) -> None:
    def breaker(state: str, buffered: int) -> dict[str, Any]:
        return {
            "type": "circuitbreaker",
            "name": "acquirer",
            "config": {},
            "state": {
                "state": state,
                "failure_rate": -1.0,
                "slow_call_rate": -1.0,
                "number_of_buffered_calls": buffered,
                "number_of_failed_calls": 0,
                "number_of_successful_calls": buffered,
                "number_of_slow_calls": 0,
                "number_of_not_permitted_calls": 0,
                "total_not_permitted_calls": 1,
                "remaining_open_ns": 0,
                "remaining_open_seconds": 0.0,
            },
        }

    workers = [
        {"age_seconds": 1.0, "instances": [breaker("CLOSED", 2)]},
        {"age_seconds": 0.5, "instances": [breaker("CLOSED", 3)]},
        {"age_seconds": 0.1, "instances": [breaker("OPEN", 0)]},
    ]
    [total] = control.totals(workers)
    assert total["workers"] == 3
    assert total["state"]["state"] == "MIXED" and total["state"]["states"] == {"CLOSED": 2, "OPEN": 1}
    assert total["state"]["number_of_buffered_calls"] == 5 and total["state"]["total_not_permitted_calls"] == 3
    row = r4_command._row(total, 7)
    assert row[1] == "MIXED(CLOSED:2,OPEN:1)"


def test_transition_reaches_every_worker_and_reports_who_acknowledged(cluster: control.ControlPlane) -> None:
    out, _ = run("transition", "acquirer", "--to", "FORCED_OPEN", *ACK_WAIT)
    me = control.worker()
    assert "transition 'acquirer': acknowledged by 1 of 1 live worker(s)" in out
    assert f"{me['host']} pid {me['pid']}: circuitbreaker 'acquirer': CLOSED -> FORCED_OPEN" in out
    assert get_circuit_breaker("acquirer").state.name == "FORCED_OPEN"
    # A reset reaches it too, and clears the stored (sticky) state.
    run("reset", "circuitbreaker:acquirer", *ACK_WAIT)
    assert get_circuit_breaker("acquirer").state.name == "CLOSED"
    assert cluster.client.hgetall(cluster.sticky_key) == {}


def test_a_worker_that_does_not_acknowledge_is_named_and_the_command_fails(
    cluster: control.ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_worker(cluster, "ghost-host", 999_999, [], ttl_ms=60_000)
    # The ghost never acknowledges, so the command waits out its --timeout. Its clock runs out the moment it has
    # read this worker's acknowledgement (not after a fixed 0.3 s that a loaded machine may not give this
    # worker's thread): the acks it reports are then exactly this worker's, the ghost missing.
    me, main = control._worker_id(), threading.current_thread()
    read_acks = cluster.client.hgetall
    mine_read = threading.Event()

    def hgetall(key: Any) -> Any:
        raw = read_acks(key)
        acks = str(key).startswith(cluster._ack_prefix) and threading.current_thread() is main
        if acks and me in {control._text(k) for k in raw}:
            mine_read.set()
        return raw

    class Clock:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        @staticmethod
        def monotonic() -> float:
            late = mine_read.is_set() and threading.current_thread() is main
            return time.monotonic() + (HANG_GUARD_S if late else 0.0)

    monkeypatch.setattr(cluster.client, "hgetall", hgetall)
    monkeypatch.setattr(control, "time", Clock())
    with pytest.raises(CommandError, match=r"1 live worker\(s\) did not acknowledge: ghost-host pid 999999"):
        run("drain", "slow", *ACK_WAIT)
    assert mine_read.is_set()
    assert get_rate_limiter("slow").metrics.available_permissions == 0  # this worker did drain


def test_a_refusal_is_reported_per_worker(cluster: control.ControlPlane) -> None:
    get_circuit_breaker("acquirer").transition_to_metrics_only_state()
    with pytest.raises(CommandError, match=r"1 worker\(s\) refused"):
        run("transition", "acquirer", "--to", "HALF_OPEN", *ACK_WAIT)
    with pytest.raises(CommandError, match="no circuitbreaker named 'nope'"):
        run("transition", "nope", "--to", "OPEN")  # checked before anything is sent


def test_a_dead_worker_disappears_after_its_ttl(cluster: control.ControlPlane) -> None:
    _fake_worker(cluster, "dying-host", 4242, [], ttl_ms=300)
    assert any(w["host"] == "dying-host" for w in cluster.workers())
    _until(lambda: not any(w["host"] == "dying-host" for w in cluster.workers()), "the dead worker to expire")


def test_sticky_state_is_applied_by_a_worker_that_starts_later(cluster: control.ControlPlane) -> None:
    run("transition", "acquirer", "--to", "FORCED_OPEN", *ACK_WAIT)
    get_circuit_breaker("acquirer").transition_to_closed_state()  # as a fresh worker starts: CLOSED
    cluster.apply_sticky()  # what a starting worker's control plane does
    assert get_circuit_breaker("acquirer").state.name == "FORCED_OPEN"
    run("transition", "acquirer", "--to", "CLOSED", *ACK_WAIT)
    assert cluster.client.hgetall(cluster.sticky_key) == {}


def test_the_endpoint_broadcasts_and_shows_the_cluster(cluster: control.ControlPlane, client: Client) -> None:
    response = client.post(
        BASE + "acquirer/transition",
        json.dumps({"to": "FORCED_OPEN", "timeout": HANG_GUARD_S}),
        content_type="application/json",
        **_bearer(),
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["scope"] == "cluster" and body["missing"] == []
    assert [a["pid"] for a in body["acks"]] == [control.worker()["pid"]]
    assert body["acks"][0]["result"]["to_state"] == "FORCED_OPEN"
    _until(
        lambda: client.get(BASE + "?cluster=1", **_bearer()).json()["totals"][0]["workers"] >= 1,
        "a heartbeat",
    )
    view = client.get(BASE + "?cluster=1&name=circuitbreaker:acquirer", **_bearer()).json()
    assert [t["name"] for t in view["totals"]] == ["acquirer"]
    _until(
        lambda: client.get(BASE + "?cluster=1&name=circuitbreaker:acquirer", **_bearer()).json()["totals"][0][
            "state"
        ]["state"]
        == "FORCED_OPEN",
        "the heartbeat after the command",
    )


def test_the_cluster_bulkhead_in_status_and_prometheus(cluster: control.ControlPlane) -> None:
    from prometheus_client import CollectorRegistry

    from django_ratelimit_r4.contrib import prometheus

    partner = get_bulkhead("partner")
    assert partner.try_acquire_permission() and partner.try_acquire_permission()
    try:
        def row() -> list[str]:  # the totals come from the heartbeats: the next one shows the two calls
            table, _ = run("status", "partner")
            header = next(x for x in table.splitlines() if x.startswith("NAME") and "CLUSTER IN USE" in x)
            assert "EXPIRED LEASES" in header
            return next(x for x in table.splitlines() if x.startswith("partner")).split()

        # A heartbeat reads this worker's figures, then the cluster's in Redis: one taken during the acquires
        # may show the cluster's 2 and 0 here. Wait for one that shows both (a heartbeat after the acquires).
        cells = _until(lambda: (r := row())[1] == r[-2] == "2" and r, "a heartbeat after the acquires")
        assert cells[1:4] == ["2", "3", "1"]  # in use here, the cluster's max, available cluster-wide
        assert cells[-2:] == ["2", "0"]  # the cluster's slots in use, leases expired
        target = CollectorRegistry()
        target.register(prometheus.R4Collector())
        assert target.get_sample_value("r4_bulkhead_cluster_concurrent_calls", {"name": "partner"}) == 2.0
        assert target.get_sample_value("r4_bulkhead_cluster_expired_leases", {"name": "partner"}) == 0.0
        assert target.get_sample_value("r4_bulkhead_lost_leases_total", {"name": "partner"}) == 0.0
        assert target.get_sample_value("resilience4j_bulkhead_available_concurrent_calls", {"name": "partner"}) == 1.0
    finally:
        partner.on_complete()
        partner.on_complete()


def test_an_expired_lease_is_counted_cluster_wide(redis_url: str, prefix: str) -> None:
    """A lease nobody renews (its worker was killed) is given back by its TTL and counted in Redis."""
    from django_ratelimit_r4.backends.redis_bulkhead import RedisBulkhead
    from django_ratelimit_r4.core.bulkhead import BulkheadConfig

    bulkhead = RedisBulkhead("p", BulkheadConfig(max_concurrent_calls=2), url=redis_url, prefix=prefix, lease_ttl="300ms")
    other = RedisBulkhead("p", BulkheadConfig(max_concurrent_calls=2), url=redis_url, prefix=prefix, lease_ttl="300ms")
    try:
        assert bulkhead.try_acquire_permission()
        assert len(bulkhead._live) == 1
        bulkhead._live.clear()  # as if its process were gone: nobody renews the lease any more
        _until(lambda: other.cluster_counts() == (0, 1), "the lease's TTL to give the slot back")
    finally:
        bulkhead.close()
        other.close()


def test_a_shared_breaker_is_transitioned_once_however_many_workers_acknowledge(
    cluster: control.ControlPlane, settings: Any
) -> None:
    # With a cluster-wide breaker the transition itself reaches every worker: each worker calling
    # transition_to_open_state again would count N openings (the exponential backoff's attempts).
    config = copy.deepcopy(settings.RATELIMIT_R4)
    config["circuitbreakers"]["instances"]["acquirer"].update(
        backend="shared", wait_duration_in_open_state="10s", enable_exponential_backoff=True,
        exponential_backoff_multiplier=2,
    )
    settings.RATELIMIT_R4 = config
    breaker = get_circuit_breaker("acquirer")
    assert getattr(breaker, "shared", False)
    assert breaker.wait_listening(HANG_GUARD_S)
    epoch = breaker.epoch
    result = cluster.broadcast("transition", "acquirer", to="OPEN", timeout=HANG_GUARD_S)
    assert [a["ok"] for a in result["acks"]] == [True], result
    assert result["acks"][0]["result"]["to_state"] == "OPEN"
    # The command as every other worker receives it: applying it again changes nothing shared.
    assert result["epoch"] == epoch + 1
    command = {"id": "x", "action": "transition", "name": "acquirer", "to": "OPEN", "epoch": result["epoch"],
               "from_state": "CLOSED"}
    again = cluster.apply(command)
    assert again["ok"] and again["result"]["to_state"] == "OPEN" and again["result"]["shared"], again
    assert breaker.epoch == epoch + 1  # one shared transition
    assert breaker.remaining_open_ns() <= 10_000_000_000  # the first opening's wait, not the backoff's second
    out, _ = run("transition", "acquirer", "--to", "CLOSED", *ACK_WAIT)
    assert "circuitbreaker 'acquirer': OPEN -> CLOSED (cluster-wide breaker: one shared transition)" in out
    assert breaker.state.name == "CLOSED" and breaker.epoch == epoch + 2
