"""One control plane for every worker on every host: heartbeats, a cluster ``r4 status`` and broadcast actions.

Without ``RATELIMIT_R4["control"]`` nothing here runs: ``manage.py r4`` and the state endpoint act on one
process and say which (:func:`worker`: host and pid). With ``{"backend": "shared"}`` (a redis entry of
``RATELIMIT_R4["backends"]``) every worker process runs one daemon thread, :class:`ControlPlane`, that

* publishes a **heartbeat** every ``heartbeat_interval`` (5 s by default): its host, pid, start time and
  :func:`~django_ratelimit_r4.state.snapshot` of every instance, stored in Redis with an expiry of three
  intervals in Redis server time (a worker that stops beating is gone from the list after that);
* listens on a Redis **pub/sub channel** for commands (``transition``, ``reset``, ``drain``), applies each through
  :mod:`django_ratelimit_r4.state` (so a cluster-wide breaker's own ``transition_to_*`` stays the one entry
  point) and writes an **acknowledgement** (host, pid, result or error) under the command's id.

:func:`broadcast` publishes a command and waits (``timeout``) for the acknowledgements of the workers that were
alive when it was sent: the answer names who acknowledged and who did not. :func:`cluster_status` reads every
live heartbeat and adds up what adds up (:func:`totals`).

The thread starts lazily: at the first request a process serves (``request_started``) or when
:func:`start` is called (gunicorn's ``post_worker_init`` hook, so a worker that has not served yet is listed
and reachable too). Never in a gunicorn master: a fork forgets the parent's control plane and the child starts
its own. The hot path pays one attribute check per request and nothing per decision.

An operator's "sticky" breaker states (``FORCED_OPEN``, ``DISABLED``, ``METRICS_ONLY``: states only an operator
leaves) are also stored: a worker that starts later applies them when its control plane starts, so a worker
recycled by gunicorn's ``max_requests`` does not quietly close a breaker the operator forced open. Any other
transition or a reset of that breaker clears it.

Keys (all in one Redis Cluster slot): ``<key_prefix>:control:{<key_prefix>}:workers`` and ``...:expires``
(hashes by worker id), ``...:sticky`` (hash by breaker name), ``...:ack:<command id>`` (a hash that expires after
a minute) and the channel ``...:commands``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from django.core.signals import request_started

from . import conf, registry, state
from .backends.base import redact_url

__all__ = [
    "ACK_TTL_S",
    "DEFAULT_TIMEOUT_S",
    "MAX_TIMEOUT_S",
    "STICKY_STATES",
    "ControlPlane",
    "ControlUnavailable",
    "broadcast",
    "cluster_status",
    "get_control_plane",
    "start",
    "stop",
    "totals",
    "worker",
]

logger = logging.getLogger("django_ratelimit_r4.control")

#: How long :func:`broadcast` waits for acknowledgements by default (seconds).
DEFAULT_TIMEOUT_S = 2.0
#: The longest wait for acknowledgements an operator may ask for (``r4 --timeout``, the endpoint's ``timeout``).
MAX_TIMEOUT_S = 30.0
#: An acknowledgement hash lives this long (seconds) after the last ack written to it.
ACK_TTL_S = 60
#: How long a worker waits to hear a cluster-wide breaker's transition the sender made before it fails its ack.
FOLLOW_TIMEOUT_S = 2.0
#: Breaker states only an operator leaves: kept in Redis and applied by workers that start later.
STICKY_STATES = ("FORCED_OPEN", "DISABLED", "METRICS_ONLY")
#: Seconds between reconnection attempts while Redis cannot be reached (doubling up to the heartbeat interval).
RECONNECT_S = 0.2
#: Seconds a control-plane Redis call may take (the plane is not on any request's path).
SOCKET_TIMEOUT_S = 5.0
_LOG_INTERVAL_S = 30.0

_HOST = socket.gethostname()
_started_at = time.time()

# beat: KEYS workers, expires; ARGV id, json, ttl ms. read: KEYS workers, expires. leave: KEYS workers, expires; ARGV id.
# Expiry is in Redis server time, so hosts with skewed clocks agree; expired workers are pruned by every call.
_SCRIPT = """
local op = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if op == 'beat' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  redis.call('HSET', KEYS[2], ARGV[2], now + tonumber(ARGV[4]))
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]) * 4)
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[4]) * 4)
elseif op == 'leave' then
  redis.call('HDEL', KEYS[1], ARGV[2])
  redis.call('HDEL', KEYS[2], ARGV[2])
