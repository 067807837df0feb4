"""Backends chosen per instance: ``RATELIMIT_R4["backends"]``, ``"backend"`` and ``on_backend_error`` (issue 9).

Against the real Redis (db 15, this test's key prefix) and, for faults, a dedicated ``redis-server`` that a test
stops (connections refused) or pauses (connections accepted, nothing answers). No FakeClock where processes
or the server's own time are involved: periods are an hour long, so no cycle boundary falls inside a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from django_ratelimit_r4 import conf, get_rate_limiter, registry
from django_ratelimit_r4.backends.memory import MemoryBackend, MemoryStore
from django_ratelimit_r4.decorators import ratelimit
from django_ratelimit_r4.keyed import KeyedRateLimiter
from tests.backends.patient import patient

redis = pytest.importorskip("redis")
rb = pytest.importorskip("django_ratelimit_r4.backends.redis")

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(databases=[])]

ROOT = Path(__file__).resolve().parents[2]
A = {"REMOTE_ADDR": "203.0.113.7"}


def side_by_side(url: str, prefix: str, trials: int = 1, **instance: Any) -> dict[str, Any]:
    """The issue's shape: a per-process ``pool`` (default memory backend) and a cluster-wide ``global``.

    Its 100 ms socket timeout keeps the fault tests short; a test counting exact answers passes a
    :func:`~tests.backends.patient.patient` URL, whose query overrides it."""
    instances: dict[str, Any] = {
        "pool": {"limit_for_period": 3},
        "global": {"limit_for_period": 3, "backend": "shared", **instance},
        "per_ip": {"limit_for_period": 3, "backend": "shared", "key": "ip", **instance},
    }
    for t in range(trials):
        instances[f"pool_{t}"] = {"limit_for_period": 3}
        instances[f"global_{t}"] = {"limit_for_period": 8, "backend": "shared"}
    return {
        "backends": {
            "default": {"BACKEND": "memory"},
            "shared": {
                "BACKEND": "redis",
                "LOCATION": url,
                "OPTIONS": {"socket_timeout": "100ms", "key_prefix": prefix},
            },
        },
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": "1h"}},
            "instances": instances,
        },
    }


# ------------------------------------------------------------------------------------------------ views


@ratelimit("global")
def global_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("per_ip")
def per_ip_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("pool")
def pool_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("global/", global_view),
    path("per-ip/", per_ip_view),
    path("pool/", pool_view),
]


# ----------------------------------------------------------------------------------------- building


def test_each_instance_gets_the_backend_it_names(redis_url: str, prefix: str) -> None:
    with override_settings(RATELIMIT_R4=side_by_side(redis_url, prefix)):
        assert type(get_rate_limiter("pool").backend) is MemoryBackend
        remote = get_rate_limiter("global").backend
        assert isinstance(remote, rb.RedisBackend)
        assert remote.state_key == f"{prefix}:rl:{{global}}:state"  # OPTIONS key_prefix
        assert remote.fault_policy == "local"  # on_backend_error's default on redis
        assert isinstance(registry.get_keyed_rate_limiter("per_ip").store, rb.RedisKeyedStore)
        assert registry.instance_options("ratelimiters", "global")["on_backend_error"] == "local"
        assert registry.instance_options("ratelimiters", "pool")["on_backend_error"] is None


def test_options_map_onto_one_connection_per_url_and_options(redis_url: str, prefix: str) -> None:
    setting = side_by_side(redis_url, prefix)
    setting["backends"]["other"] = {  # same server and connection options, another prefix: same connection
        "BACKEND": "redis",
        "LOCATION": redis_url,
        "OPTIONS": {"socket_timeout": "100ms", "key_prefix": prefix + ":b"},
    }
    setting["backends"]["tuned"] = {
        "BACKEND": "redis",
        "LOCATION": redis_url,
        "OPTIONS": {
            "socket_timeout": "50ms",
            "socket_connect_timeout": "1s",
            "max_connections": 4,
            "timeout": "2s",
            "key_prefix": prefix,
        },
    }
    instances = setting["ratelimiters"]["instances"]
    instances["b"] = {"backend": "other"}
    instances["c"] = {"backend": "tuned"}
    with override_settings(RATELIMIT_R4=setting):
        shared = get_rate_limiter("global").backend._connection()  # type: ignore[union-attr]
        other = get_rate_limiter("b").backend._connection()  # type: ignore[union-attr]
        tuned = get_rate_limiter("c").backend._connection()  # type: ignore[union-attr]
    assert shared is other and tuned is not shared
    pool = tuned.sync.connection_pool
    assert pool.connection_kwargs["socket_timeout"] == 0.05
    assert pool.connection_kwargs["socket_connect_timeout"] == 1.0
    assert (pool.max_connections, pool.timeout) == (4, 2.0)
    assert shared.sync.connection_pool.connection_kwargs["socket_timeout"] == 0.1


def test_the_shorthand_is_backends_default_and_keeps_its_fault_policy(redis_url: str, prefix: str) -> None:
    shorthand = {
        "backend": "redis",
        "redis_url": redis_url,
        "redis_key_prefix": prefix,
        "redis_fault_policy": "closed",
        "ratelimiters": {"instances": {"api": {"limit_refresh_period": "1h"}}},
    }
    analysis = conf.analyse(shorthand)
    assert analysis.problems == []
    default = analysis.backends["default"]
    assert (default.backend, default.location, dict(default.options)) == ("redis", redis_url, {"key_prefix": prefix})
    with override_settings(RATELIMIT_R4=shorthand):
        backend = get_rate_limiter("api").backend
        assert isinstance(backend, rb.RedisBackend) and backend.fault_policy == "closed"
        assert backend.state_key == f"{prefix}:rl:{{api}}:state"
    # The instance's own word wins over the shorthand default.
    shorthand["ratelimiters"]["instances"]["api"]["on_backend_error"] = "local"
    with override_settings(RATELIMIT_R4=shorthand):
        assert get_rate_limiter("api").backend.fault_policy == "local"  # type: ignore[union-attr]
    del shorthand["redis_fault_policy"]
    shorthand["ratelimiters"]["instances"]["api"].pop("on_backend_error")
    with override_settings(RATELIMIT_R4=shorthand):
        assert get_rate_limiter("api").backend.fault_policy == "local"  # type: ignore[union-attr]


def test_backend_in_a_config_is_inherited(redis_url: str, prefix: str) -> None:
    setting = side_by_side(redis_url, prefix)
    setting["ratelimiters"]["configs"]["cluster"] = {"backend": "shared", "on_backend_error": "deny"}
    setting["ratelimiters"]["instances"]["quota"] = {"base_config": "cluster"}
    with override_settings(RATELIMIT_R4=setting):
        backend = get_rate_limiter("quota").backend
        assert isinstance(backend, rb.RedisBackend) and backend.fault_policy == "closed"


class CountingStore(MemoryStore):
    """A third-party backend: plugged in by its dotted path, the registry knows nothing about it."""

    built: list[tuple[str, str | None, dict[str, Any]]] = []

    def __init__(self, alias: str, location: str | None, options: Mapping[str, Any]) -> None:
        super().__init__(alias, location, options)
        self.built.append((alias, location, dict(options)))


def test_a_third_party_backend_plugs_in_by_dotted_path() -> None:
    CountingStore.built.clear()
    setting = {
        "backends": {
            "custom": {"BACKEND": f"{__name__}.CountingStore", "LOCATION": "anywhere", "OPTIONS": {"x": 1}}
        },
        "ratelimiters": {"instances": {"a": {"backend": "custom"}, "b": {"backend": "custom", "key": "ip"}}},
    }
    assert conf.analyse(setting).problems == []
    with override_settings(RATELIMIT_R4=setting):
        assert type(get_rate_limiter("a").backend) is MemoryBackend
        assert isinstance(registry.get_keyed_rate_limiter("b"), KeyedRateLimiter)
    assert CountingStore.built == [("custom", "anywhere", {"x": 1})]  # one store per entry


#: The methods and attributes of core.backend.KeyedBackend: all that a third-party keyed store has.
KEYED_PROTOCOL = frozenset(
    {"remote", "rejection_quotas", "successful_calls", "failed_calls", "lossy_evictions", "decide", "adecide",
     "decide_quota", "adecide_quota", "state", "quota", "aquota", "drain", "reset", "set_clock", "purge", "keys",
     "live_keys", "__len__", "__contains__"}
)


class ProtocolOnlyKeyedStore:
    """A third-party keyed store: the protocol and nothing else (ours decides behind it, out of reach)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name not in KEYED_PROTOCOL:
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)

    def __contains__(self, key: object) -> bool:
        return key in self._inner


