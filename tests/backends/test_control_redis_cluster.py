"""The control plane on a real 3-primary Redis Cluster (the session's ``redis_cluster``): heartbeats and command
acknowledgements live in one slot (a hash tag per key prefix) and a command published on one node reaches
subscribers connected to others. Two forked processes are the workers; this process sends the command.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from typing import Any

import pytest

redis = pytest.importorskip("redis")

from django_ratelimit_r4 import conf, control  # noqa: E402

HANG_GUARD_S = 30.0


def _plane(url: str, prefix: str) -> control.ControlPlane:
    spec = conf.BackendSpec("shared", "redis", url, {"key_prefix": prefix, "cluster": True})
    return control.ControlPlane(conf.ControlOptions("shared", 200_000_000), spec)


def _worker(url: str, prefix: str, ready: Any, stop: Any) -> None:
    plane = _plane(url, prefix)
    control._plane = plane  # this process's plane, as control.start() makes it
    plane.ensure_started()
    plane.subscribed.wait(HANG_GUARD_S)
    ready.release()
    stop.wait(HANG_GUARD_S * 2)
    plane.stop()


def test_heartbeats_and_a_broadcast_on_a_redis_cluster(redis_cluster: Any, r4_clock: Any) -> None:
    from redis.crc import key_slot

    prefix = f"r4c:{uuid.uuid4().hex[:10]}"
    sender = _plane(redis_cluster.url, prefix)
    slots = {key_slot(k.encode()) for k in (sender.workers_key, sender.expires_key, sender.sticky_key)}
    assert len(slots) == 1  # one slot: the scripts are legal on a cluster
    ctx = multiprocessing.get_context("fork")
    ready, stop = ctx.Semaphore(0), ctx.Event()
    procs = [ctx.Process(target=_worker, args=(redis_cluster.url, prefix, ready, stop)) for _ in range(2)]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            assert ready.acquire(timeout=HANG_GUARD_S)
        deadline = time.monotonic() + HANG_GUARD_S
        while {w["pid"] for w in sender.workers()} != {p.pid for p in procs}:
            assert time.monotonic() < deadline, sender.workers()
            time.sleep(0.05)
        result = sender.broadcast("transition", "circuitbreaker:acquirer", to="FORCED_OPEN", timeout=HANG_GUARD_S)
        assert result["missing"] == []
        assert {a["pid"] for a in result["acks"]} == {p.pid for p in procs}
        assert all(a["ok"] and a["result"]["to_state"] == "FORCED_OPEN" for a in result["acks"])
    finally:
        stop.set()
        for proc in procs:
            proc.join(15)
        sender.client.delete(sender.workers_key, sender.expires_key, sender.sticky_key)