end
local exp = redis.call('HGETALL', KEYS[2])
for i = 1, #exp, 2 do
  if tonumber(exp[i + 1]) <= now then
    redis.call('HDEL', KEYS[1], exp[i])
    redis.call('HDEL', KEYS[2], exp[i])
  end
end
if op == 'read' then
  return {now, redis.call('HGETALL', KEYS[1])}
end
return {now}
"""


class ControlUnavailable(state.StateError):
    """The control plane's Redis could not be reached (``str()`` says which and why)."""


def worker() -> dict[str, Any]:
    """This process as ``r4`` names it: ``{"host": ..., "pid": ..., "started": <epoch seconds>}``."""
    return {"host": _HOST, "pid": os.getpid(), "started": _started_at}


def _worker_id() -> str:
    return f"{_HOST}:{os.getpid()}:{int(_started_at * 1000)}"


def _client(spec: conf.BackendSpec) -> Any:
    """A redis-py client of its own for ``spec`` (plain, Redis Cluster or Sentinel, as the backend's decisions use),
    never taking a decision's pooled connection; the subscription holds one of its connections."""
    from .backends.redis import RedisStore, connection

    store = RedisStore(spec.alias, spec.location, spec.options)
    return connection(store.url, store.connection_options).new_client(
        socket_timeout=SOCKET_TIMEOUT_S, max_connections=8
    )