class ProtocolOnlyStore(MemoryStore):
    def keyed_store(self, name: str, config: Any, **kwargs: Any) -> Any:
        return ProtocolOnlyKeyedStore(super().keyed_store(name, config, **kwargs))


@ratelimit("third_party_ip")
def third_party_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns.append(path("third-party/", third_party_view))


def test_a_third_party_keyed_store_decides_alone_and_refuses_all_or_nothing_clearly() -> None:
    """A keyed store that has only the protocol works behind @ratelimit; one all-or-nothing decision over it and
    another limit raises a TypeError that names it (it failed with AttributeError: '_lock', the memory store's
    private lock), and charges nothing."""
    from django_ratelimit_r4.keyed import acquire_all_keyed

    setting = {
        "backends": {"custom": {"BACKEND": f"{__name__}.ProtocolOnlyStore"}},
        "ratelimiters": {
            "configs": {"default": {"limit_refresh_period": "1h"}},
            "instances": {
                "third_party_ip": {"limit_for_period": 2, "backend": "custom", "key": "ip"},
                "pool": {"limit_for_period": 5},
            },
        },
    }
    with override_settings(RATELIMIT_R4=setting):
        keyed = registry.get_keyed_rate_limiter("third_party_ip")
        assert isinstance(keyed.store, ProtocolOnlyKeyedStore)
        assert [Client().get("/third-party/", **A).status_code for _ in range(3)] == [200, 200, 429]
        pool = get_rate_limiter("pool")
        with pytest.raises(TypeError, match=r"'third_party_ip'.*ProtocolOnlyKeyedStore.*one at a time"):
            acquire_all_keyed([(pool, None), (keyed, "203.0.113.9")])
        assert pool.metrics.available_permissions == 5 and keyed.quota("203.0.113.9")[0] == 2


#: The methods and attributes of core.backend.RateLimiterBackend: all that a third-party unkeyed backend has.
UNKEYED_PROTOCOL = frozenset(
    {"successful_calls", "failed_calls", "acquire", "state", "quota", "drain", "change_limit", "reset"}
)


class ProtocolOnlyBackend:
    """A third-party in-process backend: the protocol and nothing else; ``acquire_many`` over its own kind."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name not in UNKEYED_PROTOCOL:
            raise AttributeError(name)
        return getattr(self._inner, name)

    def acquire_many(self, backends: Any, permits: int) -> Any:
        from django_ratelimit_r4.backends.memory import acquire_many

        return acquire_many([b._inner for b in backends], permits)


class ProtocolOnlyUnkeyedStore(MemoryStore):
    def backend_factory(self, on_error: str | None) -> Any:
        return lambda *args: ProtocolOnlyBackend(MemoryBackend(*args))


@ratelimit(["third_party_pool", "remote_small"])
def third_party_and_redis_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns.append(path("third-party-and-redis/", third_party_and_redis_view))


def test_a_third_party_unkeyed_backend_with_a_redis_limit_is_refused_before_anything_is_taken(
    redis_url: str, prefix: str
) -> None:
    """The mixed path takes the in-process limits first and gives them back with give_back when Redis refuses, which
    the protocol has not: that was an AttributeError at the first refusal (a 500 only when Redis said no, with the
    in-process permit spent). Now a TypeError naming the limit, whatever Redis says, with nothing taken
    (manage.py check reports it first: ratelimit_r4.E035)."""
    from django_ratelimit_r4.keyed import acquire_all_keyed

    setting = mixed(patient(redis_url), prefix)  # Redis's exact grants: no decision to a fault policy
    setting["backends"]["custom"] = {"BACKEND": f"{__name__}.ProtocolOnlyUnkeyedStore"}
    setting["ratelimiters"]["instances"]["third_party_pool"] = {"limit_for_period": 3, "backend": "custom"}
    with override_settings(RATELIMIT_R4=setting):
        third_party, remote = get_rate_limiter("third_party_pool"), get_rate_limiter("remote_small")
        assert isinstance(third_party.backend, ProtocolOnlyBackend)
        for granted in (True, True, False):  # Redis grants twice, then refuses
            for entries in ([(third_party, None), (remote, None)], [(remote, None), (third_party, None)]):
                with pytest.raises(TypeError, match=r"'third_party_pool'.*give_back"):
                    acquire_all_keyed(entries)
            with pytest.raises(TypeError, match=r"'third_party_pool'.*give_back"):
                Client().get("/third-party-and-redis/")
            assert remote.acquire_permission() is granted
        assert available("third_party_pool") == 3  # nothing was ever taken from it


def test_a_broken_backend_breaks_only_its_instances(redis_url: str, prefix: str) -> None:
    setting = side_by_side(redis_url, prefix)
    setting["backends"]["shared"]["OPTIONS"]["socket_timout"] = "1s"
    with override_settings(RATELIMIT_R4=setting):
        assert get_rate_limiter("pool").acquire_permission()
        with pytest.raises(registry.MisconfiguredInstance, match=r"socket_timout.*ratelimit_r4\.E002"):
            get_rate_limiter("global")
        assert Client().get("/pool/").status_code == 200


# ------------------------------------------------------------------------------- side by side, processes


CHILD = textwrap.dedent(
    """
    import json, os, sys
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django
    django.setup()
    from django.test.utils import override_settings
    from django_ratelimit_r4 import get_rate_limiter
    r4 = json.loads(sys.argv[1])
    with override_settings(RATELIMIT_R4=r4):
        for name in r4["ratelimiters"]["instances"]:
            get_rate_limiter(name)
        get_rate_limiter("global_0").backend.state()  # connect before the race
        print("ready", flush=True)
        for line in sys.stdin:
            trial = int(line)
            pool = [get_rate_limiter(f"pool_{trial}").acquire_permission() for _ in range(5)]
            cluster = [get_rate_limiter(f"global_{trial}").acquire_permission() for _ in range(5)]
            print(json.dumps([pool.count(True), cluster.count(True)]), flush=True)
    """
)


def test_memory_stays_per_process_while_redis_gives_exactly_its_limit_across_four_processes(
    redis_url: str, prefix: str
) -> None:
    trials = 12
    r4 = side_by_side(patient(redis_url), prefix, trials=trials)  # exact counts: no decision to a fault policy
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(r4)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
        results = []
        for trial in range(trials):
            for child in children:  # the barrier: every process blocks on its line until all are written
                assert child.stdin is not None
                child.stdin.write(f"{trial}\n")
            for child in children:
                assert child.stdin is not None
                child.stdin.flush()
            results.append([json.loads(child.stdout.readline()) for child in children])  # type: ignore[union-attr]
        for child in children:
            assert child.stdin is not None
            child.stdin.close()
            assert child.wait(60) == 0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            for stream in (child.stdout, child.stderr, child.stdin):
                if stream is not None and not stream.closed:
                    stream.close()
    for trial, per_process in enumerate(results):
        assert [pool for pool, _ in per_process] == [3, 3, 3, 3], (trial, per_process)  # 3 in every process
        assert sum(cluster for _, cluster in per_process) == 8, (trial, per_process)  # 8 for all of them


# ------------------------------------------------------------------------------------------------ faults


@pytest.fixture
def on_dedicated_server(redis_server: Any) -> Iterator[Any]:
    """``redis_server`` with its connections closed afterwards (the fault state of this URL goes with them)."""
    yield redis_server
    rb.close_connections()


def _fail(server: Any, how: str) -> None:
    if how == "refused":
        server.stop()
    else:
        server.pause()


def _restore(server: Any, how: str) -> None:
    if how == "refused":
        server.start()
    else:
        server.resume()


EXPECTED = {
    # policy: (statuses of 180 requests while Redis fails, Retry-After of the first rejection or None)
    "local": ([200] * 3 + [429] * 177, "3600"),  # an in-process limiter of the same config: 3 per hour
    "allow": ([200] * 180, None),
    "deny": ([429] * 180, "1"),
}


@pytest.mark.parametrize("how", ["refused", "hanging"])
@pytest.mark.parametrize("policy", ["local", "allow", "deny"])
def test_on_backend_error_holds_without_500_or_hang_and_recovers(
    on_dedicated_server: Any, policy: str, how: str
) -> None:
    server = on_dedicated_server
    timeout = 0.1
    with override_settings(RATELIMIT_R4=side_by_side(server.url, "r4", on_backend_error=policy)):
        client = Client()
        assert client.get("/global/").status_code == 200  # healthy: Redis decides (2 of 3 left)
        backend = get_rate_limiter("global").backend
        keyed = registry.get_keyed_rate_limiter("per_ip")
        _fail(server, how)
        durations: list[float] = []
        responses = []
        started = time.monotonic()
        for _ in range(180):
            t0 = time.monotonic()
            responses.append(client.get("/global/"))
            durations.append(time.monotonic() - t0)
        elapsed = time.monotonic() - started
        per_ip = [client.get("/per-ip/", **A).status_code for _ in range(5)]
        pool = [client.get("/pool/").status_code for _ in range(4)]
        statuses, retry_after = EXPECTED[policy]
        assert [r.status_code for r in responses] == statuses
        if retry_after is not None:
            first = next(r for r in responses if r.status_code == 429)
            assert first["Retry-After"] == retry_after
        assert per_ip == {"local": [200] * 3 + [429] * 2, "allow": [200] * 5, "deny": [429] * 5}[policy]
        assert pool == [200, 200, 200, 429]  # the memory instance never notices
        # A fault costs at most one socket timeout per probe, and a probe comes once per cool-down (0.5 s): the
        # requests that waited a timeout are at most one per cool-down. The wall-clock bound on each request is a
        # hang guard below the 5 s pool wait (a busy 2-core machine can stall any request for a second).
        waited = [d for d in durations if d >= timeout]
        assert len(waited) <= elapsed / 0.5 + 2, (len(waited), elapsed)
        assert max(durations) < timeout + 3.0, max(durations)
        assert elapsed < 180 * timeout / 3, elapsed
        health = backend.backend_health()  # type: ignore[union-attr]
        assert health["degraded"] is True and health["fault_policy"] == rb_policy(policy)
        assert backend.faults == 180  # type: ignore[union-attr]
        assert keyed.store.faults == 5  # type: ignore[attr-defined]
        # Recovery is automatic: once Redis answers, it decides again (the fault counter stops growing).
        _restore(server, how)
        deadline = time.monotonic() + 15
        while backend.backend_health()["degraded"]:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no recovery"
            client.get("/global/")
            time.sleep(0.02)  # the cool-down is real time (0.5 s)
        faults = backend.faults  # type: ignore[union-attr]
        after = [client.get("/global/").status_code for _ in range(4)]
        assert backend.faults == faults  # type: ignore[union-attr]
        assert after[-1] == 429 and after.count(200) <= 3  # Redis's budget of 3 per hour, not a policy's
        last = client.get("/global/")
        assert int(last["Retry-After"]) > 60  # the hour-long wait Redis computed


def rb_policy(on_error: str) -> str:
    return {"local": "local", "allow": "open", "deny": "closed"}[on_error]


# ------------------------------------------------------------------------------ multi-limit across backends


def mixed(url: str, prefix: str) -> dict[str, Any]:
    setting = side_by_side(url, prefix)
    setting["ratelimiters"]["instances"].update(
        {
            "local_small": {"limit_for_period": 2},
            "remote_big": {"limit_for_period": 3, "backend": "shared"},
            "local_big": {"limit_for_period": 5},
            "remote_small": {"limit_for_period": 2, "backend": "shared"},
        }
    )
    setting["backends"]["tuned"] = {
        "BACKEND": "redis",
        "LOCATION": url,
        "OPTIONS": {"socket_timeout": "50ms", "key_prefix": prefix},
    }
    setting["ratelimiters"]["instances"]["elsewhere"] = {"backend": "tuned"}
    return setting


@ratelimit(["local_small", "remote_big"])
def local_says_no(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["local_big", "remote_small"])
def remote_says_no(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(["local_big", "remote_small"])
async def remote_says_no_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns += [
    path("local-says-no/", local_says_no),
    path("remote-says-no/", remote_says_no),
    path("remote-says-no-async/", remote_says_no_async),
]


def available(name: str) -> int:
    return get_rate_limiter(name).metrics.available_permissions  # type: ignore[union-attr]


def test_a_local_rejection_never_reaches_redis(redis_url: str, prefix: str) -> None:
    with override_settings(RATELIMIT_R4=mixed(patient(redis_url), prefix)):
        client = Client()
        assert [client.get("/local-says-no/").status_code for _ in range(3)] == [200, 200, 429]
        assert (available("local_small"), available("remote_big")) == (0, 1)  # Redis was not charged


@pytest.mark.parametrize("url", ["/remote-says-no/", "/remote-says-no-async/"])
def test_a_redis_rejection_gives_the_local_permits_back(redis_url: str, prefix: str, url: str) -> None:
    with override_settings(RATELIMIT_R4=mixed(patient(redis_url), prefix)):
        client = Client()
        statuses = [client.get(url) for _ in range(4)]
        assert [r.status_code for r in statuses] == [200, 200, 429, 429]
        assert int(statuses[-1]["Retry-After"]) > 60  # Redis's hour, not a memory figure
        assert (available("local_big"), available("remote_small")) == (3, 0)  # 5 - 2: the 429s cost nothing


def test_mixed_decisions_stay_exact_per_backend_under_concurrency(redis_url: str, prefix: str) -> None:
    import threading

    from django_ratelimit_r4.keyed import acquire_all_keyed

    with override_settings(RATELIMIT_R4=mixed(patient(redis_url), prefix)):
        local, remote = get_rate_limiter("local_big"), get_rate_limiter("remote_small")
        remote.backend.state()  # connect first  # type: ignore[union-attr]
        for trial in range(15):
            local.reset()
            remote.reset()
            barrier = threading.Barrier(8)
            granted: list[bool] = []

            def worker(barrier: threading.Barrier, granted: list[bool]) -> None:
                barrier.wait()
                for _ in range(3):
                    granted.append(acquire_all_keyed([(local, None), (remote, None)]) is None)

            threads = [threading.Thread(target=worker, args=(barrier, granted)) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            taken = granted.count(True)
            assert taken == 2, (trial, taken)  # Redis's 2: the first two decisions that reach it are granted
            # Exact per backend: each budget is charged once per granted decision, never for a rejected one.
            assert (available("local_big"), available("remote_small")) == (5 - taken, 2 - taken), trial


def test_limits_on_two_redis_connections_are_refused_when_the_plan_is_built(redis_url: str, prefix: str) -> None:
    from django_ratelimit_r4.decorators import RateLimitGate

    with override_settings(RATELIMIT_R4=mixed(redis_url, prefix)):
        gate = RateLimitGate(["global", "elsewhere"])
        with pytest.raises(TypeError, match=r"\['global', 'elsewhere'\].*different Redis servers"):
            gate.plan()
        assert RateLimitGate(["pool", "global"]).plan().remote