class ControlPlane:
    """The control plane on one redis backend: the keys, the calls, and (in a worker) the thread.

    ``ControlPlane(options)`` reads the backend named by ``options.backend``; nothing connects until used.
    In a worker, :meth:`ensure_started` starts the daemon thread that beats and listens.
    """

    def __init__(self, options: conf.ControlOptions, spec: conf.BackendSpec) -> None:
        self.options = options
        self.spec = spec
        prefix = str(spec.options.get("key_prefix") or "r4")
        tag = f"{prefix}:control:{{{quote(prefix, safe='')}}}"  # one Redis Cluster slot per prefix
        self.workers_key = tag + ":workers"
        self.expires_key = tag + ":expires"
        self.sticky_key = tag + ":sticky"
        self.channel = tag + ":commands"
        self._ack_prefix = tag + ":ack:"
        self._client_obj: Any = None
        self._script: Any = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        #: Set while this process's listener is subscribed (commands reach it).
        self.subscribed = threading.Event()
        self._pid = os.getpid()
        self._logged_at = -_LOG_INTERVAL_S

    # -- Redis -------------------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The redis-py client (created on first use)."""
        if self._client_obj is None:
            self._client_obj = _client(self.spec)
            self._script = self._client_obj.register_script(_SCRIPT)
        return self._client_obj

    def _run(self, *argv: Any) -> Any:
        _ = self.client
        return self._script(keys=[self.workers_key, self.expires_key], args=list(argv))

    def _unavailable(self, exc: BaseException) -> ControlUnavailable:

        return ControlUnavailable(
            f"the control plane's Redis (backend {self.options.backend!r} at {redact_url(self.spec.location or '')}) "
            f"cannot be reached: {type(exc).__name__}: {exc}"
        )

    def workers(self) -> list[dict[str, Any]]:
        """Every live worker's last heartbeat (oldest start first), each with ``age_seconds`` since it beat."""
        try:
            now_ms, flat = self._run("read")
        except Exception as exc:  # redis errors, OSError
            raise self._unavailable(exc) from None
        out = []
        for i in range(0, len(flat), 2):
            try:
                beat = json.loads(flat[i + 1])
            except ValueError:
                continue
            beat["id"] = flat[i].decode() if isinstance(flat[i], bytes) else str(flat[i])
            beat["age_seconds"] = max(0.0, (int(now_ms) - int(beat.get("beat_ms", now_ms))) / 1000)
            out.append(beat)
        out.sort(key=lambda b: (b.get("host", ""), b.get("started", 0), b.get("pid", 0)))
        return out

    def beat(self) -> None:
        """Publish this worker's heartbeat now (the thread does it every interval)."""
        now_ms = self._server_ms()
        payload = {**worker(), "beat_ms": now_ms, "instances": _safe_snapshot()}
        self._run("beat", _worker_id(), json.dumps(payload, sort_keys=True), self.options.heartbeat_ttl_ns // 1_000_000)

    def _server_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def leave(self) -> None:
        """Remove this worker's heartbeat at once (a clean shutdown)."""
        self._run("leave", _worker_id())

    # -- commands ----------------------------------------------------------------------------------

    def broadcast(
        self, action: str, name: str, *, key: str | None = None, to: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> dict[str, Any]:
        """Send ``action`` on ``name`` to every live worker and wait up to ``timeout`` s for their acks.

        The action is checked first (an unknown name or state raises the :class:`~.state.StateError` the local
        action would). Returns ``{"action", "name", "id", "scope": "cluster", "acks": [...], "missing": [...]}``:
        ``acks`` are ``{"host", "pid", "ok", "result" | "error"}`` of every worker that acknowledged in time,
        ``missing`` the workers alive at the start that did not.
        """
        state.check_action(action, name, key=key, to=to)
        command_id = uuid.uuid4().hex
        expected = {w["id"]: w for w in self.workers()}
        own = _plane if _plane is self and self._thread is not None else None
        if own is not None:
            own.subscribed.wait(timeout)  # this worker's own listener: subscribed before the command goes out
        # A cluster-wide breaker's transition reaches every worker by itself: make it once, here, and let the
        # workers confirm they heard it (each calling transition_to_* again would count N openings).
        epoch, from_state = self._transition_shared(name, str(to)) if action == "transition" else (None, None)
        command = {
            "id": command_id, "action": action, "name": name, "key": key, "to": to, "from": worker(),
            "epoch": epoch, "from_state": from_state,
        }
        ack_key = self._ack_prefix + command_id
        try:
            if action == "transition":
                self._remember(name, str(to), command_id)
            elif action == "reset" and key is None:
                self._forget(name)
            receivers = int(self.client.publish(self.channel, json.dumps(command)))
        except Exception as exc:
            raise self._unavailable(exc) from None
        deadline = time.monotonic() + timeout
        acks: dict[str, dict[str, Any]] = {}
        pause = 0.005
        while True:
            try:
                raw = self.client.hgetall(ack_key)
            except Exception as exc:
                raise self._unavailable(exc) from None
            acks = {_text(k): json.loads(v) for k, v in raw.items()}
            done = set(expected) <= set(acks) and len(acks) >= receivers
            if done or time.monotonic() >= deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        missing = [
            {"host": w.get("host"), "pid": w.get("pid"), "id": wid} for wid, w in expected.items() if wid not in acks
        ]
        return {
            "action": action,
            "name": name,
            "id": command_id,
            "scope": "cluster",
            "timeout_seconds": timeout,
            "epoch": epoch,
            "acks": sorted(acks.values(), key=lambda a: (a.get("host", ""), a.get("pid", 0))),
            "missing": missing,
        }

    @staticmethod
    def _shared_breaker(name: str) -> Any:
        """The cluster-wide breaker ``name`` names, if it is one and Redis answers it (else None)."""
        breaker: Any = registry.get_circuit_breaker(state.parse_name(name)[1])
        return breaker if getattr(breaker, "shared", False) and not breaker.degraded else None

    def _transition_shared(self, name: str, to: str) -> tuple[int | None, str | None]:
        """Transition a cluster-wide breaker once (raising what :func:`state.transition` raises): its new
        shared epoch and the state it left, or Nones for a per-process breaker (each worker transitions its own)."""
        breaker = self._shared_breaker(name)
        if breaker is None:
            return None, None
        result = state.transition(name, to)
        return int(breaker.epoch), str(result["from_state"])

    @staticmethod
    def _follow(breaker: Any, epoch: int, before: str | None) -> dict[str, Any]:
        """This worker's answer to a shared transition made by the sender (from state ``before``): wait until its
        breaker has heard the transition's epoch (pub/sub, normally well under a millisecond), not make it again."""
        if not breaker.wait_epoch(epoch, FOLLOW_TIMEOUT_S):
            raise state.StateError(
                f"circuit breaker {breaker.name!r}: the shared transition (epoch {epoch}) was not heard within "
                f"{FOLLOW_TIMEOUT_S:g}s; this worker is at epoch {breaker.epoch}"
            )
        return {
            "action": "transition",
            "type": state.TYPES["circuitbreakers"],
            "name": breaker.name,
            "from_state": before,
            "to_state": breaker.state.name,
            "shared": True,
        }

    def _remember(self, name: str, to: str, command_id: str) -> None:
        target = state.transition_target(to)
        bare = state.parse_name(name)[1]
        if target in STICKY_STATES:
            self.client.hset(self.sticky_key, bare, json.dumps({"to": target, "id": command_id}))
        else:
            self.client.hdel(self.sticky_key, bare)

    def _forget(self, name: str) -> None:
        section, bare = state.parse_name(name)
        if section in (None, "circuitbreakers"):
            self.client.hdel(self.sticky_key, bare)

    def apply(self, command: Mapping[str, Any]) -> dict[str, Any]:
        """Carry out one command here; the acknowledgement this worker writes (``ok`` and ``result``/``error``)."""
        ack: dict[str, Any] = {**worker(), "ok": False}
        try:
            action, name = command["action"], command["name"]
            if action == "transition":
                epoch = command.get("epoch")
                breaker = self._shared_breaker(name) if epoch is not None else None
                if breaker is not None and epoch is not None:
                    result = self._follow(breaker, int(epoch), command.get("from_state"))
                else:  # a per-process breaker, or Redis is down here: this worker decides alone
                    result = state.transition(name, command["to"])
            elif action == "reset":
                result = state.reset(name, key=command.get("key"))
            elif action == "drain":
                result = state.drain(name, key=command.get("key"))
            else:
                raise state.IllegalAction(f"unknown action {action!r}")
        except Exception as exc:  # reported in the ack: the sender shows it per worker
            ack["error"] = str(exc) if isinstance(exc, state.StateError) else f"{type(exc).__name__}: {exc}"
        else:
            ack["ok"] = True
            ack["result"] = result
        return ack

    def _on_message(self, data: Any) -> None:
        try:
            command = json.loads(data)
            command_id = str(command["id"])
        except (ValueError, KeyError, TypeError):
            logger.warning("r4 control: ignored an unreadable command on %s", self.channel)
            return
        ack = self.apply(command)
        ack_key = self._ack_prefix + command_id
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(ack_key, _worker_id(), json.dumps(ack, sort_keys=True))
        pipe.expire(ack_key, ACK_TTL_S)
        pipe.execute()

    def apply_sticky(self) -> None:
        """Apply the operator's stored sticky breaker states (a worker that starts after the command)."""
        for raw_name, raw in self.client.hgetall(self.sticky_key).items():
            name = _text(raw_name)
            try:
                target = json.loads(raw)["to"]
                if name not in registry.names("circuitbreakers"):
                    continue
                if registry.get_circuit_breaker(name).state.name != target:
                    state.transition(f"circuitbreaker:{name}", target)
            except Exception as exc:
                logger.warning("r4 control: could not apply the stored state of breaker %r: %s", name, exc)

    # -- the worker's thread -----------------------------------------------------------------------

    def ensure_started(self) -> None:
        """Start this process's heartbeat-and-listen thread, once (idempotent, cheap when running)."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="r4-control", daemon=True)
                self._thread.start()

    @property
    def running(self) -> bool:
        """True while this process's thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, leave: bool = True) -> None:
        """Stop the thread (and, with ``leave``, remove this worker's heartbeat at once)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=SOCKET_TIMEOUT_S + 1)
        if leave and thread is not None:
            with contextlib.suppress(Exception):
                self.leave()

    def _loop(self) -> None:
        interval = self.options.heartbeat_interval_ns / 1e9
        pubsub = None
        backoff = RECONNECT_S
        next_beat = 0.0
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(self.channel)
                    # Wait for the subscription's confirmation: from here on a command reaches this worker.
                    deadline = time.monotonic() + SOCKET_TIMEOUT_S
                    while not pubsub.subscribed and time.monotonic() < deadline:
                        pubsub.get_message(timeout=0.1)
                    self.subscribed.set()
                    self.apply_sticky()
                    next_beat = 0.0
                    backoff = RECONNECT_S
                now = time.monotonic()
                if now >= next_beat:
                    self.beat()
                    next_beat = now + interval
                message = pubsub.get_message(timeout=max(0.0, min(1.0, next_beat - time.monotonic())))
                if message is not None and message.get("type") == "message":
                    self._on_message(message["data"])
                    next_beat = 0.0  # the status shows the change at once
            except Exception as exc:  # Redis down or slow: keep trying, quietly
                self.subscribed.clear()
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()
                    pubsub = None
                self._log(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, max(interval, RECONNECT_S))
        if pubsub is not None:
            with contextlib.suppress(Exception):
                pubsub.close()
        self.subscribed.clear()

    def _log(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._logged_at >= _LOG_INTERVAL_S:
            self._logged_at = now
            logger.warning(
                "r4 control plane: Redis of backend %r not reachable (%s: %s); retrying", self.options.backend,
                type(exc).__name__, exc,
            )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _safe_snapshot() -> list[dict[str, Any]]:
    try:
        return state.snapshot()
    except Exception as exc:  # a broken setting: the worker is still listed
        return [{"type": "error", "name": "", "config": None, "state": None, "error": repr(exc)}]


# ------------------------------------------------------------------------------------ the process's plane

_plane: ControlPlane | None = None
_plane_lock = threading.Lock()
_FIRST_REQUEST_UID = "django_ratelimit_r4.control.first_request"


def get_control_plane() -> ControlPlane | None:
    """This process's :class:`ControlPlane` for the current ``RATELIMIT_R4["control"]``, or None when off.

    A changed setting (``override_settings``) gives a new plane; the old one's thread is stopped.
    """
    global _plane
    options = conf.get_control()
    if options is None:
        return None
    spec = conf.get_analysis().backends.get(options.backend)
    if spec is None:
        return None

    def current(plane: ControlPlane | None) -> bool:
        return plane is not None and plane.options == options and plane.spec == spec and plane._pid == os.getpid()

    plane = _plane
    if not current(plane):
        with _plane_lock:
            plane = _plane
            if not current(plane):
                old, plane = plane, ControlPlane(options, spec)
                _plane = plane
                if old is not None and old._pid == os.getpid():
                    old.stop(leave=True)
    return plane


def start() -> ControlPlane | None:
    """Start this worker's control plane now (call it from gunicorn's ``post_worker_init`` hook); None when off.

    Without it the plane starts at the first request the process serves.
    """
    plane = get_control_plane()
    if plane is not None:
        plane.ensure_started()
    return plane


def stop() -> None:
    """Stop this process's control plane and remove its heartbeat (tests, a clean worker exit)."""
    global _plane
    with _plane_lock:
        plane, _plane = _plane, None
    if plane is not None and plane._pid == os.getpid():
        plane.stop(leave=plane._thread is not None)


def _on_request_started(**kwargs: Any) -> None:
    plane = _plane
    if plane is not None and plane._thread is not None and plane._pid == os.getpid():
        return  # running: the whole per-request cost
    try:
        start()
    except Exception:  # never fail a request over the control plane
        logger.exception("r4 control plane could not start")


def connect_request_started() -> None:
    """Start the control plane at a process's first request (done by the app's ``ready()``)."""
    request_started.connect(_on_request_started, weak=False, dispatch_uid=_FIRST_REQUEST_UID)


def _after_fork_in_child() -> None:
    # The parent's thread does not exist here and its sockets must not be shared: start afresh when needed.
    global _plane, _started_at
    _started_at = time.time()
    _plane = None


os.register_at_fork(after_in_child=_after_fork_in_child)


# ------------------------------------------------------------------------------------- module-level API


def broadcast(
    action: str, name: str, *, key: str | None = None, to: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
) -> dict[str, Any]:
    """:meth:`ControlPlane.broadcast` on the configured control plane; raises :class:`ControlUnavailable` when off."""
    plane = get_control_plane()
    if plane is None:
        raise ControlUnavailable('RATELIMIT_R4["control"] is not configured')
    return plane.broadcast(action, name, key=key, to=to, timeout=timeout)


def cluster_status(names: Iterable[str] | None = None) -> dict[str, Any]:
    """Every live worker's heartbeat and the :func:`totals` over them (``names`` filters the instances).

    ``{"scope": "cluster", "backend": alias, "heartbeat_interval_seconds": s, "workers": [...], "totals": [...]}``;
    each worker has ``host``, ``pid``, ``started``, ``age_seconds`` and ``instances`` (its snapshot).
    """
    plane = get_control_plane()
    if plane is None:
        raise ControlUnavailable('RATELIMIT_R4["control"] is not configured')
    wanted = None if names is None else [state.parse_name(n) for n in names]
    if wanted:
        state.check_names(names or ())
    workers = plane.workers()
    for w in workers:
        items = w.get("instances") or []
        if wanted:
            items = [
                i for i in items if any(n == i["name"] and s in (None, state.SECTION_OF_TYPE.get(i["type"])) for s, n in wanted)
            ]
        w["instances"] = items
    return {
        "scope": "cluster",
        "backend": plane.options.backend,
        "heartbeat_interval_seconds": plane.options.heartbeat_interval_ns / 1e9,
        "workers": workers,
        "totals": totals(workers),
    }


_SUMMED = {
    "ratelimiter": ("successful_calls", "failed_calls", "number_of_waiting_threads"),
    "bulkhead": ("permitted_calls", "rejected_calls", "finished_calls", "waiting_calls", "concurrent_calls"),
    "circuitbreaker": (
        "number_of_buffered_calls",
        "number_of_failed_calls",
        "number_of_successful_calls",
        "number_of_slow_calls",
        "number_of_not_permitted_calls",
        "total_not_permitted_calls",
    ),
    # The counter-only types: every field the snapshot reads (rejection_probability is then the highest worker's).
    **{state.TYPES[section]: fields for section, fields in state.COUNTERS.items()},
}


def totals(workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One snapshot-shaped entry per instance, over every worker's latest heartbeat.

    Counters add up (calls, permits granted and refused, calls in flight of a per-process bulkhead). State that
    is shared already (a rate limiter on Redis: its ``backend`` block; a cluster-wide bulkhead's
    ``cluster_concurrent_calls``) is taken from the freshest heartbeat, never summed. A per-process limiter's
    ``available_permissions`` and a per-process bulkhead's capacity do add up (each worker has its own). A
    breaker's ``state`` is the common state, or ``"MIXED"`` with ``states`` counting each; its rates are the
    highest worker's. Each entry has ``workers``: how many heartbeats had it.
    """
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    order: list[tuple[str, str]] = []
    for w in sorted(workers, key=lambda x: x.get("age_seconds", 0), reverse=True):  # freshest last: it wins
        for item in w.get("instances") or []:
            ident = (item.get("type", ""), item.get("name", ""))
            if ident not in merged:
                order.append(ident)
                merged[ident] = {"type": ident[0], "name": ident[1], "config": item.get("config"), "parts": []}
            merged[ident]["parts"].append(item)
            if item.get("config") is not None:
                merged[ident]["config"] = item["config"]
    out = []
    for ident in order:
        entry = merged[ident]
        parts = [p["state"] for p in entry.pop("parts") if p.get("state") is not None]
        entry["workers"] = len(parts)
        entry["state"] = _total_state(ident[0], parts) if parts else None
        if entry["state"] is None:
            entry["error"] = "no worker could read it"
        out.append(entry)
    return out


def _total_state(type_name: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    freshest = parts[-1]
    total: dict[str, Any] = dict(freshest)
    for field in _SUMMED.get(type_name, ()):
        if all(field in p for p in parts):
            total[field] = sum(p[field] for p in parts)
    if type_name == "ratelimiter":
        shared = freshest.get("backend") is not None
        if not shared:  # one budget per worker: the cluster has the sum of them
            total["available_permissions"] = sum(p["available_permissions"] for p in parts)
            total["nanos_to_wait"] = min(p["nanos_to_wait"] for p in parts)
        keyed = [p["keyed"] for p in parts if p.get("keyed")]
        if keyed:
            k = dict(keyed[-1])
            for field in ("successful_calls", "failed_calls", "lossy_evictions", "number_of_waiting_threads"):
                k[field] = sum(x.get(field, 0) for x in keyed)
            if all(x.get("live_keys") is not None for x in keyed):
                k["live_keys"] = sum(x["live_keys"] for x in keyed)
            total["keyed"] = k
    elif type_name == "bulkhead":
        if "cluster_concurrent_calls" in freshest:  # one cluster-wide limit: in use is the cluster count
            total["max_allowed_concurrent_calls"] = freshest["max_allowed_concurrent_calls"]
            total["available_concurrent_calls"] = max(
                0, freshest["max_allowed_concurrent_calls"] - freshest["cluster_concurrent_calls"]
            )
            total["lost_leases"] = sum(p.get("lost_leases", 0) for p in parts)
        else:
            for field in ("max_allowed_concurrent_calls", "available_concurrent_calls"):
                total[field] = sum(p[field] for p in parts)
    elif type_name == "circuitbreaker":
        states: dict[str, int] = {}
        for p in parts:
            states[p["state"]] = states.get(p["state"], 0) + 1
        total["state"] = next(iter(states)) if len(states) == 1 else "MIXED"
        total["states"] = states
        total["failure_rate"] = max(p["failure_rate"] for p in parts)
        total["slow_call_rate"] = max(p["slow_call_rate"] for p in parts)
        total["remaining_open_ns"] = max(p["remaining_open_ns"] for p in parts)
        total["remaining_open_seconds"] = total["remaining_open_ns"] / 1e9
    elif type_name == "adaptivethrottler":
        total["rejection_probability"] = max(p["rejection_probability"] for p in parts)
    return total
